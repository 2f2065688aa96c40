"""Issue 61's check of docs/extending.md: an own op and an own model, harvested / mined and composed with the
own library at weight 0.3; share of candidates that use them, and the CPU filter chain's verdicts on a sample
of those.

    python benchmarks/extending_bench.py --catalog runs/own/seeds/catalog.parquet \
        --motifs runs/own/motifs.json.gz --n 500 --filter-sample 24

(the catalog from ``opforge seeds harvest --specs examples/extending/own_specs.yaml``, the library from
``opforge motifs --model examples/extending/own_model.py:GatedBlock --inputs-fn ...``). Writes
``benchmarks/results/<machine>/extending.json``: the share of the ``n`` candidates that call an own op or are an
own-library motif, per kind, and the funnel (accepted / reason) of ``--filter-sample`` of them through the CPU
chain (``opforge filter --device cpu``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import record

OWN_OPS = ("SquaredReLU", "scaled_tanh")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--catalog", required=True)
    ap.add_argument("--motifs", required=True)
    ap.add_argument("--weight", type=float, default=0.3)
    ap.add_argument("--n", type=int, default=500)
    ap.add_argument("--filter-sample", type=int, default=24)
    ap.add_argument("--out", default="runs/own")
    args = ap.parse_args()
    import pandas as pd

    out = Path(args.out)
    cands = out / "candidates.parquet"
    t0 = time.perf_counter()
    subprocess.run(["opforge", "compose", "--seeds", args.catalog, "--motifs", f"{args.motifs}:{args.weight}",
                    "--op-weights", "examples/extending/own_weights.yaml", "--device-profile", "cpu",
                    "--n", str(args.n), "--out", str(cands), "-q"], check=True)
    compose_s = time.perf_counter() - t0
    df = pd.read_parquet(cands)
    own_op = df.ops.apply(lambda s: any(o in json.loads(s) for o in OWN_OPS))
    own_motif = df.provenance.apply(lambda p: bool(p) and json.loads(p).get("library") == Path(args.motifs).name)
    own = df[own_op | own_motif]
    sample = own.sample(min(args.filter_sample, len(own)), random_state=0)
    sample_path = out / "own_sample.parquet"
    sample.to_parquet(sample_path, index=False)
    t1 = time.perf_counter()
    subprocess.run(["opforge", "filter", str(sample_path), str(out / "filter"), "--device", "cpu", "-q"],
                   check=False)
    filter_s = time.perf_counter() - t1
    funnel = json.loads((out / "filter" / "funnel.json").read_text())
    verdicts = pd.read_parquet(out / "filter" / "verdicts.parquet")
    reasons = verdicts.reason.fillna("accepted").value_counts().to_dict()
    payload = {
        "n": len(df), "weight": args.weight, "compose_s": round(compose_s, 1),
        "own_share": round(len(own) / len(df), 4), "own_op_share": round(float(own_op.mean()), 4),
        "own_motif_share": round(float(own_motif.mean()), 4),
        "filter_sample": len(sample), "filter_s": round(filter_s, 1), "verdicts": reasons,
        "funnel": {k: funnel[k] for k in ("verdicted_rows", "unique_tasks", "wall_s", "tasks_per_min") if k in funnel},
    }
    print(json.dumps(payload, indent=1))
    print(record.write("extending", payload))


if __name__ == "__main__":
    sys.exit(main())
