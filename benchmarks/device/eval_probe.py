"""One CUDA evaluation of a hand-written solution (benchmarks/harness_solutions), with the time of each step:
a probe of the grader on a GPU machine, run by ``benchmarks/device/eval_probe.sh`` (which dumps the process
tree, lock and budget files and every process's Python stacks when it overruns).

    python benchmarks/device/eval_probe.py --work DIR [--in-process] [--repeat N]

``--in-process``: the grader in this process (``harness.evaluate.GRADER_IN_CHILD`` off), to tell the grader's
own process apart from the rest. Prints one JSON line per evaluation (status, reward, error, seconds).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "harness_solutions"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--in-process", action="store_true")
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    import importlib

    ev = importlib.import_module("opforge.harness.evaluate")
    from opforge.harness.dataset import get_task, load_tasks
    from opforge.harness.solution import Solution

    if args.in_process:
        ev.GRADER_IN_CHILD["cuda"] = False
    tasks = load_tasks(ROOT / "tasks.jsonl")
    tid = tasks.index[0]
    for i in range(args.repeat):
        t0 = time.perf_counter()
        res = ev.evaluate(get_task(tasks, tid), Solution.from_dir(ROOT / tid), ev.EvalConfig(device="cuda"),
                          build_root=args.work / "ext", work_dir=args.work / f"eval{i}")
        print(json.dumps({"i": i, "in_process": args.in_process, "wall_s": round(time.perf_counter() - t0, 2),
                          **{k: getattr(res, k) for k in ("status", "reward", "error", "build_s", "verify_s",
                                                          "profile_s", "eager_ms", "candidate_ms", "compile_ms")}},
                         default=str), flush=True)


if __name__ == "__main__":
    main()
