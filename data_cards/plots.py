"""The data card's PNG plots (matplotlib, Agg backend), drawn from the published rows."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd

PLOTS = ("op_count", "top_ops", "runtime", "kernelbench_similarity")


def _source_order(label: str) -> tuple:
    """``torch#2`` < ``torch#10`` < ``transformers``: op counts in numeric order, other sources after them."""
    head, _, k = label.partition("#")
    return (0, int(k), "") if head == "torch" and k.isdigit() else (1, 0, label)


def op_count_figure(rows: pd.DataFrame):
    """The op-count mix plot: one horizontal bar per ``data_source`` value, in op-count order, with its task
    count; the figure grows with the number of values (0.3 inch a bar), so labels never overlap."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = rows["data_source"].astype(str).value_counts()
    labels = sorted(counts.index, key=_source_order)[::-1]  # the first at the top
    fig, ax = plt.subplots(figsize=(6, max(2.0, 0.8 + 0.3 * len(labels))))
    values = [int(counts[x]) for x in labels]
    ax.barh(labels, values, color="#4c72b0")
    for y, v in enumerate(values):
        ax.text(v, y, f" {v}", va="center", fontsize=8)
    ax.set_xlabel("tasks")
    ax.set_title("op-count mix (data_source)")
    ax.margins(x=0.12)
    return fig


def write_plots(rows: pd.DataFrame, out_dir: str | Path, device_label: str) -> dict[str, Path]:
    """Write ``<name>.png`` for each of ``PLOTS`` into ``out_dir``; returns name -> path.

    ``rows`` needs ``data_source``, ``ops``, ``eager_ms`` and ``kernelbench_similarity``; missing
    measurements give an empty plot that says so.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {}

    def save(fig, name):
        fig.tight_layout()
        paths[name] = out_dir / f"{name}.png"
        fig.savefig(paths[name], dpi=110)
        plt.close(fig)

    save(op_count_figure(rows), "op_count")

    ops = Counter(op for s in rows["ops"] for op in json.loads(s)).most_common(20)
    fig, ax = plt.subplots(figsize=(6, 5))
    if ops:
        ax.barh([o for o, _ in ops][::-1], [c for _, c in ops][::-1], color="#55a868")
    ax.set_xlabel("tasks")
    ax.set_title("20 most used seed ops")
    save(fig, "top_ops")

    for name, col, xlabel, log in (("runtime", "eager_ms", f"eager median, ms ({device_label})", True),
                                   ("kernelbench_similarity", "kernelbench_similarity",
                                    "structural similarity to the nearest KernelBench problem", False)):
        vals = pd.to_numeric(rows[col], errors="coerce").dropna().to_numpy()
        vals = vals[vals > 0] if log else vals
        fig, ax = plt.subplots(figsize=(6, 3.2))
        if len(vals):
            bins = np.logspace(np.log10(vals.min()), np.log10(vals.max() * 1.001), 30) if log else 30
            ax.hist(vals, bins=bins, color="#c44e52")
            if log:
                ax.set_xscale("log")
        else:
            ax.text(0.5, 0.5, "not measured", ha="center", va="center", transform=ax.transAxes)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("tasks")
        save(fig, name)
    return paths
