"""How far a dataset's rows let a selection spread its ops: the realistic-tasks issue's bound that no op outside
``task.realism.COMMON_OPS`` (add, sub, mul, div, matmul, linear, conv2d) is in more than 8 % of the rows
(``top_other_op_share``), measured on any KernelBench-format rows with an ``ops`` column.

For each dataset (a Parquet file, a Hub folder's ``data/*.parquet``, or an ``opforge run`` directory, whose
accepted pool - ``candidates.parquet`` joined with the accepted verdicts - is read):

* the share of rows holding each op outside ``COMMON_OPS`` (``pipeline.select.other_ops``: the ``ops``
  labels' op names, ``nn.LayerNorm`` -> ``layer_norm``), the top ``--top``;
* the distribution of the number of such ops per row;
* for each ``--targets`` N, the most rows a greedy pass takes with no such op in more than
  ``floor(N * --cap)`` of them (rows with fewer such ops first, ties in seeded order; the best of 3 seeds): a
  lower bound on the largest selection of the rows that holds the cap, and so whether N rows holding it exist;
  the same with the layout ops (``LAYOUT``: reshape, view, transpose, permute and the like, which move or
  re-label data and compute nothing) not counted; and the same holding the rows' own op-count mix (each
  ``data_source`` bucket, ``torch#K``, gets ``round(N * its share)``, as ``opforge run``'s default ``op_mix``
  ``models`` asks of the selection; buckets take turns, each the row whose most-used op is used least);
* for each N, the most frequent such op and its share in what ``pipeline.select.select_tasks`` itself chooses
  (``opforge run``'s selection defaults, ``max_op_share`` = ``--cap``).

Rows of ``../shared/reference`` may be measured for comparison; nothing here is published.

Usage:
    python benchmarks/op_spread_bench.py ours=runs/release_v2 ops6k=../shared/reference/cuda_agent_ops_6k.parquet \
        [--targets 1000 2000 6000] [--cap 0.08]
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from collections import Counter
from pathlib import Path

import pandas as pd
import record  # noqa: E402 - benchmarks/record.py, beside this script
from opforge.pipeline.select import exotic_ops as other_ops

# Ops that only move or re-label data (no arithmetic): counted apart in the second bound.
LAYOUT = frozenset({"reshape", "view", "flatten", "unflatten", "transpose", "permute", "contiguous", "squeeze",
                    "unsqueeze", "expand", "expand_as", "movedim", "t"})


def read_rows(path: Path) -> pd.DataFrame:
    """The rows of ``path``: an ``opforge run`` directory's accepted pool, a Hub folder's shards, or one Parquet
    file. Raises ``SystemExit`` naming the path when it holds none of them or has no ``ops`` column."""
    if (path / "candidates.parquet").exists() and (path / "filter" / "verdicts.parquet").exists():
        from opforge.pipeline.run import accepted_pool

        rows = accepted_pool(pd.read_parquet(path / "candidates.parquet"),
                             pd.read_parquet(path / "filter" / "verdicts.parquet"))
    elif path.is_dir() and list((path / "data").glob("*.parquet")):
        rows = pd.concat([pd.read_parquet(p) for p in sorted((path / "data").glob("*.parquet"))], ignore_index=True)
    elif path.is_file():
        rows = pd.read_parquet(path)
    else:
        raise SystemExit(f"{path}: not an opforge run directory, a Hub folder or a Parquet file")
    if "ops" not in rows:
        raise SystemExit(f"{path}: no 'ops' column")
    return rows


def greedy_bound(ops: list[frozenset[str]], n: int, cap: float, ignore: frozenset[str] = frozenset(),
                 seeds: int = 3) -> int:
    """The most of ``n`` rows a greedy pass takes with no op (less ``ignore``) in more than ``floor(n * cap)``
    taken rows; rows with fewer ops first, ties in seeded order; the best over ``seeds`` seeds."""
    limit = math.floor(n * cap)
    best = 0
    for seed in range(seeds):
        order = list(range(len(ops)))
        random.Random(seed).shuffle(order)
        order.sort(key=lambda i: len(ops[i] - ignore))
        used: Counter = Counter()
        taken = 0
        for i in order:
            mine = ops[i] - ignore
            if all(used[o] < limit for o in mine):
                used.update(mine)
                taken += 1
                if taken == n:
                    break
        best = max(best, taken)
    return best


def greedy_bound_with_mix(ops: list[frozenset[str]], buckets: list[str], n: int, cap: float, seed: int = 0
                          ) -> tuple[int, dict[str, int]]:
    """Rows taken under the bound with each bucket held to ``round(n * its share of the rows)``, and each short
    bucket's shortfall: buckets take turns; each takes, of its rows within the bound, the one whose most-used op
    is used least (the first such in seeded order)."""
    limit = math.floor(n * cap)
    shares = Counter(buckets)
    quotas = {b: round(n * c / len(buckets)) for b, c in shares.items()}
    order = list(range(len(ops)))
    random.Random(seed).shuffle(order)
    left: dict[str, list[int]] = {}
    for i in order:
        left.setdefault(buckets[i], []).append(i)
    used: Counter = Counter()
    got: Counter = Counter()
    moved = True
    while moved:
        moved = False
        for b, want in quotas.items():
            if got[b] >= want:
                continue
            best, best_use = None, None
            for i in left[b]:
                if all(used[o] < limit for o in ops[i]):
                    use = max((used[o] for o in ops[i]), default=0)
                    if best is None or use < best_use:
                        best, best_use = i, use
                    if use == 0:
                        break
            if best is not None:
                left[b].remove(best)
                used.update(ops[best])
                got[b] += 1
                moved = True
    return sum(got.values()), {b: want - got[b] for b, want in sorted(quotas.items()) if got[b] < want}


def measure(rows: pd.DataFrame, targets: list[int], cap: float, top: int) -> dict:
    ops = other_ops(rows)
    n = len(rows)
    counts = Counter(o for s in ops for o in s)
    per_row = Counter(min(len(s), 4) for s in ops)
    out = {
        "rows": n,
        "top_other_ops": [[o, round(c / n, 4)] for o, c in counts.most_common(top)],
        "other_ops_per_row_share": {("4+" if k == 4 else str(k)): round(per_row[k] / n, 4) for k in sorted(per_row)},
        "greedy_rows_under_cap": {str(t): greedy_bound(ops, t, cap) for t in targets},
        "greedy_rows_under_cap_layout_not_counted": {str(t): greedy_bound(ops, t, cap, LAYOUT) for t in targets},
    }
    if "data_source" in rows:
        buckets = rows["data_source"].fillna("").astype(str).tolist()
        with_mix = {str(t): greedy_bound_with_mix(ops, buckets, t, cap) for t in targets}
        out["greedy_rows_under_cap_with_op_count_mix"] = {t: v[0] for t, v in with_mix.items()}
        out["with_op_count_mix_short_per_bucket"] = {t: v[1] for t, v in with_mix.items()}
        out["selection_top_other_op"] = {str(t): selection_top_op(rows, t, cap) for t in targets}
    return out


def selection_top_op(rows: pd.DataFrame, n: int, cap: float) -> list:
    """``[op, share]``: the most frequent op outside the common ones in what ``pipeline.select.select_tasks``
    chooses for a target of ``n`` from ``rows`` with ``opforge run``'s selection defaults (``RunConfig``: the
    pool's own op-count mix, ``max_op_share`` = ``cap``, seed 0)."""
    from opforge.pipeline.run import run_selection
    from opforge.pipeline.run_config import RunConfig

    if "task_id" not in rows:
        rows = rows.assign(task_id=[f"row{i}" for i in range(len(rows))])
    sel = run_selection(rows, RunConfig(target=n, max_op_share=cap).resolved())
    counts = Counter(o for s in other_ops(sel.rows) for o in s)
    top = counts.most_common(1)
    return [top[0][0], round(top[0][1] / len(sel.rows), 4)] if top and len(sel.rows) else ["", 0.0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("datasets", nargs="+", help="LABEL=PATH (run directory, Hub folder or Parquet file)")
    ap.add_argument("--targets", type=int, nargs="+", default=[1000, 2000, 6000])
    ap.add_argument("--cap", type=float, default=0.08, help="share bound per op (default 0.08, the issue's)")
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--name", default="op_spread", help="result file name (results/<machine>/NAME.json)")
    args = ap.parse_args(argv)
    out = {"benchmark": "op spread: shares of the ops outside realism.COMMON_OPS and the largest selection "
                        "holding a per-op share bound (greedy lower bound), and the top other op share of "
                        "pipeline.select's choice",
           "cap": args.cap, "layout_ops": sorted(LAYOUT), "datasets": {}}
    for item in args.datasets:
        label, sep, path = item.partition("=")
        if not sep:
            raise SystemExit(f"{item!r}: expected LABEL=PATH")
        out["datasets"][label] = {"path": path, **measure(read_rows(Path(path)), args.targets, args.cap, args.top)}
        d = out["datasets"][label]
        print(f"{label}: {d['rows']} rows; top other ops {d['top_other_ops'][:5]}; "
              f"per row {d['other_ops_per_row_share']}; "
              f"greedy under {args.cap:.0%}: {d['greedy_rows_under_cap']} (layout not counted: "
              f"{d['greedy_rows_under_cap_layout_not_counted']}; op-count mix held: "
              f"{d.get('greedy_rows_under_cap_with_op_count_mix')}); select_tasks: "
              f"{d.get('selection_top_other_op')}")
    print("wrote", record.write(args.name, out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
