"""Where one cheat's evaluation (``zeros`` / ``torch_ops`` of the reward batch, no build) spends its time on CUDA:
the grader run in this process (not its grader child) under cProfile, each request to a server timed.

    python3 benchmarks/device/cheat_profile.py          # prints the requests and the profile's top entries
"""

import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness_bench import CHEAT_BODIES, _cheat  # noqa: E402
from opforge.harness import evaluate as ev  # noqa: E402
from opforge.harness import grader as gr  # noqa: E402
from opforge.harness.dataset import get_task, load_tasks  # noqa: E402
from opforge.harness.solution import Solution  # noqa: E402

if __name__ == "__main__":
    tasks = load_tasks(ROOT / "harness_solutions" / "tasks.jsonl")
    row = get_task(tasks, tasks.index[0])
    ev.GRADER_IN_CHILD["cuda"] = False
    asks = []
    plain_ask = gr.Grader._ask

    def timed_ask(self, server, msg, blob=None, limit_s=None):
        t0 = time.perf_counter()
        try:
            return plain_ask(self, server, msg, blob, limit_s)
        finally:
            asks.append((server.role if hasattr(server, "role") else "?", msg.get("op"), msg.get("target"),
                         round(time.perf_counter() - t0, 3)))

    gr.Grader._ask = timed_ask
    # the servers' imports (python -X importtime, in their logs): the slowest ones of each server, before teardown
    gr.SERVER_ENV = {**gr.SERVER_ENV, "PYTHONPROFILEIMPORTTIME": "1"}
    plain_teardown = gr.Grader._teardown

    def teardown(self, *args, **kwargs):
        for role, log in self.logs.items():
            rows = []
            for line in Path(log).read_text(errors="replace").splitlines():
                parts = line.split("|")
                if line.startswith("import time:") and len(parts) == 3 and parts[1].strip().isdigit():
                    rows.append((int(parts[1]), parts[2].rstrip()))
            rows.sort(reverse=True)
            print(f"   {role}: {len(rows)} imports, slowest (cumulative us):", flush=True)
            for us, name in rows[:12]:
                print(f"      {us:>9} {name}", flush=True)
        return plain_teardown(self, *args, **kwargs)

    gr.Grader._teardown = teardown
    for kind in sys.argv[1:] or ["torch_ops", "zeros"]:
        asks.clear()
        prof = cProfile.Profile()
        t0 = time.perf_counter()
        prof.enable()
        res = ev.evaluate(row, Solution(_cheat(CHEAT_BODIES[kind])), ev.EvalConfig(device="cuda"))
        prof.disable()
        print(f"== {kind}: {res.status} in {time.perf_counter() - t0:.2f} s, phases {res.phases_s}", flush=True)
        for a in asks:
            print("   ask", a, flush=True)
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(40)
        print("\n".join(line[:160] for line in s.getvalue().splitlines()[:70]), flush=True)
