"""Predict eager runtime of an ``OpGraph`` from FLOPs and bytes (roofline per op) and pick the batch size.

FLOPs come from ``torch.utils.flop_counter.FlopCounterMode`` on ``meta`` tensors (GEMM, conv, attention
formulas), counted op by op; bytes are each op's tensor inputs, parameters and output in the task's dtype, read
or written once. Eager runs one op after the other, so the time is the sum over ops of
``max(flops / (peak * eff), bytes / (bandwidth * eff)) + launch overhead``, with the peak of the task's dtype
(``DeviceProfile.peak_for``). ``Cost.dominant_share`` is the largest op's share of that time (launches left
out): the ``trivial`` filter rejects a task whose one op takes >= 99 % of its measured kernel time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from opforge.compose.device_profiles import DeviceProfile
from opforge.compose.graphs.graph import RECURRENT_GATES, OpGraph


@dataclass
class Cost:
    """One forward's FLOPs, bytes moved, op count, bytes of every tensor alive (``peak_bytes``, an upper bound of
    the eager peak) and bytes of the graph inputs (``input_bytes``), for the task's ``dtype``."""

    flops: float
    bytes: float
    n_ops: int
    peak_bytes: float
    input_bytes: float = 0.0
    dtype: str = "float32"
    op_flops: list[float] = field(default_factory=list)
    op_bytes: list[float] = field(default_factory=list)

    def op_ms(self, p: DeviceProfile) -> list[float]:
        """Roofline time of each op in ms, launch overhead left out."""
        if not self.op_flops:  # a cost built from totals only
            return [1e3 * max(self.flops / (p.peak_for(self.dtype) * p.flop_efficiency),
                              self.bytes / (p.bandwidth * p.bandwidth_efficiency))]
        return [1e3 * max(f / (p.peak_for(self.dtype) * p.flop_efficiency), b / (p.bandwidth * p.bandwidth_efficiency))
                for f, b in zip(self.op_flops, self.op_bytes, strict=True)]

    def predict_ms(self, p: DeviceProfile) -> float:
        return sum(self.op_ms(p)) + self.n_ops * p.launch_overhead_ms

    def dominant_share(self, p: DeviceProfile) -> float:
        """The largest op's share of the predicted op time (1.0 for a one-op graph)."""
        times = self.op_ms(p)
        return max(times) / sum(times) if sum(times) > 0 else 1.0


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def graph_cost(graph: OpGraph, sizes: dict[str, int] | None = None) -> Cost:
    """FLOPs and bytes of one forward of ``graph`` at ``sizes`` (default: the graph's own)."""
    counted: dict[str, float] = {}
    vals = graph.run("meta", sizes, op_flops=counted)
    elem = torch.empty((), dtype=getattr(torch, graph.dtype)).element_size()
    op_flops, op_bytes = [], []
    for n in graph.ops():
        label = graph.g.nodes[n]["label"]
        if label in RECURRENT_GATES:  # shape-only on meta: count the gate GEMMs here
            x, init = vals[graph.args_of(n)[0]], graph.g.nodes[n]["init_args"]
            h = init["hidden_size"]
            f = 2 * RECURRENT_GATES[label] * (init["input_size"] + h) * h * x.shape[0] * x.shape[1]
        else:
            f = counted[n]
        op_flops.append(float(f))
        b = sum(_nbytes(vals[a]) for a in graph.args_of(n)) + _nbytes(vals[n])
        b += sum(math.prod(s) * elem for s, _, _ in graph.g.nodes[n]["params"].values())
        op_bytes.append(float(b))
    peak = sum(_nbytes(v) for v in vals.values())
    inputs = sum(_nbytes(vals[n]) for n in graph.inputs())
    return Cost(flops=sum(op_flops), bytes=sum(op_bytes), n_ops=len(graph.ops()), peak_bytes=float(peak),
                input_bytes=float(inputs), dtype=graph.dtype, op_flops=op_flops, op_bytes=op_bytes)


def _nice(n: float) -> int:
    """Round to 2 significant binary digits (1, 2, 3, 4, 6, 8, 12, 16, ...)."""
    if n <= 1:
        return 1
    e = 2 ** math.floor(math.log2(n))
    return int(e if n < 1.25 * e else (1.5 * e if n < 1.75 * e else 2 * e))


def choose_batch(graph: OpGraph, profile: DeviceProfile, batch_name: str = "batch_size") -> tuple[int, float]:
    """Pick ``sizes[batch_name]`` so the predicted eager time is the window's log-midpoint, within the
    profile's memory cap and ``max_batch``. Returns (batch, predicted ms); the graph's sizes are updated.

    Raises MemoryError when the graph exceeds the memory cap even at batch 1.
    """
    lo, hi = profile.window_ms
    target = math.sqrt(max(lo, 1e-3) * hi)
    if batch_name not in graph.sizes:
        return 0, graph_cost(graph).predict_ms(profile)
    n0 = graph.sizes[batch_name]
    c0 = graph_cost(graph)
    work0 = c0.predict_ms(profile) - c0.n_ops * profile.launch_overhead_ms
    budget = target - c0.n_ops * profile.launch_overhead_ms
    scale = budget / work0 if work0 > 0 and budget > 0 else 1.0
    n = n0 * scale
    if c0.peak_bytes > 0:
        n = min(n, n0 * profile.memory_cap_bytes / c0.peak_bytes)
    n = max(1, min(_nice(n), profile.max_batch))
    # memory may grow faster than linearly in the batch (cdist, outer, kron): halve until it fits
    while True:
        sizes = {**graph.sizes, batch_name: n}
        try:
            c = graph_cost(graph, sizes)
        except Exception:
            return n0, c0.predict_ms(profile)
        if c.peak_bytes <= profile.memory_cap_bytes:
            break
        if n == 1:
            raise MemoryError(f"{c.peak_bytes / 2**30:.1f} GiB at batch 1 exceeds the {profile.name} memory cap")
        n = max(1, n // 2)
    graph.sizes = sizes
    return n, c.predict_ms(profile)
