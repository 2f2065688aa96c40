"""Filter-stage throughput: tasks verdicted per minute on a fixed set of candidate-like tasks.

The task set is the composer's output for a fixed seed (``--n`` candidates, ``cpu`` device profile, so
sizes suit the device), written once to ``--tasks``. Each configuration runs ``opforge filter``'s engine
(``run_filter``: Dask cluster, sandboxed children, ledger) into a fresh run directory and records the
funnel: wall time, tasks/min, and where the time goes (sandbox start-up, then per filter: eager,
determinism, degenerate, runtime = timing, compile).

Usage:
    python benchmarks/filter_bench.py --catalog runs/seeds/catalog.parquet --workers 1 2
    python benchmarks/filter_bench.py --device cuda --profile h100 --workers 1 4 8   # on a GPU machine
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path

import record  # noqa: E402 - benchmarks/record.py, beside this script
from opforge.compose.composer import ComposeConfig, compose
from opforge.filters.chain import FilterSettings
from opforge.filters.runtime import resolve_window
from opforge.pipeline.filter_run import run_filter
from opforge.seeds.catalog import read_catalog


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--catalog", default="runs/seeds/catalog.parquet")
    p.add_argument("--n", type=int, default=200)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--profile", default="cpu", help="composer device profile used to size the tasks")
    p.add_argument("--device", default="cpu")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--tasks", default="runs/bench/filter_tasks.parquet")
    p.add_argument("--work", default="runs/bench/filter")
    p.add_argument("--timeout-s", type=float, default=120.0)
    p.add_argument("--out", help="write here instead of benchmarks/results/<machine>/NAME.json")
    p.add_argument("--warm-cache", action="store_true",
                   help="keep Inductor's on-disk cache between configurations (default: a fresh one each)")
    args = p.parse_args()

    tasks = Path(args.tasks)
    if not tasks.exists():
        df = compose(read_catalog(args.catalog), ComposeConfig(n=args.n, seed=args.seed,
                                                               device_profile=args.profile), progress=False)
        tasks.parent.mkdir(parents=True, exist_ok=True)
        df.to_parquet(tasks, index=False)
    results = {"tasks": str(tasks), "n": args.n, "seed": args.seed, "profile": args.profile, "runs": []}
    for workers in args.workers:
        run_dir = Path(args.work) / f"{args.device}-w{workers}"
        shutil.rmtree(run_dir, ignore_errors=True)
        if not args.warm_cache:  # workers and their sandboxes inherit this: every configuration starts cold
            cache = Path(args.work) / f"inductor-cache-{args.device}-w{workers}"
            shutil.rmtree(cache, ignore_errors=True)
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache.resolve())
        settings = FilterSettings(device=args.device, timeout_s=args.timeout_s,
                                  runtime_window_ms=resolve_window(args.device, None))
        t0 = time.perf_counter()
        res = run_filter(tasks, run_dir, settings, workers=workers, progress=True)
        wall = time.perf_counter() - t0
        f = res.funnel
        row = {"device": args.device, "workers": workers, "inductor_cache": "warm" if args.warm_cache else "cold", "wall_s_including_cluster_start": round(wall, 1),
               "tasks": f["unique_tasks"], "tasks_per_min": round(60 * f["unique_tasks"] / wall, 1),
               "accepted": f["accepted_tasks"], "by_reason": f["by_reason"],
               "sandbox_start_s_total": f["sandbox_start_s_total"],
               "seconds_by_filter": {k: v["seconds_total"] for k, v in f["by_filter"].items()},
               "environment": f["environment"]}
        results["runs"].append(row)
        print(json.dumps(row, indent=2), flush=True)
    path = record.write_file(args.out, results) if args.out else record.write("filter", results)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
