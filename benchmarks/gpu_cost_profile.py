"""Where a task's GPU time goes in the filter chain: per filter, the wall seconds and the summed duration
of the GPU kernels it launched (CUPTI, through ``torch.profiler``), one process, one task at a time.

Run on the lent GPU machine (after ``. benchmarks/device/device_setup.sh``):
    python3 benchmarks/gpu_cost_profile.py CANDIDATES.parquet --limit 40 [--out cost.json] [--no-autotune-pointwise]   # default: results/<gpu>/cost_profile.json

The chain is eager, runtime_screen, determinism, degenerate, compile, runtime with the default CUDA window,
in-process (no sandbox, no neighbours), so the kernel sums are each filter's own GPU work. Profiling adds
wall time; the kernel sums are what matters. Output: per task and filter ``wall_s``, ``gpu_ms``,
``kernels``; totals and medians per filter.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import pyarrow.parquet as pq
import record  # noqa: E402 - benchmarks/record.py, beside this script
import torch
from torch.profiler import ProfilerActivity, profile


def _kernel_ms(prof) -> tuple[float, int]:
    total_us, n = 0.0, 0
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            total_us += e.device_time
            n += 1
    return total_us / 1e3, n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("candidates")
    ap.add_argument("--limit", type=int, default=40)
    ap.add_argument("--out", help="write here instead of benchmarks/results/<machine>/cost_profile.json")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu to check the script")
    ap.add_argument("--no-autotune-pointwise", action="store_true",
                    help="torch._inductor.config.triton.autotune_pointwise = False")
    args = ap.parse_args()

    from opforge.engine.execution import TaskRun
    from opforge.filters.chain import FilterSettings, make_chain

    if args.no_autotune_pointwise:
        torch._inductor.config.triton.autotune_pointwise = False
    settings = FilterSettings(device=args.device, runtime_window_ms=(1.0, 100.0) if args.device == "cuda" else None,
                              only=["eager", "runtime_screen", "determinism", "degenerate", "compile", "runtime"])
    chain = make_chain(settings)
    table = pq.read_table(args.candidates, columns=["task_id", "code"]).slice(0, args.limit).to_pylist()
    rows = []
    summary: dict = {}
    for i, row in enumerate(table):
        run = TaskRun(code=row["code"], task_id=row["task_id"], device=args.device)
        per = {}
        reason = None
        for f in chain:
            t = time.perf_counter()
            activity = ProfilerActivity.CUDA if args.device == "cuda" else ProfilerActivity.CPU
            with profile(activities=[activity]) as prof:
                try:
                    verdict = f.decide(f.score(run))
                except Exception as exc:  # noqa: BLE001 - a diagnostic: record and go on
                    verdict = None
                    reason = f"{f.name}:{type(exc).__name__}"
                if args.device == "cuda":
                    torch.cuda.synchronize()
            wall = time.perf_counter() - t
            gpu_ms, n = _kernel_ms(prof)
            per[f.name] = {"wall_s": round(wall, 4), "gpu_ms": round(gpu_ms, 3), "kernels": n}
            if verdict is not None and "autotune_cap_ms" in verdict.metrics:  # the compile filter's cap in force
                per[f.name]["autotune_cap_ms"] = verdict.metrics["autotune_cap_ms"]
            if verdict is None or not verdict.accepted:
                reason = reason or verdict.reason
                break
        run.release()
        rows.append({"task_id": row["task_id"], "reason": reason, "filters": per})
        print(i, row["task_id"], reason, {k: (v["wall_s"], v["gpu_ms"], v["kernels"]) for k, v in per.items()},
              flush=True)
        summary = _write(args, chain, rows)  # after every task: a run cut by its time limit keeps its rows
    print(json.dumps(summary, indent=1))


def _write(args, chain, rows: list[dict]) -> dict:
    """Write the JSON (summary per filter over ``rows``, and the rows) to ``args.out``; return the summary."""
    summary = {}
    for f in chain:
        got = [r["filters"][f.name] for r in rows if f.name in r["filters"]]
        if got:
            summary[f.name] = {"tasks": len(got),
                               "gpu_ms_sum": round(sum(g["gpu_ms"] for g in got), 1),
                               "gpu_ms_median": round(statistics.median(g["gpu_ms"] for g in got), 2),
                               "wall_s_sum": round(sum(g["wall_s"] for g in got), 2),
                               "kernels_median": statistics.median(g["kernels"] for g in got)}
    out = {"autotune_pointwise": not args.no_autotune_pointwise, "tasks": len(rows), "summary": summary,
           "rows": rows, "device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu", "torch": torch.__version__}
    record.write_file(args.out, out) if args.out else record.write("cost_profile", out)
    return summary


if __name__ == "__main__":
    main()
