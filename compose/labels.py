"""Recover op labels from rendered code by tracing it (on ``meta`` by default) and compare them with ``ops``."""

from __future__ import annotations

from opforge.task.source import load_task
from opforge.task.trace import trace_task


def recovered_labels(code: str, name: str = "<task>", device: str = "meta") -> list[tuple[str, ...]]:
    """For each op the task's forward calls (in order), the labels it may be spelled as.

    ``device``: where the model and inputs are built for the trace (``meta``: shapes only; ``cpu`` for a
    task with an op that has no meta kernel). Raises whatever loading, building or running the task raises.
    """
    return [op.labels for op in trace_task(load_task(code, name), device=device)]


def labels_match(code: str, ops: list[str], name: str = "<task>", device: str = "meta") -> bool:
    """True if the traced call sequence is exactly ``ops`` (one traced op per label, same order)."""
    rec = recovered_labels(code, name, device)
    return len(rec) == len(ops) and all(label in alts for label, alts in zip(ops, rec, strict=True))
