"""Reading a file of tasks (JSONL or Parquet with a ``code`` column): what ``opforge filter`` takes as
input and what the harness reads a dataset file with; and reading a published dataset as it stands (a Hub
folder's shards, a Parquet or a JSONL file: ``read_published``)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
from opforge.task.identity import task_id_for


class InputError(ValueError):
    """A task file cannot be read; the message names the file and, where known, the line or column."""


def read_tasks(path: str | Path) -> pd.DataFrame:
    """Read tasks from ``.jsonl`` / ``.json`` (one object per line) or ``.parquet``.

    Returns a frame with ``row`` (input position), ``task_id`` (given, else ``task_id_for(code)``),
    ``code`` and, when present, ``ops`` and ``data_source``. A ``code`` that is not a string stays as it
    is: the ``static`` filter turns it into an ``invalid_task`` verdict naming the row.

    Raises:
        InputError: missing file, unknown extension, a line that is not JSON, or no ``code`` column.
    """
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such file")
    if path.suffix not in (".parquet", ".jsonl", ".json"):
        raise InputError(f"{path}: expected .jsonl, .json or .parquet")
    df = _read_file(path)
    if "code" not in df.columns:
        raise InputError(f"{path}: no 'code' column (columns: {', '.join(map(str, df.columns)) or 'none'})")
    keep = [c for c in ("task_id", "code", "ops", "data_source") if c in df.columns]
    df = df[keep].copy()
    df["task_id"] = task_ids(df)
    df.insert(0, "row", range(len(df)))
    return df.reset_index(drop=True)


def task_ids(df: pd.DataFrame) -> list[str]:
    """The task id of each row of ``df`` (a ``code`` column, maybe ``task_id``), as ``read_tasks`` gives it: the
    given ``task_id`` when it is a non-empty string, else ``task_id_for(code)``, else ``row<i>`` for a ``code``
    that is not a string (i: the row's position)."""
    given = df["task_id"] if "task_id" in df.columns else [None] * len(df)
    return [str(t) if isinstance(t, str) and t else (task_id_for(c) if isinstance(c, str) else f"row{i}")
            for i, (t, c) in enumerate(zip(given, df["code"], strict=True))]


def _read_file(path: Path) -> pd.DataFrame:
    """Every column of an existing ``.parquet`` file, or of a ``.jsonl`` / ``.json`` file of one JSON object per
    line (blank lines skipped, values kept as written). Raises InputError naming the file (and the line) when
    the Parquet file cannot be read or a line is not a JSON object."""
    if path.suffix == ".parquet":
        try:
            return pq.read_table(path).to_pandas()
        except Exception as exc:  # noqa: BLE001 - re-raised with the file named
            raise InputError(f"{path}: not a readable Parquet file ({exc})") from None
    rows = []
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InputError(f"{path}:{n}: not a JSON object ({exc.msg})") from None
            if not isinstance(obj, dict):
                raise InputError(f"{path}:{n}: expected a JSON object, got {type(obj).__name__}")
            rows.append(obj)
    return pd.DataFrame(rows)


def read_published(source: str | Path) -> pd.DataFrame:
    """The rows of a published dataset as they stand: a Hub folder (its ``data/*.parquet`` shards in name
    order), a ``.parquet`` file or a ``.jsonl`` / ``.json`` file (one JSON object per line, values kept as
    written: a task id of digits stays a string).

    Raises:
        InputError: no such file or folder, a folder without ``data/*.parquet``, another extension, an
            unreadable Parquet file, a line that is not a JSON object, or rows without a ``code`` column.
    """
    source = Path(source)
    if source.is_dir():
        shards = sorted((source / "data").glob("*.parquet"))
        if not shards:
            raise InputError(f"{source}: no data/*.parquet shards (expected an opforge Hub folder)")
        rows = pd.concat([_read_file(p) for p in shards], ignore_index=True)
    elif not source.exists():
        raise InputError(f"{source}: no such file or folder")
    elif source.suffix in (".parquet", ".jsonl", ".json"):
        rows = _read_file(source)
    else:
        raise InputError(f"{source}: expected a Hub folder, a .parquet or a .jsonl file")
    if "code" not in rows.columns:
        raise InputError(f"{source}: no `code` column (columns: {', '.join(map(str, rows.columns)) or 'none'})")
    return rows
