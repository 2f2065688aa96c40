"""Interleaved timing of the reference (eager), ``torch.compile`` and the candidate.

Per trial every function runs once, in a rotating order (so drift and thermal state hit all alike), each
call bracketed by a device-wide synchronisation: on CUDA ``torch.cuda.synchronize()`` waits for every
stream; before each call a buffer twice the size of the L2 cache is zeroed (the method of
``triton.testing.do_bench``). On CUDA the time is the CUDA-event pair recorded around the call on the
current stream (``median_ms``), and the synchronised wall time is kept too (``wall_median_ms``: it
includes launch overhead, and any work left on another stream, which ``harness.guard.foreign_streams``
rejects outright). On CPU both are ``time.perf_counter``, captured when this module is imported (a
candidate patching ``time`` later does not reach it). Result per function: median, min and max in ms
over ``trials`` after ``warmup`` calls.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
from opforge.filters.timing import l2_flush_buffer

_clock = time.perf_counter
_sync = torch.cuda.synchronize
_event = torch.cuda.Event
PROTECTED = ("time_interleaved",)


def time_interleaved(fns: dict[str, Callable[[], object]], device: str = "cpu", *, trials: int = 20,
                     warmup: int = 3) -> dict[str, dict[str, float]]:
    """``{name: {"median_ms", "min_ms", "max_ms", "trials", "wall_median_ms"}}`` per zero-argument callable.

    Exceptions from a callable propagate (the caller decides what a failing candidate means).
    """
    cuda = device.startswith("cuda")
    flush = l2_flush_buffer(torch.device(device)) if cuda else None
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    if cuda:
        _sync()
    names = list(fns)
    times: dict[str, list[float]] = {n: [] for n in names}
    walls: dict[str, list[float]] = {n: [] for n in names}
    for trial in range(trials):
        k = trial % len(names)
        for name in names[k:] + names[:k]:
            if flush is not None:
                flush.zero_()
                _sync()
            if cuda:
                start, end = _event(enable_timing=True), _event(enable_timing=True)
                start.record()
            t0 = _clock()
            fns[name]()
            if cuda:
                end.record()
                _sync()
            wall = (_clock() - t0) * 1e3
            walls[name].append(wall)
            times[name].append(start.elapsed_time(end) if cuda else wall)
    return {n: {"median_ms": statistics.median(v), "min_ms": min(v), "max_ms": max(v), "trials": len(v),
                "wall_median_ms": statistics.median(walls[n])} for n, v in times.items()}
