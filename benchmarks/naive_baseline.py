"""The naive way to filter tasks, for the throughput comparison of issue #7: one process, one task at a time.

    python benchmarks/naive_baseline.py TASKS.parquet --limit 100 --out naive.json [--device cuda]

Per task: exec the source, build the model and inputs on the device, one eager forward, ``torch.compile``
(Inductor) and one compiled forward, then time eager and compiled (CUDA events, 3 warm-up + 10 timed calls,
median) - what KernelBench-style scripts do, with no sandbox, no parallelism and none of opforge's extra
checks. A task that raises is counted and skipped. Writes tasks/min and per-task seconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import pandas as pd
import torch


def _time_ms(fn, inputs, device: str, trials: int = 10) -> float:
    for _ in range(3):
        fn(*inputs)
    if device == "cuda":
        torch.cuda.synchronize()
        times = []
        for _ in range(trials):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(*inputs)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        return statistics.median(times)
    times = []
    for _ in range(trials):
        t0 = time.perf_counter()
        fn(*inputs)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def run_one(code: str, device: str) -> dict:
    ns: dict = {}
    exec(compile(code, "<task>", "exec"), ns)  # noqa: S102 - the baseline runs tasks the naive way
    with torch.device(device):
        model = ns["Model"](*ns["get_init_inputs"]()).eval()
        inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in ns["get_inputs"]()]
    with torch.no_grad():
        model(*inputs)
        torch._dynamo.reset()
        compiled = torch.compile(model)
        compiled(*inputs)
        eager_ms = _time_ms(model, inputs, device)
        compile_ms = _time_ms(compiled, inputs, device)
    return {"eager_ms": eager_ms, "compile_ms": compile_ms}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("tasks")
    p.add_argument("--limit", type=int, default=100)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", default="naive_baseline.json")
    args = p.parse_args()
    df = pd.read_parquet(args.tasks).head(args.limit)
    per_task, failed = [], 0
    t0 = time.perf_counter()
    for row in df.itertuples():
        start = time.perf_counter()
        try:
            res = run_one(row.code, args.device)
        except Exception as exc:  # noqa: BLE001 - the naive loop skips failures
            res = {"error": f"{type(exc).__name__}: {str(exc)[:120]}"}
            failed += 1
        if args.device == "cuda":
            torch.cuda.empty_cache()
        per_task.append({"task_id": row.task_id, "seconds": time.perf_counter() - start, **res})
        print(f"{len(per_task)}/{len(df)} {per_task[-1]['seconds']:.2f}s", flush=True)
    wall = time.perf_counter() - t0
    secs = [t["seconds"] for t in per_task]
    out = {"tasks": len(per_task), "failed": failed, "wall_s": round(wall, 1),
           "tasks_per_min": round(60 * len(per_task) / wall, 2), "median_s": round(statistics.median(secs), 3),
           "mean_s": round(statistics.mean(secs), 3), "device": args.device,
           "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None, "per_task": per_task}
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(json.dumps({k: v for k, v in out.items() if k != "per_task"}), flush=True)


if __name__ == "__main__":
    main()
