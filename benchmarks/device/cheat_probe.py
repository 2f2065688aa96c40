"""Two cheats of the reward batch (``zeros``, ``torch_ops``; no build), each evaluated alone N times in a row on CUDA
through the shipped grader process: the grader's phases per evaluation, to tell an evaluation's own cost from what a batch's neighbours add.

    python3 benchmarks/device/cheat_probe.py N        # prints one JSON line per evaluation
"""

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness_bench import CHEAT_BODIES, _cheat  # noqa: E402
from opforge.harness.dataset import get_task, load_tasks  # noqa: E402
from opforge.harness.evaluate import EvalConfig, evaluate  # noqa: E402
from opforge.harness.solution import Solution  # noqa: E402

if __name__ == "__main__":
    tasks = load_tasks(ROOT / "harness_solutions" / "tasks.jsonl")
    row = get_task(tasks, tasks.index[0])
    for kind in ("zeros", "torch_ops"):
        for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 2):
            t0 = time.perf_counter()
            res = evaluate(row, Solution(_cheat(CHEAT_BODIES[kind])), EvalConfig(device="cuda"))
            print(json.dumps({"kind": kind, "status": res.status, "wall_s": round(time.perf_counter() - t0, 2),
                              "phases_s": res.phases_s}), flush=True)
