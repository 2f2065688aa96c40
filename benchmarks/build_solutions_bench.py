"""Cold build time of real solutions, one at a time: the build a trainer's reward pays per distinct completion.

    python benchmarks/build_solutions_bench.py                 # -> results/<machine>/build_solutions.json
    python benchmarks/build_solutions_bench.py --full 4        # also 4 of them with the full torch headers

Every solution folder (``model_new.py`` + ``kernels/``) under ``--solutions`` (default the gold subset's,
``releases/gold-solutions``, and ``benchmarks/harness_solutions``) is built with ``harness.build.build_extension``
into an empty module and object cache, one after the other, on the toolchain of this machine (made first, timed
apart: once per torch, compiler and GPU, ``opforge harness toolchain``). Per solution: wall seconds, its ``.cu`` and
C++ source counts, the route the build log names (``light``: the light torch headers, ``full``: torch's own;
``cached``: the same sources as a solution built before it, not timed) and whether it built; the p50 / p90 over all and over the one-``.cu`` solutions. ``--full N``: the first N are built
again with the light headers off (``OPFORGE_BUILD_LITE=0``), into another empty cache, for the comparison.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import record

ROOT = Path(__file__).resolve().parents[1]


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def _build_all(folders: list[Path], lite: bool) -> list[dict]:
    from opforge.harness.build import build_extension
    from opforge.harness.solution import Solution

    os.environ["OPFORGE_BUILD_LITE"] = "1" if lite else "0"
    root = Path(tempfile.mkdtemp(prefix="opforge-buildbench-"))
    rows = []
    for folder in folders:
        sol = Solution.from_dir(folder)
        t0 = time.perf_counter()
        res = build_extension(sol, root)
        wall = time.perf_counter() - t0
        log = Path(res.log).read_text(errors="replace") if res.log and Path(res.log).is_file() else ""
        route = ("cached" if res.cached else  # the same sources as a solution built before it (not timed)
                 "light" if "light headers:" in log and "full torch headers" not in log else "full")
        why = next((line.split("light headers: ", 1)[1] for line in log.splitlines()
                    if line.startswith("light headers: not tried") or "needs more of torch" in line), None)
        rows.append({"solution": folder.name, "ok": res.ok, "seconds": round(wall, 2), "route": route,
                     "cu": sum(r.endswith(".cu") for r in sol.sources), "cpp": sum(r.endswith(".cpp") for r in sol.sources),
                     "fallback_reason": why, "error": (res.error or "")[-300:] or None})
        print(rows[-1], flush=True)
    return rows


def _summary(rows: list[dict]) -> dict:
    ok = [r for r in rows if r["ok"] and r["route"] != "cached"]
    one_cu = [r["seconds"] for r in ok if r["cu"] == 1]
    every = [r["seconds"] for r in ok]
    return {"solutions": len(rows), "built": len(ok), "routes": {k: sum(r["route"] == k for r in rows) for k in ("light", "full", "cached")},
            "p50_s": _quantile(every, 0.5), "p90_s": _quantile(every, 0.9), "max_s": max(every, default=None),
            "one_cu_solutions": len(one_cu), "one_cu_p50_s": _quantile(one_cu, 0.5),
            "one_cu_p90_s": _quantile(one_cu, 0.9), "mean_s": statistics.fmean(every) if every else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--solutions", type=Path, nargs="*",
                    default=[ROOT / "releases" / "gold-solutions", ROOT / "benchmarks" / "harness_solutions"])
    ap.add_argument("--full", type=int, default=0, help="also build the first N with the full torch headers")
    ap.add_argument("--name", default="build_solutions")
    ap.add_argument("--out", help="write the result here instead of results/<machine>/NAME.json")
    args = ap.parse_args()
    from opforge.harness.solution import Solution
    from opforge.harness.toolchain import ensure_toolchain

    folders = sorted(p for base in args.solutions for p in base.iterdir()
                     if p.is_dir() and (p / "model_new.py").is_file() and Solution.from_dir(p).sources)
    flavour = "cuda" if any(r.endswith(".cu") for f in folders for r in Solution.from_dir(f).sources) else "cpu"
    t0 = time.perf_counter()
    tc = ensure_toolchain(flavour)
    out: dict = {"benchmark": "build_solutions", "toolchain": {"flavour": flavour, "seconds_now": round(time.perf_counter() - t0, 2),
                                                                "made_in_s": round(tc["seconds"], 2),
                                                                "light": bool(tc.get("lite_binding_obj"))}}
    rows = _build_all(folders, lite=True)
    out["light"] = {"summary": _summary(rows), "rows": rows}
    if args.full:
        full = _build_all(folders[: args.full], lite=False)
        out["full_headers"] = {"summary": _summary(full), "rows": full}
    print(out["light"]["summary"], out.get("full_headers", {}).get("summary"), flush=True)
    if args.out:
        record.write_file(args.out, out)
    else:
        record.write(args.name, out)


if __name__ == "__main__":
    main()
