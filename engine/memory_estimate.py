"""Peak memory of a task's eager forward, predicted without running it on the device (``FakeTensorMode``).

The filter stage admits a task to a shared GPU by the memory it reserves (``engine.gpu_locks.MemoryBudget``).
Before anything has run, the reservation is a guess, and a task whose forward then needs tens of GiB makes
its neighbours run out of memory (composed tasks peak at 7-65 GiB from inputs of 0.2-4.5 GiB on one H200,
measured 2026-11-22; record in the git history of docs/benchmark-log.md). ``predict_peak_bytes`` builds the
model, draws the inputs and calls the forward on fake tensors (shapes, dtypes and devices, no storage, no
kernels: PyTorch's ``torch._subclasses.fake_tensor.FakeTensorMode``), and counts the bytes of every tensor
an operator creates while it stays alive, as the caching allocator would hold them: the peak covers the
parameters, the inputs and the intermediates alive at once. It leaves out allocator rounding and caching,
library workspaces (cuBLAS, cuDNN) and the CUDA context, so a caller adds its own margin.

A task that fake tensors cannot run (data-dependent shapes, ``.item()``, an operator without a fake
implementation, a failing constructor) gets None: the caller keeps its default.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from opforge.engine.execution import BUILD_SEED, INPUT_SEED
from opforge.task.source import load_task
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class _LiveBytes(TorchDispatchMode):
    """Counts the bytes of the storages operators create, for as long as each storage is alive (a
    weak reference per storage, swept at every operator: a parameter or a view keeps its storage alive
    after the tensor that created it is gone); ``peak`` is the most at once."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, tuple[StorageWeakRef, int]] = {}
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.live = {k: v for k, v in self.live.items() if not v[0].expired()}
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                ref = StorageWeakRef(t.untyped_storage())
                if ref.cdata not in self.live:  # views and in-place results share a counted storage
                    self.live[ref.cdata] = (ref, t.untyped_storage().nbytes())
        self.peak = max(self.peak, sum(n for _, n in self.live.values()))
        return out


class Footprint(NamedTuple):
    """What one fake-tensor run of a task measured, in bytes: ``peak`` (alive at once: parameters, inputs,
    intermediates), ``inputs`` (the tensors of ``get_inputs()``), ``outputs`` (the tensors the forward
    returns)."""

    peak: int
    inputs: int
    outputs: int


def predict_footprint(code: str, device: str = "cuda", task_id: str = "<task>") -> Footprint | None:
    """The ``Footprint`` of ``Model(*get_init_inputs())`` built, ``get_inputs()`` drawn and the forward
    called under ``no_grad``, all on fake tensors of ``device`` (see the module docstring).

    The task source is executed afresh (its module-level tensors become fake too), so nothing of this is
    shared with a real run of the same task. Returns None when fake tensors cannot run the task or the
    forward returns no tensor; never raises for anything the task does.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    counter = _LiveBytes()
    try:
        with FakeTensorMode(allow_non_fake_inputs=True), counter, torch.device(device), torch.no_grad():
            task = load_task(code, task_id)
            torch.manual_seed(BUILD_SEED)
            model = task.build()
            torch.manual_seed(INPUT_SEED)
            inputs: list[Any] = task.inputs()
            out = model(*inputs)
            outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
            if not outs:
                return None
            in_bytes = sum(t.untyped_storage().nbytes() for t in tree_leaves(inputs) if isinstance(t, torch.Tensor))
            out_bytes = sum(t.numel() * t.element_size() for t in outs)
            del model, inputs, out, outs
    except Exception:  # noqa: BLE001 - any failure means "no prediction"
        return None
    return Footprint(counter.peak, in_bytes, out_bytes)


def predict_peak_bytes(code: str, device: str = "cuda", task_id: str = "<task>") -> int | None:
    """``predict_footprint(...).peak``: bytes alive at once during build, draw and forward on fake tensors,
    or None when fake tensors cannot run the task."""
    fp = predict_footprint(code, device, task_id)
    return None if fp is None else fp.peak
