"""Tasks for the harness: an opforge dataset as published (docs/DESIGN.md §2 columns), from a Hub folder,
a Parquet / JSONL file, or a Hub dataset id.

Every column is kept: the grader uses ``task_id``, ``code``, ``data_source`` and the hidden ``shape_variants``
(``harness.evaluate``). A dataset without ``task_id`` (Ops-6K's layout) gets ``task.identity.task_id_for(code)``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd
from opforge.task.identity import task_id_for
from opforge.task.task_file import InputError, read_published, task_ids


class DatasetError(ValueError):
    """The dataset cannot be read or lacks a column / task; the message names the path or id."""


def _in_memory(source: Any, split: str) -> pd.DataFrame | None:
    """``source`` as a frame when it is rows in memory: a ``pandas.DataFrame``, a ``datasets.Dataset`` (what
    ``load_dataset(..., split=...)`` returns) or a ``datasets.DatasetDict`` (its ``split``); None for a path or
    id. Raises DatasetError for any other type, naming it and what is accepted."""
    if isinstance(source, pd.DataFrame):
        return source.copy().reset_index(drop=True)
    if isinstance(source, str | Path):
        return None
    kind = f"{type(source).__module__}.{type(source).__name__}"
    if kind.startswith("datasets.") and hasattr(source, "keys") and hasattr(source, "values"):  # DatasetDict
        if split not in source:
            raise DatasetError(f"<{type(source).__name__}>: no split {split!r} (splits: {', '.join(source)})")
        source = source[split]
        kind = f"{type(source).__module__}.{type(source).__name__}"
    if kind.startswith("datasets.") and hasattr(source, "to_pandas"):
        if hasattr(source, "column_names") and "code" not in source.column_names:
            raise DatasetError(f"<{type(source).__name__}>: no 'code' column (columns: "
                               f"{', '.join(source.column_names)})")
        frame = source.to_pandas()
        if not isinstance(frame, pd.DataFrame):  # an iterable dataset's to_pandas yields batches
            frame = pd.concat(list(frame), ignore_index=True)
        return frame.reset_index(drop=True)
    raise DatasetError(f"cannot read tasks from a {type(source).__name__}: give a path (a Hub dataset folder, "
                       f".parquet or .jsonl), a Hub id 'ORG/NAME', a datasets.Dataset / DatasetDict or a "
                       f"pandas.DataFrame with a 'code' column")


def load_tasks(source: str | Path | pd.DataFrame | Any, split: str = "train") -> pd.DataFrame:
    """Rows with ``task_id``, ``code``, ``data_source`` (None when absent), indexed by ``task_id``.

    ``source``: rows already in memory (a ``pandas.DataFrame`` with ``code``, or the ``datasets.Dataset`` /
    ``DatasetDict`` that ``datasets.load_dataset`` returns), a directory (an opforge run's
    ``hf/`` folder, or any folder ``datasets.load_dataset`` reads), a ``.parquet`` / ``.jsonl`` file (every column,
    ``task.task_file.read_published``; task ids as ``opforge filter`` gives them, ``task.task_file.task_ids``),
    or a Hub id ``ORG/NAME`` (needs network or the HF cache).

    Raises:
        DatasetError: unreadable source, a source of another type, no ``code`` column, or duplicate task ids.
    """
    frame = _in_memory(source, split)
    path = None if frame is not None else Path(source)
    if frame is not None:
        df = frame
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


def input_bytes(row: dict | pd.Series) -> int | None:
    """Bytes of a row's public inputs: the element counts of its ``input_shapes`` (JSON list of shapes) times the
    size of its ``dtype`` (``torch.dtype.itemsize``; float32 when absent or unknown; integer inputs are counted at that size too). None when the
    row has no readable ``input_shapes``."""
    import json

    shapes = row.get("input_shapes") if hasattr(row, "get") else None
    try:
        shapes = json.loads(shapes) if isinstance(shapes, str) else shapes
        count = sum(int(math.prod(int(d) for d in shape)) for shape in shapes)
    except (TypeError, ValueError):
        return None
    import torch

    dtype = getattr(torch, str(row.get("dtype") or "float32"), None)
    return count * (dtype.itemsize if isinstance(dtype, torch.dtype) else 4)


def small_tasks(tasks: pd.DataFrame, max_input_mb: float = 64.0) -> pd.DataFrame:
    """The rows of ``tasks`` whose public inputs take at most ``max_input_mb`` MB (10^6 bytes, ``input_bytes``):
    the rows a CPU can grade in seconds. Released rows are sized for an H200 (inputs up to several GB: a CPU
    eager run of the largest takes minutes and a float32 copy of them more memory than a laptop has), so a CPU
    smoke test picks from these. Rows without ``input_shapes`` are left out."""
    sizes = [input_bytes(r) for _, r in tasks.iterrows()]
    keep = [s is not None and s <= max_input_mb * 1e6 for s in sizes]
    return tasks[keep]
