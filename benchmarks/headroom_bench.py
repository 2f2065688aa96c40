"""Fusion headroom of datasets: the roofline fusion-gain distribution, and where GPU times exist, the room a
perfect kernel has over the better of eager and ``torch.compile``; the numbers behind the ``headroom``
filter's thresholds (``trivial:no_headroom``).

For each dataset (any Parquet / JSONL with a ``code`` column; ``eager_ms`` / ``compile_ms`` / ``gpu`` used when
present), every row (or a seeded sample) is measured with ``opforge.task.roofline.roofline`` on ``meta`` at the
given datasheet peaks (H200 SXM by default), and the result holds:

* ``fusion_gain`` and ``roofline_ms`` quantiles (p10 / p25 / p50 / p75 / p90), the share of rows below each
  of ``GAIN_CUTS``, the same by ``data_source``;
* with GPU times: ``room = min(eager_ms, compile_ms) / roofline_ms`` quantiles, the share of rows with room
  >= 2, below 1 (measured faster than the roofline: cuDNN's Winograd 3x3 convolutions do fewer FLOPs than
  the direct count, and work a later op throws away, a ``select`` or ``topk``, is still counted), the eager
  over compile speed-up, and the share of rows the rule ``fusion_gain < g and room < r`` rejects for a grid of
  (g, r) -- the defaults of ``filters.headroom.HeadroomFilter`` marked;
* rows that could not be traced on ``meta``, by error.

Usage:
    python benchmarks/headroom_bench.py                        # 500 Ops-6K rows + all of releases/opforge-ops-6k
    python benchmarks/headroom_bench.py --ops6k-rows 0 --release-rows 1000 --out /tmp/headroom.json
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import record  # noqa: E402 - benchmarks/record.py, beside this script
from opforge.filters.headroom import HeadroomFilter
from opforge.task.peaks import get_peaks
from opforge.task.roofline import RooflineError, roofline

ROOT = Path(__file__).resolve().parents[1]
OPS6K = ROOT.parent / "shared" / "reference" / "cuda_agent_ops_6k.parquet"
RELEASE = ROOT / "releases" / "opforge-ops-6k" / "data"
GAIN_CUTS = (1.05, 1.1, 1.2, 1.5, 2.0)
GRID_GAIN = (1.05, 1.1, 1.2)
GRID_ROOM = (1.25, 1.5, 2.0, 3.0)
QUANTILES = (10, 25, 50, 75, 90)


def read_rows(path: Path, n: int, seed: int) -> pd.DataFrame:
    """The rows of a Parquet file / folder or JSONL; ``n`` > 0 takes ``DataFrame.sample(n, random_state=seed)``."""
    df = pd.read_json(path, lines=True) if str(path).endswith((".jsonl", ".json")) else pd.read_parquet(path)
    if "code" not in df:
        raise SystemExit(f"{path}: no `code` column")
    return df.sample(n, random_state=seed) if 0 < n < len(df) else df


def quantiles(values) -> dict[str, float] | None:
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if not len(v):
        return None
    return {f"p{q}": round(float(np.percentile(v, q)), 4) for q in QUANTILES}


def measure(df: pd.DataFrame, peaks) -> tuple[pd.DataFrame, Counter, float]:
    """Per row ``fusion_gain``, ``roofline_ms`` (NaN where tracing failed); errors by kind; seconds."""
    gains, roofs, errors = [], [], Counter()
    t0 = time.perf_counter()
    for i, code in zip(df.index, df["code"], strict=True):
        try:
            r = roofline(code, peaks, name=f"row {i}")
            gains.append(r.fusion_gain)
            roofs.append(r.roofline_ms)
        except RooflineError as exc:
            gains.append(np.nan)
            roofs.append(np.nan)
            errors[str(exc).split(": ", 1)[-1][:80]] += 1
    out = df.drop(columns=[c for c in ("code", "graph", "shape_variants") if c in df]).copy()
    out["fusion_gain"], out["roofline_ms"] = gains, roofs
    return out, errors, time.perf_counter() - t0


def summarise(m: pd.DataFrame, errors: Counter, seconds: float, thresholds: dict) -> dict:
    gain = m["fusion_gain"].dropna()
    res = {"rows": len(m), "measured": int(len(gain)), "not_traced": int(m["fusion_gain"].isna().sum()),
           "not_traced_by_error": dict(errors.most_common(10)), "seconds_per_row": round(seconds / max(1, len(m)), 4),
           "fusion_gain": quantiles(gain), "roofline_ms": quantiles(m["roofline_ms"]),
           "share_below": {str(c): round(float((gain < c).mean()), 4) for c in GAIN_CUTS}}
    if "data_source" in m:
        res["by_data_source"] = {
            str(k): {"rows": int(len(g)), "fusion_gain_p50": round(float(g["fusion_gain"].median()), 4),
                     "share_below_1.1": round(float((g["fusion_gain"].dropna() < 1.1).mean()), 4)}
            for k, g in m.groupby("data_source") if g["fusion_gain"].notna().any()}
    if {"eager_ms", "compile_ms"} <= set(m) and pd.to_numeric(m["eager_ms"], errors="coerce").notna().any():
        eager = pd.to_numeric(m["eager_ms"], errors="coerce")
        comp = pd.to_numeric(m["compile_ms"], errors="coerce")
        best = pd.concat([eager, comp], axis=1).min(axis=1)
        room = best / m["roofline_ms"]
        both = room.notna() & m["fusion_gain"].notna()
        g, r = m["fusion_gain"][both], room[both]
        res["gpu"] = sorted(set(m["gpu"].dropna().astype(str))) if "gpu" in m else None
        res["room"] = quantiles(r)
        res["room_share_at_least_2"] = round(float((r >= 2).mean()), 4)
        res["room_share_below_1"] = round(float((r < 1).mean()), 4)
        res["compile_speedup"] = quantiles((eager / comp)[both])
        res["rejected_share_grid"] = {f"gain<{gc} & room<{rc}": round(float(((g < gc) & (r < rc)).mean()), 4)
                                      for gc in GRID_GAIN for rc in GRID_ROOM}
        rule = r < thresholds["min_room"]
        res["default_rule"] = {**thresholds, "rejected_share": round(float(rule.mean()), 4),
                               "kept_room_share_at_least_2": round(float((r[~rule] >= 2).mean()), 4),
                               "kept_fusion_gain_p50": round(float(g[~rule].median()), 4)}
    return res


def _shown(path: Path) -> str:
    """``path`` relative to the repository (``../shared/...`` beside it), absolute elsewhere."""
    path = path.resolve()
    if path.is_relative_to(ROOT):
        return str(path.relative_to(ROOT))
    return f"../{path.relative_to(ROOT.parent)}" if path.is_relative_to(ROOT.parent) else str(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops6k", type=Path, default=OPS6K, help="CUDA-Agent-Ops-6K Parquet (test reference data)")
    ap.add_argument("--ops6k-rows", type=int, default=500, help="rows sampled from it (0: all, -1: skip it)")
    ap.add_argument("--release", type=Path, default=RELEASE, help="an opforge dataset folder's data/ or a file")
    ap.add_argument("--release-rows", type=int, default=0, help="rows sampled from it (0: all, -1: skip it)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--peaks", default="h200", help="datasheet peaks (opforge.task.peaks names)")
    ap.add_argument("--out", type=Path, default=None, help="write a scratch copy here instead of results/")
    args = ap.parse_args()

    peaks = get_peaks(args.peaks)
    thresholds = HeadroomFilter.default_thresholds()
    datasets = {}
    for name, path, n in (("ops6k", args.ops6k, args.ops6k_rows), ("opforge_ops6k_v1", args.release, args.release_rows)):
        if n < 0:
            continue
        if not path.exists():
            print(f"{name}: {path} not found, skipped")
            continue
        m, errors, seconds = measure(read_rows(path, n, args.seed), peaks)
        datasets[name] = {"source": _shown(path),
                          "sample": None if n == 0 else {"n": n, "random_state": args.seed},
                          **summarise(m, errors, seconds, thresholds)}
        d = datasets[name]
        print(f"{name}: {d['measured']}/{d['rows']} measured, fusion gain {d['fusion_gain']}, "
              f"below 1.1 {d['share_below']['1.1']}" + (f", room {d['room']}, rule {d['default_rule']}"
                                                         if "room" in d else ""))
    payload = {
        "what": "roofline fusion gain per dataset (opforge.task.roofline on meta) and, with the dataset's GPU times, "
                "the room min(eager_ms, compile_ms) / roofline_ms; the shares the trivial:no_headroom rule rejects",
        "peaks": peaks.describe(), "headroom_thresholds": thresholds, "datasets": datasets,
    }
    path = record.write_file(args.out, payload) if args.out else record.write("headroom", payload)
    print(path)


if __name__ == "__main__":
    main()
