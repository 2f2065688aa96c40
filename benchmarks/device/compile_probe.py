"""Device probe of the reference server's first ``torch.compile`` in a fresh process: which of its one-time costs
can be paid before the fork (without initialising the CUDA driver, ``engine.forkserver``) or before the GPU
admission (without a CUDA context).

    python3 benchmarks/device/compile_probe.py OUT_DIR

Each step runs in a fresh process that has imported torch and torch._dynamo (a model server's preload), on the
harness solutions' tasks (``benchmarks/harness_solutions/tasks.jsonl``), with empty Inductor and Triton caches.
Per step: its seconds, whether the CUDA driver is initialised after it, and whether the device's primary CUDA
context is active. ``compile`` rows: the first compiled call of the first task and of the next one after the given
warm-up steps. Writes OUT_DIR/compile_probe.json.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

IMPORTS = ["torch._inductor.config", "torch._inductor.utils", "torch._inductor.codecache", "torch._inductor.lowering",
           "torch._inductor.graph", "torch._inductor.scheduler", "torch._inductor.compile_fx",
           "torch._inductor.codegen.triton", "torch._inductor.runtime.triton_heuristics", "triton",
           "triton.compiler", "torch._inductor.async_compile"]
CALLS = {
    "torch_key": "from torch._inductor.codecache import torch_key; torch_key()",
    "get_system": "from torch._inductor.codecache import CacheBase; CacheBase.get_system()",
    "joint_graph_init": "import torch._inductor.fx_passes.joint_graph as m; m.lazy_init()",
    "post_grad_init": "import torch._inductor.fx_passes.post_grad as m; m.lazy_init()",
    "pad_mm_init": "import torch._inductor.fx_passes.pad_mm as m; m._pad_mm_init()",
    "sfdp_init": "import torch._inductor.fx_passes.fuse_attention as m; m._sfdp_init()",
    "device_properties": "torch.cuda.get_device_properties(0)",
    "triton_target": "import triton; triton.runtime.driver.active.get_current_target()",
}

CHILD = r"""
import ctypes, json, os, sys, time
import torch, torch._dynamo
import opforge.harness.server, opforge.harness.reference_process, opforge.harness.candidate_process
from opforge.engine.forkserver import _cuda_initialised
steps, calls, compile_tasks = json.loads(sys.argv[1])

def context_active():
    with open("/proc/self/maps") as fh:
        paths = {line.split()[-1] for line in fh if "libcuda.so" in line}
    for path in paths:
        lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD)
        dev, flags, active = ctypes.c_int(0), ctypes.c_uint(0), ctypes.c_int(0)
        if lib.cuDeviceGet(ctypes.byref(dev), 0) != 0:
            return None
        lib.cuDevicePrimaryCtxGetState(dev, ctypes.byref(flags), ctypes.byref(active))
        return bool(active.value)
    return False

rows = []
for step in steps:
    t0 = time.perf_counter()
    err = None
    try:
        if step in calls:
            exec(calls[step])
        else:
            __import__(step)
    except Exception as exc:
        err = f"{type(exc).__name__}: {exc}"[:300]
    rows.append({"step": step, "s": round(time.perf_counter() - t0, 3), "driver_init": _cuda_initialised(),
                 "context": context_active(), "error": err})
from opforge.task.source import load_task
tasks = [json.loads(l) for l in open("benchmarks/harness_solutions/tasks.jsonl")][:compile_tasks]
for r in tasks:
    task = load_task(r["code"], r["task_id"])
    with torch.device("cuda"):
        model = task.build()
        x = [v.to("cuda") if isinstance(v, torch.Tensor) else v for v in task.inputs()]
    model = model.cuda().eval()
    with torch.no_grad():
        model(*x)
    torch.cuda.synchronize()
    torch._dynamo.reset()
    t0 = time.perf_counter()
    with torch.no_grad():
        torch.compile(model)(*x)
    torch.cuda.synchronize()
    rows.append({"step": "compile:" + r["task_id"], "s": round(time.perf_counter() - t0, 3)})
    del model, x
    torch.cuda.empty_cache()
print("RESULT" + json.dumps(rows))
"""


def child(steps: list[str], compile_tasks: int = 0) -> list[dict]:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": tempfile.mkdtemp(prefix="probe-inductor-"),
           "TRITON_CACHE_DIR": tempfile.mkdtemp(prefix="probe-triton-")}
    p = subprocess.run([sys.executable, "-c", CHILD, json.dumps([steps, CALLS, compile_tasks])], env=env,
                       capture_output=True, text=True, timeout=200)
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT")), None)
    return json.loads(line[len("RESULT"):]) if line else [{"error": p.stderr[-2000:]}]


def main() -> None:
    out_dir = Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    result: dict = {}
    single = {f"import {m}": [m] for m in IMPORTS} | {f"call {c}": [c] for c in CALLS}
    with ThreadPoolExecutor(8) as pool:
        for name, rows in zip(single, pool.map(child, single.values()), strict=True):
            result[name] = rows
            print(name, json.dumps(rows), flush=True)
    cpu_calls = ["torch_key", "get_system", "joint_graph_init", "post_grad_init", "pad_mm_init", "sfdp_init"]
    for name, steps in {"compile, no warm-up": [], "compile after imports": IMPORTS,
                        "compile after imports and CPU calls": IMPORTS + cpu_calls,
                        "compile after everything": IMPORTS + cpu_calls + ["device_properties", "triton_target"]}.items():
        result[name] = child(steps, 2)
        print(name, json.dumps(result[name]), flush=True)
    (out_dir / "compile_probe.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
