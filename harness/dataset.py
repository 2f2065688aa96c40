"""Tasks for the harness: an opforge dataset as published (docs/DESIGN.md §2 columns), from a Hub folder,
a Parquet / JSONL file, or a Hub dataset id.

Every column is kept: the grader uses ``task_id``, ``code``, ``data_source`` and the hidden ``shape_variants``
(``harness.evaluate``). A dataset without ``task_id`` (Ops-6K's layout) gets ``task.identity.task_id_for(code)``.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from opforge.task.identity import task_id_for
from opforge.task.task_file import InputError, read_published, task_ids


class DatasetError(ValueError):
    """The dataset cannot be read or lacks a column / task; the message names the path or id."""


def load_tasks(source: str | Path | pd.DataFrame, split: str = "train") -> pd.DataFrame:
    """Rows with ``task_id``, ``code``, ``data_source`` (None when absent), indexed by ``task_id``.

    ``source``: rows already in memory (a ``pandas.DataFrame`` with ``code``), a directory (an opforge run's
    ``hf/`` folder, or any folder ``datasets.load_dataset`` reads), a ``.parquet`` / ``.jsonl`` file (every column,
    ``task.task_file.read_published``; task ids as ``opforge filter`` gives them, ``task.task_file.task_ids``),
    or a Hub id ``ORG/NAME`` (needs network or the HF cache).

    Raises:
        DatasetError: unreadable source, no ``code`` column, or duplicate task ids.
    """
    path = None if isinstance(source, pd.DataFrame) else Path(source)
    if path is None:
        df = source.copy().reset_index(drop=True)
        if "code" not in df.columns:
            raise DatasetError(f"<frame>: no 'code' column (columns: {', '.join(map(str, df.columns))})")
        if "task_id" not in df.columns:
            df["task_id"] = [task_id_for(c) for c in df["code"]]
        df["task_id"] = df["task_id"].astype(str)
    elif path.is_file():
        try:
            # every column of the file (the hidden shape_variants above all: read_tasks keeps only what the
            # filters read), with read_tasks' task ids and row numbers
            df = read_published(path).reset_index(drop=True)
            df["task_id"] = task_ids(df)
            if "row" not in df.columns:
                df.insert(0, "row", range(len(df)))
        except InputError as exc:
            raise DatasetError(str(exc)) from None
    else:
        try:
            import datasets

            name = str(path) if path.exists() else str(source)
            df = datasets.load_dataset(name, split=split).to_pandas()
        except Exception as exc:  # noqa: BLE001 - re-raised with the source named
            raise DatasetError(f"{source}: cannot read the dataset ({type(exc).__name__}: {exc})") from None
        if "code" not in df.columns:
            raise DatasetError(f"{source}: no 'code' column (columns: {', '.join(map(str, df.columns))})")
        if "task_id" not in df.columns:
            df["task_id"] = [task_id_for(c) for c in df["code"]]
    if "data_source" not in df.columns:
        df["data_source"] = None
    if df["task_id"].duplicated().any():
        dup = df.loc[df["task_id"].duplicated(), "task_id"].iloc[0]
        raise DatasetError(f"{'<frame>' if path is None else source}: task_id {dup!r} appears more than once")
    return df.set_index("task_id", drop=False)


def get_task(tasks: pd.DataFrame, task_id: str, source: str | Path = "dataset") -> dict:
    """One row as a dict (``task_id``, ``code``, ``data_source``...). Raises DatasetError naming the id."""
    if task_id not in tasks.index:
        raise DatasetError(f"{source}: no task {task_id!r} ({len(tasks)} tasks)")
    return tasks.loc[task_id].to_dict()
