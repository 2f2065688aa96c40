"""Summary of a finished GPU run directory (``opforge run --device cuda``): funnel, yield per op count,
runtime quantiles and histogram, time by filter, admission and lock waits.

    python benchmarks/device/gpu_run_report.py RUN_DIR --out-json S.json --out-csv V.csv --out-png H.png

RUN_DIR holds ``candidates.parquet`` and ``filter/`` (``verdicts.parquet``, ``ledger.jsonl``,
``funnel.json``). Writes a JSON summary, a per-task CSV (small: no code, no metrics blob) and a histogram
of accepted tasks' eager milliseconds (log scale) with the window's edges; prints the JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - after the backend choice


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--out-json", required=True)
    ap.add_argument("--out-csv", required=True)
    ap.add_argument("--out-png", required=True)
    ap.add_argument("--window", type=float, nargs=2, default=(1.0, 100.0), help="LO HI ms")
    args = ap.parse_args()

    cands = pd.read_parquet(args.run_dir / "candidates.parquet", columns=["task_id", "num_ops", "predicted_ms"])
    verdicts = pd.read_parquet(args.run_dir / "filter" / "verdicts.parquet")
    ledger = {}
    for line in (args.run_dir / "filter" / "ledger.jsonl").read_text().splitlines():
        rec = json.loads(line)
        ledger[rec["task_id"]] = rec  # the last record of a task wins (a resumed run appends)
    funnel = json.loads((args.run_dir / "filter" / "funnel.json").read_text())
    v = verdicts.drop(columns=["metrics"]).merge(cands.drop_duplicates("task_id"), on="task_id", how="left")
    v["gpu_peak_gib"] = v["task_id"].map(lambda t: ledger.get(t, {}).get("gpu_peak_gib"))
    v["compute_wait_s"] = v["task_id"].map(lambda t: ledger.get(t, {}).get("lock_wait_s", {}).get("compute"))
    v["memory_wait_s"] = v["task_id"].map(lambda t: ledger.get(t, {}).get("lock_wait_s", {}).get("memory"))
    v["retried_alone"] = v["task_id"].map(lambda t: bool(ledger.get(t, {}).get("retried_alone")))
    cols = ["task_id", "num_ops", "accepted", "reason", "filter", "eager_ms", "compile_ms", "predicted_ms",
            "gpu_peak_gib", "seconds", "compute_wait_s", "memory_wait_s", "retried_alone"]
    v[cols].to_csv(args.out_csv, index=False, float_format="%.4g")

    acc = v[v["accepted"]]
    by_ops = {int(k): [int(g["accepted"].sum()), len(g)] for k, g in v.groupby("num_ops")}
    q = [10, 25, 50, 75, 90]
    eager = acc["eager_ms"].dropna().to_numpy()
    ratio = (acc["eager_ms"] / acc["compile_ms"]).dropna()
    summary = {
        "verdicted_tasks": len(v), "accepted": int(acc.shape[0]),
        "accepted_share": round(float(acc.shape[0] / len(v)), 4),
        "yield_by_op_count": by_ops,
        "by_reason_detail": funnel.get("by_reason_detail"),
        "accepted_eager_ms_quantiles": dict(zip([f"p{p}" for p in q], np.percentile(eager, q).round(3).tolist(),
                                                strict=True)),
        "accepted_eager_over_compiled_median": round(float(ratio.median()), 3),
        "filter_seconds_total": {k: round(f["seconds_total"]) for k, f in funnel["by_filter"].items()},
        "compute_wait_s_total": round(float(v["compute_wait_s"].fillna(0).sum())),
        "memory_wait_s_total": round(float(v["memory_wait_s"].fillna(0).sum())),
        "retried_alone": int(v["retried_alone"].sum()),
        "gpu_peak_gib_p50_p90_max": [round(float(x), 2) for x in
                                     (v["gpu_peak_gib"].median(), v["gpu_peak_gib"].quantile(0.9), v["gpu_peak_gib"].max())],
        "predicted_over_measured_median": round(float((acc["predicted_ms"] / acc["eager_ms"]).median()), 3),
    }
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for record.py
    import record

    record.write_file(args.out_json, summary)

    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    bins = np.logspace(np.log10(max(eager.min(), 1e-2)), np.log10(eager.max()), 40)
    ax.hist(eager, bins=bins, color="#4477aa")
    for edge in args.window:
        ax.axvline(edge, color="#cc3311", linestyle="--", linewidth=1)
    ax.set_xscale("log")
    ax.set_xlabel("eager forward, median ms (CUDA events, L2 flushed)")
    ax.set_ylabel("accepted tasks")
    ax.set_title(f"{len(eager)} accepted tasks; window {args.window[0]:g}-{args.window[1]:g} ms")
    fig.tight_layout()
    fig.savefig(args.out_png, dpi=110)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
