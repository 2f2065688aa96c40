"""The funnel of a run, counted one way for ``run.json``, the data card and ``opforge status``.

Counts (all over the rounds the run reached; a candidate is a composed row, a verdict a row of
``filter/verdicts.parquet``, one per filtered candidate):

* ``candidates``: composed rows; ``unique``: their distinct ``task_id`` values;
* ``not_filtered``: candidates without a verdict (their (op set, dtype) signature was full, or a heavy-op
  candidate of a round composed to hold the heavy-op cap);
* ``verdicted``: verdict rows; ``duplicates``: those rejected as a duplicate of an earlier candidate (reason
  ``duplicate``: the same normalised source, or a near copy, so two different task ids can be duplicates);
* ``accepted``: verdicts that passed every filter; ``rejected`` = ``verdicted`` - ``accepted`` (duplicates
  included);
* ``selected``: rows published.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

KEYS = ("candidates", "unique", "not_filtered", "verdicted", "duplicates", "accepted", "rejected", "selected")


def funnel_counts(candidate_ids: Iterable[str], verdicts: pd.DataFrame, selected: int | None) -> dict[str, Any]:
    """The counts of the module docstring from the candidates' task ids, the verdict table (columns
    ``accepted`` and ``reason``) and the number selected (None when nothing was selected yet)."""
    ids = list(candidate_ids)
    ok = verdicts["accepted"].astype(bool) if len(verdicts) else pd.Series([], dtype=bool)
    reasons = verdicts.loc[~ok, "reason"].fillna("").astype(str) if len(verdicts) else pd.Series([], dtype=str)
    accepted = int(ok.sum())
    return {"candidates": len(ids), "unique": len(set(ids)), "not_filtered": len(ids) - len(verdicts),
            "verdicted": len(verdicts), "duplicates": int(reasons.str.startswith("duplicate").sum()),
            "accepted": accepted, "rejected": len(verdicts) - accepted, "selected": selected}


def run_funnel(run_dir: str | Path) -> dict[str, Any] | None:
    """``funnel_counts`` of a finished ``opforge run`` directory read from its files (the rounds ``run.json``
    says it reached, ``filter/verdicts.parquet``, ``selection.json``); None when one of them is missing."""
    from opforge.pipeline.run import round_files

    run_dir = Path(run_dir)
    vpath, rpath, spath = run_dir / "filter" / "verdicts.parquet", run_dir / "run.json", run_dir / "selection.json"
    if not (vpath.is_file() and rpath.is_file()):
        return None
    try:
        run = json.loads(rpath.read_text(encoding="utf-8"))
        rounds = round_files(run_dir)
        reached = run.get("rounds") if isinstance(run.get("rounds"), int) else len(rounds)
        ids = [t for p in rounds[:reached] for t in pd.read_parquet(p, columns=["task_id"])["task_id"]]
        verdicts = pd.read_parquet(vpath, columns=["accepted", "reason"])
        selected = len(json.loads(spath.read_text(encoding="utf-8"))["task_ids"]) if spath.is_file() \
            else run.get("selected")
    except (OSError, ValueError, KeyError, TypeError):  # a file being written: counted on the next call
        return None
    return funnel_counts(ids, verdicts, selected)


def format_funnel(f: dict[str, Any]) -> str:
    """One line: ``150 candidates (148 unique), 0 not filtered, 150 verdicted (4 duplicates), 128 accepted, 22
    rejected, 100 selected``."""
    sel = "-" if f.get("selected") is None else f"{f['selected']:,}"
    return (f"{f['candidates']:,} candidates ({f['unique']:,} unique), {f['not_filtered']:,} not filtered, "
            f"{f['verdicted']:,} verdicted ({f['duplicates']:,} duplicates), {f['accepted']:,} accepted, "
            f"{f['rejected']:,} rejected, {sel} selected")
