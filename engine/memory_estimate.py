"""Peak memory of a task's eager forward, predicted without running it on the device (``FakeTensorMode``).

The filter stage admits a task to a shared GPU by the memory it reserves (``engine.gpu_locks.MemoryBudget``).
Before anything has run, the reservation is a guess, and a task whose forward then needs tens of GiB makes
its neighbours run out of memory (composed tasks peak at 7-65 GiB from inputs of 0.2-4.5 GiB on an H200:
docs/benchmark-log.md, 2026-11-22 (baa7831)). ``predict_peak_bytes`` builds the model,
draws the inputs and calls the forward on fake tensors (shapes, dtypes and devices, no storage, no
kernels: PyTorch's ``torch._subclasses.fake_tensor.FakeTensorMode``), and counts the bytes of every tensor
an operator creates while it stays alive, as the caching allocator would hold them: the peak covers the
parameters, the inputs and the intermediates alive at once. It leaves out allocator rounding and caching,
library workspaces (cuBLAS, cuDNN) and the CUDA context, so a caller adds its own margin.

A task that fake tensors cannot run (data-dependent shapes, ``.item()``, an operator without a fake
implementation, a failing constructor) gets None: the caller keeps its default.
"""

from __future__ import annotations

from typing import Any

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


def predict_peak_bytes(code: str, device: str = "cuda", task_id: str = "<task>") -> int | None:
    """Bytes alive at once while ``Model(*get_init_inputs())`` is built, ``get_inputs()`` drawn and the
    forward called under ``no_grad``, all on fake tensors of ``device`` (see the module docstring).

    The task source is executed afresh (its module-level tensors become fake too), so nothing of this is
    shared with a real run of the same task. Returns None when fake tensors cannot run the task; never
    raises for anything the task does.
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
            if not any(isinstance(t, torch.Tensor) for t in tree_leaves(out)):
                return None
            del model, inputs, out
    except Exception:  # noqa: BLE001 - any failure means "no prediction"
        return None
    return counter.peak
