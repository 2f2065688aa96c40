"""The gold subset of a release: the rows that carry reference solutions (``opforge gold select``).

The rule is fixed in code so that nobody picks rows by how easy they look:

* **strata** (``GOLD_STRATA``): the motif category of the row's ``provenance`` (``conv_norm_act``, ``norm``,
  ``norm_residual``, ``attention``, ``sampling_head``, ``gemm_epilogue``) and ``random_composer`` (rows of the
  random composer: no motif provenance, ``data_source`` ``torch#k``);
* **window**: eager time (``eager_ms``, measured on the release's GPU) in ``[0.04, 5.0]`` ms;
* **order**: inside a stratum the rows are ranked by ``sha256(f"{seed}:{task_id}")``, and dtypes take turns
  (float32, bfloat16, float16; a dtype the stratum lacks is skipped), so every dtype a stratum holds is drawn;
* **count**: ``per_stratum`` rows per stratum (fewer where the stratum has fewer rows in the window).

The draw depends only on the rows' ``task_id``, ``provenance``, ``data_source``, ``dtype`` and ``eager_ms`` and
on ``seed``: the same release and seed give the same subset, whatever the row order.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

GOLD_STRATA = ("conv_norm_act", "norm", "norm_residual", "attention", "sampling_head", "gemm_epilogue",
               "random_composer")
GOLD_DTYPES = ("float32", "bfloat16", "float16")
GOLD_SEED = 2126
GOLD_PER_STRATUM = 6
GOLD_EAGER_MS = (0.04, 5.0)
REQUIRED_COLUMNS = ("task_id", "provenance", "data_source", "dtype", "eager_ms")


def stratum_of(provenance: str | None, data_source: str | None) -> str | None:
    """The gold stratum of one row: its motif ``category`` from the ``provenance`` JSON, ``random_composer`` for
    a ``torch#k`` row without motif provenance, else None (transformers blocks, unknown categories stay
    outside). Raises ValueError when ``provenance`` is not JSON."""
    category = json.loads(provenance).get("category") if isinstance(provenance, str) and provenance else None
    if category:
        return category
    if isinstance(data_source, str) and data_source.startswith("torch#"):
        return "random_composer"
    return None


def _rank(seed: int, task_id: str) -> str:
    return hashlib.sha256(f"{seed}:{task_id}".encode()).hexdigest()


def gold_subset(rows: pd.DataFrame, per_stratum: int = GOLD_PER_STRATUM, seed: int = GOLD_SEED,
                strata: Iterable[str] = GOLD_STRATA, eager_ms: tuple[float, float] = GOLD_EAGER_MS
                ) -> pd.DataFrame:
    """The gold rows of ``rows`` (a release's rows, docs/DESIGN.md §2 columns), by the rule of this module.

    Returns a frame with ``task_id``, ``stratum``, ``dtype``, ``eager_ms`` and ``rank`` (the draw order inside
    the stratum, 0 first), strata in the order given. Raises ValueError naming a missing column or a
    row whose ``provenance`` is not JSON.
    """
    missing = [c for c in REQUIRED_COLUMNS if c not in rows.columns]
    if missing:
        raise ValueError(f"gold_subset: rows lack column(s) {', '.join(missing)}")
    lo, hi = eager_ms
    picked = []
    for i, row in enumerate(rows.itertuples(index=False)):
        try:
            stratum = stratum_of(row.provenance, row.data_source)
        except json.JSONDecodeError as exc:
            raise ValueError(f"gold_subset: row {i} ({row.task_id}): provenance is not JSON ({exc})") from None
        if stratum is None or not (lo <= float(row.eager_ms) <= hi):
            continue
        picked.append({"task_id": str(row.task_id), "stratum": stratum, "dtype": str(row.dtype),
                       "eager_ms": float(row.eager_ms), "_key": _rank(seed, str(row.task_id))})
    pool = pd.DataFrame(picked, columns=["task_id", "stratum", "dtype", "eager_ms", "_key"])
    out = []
    for stratum in strata:
        here = pool[pool["stratum"] == stratum]
        queues = {d: here[here["dtype"] == d].sort_values("_key").to_dict("records") for d in GOLD_DTYPES}
        queues = {d: q for d, q in queues.items() if q}
        rank = 0
        while rank < per_stratum and queues:
            for d in list(queues):
                if rank >= per_stratum:
                    break
                rec = queues[d].pop(0)
                out.append({**rec, "rank": rank})
                rank += 1
                if not queues[d]:
                    del queues[d]
    frame = pd.DataFrame(out, columns=["task_id", "stratum", "dtype", "eager_ms", "_key", "rank"])
    return frame.drop(columns="_key").reset_index(drop=True)


def rule_text(per_stratum: int = GOLD_PER_STRATUM, seed: int = GOLD_SEED,
              eager_ms: tuple[float, float] = GOLD_EAGER_MS) -> str:
    """The rule of this module in one line, with its settings (printed by ``opforge gold select``, stated on
    the card)."""
    return (f"strata {', '.join(GOLD_STRATA)}; eager {eager_ms[0]:g}-{eager_ms[1]:g} ms; inside a stratum rows "
            f"ranked by sha256(\"{seed}:<task_id>\"), dtypes {' / '.join(GOLD_DTYPES)} in turn; {per_stratum} per "
            f"stratum; seed {seed} (opforge.pipeline.gold)")


def read_release_rows(release: str | Path) -> pd.DataFrame:
    """The rows of a release folder's default configuration (``data/*.parquet``) or of one parquet file.

    Raises:
        FileNotFoundError: no such folder / file, or a folder without ``data/*.parquet``.
    """
    path = Path(release)
    if path.is_file():
        return pd.read_parquet(path)
    files = sorted((path / "data").glob("*.parquet")) if path.is_dir() else []
    if not files:
        raise FileNotFoundError(f"{path}: no release folder with data/*.parquet")
    return pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)
