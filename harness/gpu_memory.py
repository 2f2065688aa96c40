"""What one evaluation reserves on its GPU (``engine.gpu_locks.MemoryBudget``, shared with the filter stage).

An evaluation holds GPU memory in three processes: the grader (the input and output slots of both servers,
``input_sets`` public sets and ``VARIANT_SETS`` per hidden shape variant; the drawn inputs waiting for their
round; the copies of one round's outputs), the reference server (the model, ``torch.compile``'s buffers, a
batch of drawn inputs) and the candidate server (its copy of the weights and its own work). The reference
server reserves the sum for the whole evaluation before it touches the GPU, and holds it until it exits,
which the grader makes the last step of an evaluation (after its own tensors are freed and its cache
emptied), so a neighbour is never admitted into memory the evaluation still holds.

Per shape (the public one and each variant) a ``Shape``: ``sets`` rotating slot sets, bytes of one set of
inputs and of outputs, and the peak of one eager forward (parameters, inputs, intermediates). Before setup
the shapes come from a fake-tensor run of the task (``engine.memory_estimate.predict_footprint``; no GPU
work); after setup the reservation grows (without waiting, like a filter task's) to the same sum over the
measured layouts and the reference's measured peak.
"""

from __future__ import annotations

from typing import NamedTuple

# slot sets per hidden shape variant (the grader rotates two per variant)
VARIANT_SETS = 2
# the reference's peak x this covers eager and torch.compile's buffers (Inductor keeps its own outputs and
# workspaces next to the eager model's; the filter stage's whole chain peaked at 2.0 x the predicted eager
# forward at the median over 693 tasks on one H200, measured 2026-11-22; record in the
# git history of docs/benchmark-log.md)
REFERENCE_FACTOR = 2.0
# a server process's CUDA context and library handles: a server that had run nothing yet held 518 MiB in
# the CUDA out-of-memory report of the H200 batch run (benchmarks/results/h200/harness_batch.json)
CONTEXT_BYTES = 512 * 2**20
# the L2 flush buffer of the grader (``engine.timing.l2_flush_buffer``: twice the L2, 120 MB on an H200)
FLUSH_BYTES = 128 * 2**20
# allocator rounding and fragmentation over the sum
MARGIN = 1.1


def slot_sets(input_sets: int, burst: int, graphs: bool) -> int:
    """Rotating slot sets of the public shape an evaluation allocates, for bursts of at most ``burst`` calls:
    ``max(input_sets, burst)`` for plain bursts; with CUDA graphs (``EvalConfig.cuda_graphs``) the rounds rotate
    over the sets the first rounds capture (``harness.grader``: a burst's own sets, two when a burst is one
    call), so ``max(burst, 2)``."""
    return max(int(burst), 2) if graphs else max(int(input_sets), int(burst))


class Shape(NamedTuple):
    """One input shape of an evaluation: ``sets`` rotating slot sets, bytes of one set of ``inputs`` and of
    ``outputs``, the eager forward's ``peak`` bytes."""

    sets: int
    inputs: int
    outputs: int
    peak: int


def evaluation_bytes(shapes: list[Shape]) -> int:
    """Bytes one evaluation needs on its GPU, all three processes together (see the module docstring):

    * grader: per shape ``sets`` x (inputs + outputs) slots for each server, plus ``sets`` drawn input sets
      waiting; two copies of the largest outputs; the L2 flush buffer;
    * reference: ``REFERENCE_FACTOR`` x the largest peak, plus the largest batch of drawn inputs;
    * candidate: the largest peak;

    times ``MARGIN``, plus ``CONTEXT_BYTES`` for each server. Raises ValueError for no shape."""
    if not shapes:
        raise ValueError("evaluation_bytes: no shape")
    grader = sum(2 * s.sets * (s.inputs + s.outputs) + s.sets * s.inputs for s in shapes)
    grader += 2 * max(s.outputs for s in shapes) + FLUSH_BYTES
    peak = max(s.peak for s in shapes)
    reference = REFERENCE_FACTOR * peak + max(s.sets * s.inputs for s in shapes)
    return int(MARGIN * (grader + reference + peak)) + 2 * CONTEXT_BYTES


def layout_bytes(layout: list[dict]) -> int:
    """Bytes of the tensors of a layout (``harness.reference_process``: dicts with ``shape`` and ``dtype``;
    entries with ``"tensor": False`` are JSON values and count 0). Raises ValueError for a dtype name that is
    not a torch dtype (``harness.slots.dtype_from``)."""
    import math

    from opforge.harness.slots import dtype_from

    return sum(math.prod(int(d) for d in a["shape"]) * dtype_from(a["dtype"]).itemsize
               for a in layout if a.get("tensor", True))
