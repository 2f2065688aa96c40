"""Device probe of the warm grader (harness.warm): N evaluations of one harness solution in a row in one thread,
then the grader process's log. python3 benchmarks/device/warm_probe.py [N]"""
import sys
import time
from pathlib import Path

from opforge.harness.dataset import get_task, load_tasks
from opforge.harness.evaluate import EvalConfig, evaluate
from opforge.harness.solution import Solution

root = Path("benchmarks/harness_solutions")
tasks = load_tasks(root / "tasks.jsonl")
n = int(sys.argv[1]) if len(sys.argv) > 1 else 4
for i in range(n):
    tid = tasks.index[i % len(tasks)] if "--mix" in sys.argv else tasks.index[0]
    t0 = time.perf_counter()
    r = evaluate(get_task(tasks, tid), Solution.from_dir(root / tid), EvalConfig(device="cuda"))
    print(i, tid, r.status, r.reward, "warm", r.warm_reference, round(time.perf_counter() - t0, 2), r.phases_s,
          r.speedup_eager, r.speedup_compile, (r.error or "")[:300], flush=True)
    import glob

    for log in glob.glob("/tmp/opforge-tmp-*/opforge-grader-*/grader.log"):
        print("   grader log:", Path(log).read_text()[-700:].replace("\n", "\n   "), flush=True)
