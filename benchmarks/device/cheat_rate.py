"""Device probe: grading throughput without builds. N pure-PyTorch cheats (zeros, returns_input) over the harness
tasks, scored by evaluate_many on a local cluster with --workers evaluation threads; prints the finished count
every 5 s. python3 benchmarks/device/cheat_rate.py N WORKERS LEDGER"""
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness_bench import CHEAT_BODIES, ROOT, _cheat  # noqa: E402
from opforge.engine.cluster import open_cluster  # noqa: E402
from opforge.harness.batch import evaluate_many  # noqa: E402
from opforge.harness.dataset import get_task, load_tasks  # noqa: E402
from opforge.harness.evaluate import EvalConfig  # noqa: E402


def main() -> None:
    n, workers, ledger = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    tasks = load_tasks(ROOT / "tasks.jsonl")
    kinds = ["zeros", "returns_input"]
    pairs = [({**get_task(tasks, tasks.index[i % len(tasks)]), "task_id": f"{tasks.index[i % len(tasks)]}"},
              {"model_new.py": _cheat(CHEAT_BODIES[kinds[(i // len(tasks)) % 2]])["model_new.py"] + f"# {i}\n"})
             for i in range(n)]
    handle = open_cluster("cuda", workers)
    t0 = time.perf_counter()
    stop = threading.Event()


    def watch():
        while not stop.wait(5):
            done = len(ledger.read_text().splitlines()) if ledger.exists() else 0
            print(f"t={time.perf_counter() - t0:.0f}s done={done}", flush=True)


    threading.Thread(target=watch, daemon=True).start()
    res = evaluate_many(pairs, EvalConfig(device="cuda"), client=handle.client, results_path=ledger, progress=False)
    stop.set()
    wall = time.perf_counter() - t0
    print({"n": n, "wall_s": round(wall, 1), "per_min": round(60 * n / wall, 1),
           "status": {s: sum(r["status"] == s for r in res) for s in {r["status"] for r in res}},
           "warm": sum(bool(r.get("warm_reference")) for r in res),
           "phases": [r.get("phases_s") for r in res[-4:]]}, flush=True)
    handle.close()


if __name__ == "__main__":
    main()
