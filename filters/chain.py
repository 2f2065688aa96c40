"""The ordered filter chain and its settings.

``FilterSettings`` is the one configuration object of the filter stage (pydantic; it travels to the
workers). ``make_chain`` turns it into filter instances ordered by ``Filter.order`` (cheap first);
``run_chain`` runs them on one task and stops at the first rejection.

Adding a filter: write a ``Filter`` subclass with ``name``, ``cost``, ``order``, ``score`` and ``decide``
in a module of this package and list the module in ``FILTER_MODULES``.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from typing import Any

from opforge.engine.gpu_locks import ADMIT_FRACTION, ADMIT_GIB, ADMIT_GROWTH, ADMIT_PREDICTED
from opforge.filters.verdict import REGISTRY, Cost, Filter, TaskInput
from pydantic import BaseModel, Field, field_validator, model_validator

# Default GPU step limit (FilterSettings.gpu_step_limit_s): this many time-sliced sandboxes x the runtime
# window's upper edge; without a window, this many seconds. Default GPU-time limit of one forward call
# (gpu_share_limit_s): this many x the window's upper edge.
STEP_LIMIT_SANDBOXES, STEP_LIMIT_NO_WINDOW_S, STEP_SHARE_WINDOWS = 16, 5.0, 2.0

# Modules whose Filter subclasses make up the chain (importing a module registers its filters).
FILTER_MODULES = ("duplicate", "static", "contamination", "eager", "determinism", "degenerate", "trivial",
                  "runtime", "torch_compile")  # runtime.py holds runtime_screen and runtime


def load_filters() -> dict[str, type[Filter]]:
    """Import the filter modules and return the registry (name -> class)."""
    for mod in FILTER_MODULES:
        importlib.import_module(f"opforge.filters.{mod}")
    return dict(REGISTRY)


class FilterSettings(BaseModel):
    """Settings of one filter run. Units: ms for the window, seconds for the timeout, GiB for memory.

    Attributes:
        device: "cpu" or "cuda".
        only / skip: filter names to run exclusively / to leave out (``static`` always runs).
        runtime_window_ms: [lo, hi] eager-median window; None = off (the CPU default).
        timeout_s: wall-clock limit per task in its sandbox child (everything: build, compile, timing).
        memory_gib: memory guard per sandbox child: how much it may grow beyond its size after start
            (resident size, checked by the parent; on CPU also an address-space cap in the child).
        address_space_cap: apply the CPU address-space cap (off: only the resident-size watchdog).
        cpu_threads: torch intra-op threads per CPU sandbox child (None = cores / workers).
        gpu_memory_fraction: share of a GPU's memory its tasks may reserve together
            (``engine.gpu_locks.MemoryBudget``; the rest is CUDA contexts, cuBLAS / Triton workspaces).
        gpu_admit_gib: what a task reserves on its GPU before it starts (GiB; see
            ``engine.gpu_locks.ADMIT_GIB``: a reservation only has to hold until ``eager`` has measured
            the task, and waiting for admission idles a sandbox).
        gpu_admit_predicted: when > 0, a task reserves this factor x its predicted eager peak instead
            (at least ``ADMIT_MIN_GIB``; ``engine.memory_estimate``, fake tensors, no GPU work), and
            ``gpu_admit_gib`` only when the prediction fails; 0 = always ``gpu_admit_gib``.
        gpu_growth: after each GPU step and before each filter a task's reservation grows to this factor
            x the memory its allocator has held so far (room for the outputs and compiled graphs still to
            come).
        gpu_step_limit_s: most seconds one GPU step of a task (a forward call, a comparison, a compiled
            model's first call with Inductor's autotuning, a timing section) may hold the GPU's lock; a longer
            one ends the task with reason ``timeout:gpu_step`` (metrics ``gpu_step_s``). The rule: while a
            step runs, every neighbour that wants to time its task waits for it, so a long step idles the
            other sandboxes of its GPU; a step is cut as soon as it is certainly too slow. Default (None):
            ``STEP_LIMIT_SANDBOXES`` x the window's upper edge, i.e. 1.6 s for 1-100 ms: a forward inside
            the window, time-sliced with that many sandboxes, still ends within it (measured on an H200 with
            14 sandboxes: the longest step of an accepted task took 0.58 s, and a 2.5 s limit finished 600
            tasks ~10 % sooner than 5 s; docs/benchmark-log.md, 2026-11-22 (2fefd48)); without a window
            ``STEP_LIMIT_NO_WINDOW_S``. Results carry ``gpu_step_max_s``, the task's longest step. 0: no
            limit.
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
        thresholds: per-filter threshold overrides, e.g. ``{"determinism": {"max_drift": 0.05}}``.
        kernelbench: where the contamination filter's KernelBench problems come from (a .jsonl/.parquet
            path or ``hub:REPO@REVISION``; None = ``filters.kernelbench.default_reference()``).
        kernelbench_levels: KernelBench levels to compare with (default 1–3).
        kernelbench_index: path of the built index the sandboxes load (set by the run, not by users).
        kernelbench_identity: source hash, levels and version of that index (part of the fingerprint).
    """

    device: str = "cpu"
    only: list[str] | None = None
    skip: list[str] = Field(default_factory=list)
    runtime_window_ms: tuple[float, float] | None = None
    timeout_s: float = 300.0
    memory_gib: float = 8.0
    address_space_cap: bool = True
    cpu_threads: int | None = None
    gpu_memory_fraction: float = Field(ADMIT_FRACTION, gt=0, le=1)
    gpu_admit_gib: float = Field(ADMIT_GIB, gt=0)
    gpu_admit_predicted: float = Field(ADMIT_PREDICTED, ge=0)
    gpu_growth: float = Field(ADMIT_GROWTH, ge=1)
    gpu_step_limit_s: float | None = Field(None, ge=0)
    gpu_share_limit_s: float | None = Field(None, ge=0)
    gpu_concurrency: int = Field(0, ge=0)
    compile_threads: int = Field(1, ge=1)
    thresholds: dict[str, dict[str, Any]] = Field(default_factory=dict)
    kernelbench: str | None = None
    kernelbench_levels: tuple[int, ...] = (1, 2, 3)
    kernelbench_index: str | None = None
    kernelbench_identity: dict[str, Any] | None = None

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        if v not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda', got {v!r}")
        return v

    @field_validator("runtime_window_ms")
    @classmethod
    def _window(cls, v):
        if v is not None and not 0 <= v[0] < v[1]:
            raise ValueError(f"runtime window must be 0 <= lo < hi (ms), got {list(v)}")
        return v

    @model_validator(mode="after")
    def _step_limits(self) -> FilterSettings:
        window = self.runtime_window_ms
        if self.gpu_step_limit_s is None:
            self.gpu_step_limit_s = (STEP_LIMIT_NO_WINDOW_S if window is None
                                     else round(STEP_LIMIT_SANDBOXES * window[1] / 1e3, 3))
        if self.gpu_share_limit_s is None:
            autotune = bool(self.thresholds.get("compile", {}).get("autotune"))
            self.gpu_share_limit_s = (0.0 if window is None or autotune
                                      else round(STEP_SHARE_WINDOWS * window[1] / 1e3, 3))
        return self

    def names(self) -> list[str]:
        """Filter names that will run, in chain order. Raises ValueError on an unknown name."""
        for n in [*(self.only or []), *self.skip]:
            if n not in FILTER_NAMES:
                raise ValueError(f"unknown filter {n!r}; known: {', '.join(FILTER_NAMES)}")
        return [n for n in FILTER_NAMES if (self.only is None or n in self.only or n == "static")
                and (n not in self.skip or n == "static")]

    def fingerprint_fields(self) -> dict[str, Any]:
        """What changes verdicts: chain, window, thresholds, memory guard, KernelBench reference (not
        timeout or threads)."""
        fields = {"device": self.device, "filters": self.names(), "window": self.runtime_window_ms,
                  "thresholds": self.thresholds, "memory_gib": self.memory_gib, "filter_logic": 10}
        if "contamination" in self.names():
            fields["kernelbench"] = self.kernelbench_identity
        return fields

    def corpus_names(self) -> list[str]:
        """Filters of this run that score the whole input on the client (``duplicate``)."""
        return [n for n in self.names() if n in CORPUS_FILTERS]


# Chain order (must match the classes' ``order``; a test checks it); kept literal so the client can
# validate names without importing torch.
FILTER_NAMES = ("duplicate", "static", "contamination", "eager", "runtime_screen", "determinism", "degenerate",
                "trivial", "compile", "runtime")
# Filters that score the whole input at once on the client (``corpus = True``), before dispatch.
CORPUS_FILTERS = ("duplicate",)
# FilterSettings fields for GPU sharing that ``opforge filter`` and ``opforge run`` take as options and pass
# on only when given (None: FilterSettings' default).
GPU_SHARING_OPTIONS = ("gpu_step_limit_s", "gpu_share_limit_s", "gpu_admit_gib", "gpu_admit_predicted",
                       "gpu_growth", "gpu_memory_fraction", "gpu_concurrency", "compile_threads")


def parse_threshold(text: str) -> tuple[str, str, Any]:
    """``"FILTER.KEY=VALUE"`` -> (filter, key, value), VALUE read as YAML (``0.01`` a float, ``[1, 50]`` a
    list, ``true`` / ``null``...), e.g. ``runtime.budget_s=0.01``. Raises ValueError naming ``text`` when
    it is not of that form or names an unknown filter (keys are checked by ``check_thresholds``)."""
    import yaml

    name_key, sep, raw = text.partition("=")
    name, dot, key = name_key.strip().partition(".")
    if not (sep and dot and name and key.strip()):
        raise ValueError(f"threshold {text!r}: expected FILTER.KEY=VALUE, e.g. runtime.budget_s=0.01")
    if name not in FILTER_NAMES:
        raise ValueError(f"threshold {text!r}: unknown filter {name!r}")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        raise ValueError(f"threshold {text!r}: value {raw.strip()!r} is not valid YAML") from None
    return name, key.strip(), value


def merge_thresholds(base: dict[str, dict[str, Any]], texts: list[str] | None = None,
                     compile_autotune: bool = False) -> dict[str, dict[str, Any]]:
    """``base`` (filter -> {key: value}) with every ``parse_threshold`` text applied on top (later wins),
    then ``compile.autotune`` = True when ``compile_autotune`` (``--compile-autotune`` / the run key: the
    dedicated switch wins); ``base`` itself is not changed. Raises ValueError as ``parse_threshold``."""
    merged = {name: dict(values) for name, values in base.items()}
    for text in texts or []:
        name, key, value = parse_threshold(text)
        merged.setdefault(name, {})[key] = value
    if compile_autotune:
        merged.setdefault("compile", {})["autotune"] = True
    return merged


def check_thresholds(thresholds: dict[str, dict[str, Any]]) -> None:
    """Raise ValueError naming the filter and key when ``thresholds`` (filter -> {key: value}) names a
    filter or a key that does not exist (the keys are each filter's ``default_thresholds``); imports the
    filter modules, so call it before dispatching work, not per task."""
    registry = load_filters()
    for name, values in thresholds.items():
        if name not in registry:
            raise ValueError(f"thresholds: unknown filter {name!r}; known: {', '.join(FILTER_NAMES)}")
        known = registry[name].default_thresholds()
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ValueError(f"thresholds: filter {name!r} has no threshold(s) {unknown}; "
                             f"known: {', '.join(sorted(known)) or 'none'}")


def make_chain(settings: FilterSettings) -> list[Filter]:
    """Instantiate the chosen per-task filters in order (corpus filters excluded), applying
    ``settings.thresholds``, the runtime window and the KernelBench index."""
    registry = load_filters()
    chain = []
    for name in settings.names():
        if name in CORPUS_FILTERS:
            continue
        overrides = dict(settings.thresholds.get(name, {}))
        if name in ("runtime", "runtime_screen") and settings.runtime_window_ms is not None:
            overrides.setdefault("window_ms", list(settings.runtime_window_ms))
        if name == "contamination":
            chain.append(registry[name](index=settings.kernelbench_index, **overrides))
            continue
        chain.append(registry[name](**overrides))
    return sorted(chain, key=lambda f: f.order)


def make_corpus_filters(settings: FilterSettings) -> list[Filter]:
    """Instantiate the chosen corpus filters (run on the client over the whole input)."""
    registry = load_filters()
    return [registry[n](**settings.thresholds.get(n, {})) for n in settings.corpus_names()]


def run_chain(task: TaskInput, chain: list[Filter],
              on_stage: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run ``chain`` on one task; stop at the first rejection.

    Returns a JSON-ready dict: ``accepted``, ``reason``, ``filter`` (the rejecting one, None when
    accepted), ``metrics`` (filter name -> metrics of every filter that ran), ``seconds`` (filter name ->
    wall seconds). ``on_stage(name)`` is called before each filter. An exception escaping a filter's
    ``score`` becomes its rejection: ``oom`` for out-of-memory, otherwise ``compile_error:<Exc>`` in the
    ``compile`` filter and ``eager_error:<Exc>`` in any other.
    """
    from opforge.engine.execution import failure_metrics

    metrics: dict[str, Any] = {}
    seconds: dict[str, float] = {}
    for f in chain:
        if on_stage is not None:
            on_stage(f.name)
        start = time.perf_counter()
        try:
            with _device_work(f, task):
                metrics_f = f.score(task)
            verdict = f.decide(metrics_f)
        except Exception as exc:  # noqa: BLE001 - a filter's own crash on odd output is still a verdict
            verdict = f.reject_failure(failure_metrics(exc),
                                       "compile_error" if f.name == "compile" else "eager_error")
        seconds[f.name] = time.perf_counter() - start
        metrics[f.name] = verdict.metrics
        if not verdict.accepted:
            return {"accepted": False, "reason": verdict.reason, "filter": f.name, "metrics": metrics,
                    "seconds": seconds}
    return {"accepted": True, "reason": None, "filter": None, "metrics": metrics, "seconds": seconds}


def _device_work(f: Filter, task: TaskInput):
    """A device filter's scoring on CUDA holds the GPU's ``compute`` lock shared (``engine.gpu_locks``),
    so no neighbour's timing overlaps it, unless the filter takes the lock itself (``gpu_work_lock``
    False); anything else runs unlocked."""
    import contextlib

    device = getattr(task, "device", "cpu")
    if f.cost != Cost.DEVICE or not f.gpu_work_lock or not str(device).startswith("cuda"):
        return contextlib.nullcontext()
    from opforge.engine.gpu_locks import gpu_work

    return gpu_work(device)


# The filter chain as the engine's sandbox job (``engine.sandbox.Sandbox(CHAIN_JOB, settings)``).
CHAIN_JOB = "opforge.filters.chain:ChainJob"


class ChainJob:
    """The per-task filter chain of ``settings`` (a ``FilterSettings`` dict) as an
    ``engine.sandbox_child.SandboxJob``: ``run`` is ``run_chain`` on one task."""

    def __init__(self, settings: dict[str, Any]):
        self.settings = FilterSettings.model_validate(settings)
        self.chain = make_chain(self.settings)
        self.device_stages = frozenset(f.name for f in self.chain if f.cost == Cost.DEVICE)
        self._run = None

    def warm_up(self) -> dict[str, Any]:
        """On CUDA with the compile filter: a first small compile (a process's first costs seconds more than
        later ones). Returns ``compile_warm_up_s`` or ``compile_warm_up_error``."""
        compile_filter = next((f for f in self.chain if f.name == "compile"), None)
        if self.settings.device != "cuda" or compile_filter is None:
            return {}
        from opforge.filters.torch_compile import warm_up_compiler

        heuristic = not compile_filter.thresholds["autotune"]  # the filter's defaults merged with the run's
        try:
            return {"compile_warm_up_s": round(warm_up_compiler("cuda", heuristic=heuristic), 3)}
        except Exception as exc:  # noqa: BLE001 - only a head start: the compile filter meets and reports it
            return {"compile_warm_up_error": f"{type(exc).__name__}: {str(exc)[:200]}"}

    def run(self, task_id: str, code: str, on_stage: Callable[[str], None]) -> dict[str, Any]:
        from opforge.engine.execution import TaskRun

        self._run = TaskRun(code=code, task_id=task_id, device=self.settings.device)
        return run_chain(self._run, self.chain, on_stage=on_stage)

    def release(self) -> None:
        if self._run is not None:
            self._run.release()
            self._run = None
