"""Wall-clock timing of one forward call, on CUDA or CPU.

Method (recorded with every measurement in ``Timing.method``):

* CUDA: warm-up calls, then per trial an L2 flush (zeroing a buffer twice the size of the device's L2, the
  approach of ``triton.testing.do_bench``), a CUDA event pair around the call only, and the median over
  the trials (KernelBench's ``time_execution_with_cuda_event`` also uses event pairs; it reports the mean).
* CPU: warm-up calls, ``time.perf_counter`` around each call, median.

The number of trials adapts to the call's cost: as many as fit ``budget_s`` after warm-up, clamped to
``[min_trials, max_trials]``, so a 0.05 ms op gets 100 trials and a 500 ms op gets 3. Warm-up stops early
once it has used half the budget (a 5 s call is warmed up once).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass

import torch


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
_HELD: dict[int, bool] = {}


def _l2_flush_buffer(device: torch.device) -> torch.Tensor:
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _FLUSH:
        l2 = getattr(torch.cuda.get_device_properties(index), "L2_cache_size", 0) or 64 * 2**20
        _FLUSH[index] = torch.empty(2 * l2 // 4, dtype=torch.int32, device=device)
    return _FLUSH[index]


def physical_gpu(device: torch.device) -> str:
    """The id of the physical GPU behind ``device``: its entry in ``CUDA_VISIBLE_DEVICES`` (else its index)."""
    index = device.index or 0
    ids = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    return ids[index] if index < len(ids) else str(index)


@contextlib.contextmanager
def gpu_memory_share(gpu: str, exclusive: bool = False) -> Iterator[None]:
    """Reader/writer lock over one GPU's memory, across the sandboxes sharing it.

    Every task runs holding it shared (many at once); a task that ran out of memory is re-run holding it
    exclusively, which waits until no other task is on the GPU (each sandbox frees its memory after a task)
    and keeps new ones out, so an ``oom`` verdict means the task does not fit alone. A turnstile lock in
    front of the shared side stops a stream of shared holders from starving a waiting exclusive one.
    Files: ``$TMPDIR/opforge-gpu-<gpu>.memory`` and ``.turnstile`` (``flock``).
    """
    base = os.path.join(tempfile.gettempdir(), f"opforge-gpu-{gpu}")
    with open(base + ".turnstile", "a") as turn, open(base + ".memory", "a") as mem:
        fcntl.flock(turn, fcntl.LOCK_EX)
        if exclusive:
            try:
                fcntl.flock(mem, fcntl.LOCK_EX)
                try:
                    yield
                finally:
                    fcntl.flock(mem, fcntl.LOCK_UN)
            finally:
                fcntl.flock(turn, fcntl.LOCK_UN)
            return
        fcntl.flock(turn, fcntl.LOCK_UN)
        fcntl.flock(mem, fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(mem, fcntl.LOCK_UN)


@contextlib.contextmanager
def exclusive_gpu(device: torch.device) -> Iterator[None]:
    """Hold an exclusive lock on the physical GPU behind ``device`` while timing on it.

    Several sandboxes share one GPU so that compilation (CPU) overlaps GPU work; only timing must have the
    GPU to itself. The lock is an ``flock`` on ``$TMPDIR/opforge-gpu-<id>.lock``, where ``<id>`` is the
    device's entry in ``CUDA_VISIBLE_DEVICES`` (the physical GPU), so it works across processes.
    Re-entrant within a process (a task re-run alone holds it while its own timing asks again).
    """
    index = device.index or 0
    if _HELD.get(index):
        yield
        return
    path = os.path.join(tempfile.gettempdir(), f"opforge-gpu-{physical_gpu(device)}.lock")
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        _HELD[index] = True
        try:
            yield
        finally:
            _HELD[index] = False
            fcntl.flock(fh, fcntl.LOCK_UN)


def time_call(fn: Callable[[], object], device: str | torch.device = "cpu", *, warmup: int = 3,
              min_trials: int = 3, max_trials: int = 100, budget_s: float = 0.5) -> Timing:
    """Median wall time of ``fn()`` in ms on ``device`` ("cpu" or "cuda[:i]"); see the module docstring.

    On CUDA the whole measurement (warm-up included) holds ``exclusive_gpu``.

    ``fn`` takes no arguments (close over the model and inputs). Exceptions from ``fn`` propagate.
    """
    device = torch.device(device)
    if device.type == "cuda":
        with exclusive_gpu(device):
            return _time_cuda(fn, device, warmup, min_trials, max_trials, budget_s)
    return _time_cpu(fn, warmup, min_trials, max_trials, budget_s)


def _trials(estimate_s: float, min_trials: int, max_trials: int, budget_s: float) -> int:
    if estimate_s <= 0:
        return max_trials
    return int(max(min_trials, min(max_trials, budget_s / estimate_s)))


def _warm_up(fn, warmup: int, budget_s: float, sync=lambda: None) -> float:
    """Call ``fn`` up to ``warmup`` times (at least once, stopping after ``budget_s / 2``); seconds per call."""
    sync()
    t0 = time.perf_counter()
    calls = 0
    while calls < max(warmup, 1):
        fn()
        calls += 1
        sync()
        if time.perf_counter() - t0 > budget_s / 2:
            break
    return (time.perf_counter() - t0) / calls


def _time_cpu(fn, warmup, min_trials, max_trials, budget_s) -> Timing:
    estimate = _warm_up(fn, warmup, budget_s)
    times = []
    for _ in range(_trials(estimate, min_trials, max_trials, budget_s)):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return Timing(statistics.median(times), min(times), max(times), len(times), "cpu:perf_counter:median")


def _time_cuda(fn, device, warmup, min_trials, max_trials, budget_s) -> Timing:
    flush = _l2_flush_buffer(device)
    with torch.cuda.device(device):
        estimate = _warm_up(fn, warmup, budget_s, torch.cuda.synchronize)
        n = _trials(estimate, min_trials, max_trials, budget_s)
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
