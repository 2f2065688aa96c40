"""How far the filter verdicts of two ``opforge run`` (or ``opforge filter``) directories agree (issue #37: a
streamed run against the same run with its stages one after the other, same seed and filter fingerprint).

    python benchmarks/verdict_agreement.py RUN_A RUN_B [--out FILE]

Each directory's ``filter/verdicts.parquet`` (or ``verdicts.parquet`` at its top) is read; tasks are matched by
``task_id``. A task agrees when both runs accepted it, or both rejected it for the same reason. A disagreement
is ``timed`` when either reason is decided from a measured time (``runtime_out_of_window``, ``trivial:
no_headroom``, ``trivial:dominated``: one op's share of the profiled kernel time, ``timeout``): on a GPU two
runs of one task measure different times, so such tasks near a threshold may fall either way; the report gives both runs' eager time (ms) and room (the headroom filter's
``room``, or ``room_bound`` where the screen decided) for each. Any other disagreement is listed as
``untimed``: it is a difference in what the filters decide, not in what they measured.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))

TIMED = ("runtime_out_of_window", "trivial:no_headroom", "trivial:dominated", "timeout")


def read_verdicts(run: Path) -> pd.DataFrame:
    """The verdict table of a run directory (``filter/verdicts.parquet``, else ``verdicts.parquet``).
    Raises FileNotFoundError naming the directory when it has neither."""
    for path in (run / "filter" / "verdicts.parquet", run / "verdicts.parquet"):
        if path.exists():
            return pd.read_parquet(path).drop_duplicates("task_id").set_index("task_id")
    raise FileNotFoundError(f"{run}: no filter/verdicts.parquet or verdicts.parquet")


def _measured(metrics_json: str) -> dict:
    m = json.loads(metrics_json or "{}")
    room = (m.get("headroom") or {}).get("room")
    if room is None:
        room = (m.get("headroom_screen") or {}).get("room_bound")
    return {"eager_ms": (m.get("runtime") or {}).get("eager_ms") or (m.get("runtime_screen") or {}).get("screen_ms"),
            "room": room}


def _label(accepted: bool, reason) -> str:
    return "accepted" if accepted else str(reason)


def agreement(a: pd.DataFrame, b: pd.DataFrame, listed: int = 50) -> dict:
    """Counts of agreeing and disagreeing tasks of two verdict tables (see the module docstring), with up to
    ``listed`` disagreements of each kind spelled out."""
    common = a.index.intersection(b.index)
    la = pd.Series([_label(x, r) for x, r in zip(a.loc[common, "accepted"], a.loc[common, "reason"], strict=True)],
                   index=common)
    lb = pd.Series([_label(x, r) for x, r in zip(b.loc[common, "accepted"], b.loc[common, "reason"], strict=True)],
                   index=common)
    differ = common[la.values != lb.values]
    timed, untimed = [], []
    for t in differ:
        row = {"task_id": t, "a": la[t], "b": lb[t], "a_measured": _measured(a.at[t, "metrics"]),
               "b_measured": _measured(b.at[t, "metrics"])}
        (timed if any(x.startswith(TIMED) for x in (la[t], lb[t])) else untimed).append(row)
    pairs = pd.Series([f"{la[t]} | {lb[t]}" for t in differ], dtype=str).value_counts()
    return {"tasks_a": len(a), "tasks_b": len(b), "common": len(common), "agree": int(len(common) - len(differ)),
            "agree_share": round((len(common) - len(differ)) / max(1, len(common)), 5),
            "accepted_a": int(a.loc[common, "accepted"].sum()), "accepted_b": int(b.loc[common, "accepted"].sum()),
            "differ_timed": len(timed), "differ_untimed": len(untimed),
            "differ_pairs": {str(k): int(v) for k, v in pairs.items()},
            "timed": timed[:listed], "untimed": untimed[:listed]}


def main(argv=None) -> None:
    import record

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_a", type=Path)
    ap.add_argument("run_b", type=Path)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    res = {"benchmark": "filter verdicts of two runs, task by task",
           "runs": {"a": args.run_a.name, "b": args.run_b.name},
           **agreement(read_verdicts(args.run_a), read_verdicts(args.run_b))}
    if args.out:
        record.write_file(args.out, res)
    print(json.dumps({k: v for k, v in res.items() if k not in ("timed", "untimed")}, indent=1))


if __name__ == "__main__":
    main()
