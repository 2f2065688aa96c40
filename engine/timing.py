"""Wall-clock timing of one forward call, on CUDA or CPU.

Method (recorded with every measurement in ``Timing.method``):

* CUDA: warm-up calls, then per trial an L2 flush (zeroing a buffer twice the size of the device's L2, the
  approach of ``triton.testing.do_bench``), a CUDA event pair around the call only, and the median over
  the trials (KernelBench's ``time_execution_with_cuda_event`` also uses event pairs; it reports the mean).
* CPU: warm-up calls, ``time.perf_counter`` around each call, median.

The number of trials adapts to the call's cost: as many as fit ``budget_s`` after warm-up (estimated from
the fastest warm-up call; with several functions timed together, the slowest one's), clamped to
``[min_trials, max_trials]``, so a 0.05 ms op gets ``max_trials`` and a 500 ms op gets ``min_trials``.
Warm-up stops early once it has used half the budget (a 5 s call is warmed up once); each warm-up call is
itself timed (CUDA events), which lets ``stop_above_ms`` end the measurement of a far-too-slow call after
one call. ``warmup=0`` is for functions the caller has already run (the filter chain's ``runtime`` filter
comes after five other filters called the model): the first call of each function is then the first trial
(L2-flushed like the others) and, at the same time, the estimate and the ``stop_above_ms`` check.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
from opforge.engine.gpu_locks import gpu_timing


@dataclass
class Timing:
    """One measurement. ``median_ms`` / ``min_ms`` / ``max_ms`` in milliseconds."""

    median_ms: float
    min_ms: float
    max_ms: float
    trials: int
    method: str

    def as_dict(self) -> dict:
        return asdict(self)


_FLUSH: dict[int, torch.Tensor] = {}


def l2_flush_buffer(device: torch.device) -> torch.Tensor:
    """An int32 buffer twice the size of ``device``'s L2 cache (64 MiB assumed when unknown); zeroing it
    before a timed call evicts the previous call's data. One per device, kept for the process."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _FLUSH:
        l2 = getattr(torch.cuda.get_device_properties(index), "L2_cache_size", 0) or 64 * 2**20
        _FLUSH[index] = torch.empty(2 * l2 // 4, dtype=torch.int32, device=device)
    return _FLUSH[index]


def time_call(fn: Callable[[], object], device: str | torch.device = "cpu", *, warmup: int = 3,
              min_trials: int = 3, max_trials: int = 100, budget_s: float = 0.5,
              stop_above_ms: float | None = None) -> Timing:
    """Median time of ``fn()`` in ms on ``device`` ("cpu" or "cuda[:i]"); see the module docstring and
    ``time_calls`` (this is its one-function case)."""
    return time_calls({"fn": fn}, device, warmup=warmup, min_trials=min_trials, max_trials=max_trials,
                      budget_s=budget_s, stop_above_ms=stop_above_ms)["fn"]


def time_calls(fns: dict[str, Callable[[], object]], device: str | torch.device = "cpu", *, warmup: int = 3,
               min_trials: int = 3, max_trials: int = 100, budget_s: float = 0.5,
               stop_above_ms: float | None = None) -> dict[str, Timing]:
    """Median time in ms of each zero-argument callable of ``fns`` on ``device`` ("cpu" or "cuda[:i]"),
    measured interleaved: each trial calls every function once, in the given order, so clock and thermal
    drift hit all alike. ``budget_s`` is per function (trials are sized by the slowest one's warm-up).

    On CUDA the whole measurement (warm-up included) holds the GPU's ``compute`` lock exclusively
    (``engine.gpu_locks.gpu_timing``): no other sandbox's kernel runs meanwhile, and the measurement is
    one exclusive section however many functions it times.

    ``stop_above_ms``: when the first function's first warm-up call alone takes longer (CUDA events /
    ``perf_counter``), stop there and report that one call for it (``trials=0``, method ending in
    ``:stopped_above``) and nothing for the others: enough to call a task too slow without spending
    seconds of GPU time on it.

    Returns ``{name: Timing}`` (only the first name when stopped). Exceptions from a function propagate.
    """
    device = torch.device(device)
    if device.type == "cuda":
        with gpu_timing(device):
            return _time_cuda(fns, device, warmup, min_trials, max_trials, budget_s, stop_above_ms)
    return _time_cpu(fns, warmup, min_trials, max_trials, budget_s, stop_above_ms)


def _trials(estimate_s: float, min_trials: int, max_trials: int, budget_s: float) -> int:
    if estimate_s <= 0:
        return max_trials
    return int(max(min_trials, min(max_trials, budget_s / estimate_s)))


def _warm_up(fns: dict[str, Callable[[], object]], timed: Callable[[Callable[[], object]], float], warmup: int,
             budget_s: float, stop_above_ms: float | None) -> dict[str, list[float]] | Timing:
    """Warm-up times in ms per function: up to ``warmup`` calls each, stopping once the calls of a
    function used half of ``budget_s`` (a call longer than that is made once). The ``Timing`` of a stopped
    measurement when the first function's first call exceeds ``stop_above_ms``."""
    times: dict[str, list[float]] = {}
    for i, (name, fn) in enumerate(fns.items()):
        first = timed(fn)
        if i == 0 and stop_above_ms is not None and first > stop_above_ms:
            return Timing(first, first, first, 0, "stopped_above")
        times[name] = [first]
        while len(times[name]) < warmup and sum(times[name]) <= budget_s * 1e3 / 2:
            times[name].append(timed(fn))
    return times


def _result(times: dict[str, list[float]], method: str) -> dict[str, Timing]:
    return {n: Timing(statistics.median(v), min(v), max(v), len(v), method) for n, v in times.items()}


def _stopped(first: Timing, name: str, kind: str) -> dict[str, Timing]:
    first.method = f"{kind}:stopped_above"
    return {name: first}


def _time_cpu(fns, warmup, min_trials, max_trials, budget_s, stop_above_ms) -> dict[str, Timing]:
    def timed(fn) -> float:
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3

    warm = _warm_up(fns, timed, max(warmup, 1), budget_s, stop_above_ms)
    if isinstance(warm, Timing):
        return _stopped(warm, next(iter(fns)), "cpu:perf_counter")
    n = _trials(max(min(v) for v in warm.values()) / 1e3, min_trials, max_trials, budget_s)
    times: dict[str, list[float]] = {name: list(warm[name]) if warmup == 0 else [] for name in fns}
    for _ in range(n - (1 if warmup == 0 else 0)):
        for name, fn in fns.items():
            times[name].append(timed(fn))
    return _result(times, "cpu:perf_counter:median")


def _time_cuda(fns, device, warmup, min_trials, max_trials, budget_s, stop_above_ms) -> dict[str, Timing]:
    flush = l2_flush_buffer(device)
    with torch.cuda.device(device):
        torch.cuda.synchronize()

        def timed(fn) -> float:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            if warmup == 0:  # this call is a trial too
                flush.zero_()
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end)

        warm = _warm_up(fns, timed, max(warmup, 1), budget_s, stop_above_ms)
        if isinstance(warm, Timing):
            return _stopped(warm, next(iter(fns)), "cuda:events")
        n = _trials(max(min(v) for v in warm.values()) / 1e3, min_trials, max_trials, budget_s)
        events = {name: [] for name in fns}
        for _ in range(n - (1 if warmup == 0 else 0)):
            for name, fn in fns.items():
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                flush.zero_()
                start.record()
                fn()
                end.record()
                events[name].append((start, end))
        torch.cuda.synchronize()
    first = {name: list(warm[name]) if warmup == 0 else [] for name in fns}
    return _result({name: first[name] + [s.elapsed_time(e) for s, e in pairs] for name, pairs in events.items()},
                   "cuda:events:l2_flush:median")
