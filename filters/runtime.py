"""``runtime`` filter: the eager forward's median time lies inside the runtime window.

Default window 1-100 ms on CUDA (the default named in opforge issue #4 and ../shared/DESIGN.md).
On CPU the window is off by default and the time is recorded as a flag (``in_window``): CPU times say
little about GPU times. Timing method: ``filters.timing.time_call``.

Runs right after ``eager`` (order 15): a task outside the window is dropped before the other filters
spend GPU time on it, and one far above the window (its first timed call longer than ``stop_above`` x
the upper edge) after that single call. The timed calls are made without re-seeding; the last one's
outputs are kept on ``TaskRun.unseeded_outputs`` for the ``determinism`` filter (which would otherwise
make that call itself).
"""

from __future__ import annotations

from typing import Any

from opforge.filters.execution import TaskRun
from opforge.filters.timing import time_call
from opforge.filters.verdict import Cost, Filter, Verdict

CUDA_WINDOW_MS = (1.0, 100.0)


def resolve_window(device: str, window_ms: tuple[float, float] | None, no_window: bool = False
                   ) -> tuple[float, float] | None:
    """The runtime window a run enforces: none with ``no_window``, else the given one, else
    ``CUDA_WINDOW_MS`` on CUDA and none on CPU."""
    if no_window:
        return None
    if window_ms is not None:
        return (float(window_ms[0]), float(window_ms[1]))
    return CUDA_WINDOW_MS if device == "cuda" else None


def measure_eager_ms(code: str, task_id: str = "<task>", device: str = "cpu", budget_s: float = 0.2) -> float:
    """Median eager forward time of a task in ms (seeded build in ``eval()``, ``no_grad``), in-process.

    For quick measurements outside a filter run (composer sizing checks, benchmarks). Raises whatever the
    task raises (``TaskFormatError`` for a malformed source).
    """
    run = TaskRun(code, task_id, device)
    run.model, run.inputs = run.build_model(), run.draw_inputs()
    return time_call(lambda: run.call(seed=None), device, budget_s=budget_s).median_ms


class RuntimeFilter(Filter):
    """Rejects ``runtime_out_of_window:too_fast`` / ``:too_slow`` when ``window_ms`` is set.

    Thresholds: ``window_ms`` ([lo, hi] in ms, or None = record only), ``budget_s`` (timing budget per task,
    seconds), ``warmup`` (calls before timing; the ``eager`` filter's call already warmed libraries up),
    ``max_trials``, ``stop_above`` (factor over the window's upper edge that ends timing after one call).
    Metrics: ``eager_ms`` (median, ms), ``min_ms``, ``max_ms``, ``trials`` (0 when stopped after the first
    call), ``method``, ``in_window`` (bool, or None without a window).
    """

    name = "runtime"
    cost = Cost.DEVICE
    order = 15
    gpu_work_lock = False  # time_call holds the compute lock exclusively

    @classmethod
    def default_thresholds(cls) -> dict[str, Any]:
        # 0.05 s: a 10 ms task gets 1 warm-up + 5 timed calls, a 0.5 ms task 50; the window's edges are a
        # factor 100 apart, so a median of >= 3 decides in or out. Every second of timing is exclusive GPU
        # time, which every other sandbox on the GPU waits for.
        return {"window_ms": None, "budget_s": 0.05, "warmup": 1, "max_trials": 50, "stop_above": 2.0}

    def score(self, run: TaskRun) -> dict[str, Any]:
        t = self.thresholds
        model, inputs = run.model, run.inputs
        # record-only (no window): one trial is enough for a flag; with a window, at least three
        trials = 1 if t["window_ms"] is None else 3
        stop = t["window_ms"][1] * t["stop_above"] if t["window_ms"] is not None and t["stop_above"] else None
        last: list = []

        def call():
            last[:] = [run.call(model, inputs, seed=None)]

        timing = time_call(call, run.device, warmup=t["warmup"], budget_s=t["budget_s"], min_trials=trials,
                           max_trials=t["max_trials"], stop_above_ms=stop)
        run.unseeded_outputs = last[0]
        m = timing.as_dict()
        m["eager_ms"] = m.pop("median_ms")
        return m

    def decide(self, m: dict[str, Any]) -> Verdict:
        window = self.thresholds["window_ms"]
        if window is None:
            return self.accept({**m, "in_window": None})
        lo, hi = window
        m = {**m, "in_window": lo <= m["eager_ms"] <= hi}
        if m["eager_ms"] < lo:
            return self.reject("runtime_out_of_window:too_fast", m)
        if m["eager_ms"] > hi:
            return self.reject("runtime_out_of_window:too_slow", m)
        return self.accept(m)
