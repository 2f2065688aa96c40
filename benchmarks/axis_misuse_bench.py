"""Share of tasks whose forward runs an axis-wise op over the batch axis or rolls a flattened tensor
(``opforge.task.axis_misuse``), on CUDA-Agent-Ops-6K rows and on composed candidates.

For each dataset: rows checked, rows misused (share of the traced rows and of all rows), rows that could not
be traced on ``meta``, and the misuses counted by op (``softmax``, ``cumsum``, ``roll``...). Ops-6K rows are
named by their row index only (its rows are never copied); composed rows by ``task_id``, with a few examples.

Writes ``benchmarks/results/<machine>/axis_misuse.json`` (``record.write``).

Usage:
    python benchmarks/axis_misuse_bench.py --ops6k ../shared/reference/cuda_agent_ops_6k.parquet --n 500 \\
        --candidates before=/tmp/before.parquet --candidates after=/tmp/after.parquet
"""

from __future__ import annotations

import argparse
import re
import time
from collections import Counter
from pathlib import Path

import pandas as pd
import record  # noqa: E402 - benchmarks/record.py, beside this script
from opforge.task.axis_misuse import axis_misuse


def measure(codes: list[tuple[str, str]], examples: int = 5) -> dict:
    """``codes``: (row name, task source) pairs -> counts, shares, misuses per op and example rows."""
    t0 = time.perf_counter()
    misused, untraced, by_op, rows = 0, 0, Counter(), []
    untraced_why = Counter()
    for name, code in codes:
        check = axis_misuse(code, name)
        if check.misused is None:
            untraced += 1
            untraced_why[re.sub(r"\d+", "#", check.reason)[:90]] += 1
        elif check.misused:
            misused += 1
            for why in check.reasons:
                by_op[why.split(" ")[0] if not why.startswith("roll without") else "roll (flattened)"] += 1
            if len(rows) < examples:
                rows.append({"row": name, "reasons": check.reasons})
    n = len(codes)
    traced = n - untraced
    return {"rows": n, "misused": misused, "untraced": untraced,
            "share_of_traced": round(misused / traced, 4) if traced else None,
            "share_of_all": round(misused / n, 4) if n else None,
            "misuses_by_op": dict(by_op.most_common()), "untraced_reasons": dict(untraced_why.most_common(8)),
            "examples": rows, "seconds": round(time.perf_counter() - t0, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops6k", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "reference"
                    / "cuda_agent_ops_6k.parquet")
    ap.add_argument("--n", type=int, default=500, help="Ops-6K rows checked (a seeded random sample)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--candidates", action="append", default=[],
                    help="NAME=PATH of a candidates / published Parquet (column code, and task_id when present)")
    ap.add_argument("--note", action="append", default=[], help="NAME=TEXT: how a candidates file was made")
    args = ap.parse_args()
    out: dict = {"datasets": {}}
    if args.ops6k and args.n > 0:
        df = pd.read_parquet(args.ops6k, columns=["code"]).sample(n=args.n, random_state=args.seed)
        out["datasets"]["ops6k"] = {"source": str(args.ops6k.name), "sample_seed": args.seed,
                                    **measure([(f"row {i}", c) for i, c in zip(df.index, df.code, strict=True)])}
    notes = dict(n.split("=", 1) for n in args.note)
    for spec in args.candidates:
        name, path = spec.split("=", 1)
        df = pd.read_parquet(path)
        ids = df.task_id if "task_id" in df else [f"row {i}" for i in df.index]
        out["datasets"][name] = {"source": Path(path).name, "note": notes.get(name, ""),
                                 **measure(list(zip(ids, df.code, strict=True)))}
    for name, d in out["datasets"].items():
        print(f"{name}: {d['misused']}/{d['rows']} misused ({d['share_of_all']:.1%} of all, "
              f"{d['untraced']} untraced) {d['misuses_by_op']}")
    print(record.write("axis_misuse", out))


if __name__ == "__main__":
    main()
