"""Composer benchmark: time to compose N candidates with the default workers, CPU seconds per candidate of each
kind (motif, random composer, transformers block), label fidelity, diversity vs Ops-6K, CPU sizing.

Usage: python benchmarks/compose_bench.py --catalog runs/seeds/catalog.parquet [--sizes 2000 10000]
           [--profile h200] [--workers N] [--per-kind 300] [--skip-cpu-sizing]
Writes benchmarks/results/<machine>/compose.json (``record.write``) and prints a summary. The machine may be
shared: the 1-minute load average before and after each timed run is recorded beside its wall and CPU
seconds (CPU seconds are what the composer used, whatever else ran).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import time
from pathlib import Path

import pandas as pd
import record
from opforge.compose import composer as C
from opforge.compose.composer import ComposeConfig, compose
from opforge.compose.labels import labels_match
from opforge.engine.cluster import usable_cores
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


def _cpu_children() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed_compose(cat, cfg: ComposeConfig, workers: int) -> tuple[pd.DataFrame, dict]:
    """``compose`` with wall seconds, CPU seconds (this process and its pool) and the load around it."""
    load0, cpu0, own0, t0 = os.getloadavg()[0], _cpu_children(), time.process_time(), time.perf_counter()
    df = compose(cat, cfg, workers=workers, progress=False)
    wall = time.perf_counter() - t0
    cpu = _cpu_children() - cpu0 + time.process_time() - own0
    return df, {"n": cfg.n, "workers": workers, "seconds": round(wall, 1), "cpu_seconds": round(cpu, 1),
                "per_minute": round(cfg.n / wall * 60), "load_1min_before": round(load0, 2),
                "load_1min_after": round(os.getloadavg()[0], 2)}


def per_kind(cat, cfg: ComposeConfig, n: int) -> dict:
    """CPU seconds per candidate of each kind over the first ``n`` indices, in this process (the composer's
    state built once beforehand; its memo warms up over the sample as in a worker)."""
    C._STATE.clear()
    t0 = time.process_time()
    C.compose_rows(cat, cfg, [])
    init = time.process_time() - t0
    secs: dict[str, float] = {}
    count: dict[str, int] = {}
    for i in range(cfg.start_index, cfg.start_index + n):
        first = random.Random(f"{cfg.seed}:{i}:dtype")  # the composer's own first draws (composer._candidate)
        dtypes, mix = C._STATE["dtypes"], C._STATE["mix"]
        first.choices(list(dtypes), list(dtypes.values()))
        block = bool(C._STATE["blocks"]) and first.random() < cfg.transformers_share
        first.choices(list(mix), list(mix.values()))
        kind = "block" if block else "motif" if (C._STATE["motifs"] is not None and first.random() < cfg.motif_share) \
            else "random"
        t = time.process_time()
        C._candidate(i)
        secs[kind] = secs.get(kind, 0.0) + time.process_time() - t
        count[kind] = count.get(kind, 0) + 1
    return {"init_cpu_s": round(init, 2), "sample": n,
            "kinds": {k: {"candidates": count[k], "cpu_s_per_candidate": round(secs[k] / count[k], 4)}
                      for k in sorted(count)}}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--catalog", default="runs/seeds/catalog.parquet")
    ap.add_argument("--vocabulary", default=None, help="shape vocabulary JSON (default: the packaged one)")
    ap.add_argument("--profile", default="h200")
    ap.add_argument("--sizes", type=int, nargs="+", default=[2000, 10000])
    ap.add_argument("--workers", type=int, default=None, help="processes (default: the usable cores, as "
                                                               "`opforge compose`)")
    ap.add_argument("--per-kind", type=int, default=300)
    ap.add_argument("--skip-cpu-sizing", action="store_true")
    ap.add_argument("--out", help="write here instead of benchmarks/results/<machine>/NAME.json")
    args = ap.parse_args()
    cat = read_catalog(Path(args.catalog))
    workers = args.workers or usable_cores()
    base = dict(seed=0, device_profile=args.profile, vocabulary=args.vocabulary)
    res: dict = {"profile": args.profile, "workers": workers, "runs": []}
    df = None
    for n in args.sizes:
        df, run = timed_compose(cat, ComposeConfig(n=n, **base), workers)
        res["runs"].append(run)
        print(run, flush=True)
    res["per_kind"] = per_kind(cat, ComposeConfig(n=args.per_kind, **base), args.per_kind)
    print(res["per_kind"], flush=True)
    sample = df[df.data_source != "transformers"].head(1000)
    res["label_fidelity_1000"] = float(sum(labels_match(r.code, json.loads(r.ops)) for r in sample.itertuples())
                                       / len(sample))
    res["opforge_6000"] = diversity(df.head(6000))
    if REF.exists():
        ref = pd.read_parquet(REF)
        ref_ok = ref[ref.ops.str.startswith("[")]
        res["ops6k_reference"] = diversity(pd.concat([ref_ok, ref[~ref.ops.str.startswith("[")].assign(
            ops=lambda d: d.ops.map(lambda s: s.rsplit("_", 1)[0]))]))
        res["ops6k_reference"]["dag_share"] = None  # Ops-6K tasks are free-form code, not graphs
    if not args.skip_cpu_sizing:
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
    print(json.dumps({k: v for k, v in res.items() if k not in ("opforge_6000", "ops6k_reference")}, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
