"""Timing of forward calls, on CUDA or CPU: the one method of the ``runtime`` filter and the grader.

Method (recorded with every measurement in ``Timing.method``): a *burst* is ``K`` back-to-back calls of the
same forward, each on its own input set where the caller rotates them, and on CUDA one device synchronisation
(every stream) after the last call; its time is this process's ``time.perf_counter`` around the calls and the
synchronisation, divided by ``K`` (``run_burst``). The grader's model servers time a burst the same way
(``harness.server``), so the filter's ``eager_ms`` and the grader's are measured alike.

* ``K`` (``burst_size``): enough calls that a burst lasts about ``BURST_TARGET_MS``, at most ``MAX_BURST``,
  and no more input + output sets than fit ``BURST_BYTES``. A call of 20 us gets 50, one of 1 ms or more gets
  1. What a burst amortises is the fixed cost of asking for it (a request across a process boundary, the wake
  of a stopped process, the synchronisation), which on an H200 is 0.2-0.3 ms and varies with the neighbours;
  the device work itself is timed back to back, as a real model runs it.
* L2 (the policy of ``triton.testing.do_bench``): a buffer twice the size of the device's L2 is zeroed before
  each burst, outside the measured time; inside a burst each call reads input sets written before that flush,
  so inputs come from HBM, while weights small enough to stay in L2 stay there from the burst's second call on,
  on both sides of a speed-up alike.
* Queued work: the synchronisation is device-wide, so work a call leaves queued on any stream of the process is
  charged to the burst.
* Trials: after warm-up calls, as many bursts as fit ``budget_s`` (estimated from the fastest warm-up call;
  with several functions timed together, the slowest one's), clamped to ``[min_trials, max_trials]``; the
  result is the median over the bursts. Warm-up stops early once it has used half the budget (a 5 s call is
  warmed up once); each warm-up call is itself timed, which lets ``stop_above_ms`` end the measurement of a
  far-too-slow call after one call. ``warmup=0`` is for functions the caller has already run (the filter
  chain's ``runtime`` filter comes after five other filters called the model): the first call of each
  function is then the first trial (L2-flushed like the others) and, at the same time, the estimate and the
  ``stop_above_ms`` check.
* CUDA graphs (``graphs=True``, the default of the ``runtime`` filter and the grader): after warm-up, each
  function's burst of ``K`` calls is captured once into a CUDA graph (``capture_burst``) and every trial
  replays it, so the time is the device's work for the ``K`` calls, without the host's per-call cost (Python,
  dispatch, launches: 20-60 us per call, more than the device work of a short kernel). When any function cannot
  be captured (it synchronises, copies to the host or leaves a stream it forked unjoined), all of them are
  timed as plain bursts, and ``Timing.method`` says which way was used.
* CPU: the same bursts, without a flush or a synchronisation.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from opforge.engine.gpu_locks import gpu_timing

if TYPE_CHECKING:  # torch is imported where a measurement runs: the constants and sizing rules need none of it
    import torch

# A timed burst lasts about this long (ms): the fixed cost of one request across the grader's process boundary,
# 0.2-0.3 ms on an H200 and moved by the neighbours in a batch (measured 2026-11-26, one H200; record in the
# git history of docs/benchmark-log.md), is then a small and steady part of the burst's wall time.
BURST_TARGET_MS = 1.0
# The runtime window's default floor on CUDA (ms of eager; filters.runtime.CUDA_WINDOW_MS and the GPU device
# profiles of compose.device_profiles). Rule: the smallest eager time at which the grader's speed-up of an honest
# fused kernel has a coefficient of variation <= 3 % over evaluations alone, and a median within 3 % of alone when
# 16 evaluations share the GPU. Measured 2026-11-26 with CUDA-graph bursts (grader 6): on one H200 met from
# 0.034 ms up (CV alone <= 1.3 %, batch / alone 0.99-1.01), not at 0.013 ms (CV alone 13 %); on one H100 met from
# 0.038 ms up (CV alone <= 1 %, batch / alone 0.97-1.01), not at 0.015 ms (CV alone 18 %);
# benchmarks/results/h200/timing_floor.json and h100/timing_floor.json.
WINDOW_FLOOR_MS = 0.04
WINDOW_FLOOR_SOURCE = ("the smallest eager time at which the grader's speed-up of an honest fused kernel varies by "
                       "at most 3 % (coefficient of variation) between evaluations alone and moves by at most 3 % "
                       "when 16 evaluations share the GPU: met from 0.034 ms up on one H200 and from 0.038 ms up "
                       "on one H100, not at 0.013-0.015 ms (2026-11-26, CUDA-graph timing; opforge "
                       "benchmarks/results/h200/timing_floor.json and h100/timing_floor.json)")
# At most this many calls per burst, and at most this many bytes of input + output sets in one burst (each call
# of a grader's burst has a fresh input set and output slots of its own).
MAX_BURST = 64
BURST_BYTES = 1 << 30


def burst_cap(set_bytes: int, max_bytes: int = BURST_BYTES, max_burst: int = MAX_BURST) -> int:
    """The most calls one burst may have when one call's input + output set takes ``set_bytes`` bytes: as many
    sets as fit ``max_bytes``, between 1 and ``max_burst``."""
    return max(1, min(int(max_burst), int(max_bytes) // max(int(set_bytes), 1)))


def burst_size(call_ms: float, set_bytes: int = 0, target_ms: float = BURST_TARGET_MS) -> int:
    """Calls per burst (``K``) for a call of about ``call_ms`` ms whose input + output set takes ``set_bytes``
    bytes: ``ceil(target_ms / call_ms)``, at most ``burst_cap(set_bytes)``, at least 1 (1 when
    ``target_ms`` <= 0: one call per timed request)."""
    if target_ms <= 0 or not math.isfinite(call_ms):
        return 1
    return max(1, min(math.ceil(target_ms / max(call_ms, 1e-4)), burst_cap(set_bytes)))


def run_burst(calls: Sequence[Callable[[], object]], cuda: bool) -> float:
    """Wall ms of calling each of ``calls`` in turn and then, on CUDA, synchronising the device (every stream of
    this process): ``time.perf_counter`` around both. The caller divides by ``len(calls)``."""
    if cuda:
        import torch
    t = time.perf_counter()
    for fn in calls:
        fn()
    if cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - t) * 1e3


def capture_burst(fn: Callable[[], object], calls: int = 1, stream: torch.cuda.Stream | None = None,
                  pool: Any = None) -> tuple[Any, str | None]:
    """Capture ``calls`` back-to-back calls of ``fn()`` into one ``torch.cuda.CUDAGraph`` on the current device.

    ``fn`` is called once on ``stream`` (a side stream when None, as ``torch.cuda.graphs`` requires for lazy
    initialisation) before the capture. ``pool``: a graph memory pool to share (``torch.cuda.graph_pool_handle``);
    graphs that share one must be replayed one after another on one stream, never at the same time.

    Returns ``(graph, None)``, or ``(None, error)`` when ``fn`` cannot be captured (it synchronises, reads a
    value on the host, or forks a stream it does not join back); the device is synchronised either way and
    any partial capture is dropped. Exceptions of ``fn`` itself are returned the same way."""
    import torch

    side = stream if stream is not None else torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    try:
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(graph, pool=pool, stream=side):
            for _ in range(calls):
                fn()
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - any failure means: time it without a graph
        try:
            torch.cuda.synchronize()
        except Exception:  # noqa: BLE001, S110 - a sticky error shows again at the caller's next call
            pass
        return None, f"{type(exc).__name__}: {str(exc)[:300]}"
    return graph, None


@dataclass
class Timing:
    """One measurement. ``median_ms`` / ``min_ms`` / ``max_ms`` in milliseconds per call; ``trials`` timed
    bursts of ``burst`` calls each."""

    median_ms: float
    min_ms: float
    max_ms: float
    trials: int
    method: str
    burst: int = 1

    def as_dict(self) -> dict:
        return asdict(self)


_FLUSH: dict[int, Any] = {}  # device index -> its flush buffer


def l2_flush_buffer(device: torch.device) -> torch.Tensor:
    """An int32 buffer twice the size of ``device``'s L2 cache (64 MiB assumed when unknown); zeroing it
    before a timed call evicts the previous call's data. One per device, kept for the process."""
    import torch

    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _FLUSH:
        l2 = getattr(torch.cuda.get_device_properties(index), "L2_cache_size", 0) or 64 * 2**20
        _FLUSH[index] = torch.empty(2 * l2 // 4, dtype=torch.int32, device=device)
    return _FLUSH[index]


def flush_buffer_bytes() -> int:
    """Bytes of the L2 flush buffers (``l2_flush_buffer``) this process keeps, over all devices."""
    return sum(t.numel() * t.element_size() for t in _FLUSH.values())


def time_call(fn: Callable[[], object], device: str | torch.device = "cpu", *, warmup: int = 3,
              min_trials: int = 3, max_trials: int = 100, budget_s: float = 0.5,
              stop_above_ms: float | None = None, burst: int | None = 1, set_bytes: int = 0,
              graphs: bool = False) -> Timing:
    """Median time of ``fn()`` in ms per call on ``device`` ("cpu" or "cuda[:i]"); see the module docstring and
    ``time_calls`` (this is its one-function case)."""
    return time_calls({"fn": fn}, device, warmup=warmup, min_trials=min_trials, max_trials=max_trials,
                      budget_s=budget_s, stop_above_ms=stop_above_ms, burst=burst, set_bytes=set_bytes,
                      graphs=graphs)["fn"]


def time_calls(fns: dict[str, Callable[[], object]], device: str | torch.device = "cpu", *, warmup: int = 3,
               min_trials: int = 3, max_trials: int = 100, budget_s: float = 0.5,
               stop_above_ms: float | None = None, burst: int | None = 1,
               set_bytes: int = 0, graphs: bool = False) -> dict[str, Timing]:
    """Median time in ms per call of each zero-argument callable of ``fns`` on ``device`` ("cpu" or "cuda[:i]"),
    in bursts (see the module docstring), interleaved: each trial times one burst of every function, in the
    given order, so clock and thermal drift hit all alike. ``budget_s`` is per function (trials are sized by
    the slowest one's warm-up).

    ``burst``: calls per burst; None sizes it from the first function's fastest warm-up call
    (``burst_size``, with ``set_bytes``: bytes of one call's input + output set). A function whose calls
    should each read other inputs rotates them itself (a captured burst keeps the rotation it was captured
    with: ``K`` calls on the ``K`` sets of one cycle).

    ``graphs``: on CUDA, time each burst as the replay of a CUDA graph of its ``K`` calls (``capture_burst``),
    for all functions or (when one cannot be captured) for none; ignored on CPU.

    On CUDA the whole measurement (warm-up included) holds the GPU's ``compute`` lock exclusively
    (``engine.gpu_locks.gpu_timing``): no other sandbox's kernel runs meanwhile, and the measurement is
    one exclusive section however many functions it times.

    ``stop_above_ms``: when the first function's first warm-up call alone takes longer, stop there and report
    that one call for it (``trials=0``, method ending in ``:stopped_above``) and nothing for the others: enough
    to call a task too slow without spending seconds of GPU time on it.

    Returns ``{name: Timing}`` (only the first name when stopped). Exceptions from a function propagate.
    """
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        with gpu_timing(device), torch.cuda.device(device):
            return _time(fns, device, warmup, min_trials, max_trials, budget_s, stop_above_ms, burst, set_bytes,
                         graphs)
    return _time(fns, device, warmup, min_trials, max_trials, budget_s, stop_above_ms, burst, set_bytes, False)


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


def _time(fns, device, warmup, min_trials, max_trials, budget_s, stop_above_ms, burst, set_bytes, graphs
          ) -> dict[str, Timing]:
    import torch

    cuda = device.type == "cuda"
    kind = "cuda:l2_flush" if cuda else "cpu"
    flush = l2_flush_buffer(device) if cuda else None

    def timed(fn, k: int = 1) -> float:
        if cuda:
            flush.zero_()  # outside the measured time (run_burst starts its clock after)
            torch.cuda.synchronize()
        return run_burst([fn] * k, cuda) / k

    if cuda:
        torch.cuda.synchronize()
    warm = _warm_up(fns, timed, max(warmup, 1), budget_s, stop_above_ms)
    if isinstance(warm, Timing):
        warm.method = f"{kind}:burst:stopped_above"
        return {next(iter(fns)): warm}
    k = burst_size(min(next(iter(warm.values()))), set_bytes) if burst is None else max(1, int(burst))
    bursts: dict[str, Callable[[], object]] = {}
    if cuda and graphs:
        for name, fn in fns.items():
            graph, _error = capture_burst(fn, k)
            if graph is None:
                bursts = {}
                break
            bursts[name] = graph.replay
        if bursts:
            kind += ":graph"
            # the replays' times replace the warm-up's plain calls as the estimate of a call
            warm = {name: [timed(g) / k] for name, g in bursts.items()}
    n = _trials(max(min(v) for v in warm.values()) * k / 1e3, min_trials, max_trials, budget_s)
    # without warm-up the first call was a trial: kept as one when trials are single plain calls
    keep = warmup == 0 and k == 1 and not bursts
    times: dict[str, list[float]] = {name: list(warm[name]) if keep else [] for name in fns}
    for _ in range(n - (1 if keep else 0)):
        for name, fn in fns.items():
            times[name].append(timed(bursts[name]) / k if bursts else timed(fn, k))
    return {name: Timing(statistics.median(v), min(v), max(v), len(v), f"{kind}:burst:median", k)
            for name, v in times.items()}
