"""One CUDA evaluation of a hand-written solution (benchmarks/harness_solutions), with the time of each step:
a probe of the grader on a GPU machine, run by ``benchmarks/device/eval_probe.sh`` (which dumps the process
tree, lock and budget files and every process's Python stacks when it overruns).

    python benchmarks/device/eval_probe.py --work DIR [--in-process] [--repeat N] [--case harness|redteam]

``--in-process``: the grader in this process (``harness.evaluate.GRADER_IN_CHILD`` off), to tell the grader's
own process apart from the rest. ``--case redteam``: the GPU red-team suite's small task and honest CUDA
control (tests/redteam) instead of the first hand-written solution. Prints one JSON line per evaluation (status, reward, error, seconds).
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
    ap.add_argument("--case", choices=["harness", "redteam"], default="harness")
    args = ap.parse_args()
    import importlib

    ev = importlib.import_module("opforge.harness.evaluate")
    from opforge.harness.dataset import get_task, load_tasks
    from opforge.harness.solution import Solution

    if args.in_process:
        ev.GRADER_IN_CHILD["cuda"] = False
    if args.case == "redteam":
        import sys

        sys.path.insert(0, str(ROOT.parents[1]))
        from tests.redteam.solutions_cuda import CUDA_HONEST
        from tests.test_grader_redteam import ROW

        task, solution = ROW, Solution(CUDA_HONEST)
    else:
        tasks = load_tasks(ROOT / "tasks.jsonl")
        task, solution = get_task(tasks, tasks.index[0]), Solution.from_dir(ROOT / tasks.index[0])
    for i in range(args.repeat):
        t0 = time.perf_counter()
        res = ev.evaluate(task, solution, ev.EvalConfig(device="cuda"),
                          build_root=args.work / "ext", work_dir=args.work / f"eval{i}")
        print(json.dumps({"i": i, "in_process": args.in_process, "wall_s": round(time.perf_counter() - t0, 2),
                          **{k: getattr(res, k) for k in ("status", "reward", "error", "build_s", "verify_s",
                                                          "profile_s", "eager_ms", "candidate_ms", "compile_ms")}},
                         default=str), flush=True)


if __name__ == "__main__":
    main()
