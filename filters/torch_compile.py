"""``compile`` filter: the model runs under ``torch.compile`` (Inductor) and agrees with eager.

Each task starts from ``torch._dynamo.reset()`` so a worker that is reused across tasks neither hits
Dynamo's recompile limits nor keeps earlier tasks' graphs alive. The compiled model gets the ``eager``
filter's inputs after the same ``CALL_SEED`` and must be allclose to the eager outputs at the evaluation
tolerance of the output's dtype (``opforge.task.precision``). The compiled model is left on ``TaskRun.compiled`` for the ``runtime``
filter, which times it with eager in one exclusive section.

On CUDA the default Inductor backend is wrapped so that only the compiled graph's execution holds the GPU's
``compute`` lock (shared, ``engine.gpu_locks``); Dynamo tracing and Inductor's compilation (FX passes,
code generation, Triton builds: seconds of CPU work) run unlocked, so a neighbour's timing never waits
for a compile. Output comparison holds it shared.

Inductor's runtime autotuning (on CUDA, at a kernel's first launch when it has several candidate configs:
pointwise kernels 2-3, reductions up to 3; default mode) benchmarks each config for up to
``max_benchmark_duration`` = 25 ms after 100 L2-flushing memsets (``InductorBenchmarker.benchmark_gpu``,
torch 2.6+). On an H200 that was over half of all GPU time a task costs the filter stage (compile 175 of
~330 kernel-ms per task; measured 2026-11-21, one H200; record in the git history of docs/benchmark-log.md).
The check caps it (threshold ``autotune_bench_ms``, default 1 ms, 10 warm-up memsets, 1 estimation call):
Inductor still picks among the same configs by measurement; only configs within a timing noise of each
other can be picked differently, which changes ``compile_ms`` by that noise and never the output checked.
With the cap the compile filter's kernels took 46 instead of 175 ms per task (same 12 tasks, H200:
``benchmarks/results/h200/cost_profile.json``).

By default (threshold ``autotune`` False) the check does not autotune at all: on CUDA, with the default
Inductor backend and mode, the compilation and first call run under ``inductor_heuristic_configs``:
Inductor's deterministic mode (``torch._inductor.config.deterministic``: "skips any on device benchmarking
in Inductor if we know they affect numerics", which leaves one heuristic config per reduction) and
``triton.autotune_pointwise = False`` (one config per pointwise kernel). Each kernel is then built once,
in one config chosen by Inductor's own heuristics, instead of once per candidate config and benchmarked:
less CPU (Triton builds) and no autotuning GPU time. The compiled output that is checked is what Inductor
computes in that mode, and it is reproducible run to run (a reduction's config, which decides its
summation order, is no longer picked by a timing). ``compile_ms`` then times the heuristic configs, so it
may be somewhat slower than a default, autotuned ``torch.compile`` of the same model; the harness times
``torch.compile`` again when it scores a candidate (``harness/child.py``).
"""

from __future__ import annotations

import contextlib
import inspect
import time
from collections.abc import Iterator
from typing import Any

import torch
from opforge.engine.execution import TaskRun, failure_metrics, outputs_error
from opforge.engine.gpu_locks import gpu_work
from opforge.filters.verdict import Cost, Filter, Verdict


def _inductor_locking_execution(device: str):
    """An Inductor backend for ``torch.compile`` whose compiled graphs run holding the GPU's ``compute``
    lock shared, while Dynamo, AOTAutograd and Inductor themselves (CPU) run unlocked."""
    from torch._inductor.compile_fx import compile_fx

    def backend(gm, example_inputs):
        compiled = compile_fx(gm, example_inputs)

        def run(*args):
            with gpu_work(device):
                return compiled(*args)

        run._boxed_call = getattr(compiled, "_boxed_call", False)  # Dynamo's calling convention flag
        return run

    return backend


@contextlib.contextmanager
def capped_autotune_benchmarks(max_ms: float | None) -> Iterator[float | None]:
    """Within the block, each Inductor autotuning benchmark of one kernel config on the GPU lasts at most
    ``max_ms`` (ms) plus 1 + 1 calls and 10 L2-flushing memsets (defaults: 25 ms, 1 + 5 calls, 100 memsets);
    a config is still measured at least twice (the estimation call and one benchmark call, minimum kept).

    Yields the cap in force, or None when there is none (``max_ms`` None, or this torch's benchmarker has no
    ``max_benchmark_duration``, e.g. ``TORCHINDUCTOR_USE_EXPERIMENTAL_BENCHMARKER=0``). Process-wide while
    it lasts (the benchmarker is one object per process); restored on exit, exceptions included.
    """
    if max_ms is None:
        yield None
        return
    from torch._inductor.runtime import benchmarking

    bench = benchmarking.benchmarker
    original = bench.benchmark_gpu
    try:
        params = inspect.signature(original).parameters
    except (TypeError, ValueError):
        params = {}
    if "max_benchmark_duration" not in params:
        yield None
        return

    def capped(*args, **kwargs):
        kwargs["max_benchmark_duration"] = min(kwargs.get("max_benchmark_duration", max_ms), max_ms)
        kwargs.setdefault("estimation_iters", 1)
        kwargs.setdefault("memory_warmup_iters", 10)
        return original(*args, **kwargs)

    bench.benchmark_gpu = capped  # instance attribute shadows the method; every caller shares ``bench``
    try:
        yield max_ms
    finally:
        del bench.benchmark_gpu


# Inductor settings of ``inductor_heuristic_configs`` (torch >= 2.8 has both; a missing one is skipped)
HEURISTIC_CONFIG = {"deterministic": True, "triton.autotune_pointwise": False}


@contextlib.contextmanager
def inductor_heuristic_configs(enabled: bool = True) -> Iterator[dict[str, Any]]:
    """Within the block Inductor neither autotunes nor benchmarks kernel configs: ``HEURISTIC_CONFIG`` is
    patched into ``torch._inductor.config`` (see the module docstring). Yields the settings in force (a
    subset of ``HEURISTIC_CONFIG``; empty when not ``enabled``). Process-wide while it lasts; restored on
    exit, exceptions included."""
    if not enabled:
        yield {}
        return
    import torch._inductor.config as inductor_config

    def known(key: str) -> bool:
        obj = inductor_config
        for part in key.split("."):
            if not hasattr(obj, part):
                return False
            obj = getattr(obj, part)
        return True

    patch = {k: v for k, v in HEURISTIC_CONFIG.items() if known(k)}
    with inductor_config.patch(patch):
        yield patch


def warm_up_compiler(device: str, heuristic: bool = True) -> float:
    """Compile and run a tiny softmax model once on ``device`` (the filter's locking Inductor backend on
    CUDA, ``inductor_heuristic_configs`` when ``heuristic``), so that the first task's compile check does not
    pay the one-time costs of a process's first compile: importing Inductor and Triton, and building
    Triton's launcher (several seconds in a fresh process). Returns the seconds it took; clears Dynamo."""
    start = time.perf_counter()
    backend = _inductor_locking_execution(device) if device.startswith("cuda") else "inductor"
    fn = torch.compile(lambda x: torch.softmax(x, dim=-1) * 2.0, backend=backend)
    with inductor_heuristic_configs(heuristic and device.startswith("cuda")), torch.no_grad():
        with gpu_work(device):
            x = torch.randn(8, 64, device=device)
        fn(x)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
    torch._dynamo.reset()
    return time.perf_counter() - start


class CompileFilter(Filter):
    """Rejects ``compile_error:<ExceptionType>``, ``oom`` and ``compile_mismatch``.

    Thresholds: ``backend`` (default "inductor"), ``mode`` (None = default), ``max_err`` (1.0 = the
    evaluation tolerance), ``autotune`` (False: on CUDA with the default Inductor backend and mode, compile
    with ``inductor_heuristic_configs``; True: Inductor's default autotuning), ``autotune_bench_ms`` (cap of
    Inductor's autotuning benchmark per config on CUDA, ms, for what still benchmarks; None = Inductor's own
    25 ms; see the module docstring).
    Metrics: ``compile_s`` (first compiled call, seconds), ``err_compile`` (tolerance units),
    ``inductor_config`` (the ``inductor_heuristic_configs`` settings in force, {} when none),
    ``autotune_cap_ms`` (the cap in force, None on CPU or without one), ``error``.
    The compiled runtime (``compile_ms``) is measured by the ``runtime`` filter.
    """

    name = "compile"
    cost = Cost.DEVICE
    gpu_work_lock = False  # see the module docstring

    @classmethod
    def default_thresholds(cls) -> dict[str, Any]:
        return {"backend": "inductor", "mode": None, "max_err": 1.0, "autotune": False, "autotune_bench_ms": 1.0}

    def score(self, run: TaskRun) -> dict[str, Any]:
        t = self.thresholds
        m: dict[str, Any] = {"error": None, "oom": False}
        torch._dynamo.reset()
        try:
            backend = t["backend"]
            locks_itself = backend == "inductor" and t["mode"] is None and run.device.startswith("cuda")
            if locks_itself:
                backend = _inductor_locking_execution(run.device)
            compiled = torch.compile(run.model, backend=backend, mode=t["mode"])
            cap = t["autotune_bench_ms"] if run.device.startswith("cuda") else None
            heuristic = locks_itself and not t["autotune"]
            start = time.perf_counter()
            # the first call compiles (and autotunes, unless heuristic); the default Inductor backend on CUDA
            # locks only its graphs' execution, any other backend holds the lock for the whole call
            # (compilation included)
            with inductor_heuristic_configs(heuristic) as m["inductor_config"], \
                    capped_autotune_benchmarks(cap) as m["autotune_cap_ms"]:
                out = run.call(model=compiled, lock=not locks_itself)
                if run.device.startswith("cuda"):
                    torch.cuda.synchronize()
            m["compile_s"] = time.perf_counter() - start
            m["err_compile"] = outputs_error(run.outputs, out)
            del out
            run.compiled = compiled
        except Exception as exc:  # noqa: BLE001 - any compiler failure is a verdict
            m.update(failure_metrics(exc))
            run.compiled = None
            torch._dynamo.reset()
        return m

    def decide(self, m: dict[str, Any]) -> Verdict:
        failed = self.reject_failure(m, "compile_error")
        if failed is not None:
            return failed
        if m["err_compile"] > self.thresholds["max_err"]:
            return self.reject("compile_mismatch", m)
        return self.accept(m)
