"""The stage timeline of ``opforge run``: when each stage ran, how busy its workers were, and how much of the
time the GPUs were busy (``run.json``'s ``timeline``; ``opforge status`` prints it).

Per stage: ``start`` / ``end`` (Unix seconds, the client's clock; the workers of an embedded cluster share it),
``wall_s`` and ``busy_s`` (seconds of work done in the stage, summed over its workers: composer seconds of
the shards, sandbox seconds of the verdicts; a stage on several workers can be busier than its wall).

GPU busy share: per GPU worker, the union of the intervals in which one of its sandboxes held the GPU's
compute lock (``engine.gpu_locks``: every GPU step of a task runs under it), divided by the time from the
first candidates to the last verdict (``share_after_first_candidates``), from the first candidates to the
end of the run (``share_after_first_candidates_to_run_end``: the closing of the cluster (stage
``cluster_close``, beside the publication) and the publication after the last verdict count as idle), and by
the whole run (``share_of_run``). The intervals are each task's recorded hold spans (the ledger's
``gpu_hold_t0`` / ``gpu_hold_ms``; method ``compute-lock hold spans``); a verdict without them counts its held
seconds (``lock_hold_s``) as one interval ending when the task ended (method ``... (approximate)``: that
interval is not where the holds were, so the union can be off either way). A reading from the sandboxes' own
records, not of the GPU: a held lock is not a busy SM (``nvidia-smi``'s utilization counts only the time a
kernel runs). None on CPU runs.
"""

from __future__ import annotations

import time
from typing import Any


class Timeline:
    """Stage records of one run; see the module docstring."""

    def __init__(self):
        self.stages: dict[str, dict[str, Any]] = {}
        self.marks: dict[str, float] = {}
        self.rounds: dict[int, dict[str, float]] = {}

    def round_seconds(self, k: int, **seconds: float) -> None:
        """Seconds the client spent on round ``k``, by phase (e.g. ``pieces_s``, ``result_s``, ``waiting_s``,
        ``select_s``; ``run.json``'s ``client_rounds``)."""
        self.rounds.setdefault(k, {}).update({name: round(v, 2) for name, v in seconds.items()})

    def begin(self, stage: str, at: float | None = None) -> None:
        """Stage ``stage`` starts (the first call counts)."""
        rec = self.stages.setdefault(stage, {"start": None, "end": None, "busy_s": None})
        if rec["start"] is None:
            rec["start"] = time.time() if at is None else at

    def end(self, stage: str, at: float | None = None, busy_s: float | None = None) -> None:
        """Stage ``stage`` ends (the last call counts); ``busy_s`` replaces the stage's busy seconds."""
        self.begin(stage, at)
        rec = self.stages[stage]
        rec["end"] = time.time() if at is None else at
        if busy_s is not None:
            rec["busy_s"] = round(busy_s, 2)

    def mark(self, name: str, at: float | None = None) -> None:
        """A point in time (first call counts), e.g. ``first_candidates``."""
        self.marks.setdefault(name, time.time() if at is None else at)

    def record(self, gpu_spans: list[tuple] | None = None, compose_spans: list[tuple] | None = None
               ) -> dict[str, Any]:
        """The JSON record: stages (with ``wall_s``), marks, the run's start, end and wall, the GPU busy
        share from ``gpu_spans`` ((worker, started_at, ended_at, lock_hold_s[, hold spans]) of each verdict;
        hold spans as [start, end] Unix seconds), the client's seconds per round (``round_seconds``), and the
        composer shards from ``compose_spans`` ((worker, started_at, ended_at, round, shard) of each shard;
        ``compose_shards``)."""
        stages = {}
        for name, rec in self.stages.items():
            wall = rec["end"] - rec["start"] if rec["start"] is not None and rec["end"] is not None else None
            stages[name] = {"start": _r(rec["start"]), "end": _r(rec["end"]),
                            "wall_s": None if wall is None else round(wall, 2), "busy_s": rec["busy_s"]}
        starts = [r["start"] for r in self.stages.values() if r["start"] is not None]
        ends = [r["end"] for r in self.stages.values() if r["end"] is not None]
        run = (min(starts), max(ends)) if starts and ends else None
        out: dict[str, Any] = {"stages": stages, "marks": {k: _r(v) for k, v in self.marks.items()},
                               "start": _r(run[0]) if run else None, "end": _r(run[1]) if run else None,
                               "wall_s": round(run[1] - run[0], 2) if run else None, "gpu_busy": None,
                               "client_rounds": {str(k): v for k, v in sorted(self.rounds.items())}}
        filt = self.stages.get("filter")
        if gpu_spans and run and filt and filt["end"] is not None:
            after = self.marks.get("first_candidates", filt["start"])
            out["gpu_busy"] = gpu_busy(gpu_spans, after, filt["end"], run[0], run[1])
        if compose_spans and run:
            out["compose_shards"] = compose_shards(compose_spans, run[0])
        return out


def gpu_busy(spans: list[tuple], after: float, until: float, run_start: float, run_end: float
             ) -> dict[str, Any] | None:
    """Busy share per GPU worker and overall (see the module docstring): ``share_after_first_candidates``
    over [``after``, ``until``], ``share_after_first_candidates_to_run_end`` over [``after``, ``run_end``],
    ``share_of_run`` over the run. None when no span held a GPU lock."""
    per: dict[str, list[tuple[float, float]]] = {}
    approximate = False
    for worker, started, ended, holds, *exact in spans:
        if exact and exact[0]:
            per.setdefault(str(worker), []).extend((float(a), float(b)) for a, b in exact[0])
            continue
        held = sum(v for k, v in (holds or {}).items() if k.startswith("compute"))
        if not held or ended is None:
            continue
        approximate = True
        lo = max(ended - held, started if started is not None else ended - held)
        per.setdefault(str(worker), []).append((lo, ended))
    if not per:
        return None
    windows = {"share_after_first_candidates": (after, until),
               "share_after_first_candidates_to_run_end": (after, run_end), "share_of_run": (run_start, run_end)}
    workers = {worker: {name: round(_covered(intervals, lo, hi) / max(hi - lo, 1e-9), 4)
                        for name, (lo, hi) in windows.items()}
               for worker, intervals in sorted(per.items())}
    n = len(workers)
    method = ("compute-lock hold intervals of the sandboxes (approximate)" if approximate
              else "compute-lock hold spans of the sandboxes")
    return {"method": method, "gpus": n,
            **{name: round(sum(w[name] for w in workers.values()) / n, 4) for name in windows},
            "per_gpu": workers}


def compose_shards(spans: list[tuple], run_start: float) -> dict[str, Any]:
    """The composer shards of a run: how many, their seconds (p50, max), and per round when its first shard
    started and its last one ended (seconds from ``run_start``), to set beside the filter's occupancy."""
    secs = sorted(e - s for _, s, e, *_ in spans)
    rounds: dict[int, list[float]] = {}
    for _, s, e, k, *_ in spans:
        lo, hi = rounds.setdefault(int(k), [s, e])
        rounds[int(k)] = [min(lo, s), max(hi, e)]
    return {"shards": len(spans), "seconds_p50": round(secs[len(secs) // 2], 3), "seconds_max": round(secs[-1], 3),
            "rounds_s": {str(k): [round(lo - run_start, 1), round(hi - run_start, 1)]
                         for k, (lo, hi) in sorted(rounds.items())}}


def _covered(intervals: list[tuple[float, float]], lo: float, hi: float) -> float:
    """Seconds of [lo, hi] covered by the union of ``intervals``."""
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted((max(s, lo), min(e, hi)) for s, e in intervals):
        if e <= s:
            continue
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def _r(t: float | None) -> float | None:
    return None if t is None else round(t, 3)


def outside_wait_s(client_rounds: dict[str, dict[str, float]]) -> list[float]:
    """Per round, in round order, the client's seconds outside the wait for verdicts (``client_rounds`` of
    ``Timeline.record``: feeding the round, its result phase less the wait, the selection)."""
    return [round(r.get("pieces_s", 0) + r.get("result_s", 0) - r.get("waiting_s", 0) + r.get("select_s", 0), 2)
            for _, r in sorted(client_rounds.items(), key=lambda kv: int(kv[0]))]


def format_timeline(t: dict[str, Any]) -> list[str]:
    """``run.json``'s timeline as lines for the terminal."""
    if not t or not t.get("stages"):
        return []
    t0 = t.get("start") or 0.0
    lines = [f"timeline (s from the start; wall {t.get('wall_s')} s):"]
    for name, s in t["stages"].items():
        start = "-" if s["start"] is None else f"{s['start'] - t0:7.1f}"
        end = "-" if s["end"] is None else f"{s['end'] - t0:7.1f}"
        busy = "" if s.get("busy_s") is None else f", busy {s['busy_s']} s"
        lines.append(f"  {name:<20}{start} -> {end}  ({s.get('wall_s')} s{busy})")
    own = outside_wait_s(t.get("client_rounds") or {})
    if own:
        lines.append(f"  client seconds per round outside the wait for verdicts (shards, rescan, selection): {own}")
    c = t.get("compose_shards")
    if c:
        lines.append(f"  composer shards: {c['shards']} (p50 {c['seconds_p50']} s, max {c['seconds_max']} s)")
    g = t.get("gpu_busy")
    if g:
        to_end = g.get("share_after_first_candidates_to_run_end")
        lines.append(f"  GPU busy: {g['share_after_first_candidates']:.1%} from the first candidates to the last "
                     f"verdict" + (f", {to_end:.1%} to the end of the run" if to_end is not None else "")
                     + f", {g['share_of_run']:.1%} of the run ({g['gpus']} GPU(s); {g['method']})")
    return lines
