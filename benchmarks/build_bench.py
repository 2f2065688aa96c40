"""Extension build time: opforge's build (``harness.build``) against a plain ``torch.utils.cpp_extension.load`` of
the same sources, timed in the same run.

    python benchmarks/build_bench.py                      # -> results/<machine>/build.json
    python benchmarks/build_bench.py --cold-toolchain     # also make the toolchain inside the timed run

The solution is a small honest C++ one in the workspace's format (``kernels/fused.cpp`` registers
``fused_scale_relu`` with ``OPFORGE_EXPORT``; ``tests/harness_cases.py``'s kernel), so the sources are that file
plus the harness's fixed ``kernels/binding.cpp`` and ``kernels/registry.h``. Steps, each in a fresh child
process:

1. ``load``: ``torch.utils.cpp_extension.load(sources=[fused.cpp, binding.cpp], extra_cflags=["-O3"])`` into an
   empty folder (what opforge did before, and what KernelBench's ``load_inline`` does).
2. ``toolchain``: ``harness.toolchain.ensure_toolchain("cpu")`` (once per torch, compiler and GPU: the
   precompiled header and the fixed binding's object; 0 when it was already made). With ``--cold-toolchain`` a
   fresh toolchain folder is used and this step is timed as part of opforge's cold build.
3. ``opforge_cold``: ``build_extension`` with an empty extension cache (no module, no object).
4. ``opforge_edit`` (``--edit``): the same after a one-character change of ``fused.cpp`` (the object cache holds the old
   source's object; the changed source is compiled again).
5. ``opforge_cached``: the unchanged solution again (the module from the cache).

Wall seconds and the CPU seconds of each step's processes (user + system of the child and the compilers it
waited for), and the machine's load average before and after (this 2-core machine is shared: wall times move
with the load, CPU seconds much less).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import record

ROOT = Path(__file__).resolve().parents[1]


def solution_files() -> dict[str, str]:
    sys.path.insert(0, str(ROOT))
    from tests.harness_cases import EXPORT_KERNEL, HONEST

    return {"model_new.py": HONEST["model_new.py"], "kernels/fused.cpp": EXPORT_KERNEL}


def timed(code: str, env: dict[str, str] | None = None) -> dict:
    """Run ``python -c code`` (it prints one JSON line last); wall and CPU seconds of it and its children."""
    t0, r0 = time.perf_counter(), os.times()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, **(env or {})})
    wall, r1 = time.perf_counter() - t0, os.times()
    if proc.returncode:
        raise SystemExit(f"step failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"wall_s": round(wall, 2), "cpu_s": round(r1.children_user + r1.children_system
                                                      - r0.children_user - r0.children_system, 2), **out}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cold-toolchain", action="store_true", help="a fresh toolchain folder, timed with the cold build")
    ap.add_argument("--edit", action="store_true", help="also time step 4 (a one-character change)")
    ap.add_argument("--name", default="build")
    ap.add_argument("--out", help="write the result here instead of results/<machine>/NAME.json")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="opforge-build-bench-"))
    files = solution_files()
    from opforge.harness.build import extension_sources
    from opforge.harness.solution import Solution

    sources = extension_sources(Solution(files))
    src = work / "load_src"
    for rel, text in sources.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text)
    tc_root = str(work / "toolchain") if args.cold_toolchain else ""
    load_avg = [os.getloadavg()]
    steps: dict[str, dict] = {}
    tc_code = ("import json; from opforge.harness.toolchain import ensure_toolchain; "
               f"r = ensure_toolchain('cpu', {tc_root!r} or None, log=open('/dev/null', 'w')); "
               "print(json.dumps({'made_s': r['seconds'], 'dir': r['dir']}))")
    cu = [str(src / "kernels/fused.cpp"), str(src / "kernels/binding.cpp")]
    (work / "load_build").mkdir()
    steps["load"] = timed(
        "import json, os, sys; os.environ['PATH'] = os.path.dirname(sys.executable) + ':' + os.environ['PATH']; "
        "from torch.utils.cpp_extension import load; "
        f"load(name='opforge_kernels', sources={cu!r}, build_directory={str(work / 'load_build')!r}, "
        "extra_cflags=['-O3'], with_cuda=False); print(json.dumps({'ok': True}))")
    print("load", steps["load"], flush=True)
    if not args.cold_toolchain:
        steps["toolchain"] = timed(tc_code)
        print("toolchain", steps["toolchain"], flush=True)
    build_root = str(work / "extensions")

    def opforge(name: str, sol: dict[str, str]) -> None:
        steps[name] = timed(
            "import json; from opforge.harness.build import build_extension; "
            "from opforge.harness.solution import Solution; "
            f"r = build_extension(Solution({sol!r}), {build_root!r}, toolchain_root={tc_root!r} or None); "
            "print(json.dumps({'ok': r.ok, 'cached': r.cached, 'error': r.error, 'module': r.module_path, "
            "'build_s': r.seconds}))")
        if not steps[name]["ok"]:
            raise SystemExit(f"{name}: build failed: {steps[name]['error']}")
        print(name, steps[name], flush=True)

    opforge("opforge_cold", files)
    edited = dict(files, **{"kernels/fused.cpp": files["kernels/fused.cpp"].replace("1.0f;", "2.0f;", 1)})
    if args.edit:
        opforge("opforge_edit", edited)
    opforge("opforge_cached", edited if args.edit else files)
    load_avg.append(os.getloadavg())
    ratio = {k: steps["opforge_cold"][k] / steps["load"][k] for k in ("wall_s", "cpu_s")}
    out = {"solution": {"files": sorted(sources), "kernel": "tests/harness_cases.py EXPORT_KERNEL"},
           "cold_toolchain": args.cold_toolchain, "steps": steps,
           "opforge_cold_over_load": {k: round(v, 3) for k, v in ratio.items()},
           "load_average_1_5_15": [list(a) for a in load_avg], "cpus": os.cpu_count()}
    print(json.dumps(out["opforge_cold_over_load"]), flush=True)
    path = record.write_file(args.out, out) if args.out else record.write(args.name, out)
    print(path)
    shutil.rmtree(work, ignore_errors=True)  # the modules and build folders of the steps


if __name__ == "__main__":
    main()
