"""Contamination / duplicate benchmark: KernelBench self-check, disguise suite, false positives, speed.

    python benchmarks/contamination_bench.py [--n 10000] [--workers 2] [--out FILE]  (default: benchmarks/results/<machine>/contamination.json)

1. builds the KernelBench L1–3 index from ../shared/reference/kernelbench.jsonl (fresh cache: timed);
2. feeds the 250 problems as tasks (each must be contaminated, nearest = itself);
3. the disguise suite of tests/disguises.py on all 250 problems: rejection rate per disguise and tier;
   plus ``extra_op`` (forward result times 1.0), which changes the op set and is reported apart;
4. false positives: the hand-written new fusions of tests/new_fusions.py, and the Ops-6K reference rows
   through ``opforge filter --only contamination,duplicate`` (flags per tier, exact / near duplicates);
5. speed: ``--n`` composed candidates (seed 0, h100 profile) through the same two filters on
   ``--workers`` CPU workers, wall time including cluster start-up.
"""

from __future__ import annotations

import argparse
import collections
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the disguise suite and new fusions live with the tests

import record  # noqa: E402 - benchmarks/record.py, beside this script

from tests.disguises import DISGUISES, changed, extra_op  # noqa: E402
from tests.new_fusions import NEW_FUSIONS  # noqa: E402
from tests.paths import KERNELBENCH, OPS6K  # noqa: E402


def tier_counts(verdicts) -> dict[str, int]:
    return dict(collections.Counter(v.reason or "accepted" for v in verdicts).most_common())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=10_000, help="composed candidates for the speed run")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--catalog", default="runs/seeds/catalog.parquet")
    p.add_argument("--work", default="runs/bench/contamination")
    p.add_argument("--out", help="write here instead of benchmarks/results/<machine>/NAME.json")
    args = p.parse_args()
    os.environ["OPFORGE_CACHE"] = tempfile.mkdtemp(prefix="opforge-cache-")  # time a cold index build

    from opforge.filters.chain import FilterSettings
    from opforge.filters.contamination import ContaminationFilter
    from opforge.filters.kernelbench import cached_index, load_problems
    from opforge.pipeline.filter_run import run_filter

    res: dict = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                             "python": platform.python_version()}}
    t0 = time.perf_counter()
    _, index = cached_index(KERNELBENCH)
    res["index"] = {"problems": len(index.problems), "build_s": round(time.perf_counter() - t0, 1),
                    "trace_failures": index.trace_failures}
    f = ContaminationFilter(index)
    problems = load_problems(KERNELBENCH)

    t0 = time.perf_counter()
    own = [(pr, f(pr.code, pr.key)) for pr in problems]
    res["kernelbench_self"] = {
        "problems": len(own), "contaminated": sum(not v.accepted for _, v in own),
        "nearest_is_itself": sum(v.metrics["kernelbench_nearest"] == pr.key for pr, v in own),
        "by_tier": tier_counts(v for _, v in own), "seconds": round(time.perf_counter() - t0, 1)}
    print("self:", res["kernelbench_self"], flush=True)

    res["disguises"] = {}
    for name, fn in [*DISGUISES.items(), ("extra_op", extra_op)]:
        verdicts, n_changed, nearest_self = [], 0, 0
        for pr in problems:
            code = fn(pr.code)
            n_changed += changed(pr.code, code)
            v = f(code, pr.key)
            verdicts.append(v)
            nearest_self += v.metrics["kernelbench_nearest"] == pr.key
        rejected = sum(not v.accepted for v in verdicts)
        res["disguises"][name] = {"problems": len(verdicts), "source_changed": n_changed,
                                  "rejected": rejected, "rate": round(rejected / len(verdicts), 4),
                                  "nearest_is_original": nearest_self, "by_tier": tier_counts(verdicts),
                                  "in_required_suite": name in DISGUISES}
        print(name, res["disguises"][name], flush=True)

    fusions = {name: f(code, name) for name, code in NEW_FUSIONS.items()}
    res["new_fusions"] = {"tasks": len(fusions), "flagged": sum(not v.accepted for v in fusions.values()),
                          "max_similarity": max(v.metrics["kernelbench_similarity"] for v in fusions.values()),
                          "flagged_names": [k for k, v in fusions.items() if not v.accepted]}
    print("new fusions:", res["new_fusions"], flush=True)

    settings = FilterSettings(only=["contamination", "duplicate"], kernelbench=str(KERNELBENCH), timeout_s=60)
    work = Path(args.work)
    import shutil

    shutil.rmtree(work, ignore_errors=True)
    t0 = time.perf_counter()
    ops = run_filter(OPS6K, work / "ops6k", settings, workers=args.workers, progress=False)
    wall = time.perf_counter() - t0
    codes = list(pd.read_parquet(OPS6K, columns=["code"])["code"])
    fn_ = ops.funnel
    res["ops6k"] = {"rows": fn_["input_rows"], "byte_identical_duplicates": len(codes) - len(set(codes)),
                    "by_reason_detail": fn_["by_reason_detail"], "wall_s": round(wall, 1),
                    "contamination_seconds_mean": fn_["by_filter"]["contamination"]["seconds_mean"]}
    print("ops6k:", res["ops6k"], flush=True)

    from opforge.compose.composer import ComposeConfig, compose
    from opforge.seeds.catalog import read_catalog

    cand = work / f"composed{args.n}.parquet"
    t0 = time.perf_counter()
    compose(read_catalog(args.catalog), ComposeConfig(n=args.n, seed=0, device_profile="h100"),
            progress=False).to_parquet(cand, index=False)
    compose_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    run = run_filter(cand, work / "composed", settings, workers=args.workers, progress=False)
    wall = time.perf_counter() - t0
    fc = run.funnel
    res["speed"] = {"tasks": fc["input_rows"], "workers": args.workers, "compose_s": round(compose_s, 1),
                    "wall_s_including_cluster_start": round(wall, 1),
                    "tasks_per_min": round(60 * fc["input_rows"] / wall, 1),
                    "duplicate_s": fc["by_filter"]["duplicate"]["seconds_total"],
                    "contamination_seconds_mean": fc["by_filter"]["contamination"]["seconds_mean"],
                    "by_reason_detail": fc["by_reason_detail"]}
    print("speed:", res["speed"], flush=True)
    path = record.write_file(args.out, res) if args.out else record.write("contamination", res)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
