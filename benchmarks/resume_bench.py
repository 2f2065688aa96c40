"""Resuming a run: the client's seconds per round when ``opforge run`` reads its finished rounds back.

A run that is stopped (a device call's time limit, a kill) and started again redoes no verdict, but reads its
rounds back one by one, as the first run decided them: each round's candidates, the corpus filters over all
candidates so far, the verdict table and the selection. This measures that read-back on CPU:

1. a run of ``--rounds`` rounds of ``--round-size`` candidates (``--device-profile test``, the cheap filters
   only: no compile, timing, KernelBench or triviality check), stopped by its candidate budget after the last
   round (built once; an existing finished run directory is reused);
2. the same command again on the finished run directory: every verdict is in the ledger, so it is the
   read-back plus the publication.

Records the wall of both runs and, of the second, ``run.json``'s ``client_rounds`` (per round: feeding the
round, its result phase and the wait for verdicts inside it, the selection) and its seconds per stage.

Usage: python benchmarks/resume_bench.py --catalog CATALOG [--rounds 8] [--round-size 400] [--workers 2]
           [--dir /tmp/resume_bench]
Writes benchmarks/results/<machine>/resume.json (``record.write``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import record
from opforge.pipeline.run import run_pipeline
from opforge.pipeline.run_config import RunConfig
from opforge.pipeline.timeline import outside_wait_s

# Filters left out: those that compile, time or need the KernelBench reference, so that building the run costs
# minutes on two cores; the read-back does the same work whichever filters decided the verdicts.
SKIP = ["compile", "contamination", "determinism", "runtime", "runtime_screen", "trivial", "headroom"]


def _config(args) -> RunConfig:
    return RunConfig(target=10 * args.rounds * args.round_size, out=args.dir, device="cpu", seed=11,
                     seeds_catalog=args.catalog, device_profile="test", round_size=args.round_size,
                     candidate_budget=args.rounds * args.round_size, workers=args.workers, timeout_s=120,
                     skip_filters=SKIP)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--catalog", required=True, type=Path)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--round-size", type=int, default=400)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/resume_bench"))
    ap.add_argument("--fresh", action="store_true", help="build the run again even when the directory has one")
    args = ap.parse_args(argv)
    if args.fresh and args.dir.exists():
        shutil.rmtree(args.dir)
    cfg = _config(args)
    out: dict = {"benchmark": "resuming a finished run: the client's read-back of its rounds",
                 "rounds": args.rounds, "round_size": args.round_size, "workers": args.workers, "skip": SKIP}
    first = None
    if not (args.dir / "run.json").exists():
        t0 = time.perf_counter()
        res = run_pipeline(cfg, progress=False)
        first = {"wall_s": round(time.perf_counter() - t0, 1), "stop_reason": res.stop_reason,
                 "candidates": res.candidates, "accepted": res.accepted}
    out["first_run"] = first or "reused an existing finished run directory"
    t0 = time.perf_counter()
    res = run_pipeline(cfg, progress=False)
    wall = time.perf_counter() - t0
    run = json.loads((args.dir / "run.json").read_text())
    rounds = run["timeline"]["client_rounds"]
    out["resumed_run"] = {"wall_s": round(wall, 1), "candidates": res.candidates, "accepted": res.accepted,
                          "seconds": run["seconds"], "client_rounds": rounds,
                          "outside_wait_s_per_round": outside_wait_s(rounds)}
    path = record.write("resume", out)
    print(json.dumps(out["resumed_run"], indent=1))
    print(f"written to {path}")


if __name__ == "__main__":
    main()
