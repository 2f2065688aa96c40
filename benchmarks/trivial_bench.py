"""How many composed candidates the ``trivial`` filter rejects, per reason, and what the accepted ones are.

Composes ``--n`` candidates (``opforge compose``'s Python API, ``--profile test`` sizes by default so the
tasks run on a CPU), runs the filter chain on them (``opforge filter``'s engine: Dask, sandboxes, ledger;
``--skip`` leaves filters out, by default ``compile`` and ``runtime``, which come after ``trivial`` and do not
change its shares), and prints / writes:

* the share of candidates rejected per reason (and per ``trivial:*`` reason, with the ops it named),
* the ``trivial`` filter's share of the chain's time per task (its seconds / all filters' seconds),
* ``--sample`` random accepted tasks (seeded) with their op lists (the ``ops`` column and the traced ops),
  to read as a kernel engineer would.

The result (``record.write``: benchmarks/results/<machine>/trivial.json) names its commit, date, command,
machine, GPU and library versions.

Usage:
    python benchmarks/trivial_bench.py --catalog runs/seeds/catalog.parquet --n 200
    python benchmarks/trivial_bench.py --n 2000 --device cuda --profile h100 --skip ""   # on a GPU machine
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections import Counter
from pathlib import Path

import record  # noqa: E402 - benchmarks/record.py, beside this script
from opforge.compose.composer import ComposeConfig, compose
from opforge.filters.chain import FilterSettings
from opforge.filters.runtime import resolve_window
from opforge.pipeline.filter_run import run_filter
from opforge.seeds.catalog import read_catalog


def _records(run_dir: Path) -> list[dict]:
    recs = {}
    with open(run_dir / "ledger.jsonl", encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                rec = json.loads(line)
                recs.setdefault(rec["task_id"], rec)
    return list(recs.values())


def summarise(recs: list[dict], tasks, sample: int, seed: int) -> dict:
    """Shares per reason, the trivial filter's time share, named ops and a seeded sample of accepted tasks."""
    n = len(recs)
    reasons = Counter(r["reason"] if not r["accepted"] else "accepted" for r in recs)
    prefix = Counter(r["reason"].split(":")[0] if not r["accepted"] else "accepted" for r in recs)
    named = Counter()
    for r in recs:
        if r.get("filter") == "trivial" and r["reason"] == "trivial:noop":
            for a in r["metrics"]["trivial"].get("removable", []):
                named[" + ".join(o["op"] for o in a["ops"])] += 1
    judged = [r for r in recs if "trivial" in r.get("seconds", {})]
    shares = sorted(r["seconds"]["trivial"] / max(1e-9, sum(r["seconds"].values())) for r in judged)
    untraced = Counter((r["metrics"]["trivial"].get("trace_error") or "")[:60] for r in judged
                       if r["metrics"].get("trivial", {}).get("trace_error"))
    by_id = tasks.set_index("task_id")
    accepted = [r for r in recs if r["accepted"]]
    picked = random.Random(seed).sample(accepted, min(sample, len(accepted)))
    examples = []
    for r in picked:
        row = by_id.loc[r["task_id"]]
        examples.append({"task_id": r["task_id"], "ops": json.loads(row["ops"]) if isinstance(row["ops"], str)
                         else list(row["ops"]), "pattern": row.get("pattern"),
                         "traced_ops": r["metrics"].get("trivial", {}).get("ops")})
    return {
        "candidates": n,
        "share_by_reason": {k: round(v / n, 4) for k, v in reasons.most_common()},
        "count_by_reason": dict(reasons.most_common()),
        "share_by_reason_prefix": {k: round(v / n, 4) for k, v in prefix.most_common()},
        "trivial_judged": len(judged),
        "trivial_share_of_rejections_among_judged": round(
            sum(1 for r in judged if r.get("filter") == "trivial") / max(1, len(judged)), 4),
        "noop_ops_named": dict(named.most_common()),
        "untraceable": sum(untraced.values()), "untraceable_reasons": dict(untraced.most_common(10)),
        "trivial_time_share_of_chain": {"median": shares[len(shares) // 2] if shares else None,
                                        "p90": shares[int(0.9 * (len(shares) - 1))] if shares else None,
                                        "mean": sum(shares) / len(shares) if shares else None},
        "accepted_sample": examples,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--catalog", default="runs/seeds/catalog.parquet")
    p.add_argument("--n", type=int, default=200)
    p.add_argument("--seed", type=int, default=21)
    p.add_argument("--profile", default="test", help="composer device profile used to size the tasks")
    p.add_argument("--device", default="cpu")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--skip", default="compile,runtime", help="comma-separated filters to leave out")
    p.add_argument("--sample", type=int, default=25)
    p.add_argument("--timeout-s", type=float, default=120.0)
    p.add_argument("--work", default="runs/bench/trivial")
    p.add_argument("--name", default="trivial", help="result name (benchmarks/results/<machine>/NAME.json)")
    p.add_argument("--out", help="write here instead of benchmarks/results/<machine>/NAME.json")
    args = p.parse_args()

    work = Path(args.work)
    tasks_path = work / f"candidates-{args.profile}-s{args.seed}-n{args.n}.parquet"
    if tasks_path.exists():
        import pandas as pd

        tasks = pd.read_parquet(tasks_path)
    else:
        tasks = compose(read_catalog(args.catalog), ComposeConfig(n=args.n, seed=args.seed,
                                                                  device_profile=args.profile))
        tasks_path.parent.mkdir(parents=True, exist_ok=True)
        tasks.to_parquet(tasks_path, index=False)
    run_dir = work / f"filter-{args.device}-s{args.seed}-n{args.n}"
    skip = [s.strip() for s in args.skip.split(",") if s.strip()]
    settings = FilterSettings(device=args.device, timeout_s=args.timeout_s, skip=skip,
                              runtime_window_ms=resolve_window(args.device, None))
    t0 = time.perf_counter()
    res = run_filter(tasks_path, run_dir, settings, workers=args.workers, progress=True)
    wall = time.perf_counter() - t0
    summary = summarise(_records(run_dir), tasks, args.sample, args.seed)
    result = {
        "n": args.n, "seed": args.seed, "profile": args.profile, "device": args.device, "skip": skip,
        "wall_s": round(wall, 1), "seconds_by_filter": {k: v["seconds_total"] for k, v in
                                                        res.funnel["by_filter"].items()},
        **summary,
    }
    path = record.write_file(args.out, result) if args.out else record.write(args.name, result)
    print(f"wrote {path}")
    printable = {k: v for k, v in result.items() if k != "accepted_sample"}
    print(json.dumps(printable, indent=2, default=str))
    for ex in result["accepted_sample"]:
        print(f"{ex['task_id']}: {' -> '.join(map(str, ex['ops']))}")


if __name__ == "__main__":
    main()
