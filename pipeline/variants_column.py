"""``opforge variants``: add the ``shape_variants`` column (``compose.variants``) to rows that are already
published - a Hub dataset folder (``hf/``: every ``data/*.parquet`` shard, the card's features and a card
section) or one Parquet file - in place or into a copy.

The column is a JSON string per row (a list of ``{"sizes", "input_shapes", "work_ratio"}``; ``"[]"`` when the
task has no variant), so loaders of the Ops-6K columns are unaffected. The same rows and settings give
byte-identical files. ``opforge_variants.json`` (beside the folder's card, or ``OUT.variants.json`` beside a
Parquet file) records the generator, its settings and how many tasks got how many variants.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from opforge.compose.variants import VariantResult, VariantSettings, summary, variants_for_rows

COLUMN = "shape_variants"
SECTION_MARK = "## Hidden shape variants"


def variants_column(rows: pd.DataFrame, settings: VariantSettings | None = None, workers: int | None = None,
                    cache_path: str | Path | None = None, progress: bool = True,
                    stats: dict[str, int] | None = None) -> tuple[list[str], list[VariantResult]]:
    """The ``shape_variants`` values of ``rows`` (needs ``task_id`` and ``code``), in row order, and the
    results behind them (see ``compose.variants.variants_for_rows``, which fills ``stats``)."""
    records = rows.to_dict("records")
    results = variants_for_rows(records, settings, workers=workers, cache_path=cache_path, progress=progress,
                                stats=stats)
    return [r.to_json() for r in results], results


def _with_column(table: pa.Table, values: list[str]) -> pa.Table:
    col = pa.array(values, pa.string())
    if COLUMN in table.column_names:
        return table.set_column(table.column_names.index(COLUMN), COLUMN, col)
    return table.append_column(COLUMN, col)


def _write(table: pa.Table, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(table, tmp)
    tmp.replace(path)


def add_variants(source: str | Path, out: str | Path | None = None, settings: VariantSettings | None = None,
                 workers: int | None = None, progress: bool = True) -> dict[str, Any]:
    """Add (or recompute) ``shape_variants`` in ``source``: a dataset folder (``README.md`` + ``data/*.parquet``)
    or a ``.parquet`` file; written to ``out`` (a copy; same kind as ``source``) or in place when ``out`` is
    None. Returns the summary written to the report (``compose.variants.summary`` plus ``output``).

    Raises:
        FileNotFoundError: ``source`` does not exist.
        ValueError: ``source`` is neither a folder with ``data/*.parquet`` nor a ``.parquet`` file, or its rows
            lack ``code`` (rows without ``task_id`` get the harness's content id, ``task.identity.task_id_for``).
    """
    settings = settings or VariantSettings()
    source = Path(source)
    if not source.exists():
        raise FileNotFoundError(f"{source}: no such file or folder")
    if source.is_dir():
        shards = sorted((source / "data").glob("*.parquet"))
        if not shards:
            raise ValueError(f"{source}: not a dataset folder (no data/*.parquet)")
        target = Path(out) if out is not None else source
        if target != source:
            if target.exists():
                shutil.rmtree(target)
            shutil.copytree(source, target)
        shards = sorted((target / "data").glob("*.parquet"))
        tables = [pq.read_table(s) for s in shards]
        frame = pd.concat([_rows(t, s) for t, s in zip(tables, shards, strict=True)], ignore_index=True)
        values, results = variants_column(frame, settings, workers, progress=progress)
        start = 0
        for table, shard in zip(tables, shards, strict=True):
            _write(_with_column(table, values[start:start + table.num_rows]), shard)
            start += table.num_rows
        report = {**summary(results, settings), "output": str(target)}
        _update_card(target, report)
        (target / "opforge_variants.json").write_text(json.dumps(report, indent=2, sort_keys=True))
        return report
    if source.suffix != ".parquet":
        raise ValueError(f"{source}: expected a dataset folder or a .parquet file")
    table = pq.read_table(source)
    values, results = variants_column(_rows(table, source), settings, workers, progress=progress)
    target = Path(out) if out is not None else source
    target.parent.mkdir(parents=True, exist_ok=True)
    _write(_with_column(table, values), target)
    report = {**summary(results, settings), "output": str(target)}
    target.with_name(target.stem + ".variants.json").write_text(json.dumps(report, indent=2, sort_keys=True))
    return report


def _rows(table: pa.Table, where: Path) -> pd.DataFrame:
    """The columns ``shape_variants`` reads; a table without ``task_id`` (Ops-6K's layout) gets the id the
    harness gives such rows (``task.identity.task_id_for``)."""
    from opforge.task.identity import task_id_for

    if "code" not in table.column_names:
        raise ValueError(f"{where}: no code column (columns: {', '.join(table.column_names)})")
    cols = [c for c in ("task_id", "code", "size_context", "dtype", "eager_ms", "gpu") if c in table.column_names]
    frame = table.select(cols).to_pandas()
    if "task_id" not in frame:
        frame["task_id"] = [task_id_for(c) for c in frame["code"]]
    return frame


def _update_card(folder: Path, report: dict[str, Any]) -> None:
    """Declare the column in the card's ``dataset_info.features`` and add the card's shape-variant section
    (``data_cards/shape_variants.md.j2``) when it has none, so ``validate_folder`` accepts the folder."""
    import yaml
    from opforge.data_cards.render import render_section

    card = folder / "README.md"
    if not card.is_file():
        return
    text = card.read_text(encoding="utf-8")
    _, fm, body = text.split("---", 2)
    meta = yaml.safe_load(fm)
    feats = meta.setdefault("dataset_info", {}).setdefault("features", [])
    if not any(f.get("name") == COLUMN for f in feats):
        feats.append({"name": COLUMN, "dtype": "string"})
    section = render_section("shape_variants.md.j2", {"variants": report})
    if SECTION_MARK in body:
        head, _, rest = body.partition(SECTION_MARK)
        nxt = rest.find("\n## ")
        body = head + section.strip() + "\n" + (rest[nxt:] if nxt >= 0 else "\n")
    else:
        body = body.rstrip() + "\n\n" + section.strip() + "\n"
    card.write_text("---\n" + yaml.safe_dump(meta, sort_keys=False) + "---" + body, encoding="utf-8")
