"""The streamed main job's figures from finished ``opforge run`` directories (issue #37): per-stage wall and busy
seconds and the GPU busy share from ``run.json``'s stage timeline, and, where ``filter/ledger.jsonl`` is there,
verdicts per minute over the filter's span, the sandboxes' per-task step times (p50 of the eager and compile
filters' seconds, compute-lock wait and hold) and the timeouts.

    python benchmarks/streaming_report.py [LABEL=RUN_DIR ...] [--host LABEL=cpu_scaling.json]
        [--ledger LABEL=ledger.jsonl] [--bin-s S] [--out FILE]

``--host`` attaches a ``benchmarks/device/cpu_scaling.py`` output (the host's CPU throughput under N processes)
to the run of that label. ``--ledger LABEL=ledger.jsonl`` reads a ledger alone (a run stopped before its
``run.json``): its figures, the sandboxes' occupancy (tasks running at once, per ``--bin-s`` seconds, from each
verdict's start and end; the share of the sandbox seconds the span offered that ran a task; the stretches with
fewer than half the sandboxes busy) and the trend of the seconds each task spent handing its memory back
(``release_s``, p50 per minute).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _p50(values) -> float | None:
    v = [x for x in values if x is not None]
    return round(float(np.median(v)), 3) if v else None


def ledger_figures(path: Path) -> dict:
    """Verdicts per minute and step-time medians of one ledger (JSON lines of the filter's records)."""
    recs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    starts = [r["started_at"] for r in recs if r.get("started_at")]
    span = max(r["ended_at"] for r in recs if r.get("ended_at")) - min(starts)  # a crash record has no times
    return {"verdicts": len(recs), "filter_span_s": round(span, 1), "verdicts_per_min": round(len(recs) / span * 60),
            "eager_s_p50": _p50((r.get("seconds") or {}).get("eager") for r in recs),
            "compile_s_p50": _p50((r.get("seconds") or {}).get("compile") for r in recs),
            "compute_lock_wait_s_p50": _p50((r.get("lock_wait_s") or {}).get("compute") for r in recs),
            "compute_lock_hold_s_p50": _p50(sum((r.get("lock_hold_s") or {}).values()) for r in recs),
            "timeouts": sum(str(r.get("reason") or "").startswith("timeout") for r in recs)}


def occupancy(recs: list[dict], bin_s: float = 10.0) -> dict:
    """Tasks running at once over the ledger's span (see the module docstring). ``sandboxes`` is the most
    running at once."""
    recs = [r for r in recs if r.get("started_at") and r.get("ended_at")]
    t0, t1 = min(r["started_at"] for r in recs), max(r["ended_at"] for r in recs)
    edges = sorted([(r["started_at"], 1) for r in recs] + [(r["ended_at"], -1) for r in recs])
    running = most = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    bins = np.zeros(max(1, int(np.ceil((t1 - t0) / bin_s))))
    for r in recs:
        a, b = r["started_at"] - t0, r["ended_at"] - t0
        for i in range(int(a // bin_s), min(len(bins) - 1, int(b // bin_s)) + 1):
            bins[i] += max(0.0, min(b, (i + 1) * bin_s) - max(a, i * bin_s)) / bin_s
    low, stretches = bins < most / 2, []
    i = 0
    while i < len(bins):
        if low[i]:
            j = i
            while j < len(bins) and low[j]:
                j += 1
            stretches.append({"from_s": round(i * bin_s), "to_s": round(j * bin_s)})
            i = j
        else:
            i += 1
    busy = sum(r["ended_at"] - r["started_at"] for r in recs)
    minutes = {}
    for r in recs:
        if r.get("release_s") is not None:
            minutes.setdefault(int((r["started_at"] - t0) // 60), []).append(float(r["release_s"]))
    return {"bin_s": bin_s, "sandboxes": most, "span_s": round(t1 - t0, 1),
            "busy_share": round(busy / (most * (t1 - t0)), 4),
            "running_per_bin": [round(float(x), 1) for x in bins], "under_half_busy": stretches,
            "release_s_p50_per_minute": [round(float(np.median(v)), 3) for _, v in sorted(minutes.items())]}


def run_figures(run_dir: Path) -> dict:
    run = json.loads((run_dir / "run.json").read_text())
    t = run.get("timeline") or {}
    out = {k: run.get(k) for k in ("selected", "accepted", "candidates", "rounds", "stop_reason", "seconds")}
    out["wall_s"] = t.get("wall_s")
    out["stages"] = {k: {"wall_s": v.get("wall_s"), "busy_s": v.get("busy_s")} for k, v in (t.get("stages") or {}).items()}
    out["gpu_busy"] = t.get("gpu_busy")
    out["sandboxes"] = (run.get("sandbox_warm_up") or {}).get("of")
    ledger = run_dir / "filter" / "ledger.jsonl"
    out["ledger"] = ledger_figures(ledger) if ledger.exists() else None
    return out


def main(argv=None) -> None:
    import record

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="*", help="LABEL=RUN_DIR")
    ap.add_argument("--host", action="append", default=[], help="LABEL=cpu_scaling.json")
    ap.add_argument("--ledger", action="append", default=[], help="LABEL=ledger.jsonl (a run without run.json)")
    ap.add_argument("--bin-s", type=float, default=10.0)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    res = {"benchmark": "the streamed main job: stage timeline, GPU busy share, step times",
           "runs": {}}
    for spec in a.runs:
        label, _, path = spec.partition("=")
        res["runs"][label] = run_figures(Path(path))
    for spec in a.ledger:
        label, _, path = spec.partition("=")
        recs = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
        res["runs"][label] = {"ledger": ledger_figures(Path(path)), "occupancy": occupancy(recs, a.bin_s)}
    for spec in a.host:
        label, _, path = spec.partition("=")
        text = Path(path).read_text()
        res["runs"].setdefault(label, {})["host_cpu_scaling"] = json.loads(text[text.index("{\n"):])
    text = json.dumps(res, indent=1)
    if a.out:
        record.write_file(a.out, res)
    print(text)


if __name__ == "__main__":
    main()
