"""How far the composer's motif draw can spread its ops: the realistic-tasks issue's bound that no op outside
``task.realism.COMMON_OPS`` is in more than 8 % of the rows, asked of the motif library before any filter.

``compose.motifs.library.MotifPool.draw`` picks a class (``LIGHT_SHARE``), a category by its weight, then an op set
(``op_key``) of that category uniformly. For the packaged library (or ``--library``) this reports:

* ``uniform``: each op's expected share of motif draws as the composer draws them now (an op counts once per op
  set, named by ``pipeline.select.other_ops``: ``nn.LayerNorm`` -> ``layer_norm``);
* ``reweighted``: the same after re-weighting the op sets inside each category by iterative scaling (each
  iteration multiplies an op set's weight by ``sqrt(cap / share)`` of its most over-represented op, never below
  ``--floor`` of its start), the class and category weights kept: the lowest top-op share reachable without
  changing the category mix, and ``effective_op_sets``, the draw-weighted perplexity of the op sets inside a
  category (how many distinct op sets the draw effectively spreads over; the selection publishes at most
  ``max_per_signature`` rows of one op set and dtype).

Usage:
    python benchmarks/motif_op_spread.py [--library PATH] [--cap 0.08] [--floor 0.001] [--iterations 200]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter
from pathlib import Path

import pandas as pd
import record  # noqa: E402 - benchmarks/record.py, beside this script
from opforge.compose.motifs.cut import read_library
from opforge.compose.motifs.library import DEFAULT_LIBRARY, LIGHT_SHARE, MotifPool
from opforge.pipeline.select import exotic_ops as other_ops


def draw_cells(pool: MotifPool) -> tuple[list[tuple[tuple[str, str], frozenset[str]]], dict[tuple[str, str], float]]:
    """([((class, category), other op names) per op set], (class, category) -> its probability per motif draw)."""
    where, keys, cat_p = [], [], {}
    for cname, (groups, weights) in pool.classes.items():
        share = 1.0 if len(pool.classes) == 1 else (pool.light_share if cname == "light" else 1 - pool.light_share)
        total = sum(weights.values())
        for cat, op_sets in groups.items():
            cat_p[(cname, cat)] = share * weights[cat] / total
            where.extend((cname, cat) for _ in op_sets)
            keys.extend(json.dumps(list(k)) for k in op_sets)
    return list(zip(where, other_ops(pd.DataFrame({"ops": keys})), strict=True)), cat_p


def category_totals(cells, w: list[float]) -> Counter:
    """(class, category) -> the sum of its op sets' weights."""
    total: Counter = Counter()
    for (c, _), wi in zip(cells, w, strict=True):
        total[c] += wi
    return total


def shares(cells, cat_p, w: list[float]) -> Counter:
    """Each op's expected share of motif draws with op-set weights ``w``."""
    total = category_totals(cells, w)
    out: Counter = Counter()
    for (c, ops), wi in zip(cells, w, strict=True):
        for o in ops:
            out[o] += cat_p[c] * wi / total[c]
    return out


def effective_op_sets(cells, cat_p, w: list[float]) -> float:
    """Draw-weighted perplexity of the op sets inside each category."""
    total = category_totals(cells, w)
    entropy: Counter = Counter()
    for (c, _), wi in zip(cells, w, strict=True):
        p = wi / total[c]
        entropy[c] -= p * math.log(p) if p > 0 else 0.0
    return sum(cat_p[c] * math.exp(entropy[c]) for c in total)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--library", type=Path, default=DEFAULT_LIBRARY)
    ap.add_argument("--cap", type=float, default=0.08)
    ap.add_argument("--floor", type=float, default=0.001)
    ap.add_argument("--iterations", type=int, default=200)
    ap.add_argument("--top", type=int, default=10)
    args = ap.parse_args(argv)
    motifs, _ = read_library(args.library)
    pool = MotifPool(motifs, light_share=LIGHT_SHARE)
    cells, cat_p = draw_cells(pool)
    w = [1.0] * len(cells)
    uniform = shares(cells, cat_p, w)
    out = {"benchmark": "motif op spread: expected share of motif draws per op outside realism.COMMON_OPS, as "
                        "drawn and after re-weighting op sets inside categories",
           "library": str(args.library if args.library != DEFAULT_LIBRARY else "packaged"), "motifs": len(motifs),
           "op_sets": len(cells), "cap": args.cap, "floor": args.floor, "iterations": args.iterations,
           "uniform": {"top": [[o, round(v, 4)] for o, v in uniform.most_common(args.top)],
                       "effective_op_sets": round(effective_op_sets(cells, cat_p, w), 1)}}
    for _ in range(args.iterations):
        s = shares(cells, cat_p, w)
        factor = {o: min(1.0, args.cap / v) for o, v in s.items()}
        w = [max(args.floor, wi * min([factor[o] for o in ops] or [1.0]) ** 0.5)
             for (_, ops), wi in zip(cells, w, strict=True)]
    reweighted = shares(cells, cat_p, w)
    out["reweighted"] = {"top": [[o, round(v, 4)] for o, v in reweighted.most_common(args.top)],
                         "effective_op_sets": round(effective_op_sets(cells, cat_p, w), 1)}
    print(f"uniform: {out['uniform']}\nreweighted: {out['reweighted']}")
    print("wrote", record.write("motif_op_spread", out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
