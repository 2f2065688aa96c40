"""Realism figures of one KernelBench-format dataset (``opforge.task.realism``), with a per-row cache.

Usage::

    python benchmarks/realism_bench.py INPUT [--name realism_X] [--workers 2]   # -> benchmarks/results/<machine>/realism_X.json
        [--timeout-s 60] [--limit N] [--cache runs/realism_cache.jsonl]
    python benchmarks/realism_bench.py --compare A.json B.json                   # two results side by side

``INPUT`` is a dataset folder holding ``data/*.parquet``, a Parquet or a JSONL file (``read_rows``). The rules
of every figure are in ``opforge.task.realism``; ``opforge compare A B`` reports the same figures for two
datasets next to label fidelity, duplicates, KernelBench hits, fusion headroom and axis misuse.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shlex
import time
from pathlib import Path

import record
from opforge.task import realism

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("input", nargs="?", help="dataset folder with data/*.parquet, or a Parquet / JSONL file")
    ap.add_argument("--name", help="result name: benchmarks/results/<machine>/NAME.json (default realism_<input stem>)")
    ap.add_argument("--out", help="write the result JSON here instead")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--timeout-s", type=float, default=60.0, help="per-row limit (seconds)")
    ap.add_argument("--memory-gib", type=float, default=4.0, help="address-space margin per worker (GiB)")
    ap.add_argument("--limit", type=int, help="measure only the first N rows")
    ap.add_argument("--cache", default=str(ROOT / "runs" / "realism_cache.jsonl"),
                    help="JSONL cache of per-row records ('' for none)")
    ap.add_argument("--compare", nargs=2, metavar=("A", "B"), help="print two result JSONs side by side")
    args = ap.parse_args(argv)
    if args.compare:
        print(realism.format_table([json.loads(Path(p).read_text()) for p in args.compare]))
        return
    if not args.input:
        ap.error("INPUT is required unless --compare is given")
    path = Path(args.input)
    rows = realism.read_rows(path)
    if args.limit:
        rows = rows[: args.limit]
    t0 = time.perf_counter()
    records, cached = realism.measure_with_cache(rows, Path(args.cache) if args.cache else None,
                                                 workers=args.workers, timeout_s=args.timeout_s,
                                                 memory_gib=args.memory_gib)
    figures = realism.summarise(records)
    result = {
        "benchmark": "realism", "measure_version": realism.MEASURE_VERSION,
        "input": {"path": str(path), "rows": len(rows),
                  "sha256": hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None},
        "settings": {"workers": args.workers, "timeout_s": args.timeout_s, "memory_gib": args.memory_gib,
                     "limit": args.limit, "cache": args.cache or None, "rows_from_cache": cached},
        "seconds": round(time.perf_counter() - t0, 1),
        "figures": figures,
        "targets": realism.check_targets(figures),
        "by_source": realism.by_source(records),
    }
    if argv is not None:  # called from Python: the command is this call, not the process's
        result["provenance"] = {"command": shlex.join(["python", "benchmarks/realism_bench.py", *argv])}
    out = record.write_file(args.out, result) if args.out else record.write(args.name or f"realism_{path.stem}", result)
    print(realism.format_table([result]))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
