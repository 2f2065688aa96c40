"""Composer benchmark: time to compose 10,000 candidates, label fidelity, diversity vs Ops-6K, CPU sizing.

Usage: python benchmarks/compose_bench.py --catalog runs/seeds/catalog.parquet [--n 10000] [--workers 2]
Writes benchmarks/results/<machine>/compose.json (``record.write``) and prints a summary.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pandas as pd
import record
from opforge.compose.composer import ComposeConfig, compose
from opforge.compose.labels import labels_match
from opforge.filters.runtime import measure_eager_ms
from opforge.seeds.catalog import read_catalog

REF = Path(__file__).resolve().parents[2] / "shared" / "reference" / "cuda_agent_ops_6k.parquet"


def diversity(df: pd.DataFrame) -> dict:
    torch_rows = df[df.data_source != "transformers"]
    ops = [json.loads(o) for o in torch_rows.ops]
    out = {
        "rows": len(df),
        "distinct_op_labels": len({x for o in ops for x in o}),
        "distinct_signatures": len({tuple(sorted(set(o))) for o in ops}),
        "distinct_sequences": len({tuple(o) for o in ops}),
        "transformers_modules": len({o for o in df[df.data_source == "transformers"].ops}),
    }
    if "pattern" in df:
        out["dag_share"] = float((~torch_rows.pattern.isin(["chain"])).mean())
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--catalog", default="runs/seeds/catalog.parquet")
    ap.add_argument("--n", type=int, default=10000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", help="write here instead of benchmarks/results/<machine>/NAME.json")
    args = ap.parse_args()
    cat = read_catalog(Path(args.catalog))
    t0 = time.perf_counter()
    df = compose(cat, ComposeConfig(n=args.n, seed=0), workers=args.workers)
    secs = time.perf_counter() - t0
    res = {"n": args.n, "workers": args.workers, "seconds": round(secs, 1), "per_minute": round(args.n / secs * 60)}
    sample = df[df.data_source != "transformers"].head(1000)
    res["label_fidelity_1000"] = float(sum(labels_match(r.code, json.loads(r.ops)) for r in sample.itertuples()) / len(sample))
    res["opforge_6000"] = diversity(df.head(6000))
    ref = pd.read_parquet(REF)
    ref_ok = ref[ref.ops.str.startswith("[")]
    res["ops6k_reference"] = diversity(pd.concat([ref_ok, ref[~ref.ops.str.startswith("[")].assign(
        ops=lambda d: d.ops.map(lambda s: s.rsplit("_", 1)[0]))]))
    res["ops6k_reference"]["dag_share"] = None  # Ops-6K tasks are free-form code, not graphs
    # CPU sizing: measured eager time of 100 cpu-profile candidates vs the 1-100 ms window
    cpu = compose(cat, ComposeConfig(n=100, seed=1, device_profile="cpu", transformers_share=0), progress=False)
    times = []
    for r in cpu.itertuples():
        try:
            times.append(measure_eager_ms(r.code, r.task_id))
        except Exception:
            times.append(float("nan"))
    s = pd.Series(times)
    res["cpu_sizing"] = {"n": len(s), "inside_1_100ms": float(((s >= 1) & (s <= 100)).mean()),
                         "median_ms": float(s.median()), "errors": int(s.isna().sum()),
                         "median_measured_over_predicted": float((s / cpu.predicted_ms).median())}
    path = record.write_file(args.out, res) if args.out else record.write("compose", res)
    print(json.dumps(res, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
