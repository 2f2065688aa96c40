"""CPU throughput of a host under N concurrent single-threaded Python processes (the sandboxes' CPU work is
Python-heavy: Inductor compile, tracing, building models). Prints the host's CPU topology and, for each N, the
aggregate work rate relative to one process: a host whose rate stops growing at N has about N cores' worth of
throughput for this work, whatever ``nproc`` says.

    python3 benchmarks/device/cpu_scaling.py [--work 3000000] [--counts 1,8,16,...]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import time


def _work(n: int) -> float:
    t = time.perf_counter()
    acc = 0
    d: dict[int, int] = {}
    for i in range(n):
        acc += i * i % 7
        if i % 16 == 0:
            d[i % 1024] = acc
    return time.perf_counter() - t


def _topology() -> dict:
    out: dict = {"nproc": os.cpu_count(), "affinity": len(os.sched_getaffinity(0))}
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        keep = ("Model name", "Thread(s) per core", "Core(s) per socket", "Socket(s)", "NUMA node(s)", "CPU MHz",
                "Hypervisor vendor", "L3 cache")
        out["lscpu"] = {k.strip(): v.strip() for k, _, v in (ln.partition(":") for ln in text.splitlines())
                        if k.strip() in keep}
    except (OSError, subprocess.SubprocessError) as exc:
        out["lscpu_error"] = str(exc)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", type=int, default=3_000_000)
    ap.add_argument("--counts", default="")
    a = ap.parse_args()
    n_cpu = len(os.sched_getaffinity(0))
    counts = [int(x) for x in a.counts.split(",") if x] or sorted({1, 4, 8, 16, 24, 32, 48, 56, 64, n_cpu} & set(
        range(1, n_cpu + 1)))
    res = {"topology": _topology(), "work": a.work, "runs": []}
    base = None
    ctx = mp.get_context("fork")
    for n in counts:
        with ctx.Pool(n) as pool:
            t0 = time.perf_counter()
            times = pool.map(_work, [a.work] * n, chunksize=1)
            wall = time.perf_counter() - t0
        rate = n * a.work / wall
        base = base or rate
        res["runs"].append({"procs": n, "wall_s": round(wall, 3), "per_proc_s_p50": round(sorted(times)[n // 2], 3),
                            "rate_vs_one": round(rate / base, 2)})
        print(json.dumps(res["runs"][-1]), flush=True)
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
