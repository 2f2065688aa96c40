"""Settings of the engine, declared once: the sandbox, memory-guard and GPU-sharing settings every job run
through the engine shares (``opforge filter``, ``opforge run`` through ``filters.chain.FilterSettings``),
and the GPU memory admission the harness's ``EvalConfig`` shares with them (``GpuAdmission``)."""

from __future__ import annotations

from typing import Any, Literal

from opforge.engine.gpu_locks import ADMIT_FRACTION, ADMIT_GIB, ADMIT_GROWTH, ADMIT_PREDICTED
from pydantic import BaseModel, Field


class GpuAdmission(BaseModel):
    """GPU memory admission (``engine.gpu_locks.MemoryBudget``): jobs on one GPU start only while their
    reservations fit, so a batch never runs out of memory by crowding. Units: GiB, shares of a GPU.

    Attributes:
        device: "cpu" or "cuda".
        gpu_memory_fraction: share of a GPU's memory its tasks may reserve together
            (``engine.gpu_locks.MemoryBudget``; the rest is CUDA contexts, cuBLAS / Triton workspaces).
        gpu_admit_gib: what a task reserves on its GPU before it starts (GiB; see
            ``engine.gpu_locks.ADMIT_GIB``: a reservation only has to hold until ``eager`` has measured
            the task, and waiting for admission idles a sandbox).
        gpu_growth: after each GPU step and before each filter a task's reservation grows to this factor
            x the memory its allocator has held so far (room for the outputs and compiled graphs still to
            come).
    """

    device: Literal["cpu", "cuda"] = "cpu"
    gpu_memory_fraction: float = Field(ADMIT_FRACTION, gt=0, le=1, description=(
        "Share of GPU memory tasks may reserve together (default 0.9)."))
    gpu_admit_gib: float = Field(ADMIT_GIB, gt=0, description=(
        "GiB a task reserves before it starts when its peak cannot be predicted (default 4)."))
    gpu_growth: float = Field(ADMIT_GROWTH, ge=1, description=(
        "Reservation = this x the memory held so far, after each GPU step and before each filter "
        "(default 1.25)."))


class EngineSettings(GpuAdmission):
    """Settings of the engine's reuse sandboxes (``engine.sandbox``, ``engine.sandbox_child``) on top of
    ``GpuAdmission``. Units: seconds, GiB.

    Attributes:
        timeout_s: wall-clock limit per task in its sandbox child (everything: build, compile, timing).
        memory_gib: memory guard per sandbox child: how much it may grow beyond its size after start
            (resident size, checked by the parent; on CPU also an address-space cap in the child).
        address_space_cap: apply the CPU address-space cap (off: only the resident-size watchdog).
        cpu_threads: torch intra-op threads per CPU sandbox child (None = cores / workers).
        gpu_admit_predicted: when > 0, a task reserves this factor x its predicted eager peak instead
            (at least ``ADMIT_MIN_GIB``; ``engine.memory_estimate``, fake tensors, no GPU work), and
            ``gpu_admit_gib`` only when the prediction fails; 0 = always ``gpu_admit_gib``.
        gpu_step_limit_s: most seconds one GPU step of a task (a forward call, a comparison, a compiled
            model's first call with Inductor's autotuning, a timing section) may hold the GPU's lock; a longer
            one ends the task with reason ``timeout:gpu_step`` (metrics ``gpu_step_s``). The rule: while a
            step runs, every neighbour that wants to time its task waits for it, so a long step idles the
            other sandboxes of its GPU; a step is cut as soon as it is certainly too slow. Default (None): set
            by the job from its runtime window (the filter stage: ``filters.chain.STEP_LIMIT_SANDBOXES`` x
            the window's upper edge, i.e. 1.6 s for 1-100 ms: a forward inside the window, time-sliced with
            that many sandboxes, still ends within it (measured on an H200 with 14 sandboxes: the longest
            step of an accepted task took 0.58 s, and a 2.5 s limit finished 600 tasks ~10 % sooner than 5 s;
            measured 2026-11-22, record in the git history of docs/benchmark-log.md); without a window
            ``STEP_LIMIT_NO_WINDOW_S``).
            Results carry ``gpu_step_max_s``, the task's longest step. 0: no limit.
        gpu_share_limit_s: most seconds of GPU time one forward call of a task (after its first, which carries
            one-time costs) may have had, bounded from below by its time divided by the processes sharing the
            GPU meanwhile (``engine.sandbox.GpuStepWatch``); a longer one ends the task with reason
            ``timeout:gpu_share`` (metrics ``gpu_share_s``). Default (None): ``STEP_SHARE_WINDOWS`` x the
            window's upper edge (0.2 s for 1-100 ms: such a forward is certainly too slow), off without a
            window or with Inductor's autotuning in the compile check. It ends a far-too-slow forward as soon
            as its neighbours queue to time their tasks and leave it the GPU, instead of after
            ``gpu_step_limit_s``. 0: off.
        gpu_concurrency: most sandboxes whose GPU steps run on one GPU at once (``engine.gpu_locks``
            ``compute`` slots; the others' CPU work goes on meanwhile); 0 = no cap (the GPU time-slices
            between all of them).
        compile_threads: Inductor's ``compile_threads`` in each sandbox (1: kernels of one task compile
            one after another in the sandbox itself; more starts Inductor's pool of compile processes in
            every sandbox, which only pays when cores are idle).
    """

    timeout_s: float = Field(300.0, gt=0, description=(
        "Per-task wall-clock limit in its sandbox, seconds (default 300)."))
    memory_gib: float = Field(8.0, ge=0, description="Per-sandbox memory guard, GiB (default 8).")
    address_space_cap: bool = True
    cpu_threads: int | None = None
    gpu_admit_predicted: float = Field(ADMIT_PREDICTED, ge=0, description=(
        "A task reserves this x its predicted eager peak (fake tensors) before it starts; 0 = always "
        "--gpu-admit-gib (default 1.5)."))
    gpu_step_limit_s: float | None = Field(None, ge=0, description=(
        "Most seconds one GPU step of a task may hold the GPU's lock before the task ends as "
        "timeout:gpu_step (default: 16 x the window's top, 1.6 s for 1-100 ms; 5 s without a window; "
        "0 = no limit)."))
    gpu_share_limit_s: float | None = Field(None, ge=0, description=(
        "Most seconds of GPU time one forward call (after the task's first) may have had (its time / "
        "the processes sharing the GPU) before the task ends as timeout:gpu_share (default: 2 x the window's "
        "top; off without a window; 0 = off)."))
    gpu_concurrency: int = Field(0, ge=0, description=(
        "Most sandboxes running GPU steps on one GPU at once; 0 = no cap (default 0)."))
    compile_threads: int = Field(1, ge=1, description="Inductor compile_threads per sandbox (default 1).")


# EngineSettings fields of the sandbox that ``opforge filter`` takes as options.
SANDBOX_OPTIONS = ("timeout_s", "memory_gib")
# EngineSettings fields for GPU sharing that ``opforge filter`` takes as options and ``opforge run`` as config
# keys, passed on only when given (None: the default).
GPU_SHARING_OPTIONS = tuple(n for n in EngineSettings.model_fields
                            if n.startswith("gpu_") or n == "compile_threads")


def same_fields(model: type[BaseModel], names: tuple[str, ...]) -> dict[str, Any]:
    """``create_model`` field definitions for ``names`` of ``model`` as declared there (type, default,
    bounds, description)."""
    return {name: (model.model_fields[name].annotation, model.model_fields[name]) for name in names}


def optional_fields(model: type[BaseModel], names: tuple[str, ...]) -> dict[str, Any]:
    """``create_model`` field definitions for ``names`` of ``model``: each one's type or None, default
    None, with the field's bounds and description, so a model of options given or not (a run config, a
    command line) declares none of them again."""
    out = {}
    for name in names:
        info = model.model_fields[name]
        out[name] = (info.annotation | None, Field(None, description=info.description, json_schema_extra=None))
        out[name][1].metadata.extend(info.metadata)
    return out
