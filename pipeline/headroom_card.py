"""The data card's Headroom section: distributions of ``fusion_gain``, ``roofline_ms`` and, on a GPU run, the
room a perfect kernel has over the better of eager and ``torch.compile``.

``REFERENCE_OPS6K`` holds the same figures for CUDA-Agent-Ops-6K, measured with the same meter
(``opforge.task.roofline``, H200 SXM peaks) by ``benchmarks/headroom_bench.py``
(benchmarks/results/cpu-2core/headroom.json, 500 rows sampled with seed 0); the card prints them beside the
run's own.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

LOW_GAIN = 1.1  # "nothing to fuse": the share of rows below it is reported
ROOM_TARGET = 2.0  # the share of rows where a perfect kernel wins at least this much is reported

# CUDA-Agent-Ops-6K, 500 rows (DataFrame.sample(500, random_state=0)), H200 SXM peaks; see the module docstring.
REFERENCE_OPS6K: dict[str, Any] = {"rows": 500, "measured": 486, "fusion_gain": {"p10": 1.0, "p50": 2.0, "p90": 5.06},
                                   "low_gain_share": 0.251}


def quantiles(values: pd.Series) -> dict[str, float] | None:
    """``{"p10", "p50", "p90"}`` of the finite values, None when there is none."""
    v = pd.to_numeric(values, errors="coerce").to_numpy(dtype=float)
    v = v[np.isfinite(v)]
    if not len(v):
        return None
    p10, p50, p90 = np.percentile(v, [10, 50, 90])
    return {"p10": float(p10), "p50": float(p50), "p90": float(p90)}


def headroom_context(rows: pd.DataFrame, gpu_run: bool, peaks_line: str, peaks_source: str) -> dict[str, Any]:
    """The card's ``headroom`` context from the published ``rows`` (columns ``fusion_gain``, ``roofline_ms``,
    ``eager_ms``, ``compile_ms``).

    Returns ``n`` (rows with a fusion gain), ``fusion_gain`` / ``roofline_ms`` quantiles (None when absent),
    ``low_gain_share`` (share of those rows below ``LOW_GAIN``), on a GPU run ``room`` quantiles and
    ``room_share`` (share with room >= ``ROOM_TARGET``; room = min(eager_ms, compile_ms) / roofline_ms),
    ``peaks`` (the datasheet line), ``peaks_source``, ``gpu_run`` and ``reference`` (``REFERENCE_OPS6K``).
    """
    def col(name: str) -> pd.Series:
        return pd.to_numeric(rows[name], errors="coerce") if name in rows else pd.Series(np.nan, index=rows.index)

    gain, roof = col("fusion_gain"), col("roofline_ms")
    measured = gain.dropna()
    out: dict[str, Any] = {
        "n": int(len(measured)), "fusion_gain": quantiles(gain), "roofline_ms": quantiles(roof),
        "low_gain": LOW_GAIN, "low_gain_share": float((measured < LOW_GAIN).mean()) if len(measured) else None,
        "gpu_run": gpu_run, "peaks": peaks_line, "peaks_source": peaks_source, "room": None, "room_share": None,
        "room_target": ROOM_TARGET, "reference": REFERENCE_OPS6K,
    }
    if gpu_run:
        best = pd.concat([col("eager_ms"), col("compile_ms")], axis=1).min(axis=1, skipna=True)
        room = (best / roof.where(roof > 0)).dropna()
        out["room"] = quantiles(room)
        out["room_share"] = float((room >= ROOM_TARGET).mean()) if len(room) else None
    return out
