"""Wall-clock timing of one forward call, on CUDA or CPU.

Method (recorded with every measurement in ``Timing.method``):

* CUDA: warm-up calls, then per trial an L2 flush (zeroing a buffer twice the size of the device's L2, the
  approach of ``triton.testing.do_bench``), a CUDA event pair around the call only, and the median over
  the trials (KernelBench's ``time_execution_with_cuda_event`` also uses event pairs; it reports the mean).
* CPU: warm-up calls, ``time.perf_counter`` around each call, median.

The number of trials adapts to the call's cost: as many as fit ``budget_s`` after warm-up (estimated from
the fastest warm-up call), clamped to ``[min_trials, max_trials]``, so a 0.05 ms op gets ``max_trials``
and a 500 ms op gets ``min_trials``. Warm-up stops early once it has used half the budget (a 5 s call is
warmed up once); each warm-up call is itself timed (CUDA events), which lets ``stop_above_ms`` end the
measurement of a far-too-slow call after one call.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
from opforge.filters.gpu_locks import gpu_timing


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
    """Median time of ``fn()`` in ms on ``device`` ("cpu" or "cuda[:i]"); see the module docstring.

    On CUDA the whole measurement (warm-up included) holds the GPU's ``compute`` lock exclusively
    (``filters.gpu_locks.gpu_timing``): no other sandbox's kernel runs meanwhile.

    ``stop_above_ms``: when the first warm-up call alone takes longer (CUDA events / ``perf_counter``),
    stop there and report that one call (``trials=0``, method ending in ``:stopped_above``): enough to
    call a task too slow without spending seconds of GPU time on it.

    ``fn`` takes no arguments (close over the model and inputs). Exceptions from ``fn`` propagate.
    """
    device = torch.device(device)
    if device.type == "cuda":
        with gpu_timing(device):
            return _time_cuda(fn, device, warmup, min_trials, max_trials, budget_s, stop_above_ms)
    return _time_cpu(fn, warmup, min_trials, max_trials, budget_s, stop_above_ms)


def _trials(estimate_s: float, min_trials: int, max_trials: int, budget_s: float) -> int:
    if estimate_s <= 0:
        return max_trials
    return int(max(min_trials, min(max_trials, budget_s / estimate_s)))


def _more_warm_up(first_ms: float, timed_call: Callable[[], float], warmup: int, budget_s: float) -> list[float]:
    """Warm-up times in ms: ``first_ms`` plus more ``timed_call()`` up to ``warmup`` calls in all, stopping
    once they used half of ``budget_s`` (so a call longer than that is made once)."""
    times = [first_ms]
    while len(times) < warmup and sum(times) <= budget_s * 1e3 / 2:
        times.append(timed_call())
    return times


def _above(first_ms: float, stop_above_ms: float | None) -> bool:
    return stop_above_ms is not None and first_ms > stop_above_ms


def _stopped(ms: float, kind: str) -> Timing:
    return Timing(ms, ms, ms, 0, f"{kind}:stopped_above")


def _time_cpu(fn, warmup, min_trials, max_trials, budget_s, stop_above_ms) -> Timing:
    def timed() -> float:
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3

    first = timed()
    if _above(first, stop_above_ms):
        return _stopped(first, "cpu:perf_counter")
    warm = _more_warm_up(first, timed, warmup, budget_s)
    times = [timed() for _ in range(_trials(min(warm) / 1e3, min_trials, max_trials, budget_s))]
    return Timing(statistics.median(times), min(times), max(times), len(times), "cpu:perf_counter:median")


def _time_cuda(fn, device, warmup, min_trials, max_trials, budget_s, stop_above_ms) -> Timing:
    flush = l2_flush_buffer(device)
    with torch.cuda.device(device):
        torch.cuda.synchronize()

        def timed() -> float:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end)

        first = timed()
        if _above(first, stop_above_ms):
            return _stopped(first, "cuda:events")
        warm = _more_warm_up(first, timed, warmup, budget_s)
        n = _trials(min(warm) / 1e3, min_trials, max_trials, budget_s)
        pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
        for start, end in pairs:
            flush.zero_()
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
    times = [s.elapsed_time(e) for s, e in pairs]
    return Timing(statistics.median(times), min(times), max(times), len(times),
                  "cuda:events:l2_flush:median")
