"""The naive way to filter tasks, for the throughput comparison of issue #7: one process, one task at a time.

    python benchmarks/naive_baseline.py TASKS.parquet --limit 100 --out naive.json [--device cuda]
        [--task-timeout-s 60] [--max-seconds 300]

Per task: exec the source, build the model and inputs on the device, one eager forward, ``torch.compile``
(Inductor, default settings) and one compiled forward, then time eager and compiled (CUDA events, 3
warm-up + 10 timed calls, median: the defaults of KernelBench's ``time_execution_with_cuda_event``) - what
KernelBench-style scripts do, with no sandbox, no parallelism and none of opforge's extra checks. The
tasks run one at a time in one worker process; a task that raises is counted and skipped; one that runs
past ``--task-timeout-s`` (the same limit as opforge's ``--timeout-s``) counts as failed: the worker is
killed and a fresh one takes the next task, its start (importing torch, CUDA context) counted in the
wall time as opforge's sandbox restarts are. (An in-process ``SIGALRM`` was not enough: it is handled
only between Python bytecodes, and one task ran 200 s under a 60 s limit inside a C++ call.) The loop
stops starting tasks after ``--max-seconds``. Writes tasks/min over the finished tasks, per-task seconds
and where they went (build, eager, compile, timing).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import time

import pandas as pd
import record  # noqa: E402 - benchmarks/record.py, beside this script
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


def _worker(conn, device: str) -> None:
    """Worker process: says "ready" once torch (and the CUDA context) is up, then runs each task source
    received on ``conn`` and sends back (result, phases); None ends it."""
    torch.empty(1, device=device)
    conn.send("ready")
    while True:
        code = conn.recv()
        if code is None:
            return
        phases: dict = {}
        try:
            res = run_one(code, device, phases)
        except Exception as exc:  # noqa: BLE001 - the naive loop skips failures
            res = {"error": f"{type(exc).__name__}: {str(exc)[:120]}"}
        try:
            torch._dynamo.reset()
            if device == "cuda":
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
        except Exception as exc:  # noqa: BLE001 - a broken CUDA context: this worker is done
            res.setdefault("error", f"CUDA unusable: {exc}")
            conn.send((res, phases))
            return
        conn.send((res, phases))


def _start_worker(device: str):
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_worker, args=(child, device), daemon=True)
    proc.start()
    if not parent.poll(300) or parent.recv() != "ready":  # start-up is not the next task's time
        raise RuntimeError("naive baseline: the worker process did not start")
    return proc, parent


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def run_one(code: str, device: str, phases: dict) -> dict:
    """One task the naive way; fills ``phases`` (seconds per phase) as it goes."""
    t = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal t
        _sync(device)
        now = time.perf_counter()
        phases[name] = round(now - t, 4)
        t = now

    ns: dict = {}
    exec(compile(code, "<task>", "exec"), ns)  # noqa: S102 - the baseline runs tasks the naive way
    with torch.device(device):
        model = ns["Model"](*ns["get_init_inputs"]()).eval()
        inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in ns["get_inputs"]()]
    lap("build")
    with torch.no_grad():
        model(*inputs)
        lap("eager")
        torch._dynamo.reset()
        compiled = torch.compile(model)
        compiled(*inputs)
        lap("compile")
        eager_ms = _time_ms(model, inputs, device)
        compile_ms = _time_ms(compiled, inputs, device)
        lap("timing")
    return {"eager_ms": eager_ms, "compile_ms": compile_ms}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("tasks")
    p.add_argument("--limit", type=int, default=100)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--task-timeout-s", type=int, default=60)
    p.add_argument("--max-seconds", type=float, default=None, help="start no task after this many seconds")
    p.add_argument("--out", help="write here instead of benchmarks/results/<machine>/naive_baseline.json")
    args = p.parse_args()
    df = pd.read_parquet(args.tasks).head(args.limit)
    per_task, failed = [], 0
    t0 = time.perf_counter()
    proc, conn = _start_worker(args.device)
    for row in df.itertuples():
        if args.max_seconds is not None and time.perf_counter() - t0 > args.max_seconds:
            break
        start = time.perf_counter()
        phases: dict = {}
        if not proc.is_alive():
            proc, conn = _start_worker(args.device)
        conn.send(row.code)
        try:
            if not conn.poll(args.task_timeout_s):
                raise TimeoutError(f"task ran past --task-timeout-s ({args.task_timeout_s} s): worker killed")
            res, phases = conn.recv()
        except (TimeoutError, EOFError, OSError) as exc:
            proc.kill()
            proc.join()
            res = {"error": f"{type(exc).__name__}: {str(exc)[:120] or 'worker died'}"}
            proc, conn = _start_worker(args.device)
        failed += "error" in res
        per_task.append({"task_id": row.task_id, "seconds": time.perf_counter() - start, "phases": phases, **res})
        print(f"{len(per_task)}/{len(df)} {per_task[-1]['seconds']:.2f}s", flush=True)
        _write(args, per_task, failed, time.perf_counter() - t0)
    if proc.is_alive():
        conn.send(None)
        proc.join(10)
    out = _write(args, per_task, failed, time.perf_counter() - t0)
    print(json.dumps({k: v for k, v in out.items() if k != "per_task"}), flush=True)


def _write(args, per_task: list, failed: int, wall: float) -> dict:
    """Write the result file (after every task, so a killed baseline still leaves its numbers)."""
    secs = [t["seconds"] for t in per_task] or [0.0]
    phase_total: dict = {}
    for t in per_task:
        for k, v in t["phases"].items():
            phase_total[k] = round(phase_total.get(k, 0.0) + v, 2)
    out = {"tasks": len(per_task), "failed": failed, "wall_s": round(wall, 1),
           "tasks_per_min": round(60 * len(per_task) / wall, 2) if wall else None,
           "median_s": round(statistics.median(secs), 3), "mean_s": round(statistics.mean(secs), 3),
           "seconds_by_phase": phase_total, "device": args.device, "task_timeout_s": args.task_timeout_s,
           "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None, "per_task": per_task}
    print(f"wrote {record.write_file(args.out, out) if args.out else record.write('naive_baseline', out)}")
    return out


if __name__ == "__main__":
    main()
