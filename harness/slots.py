"""Tensors shared between the grader and a model server child: input and output *slots*.

The grader allocates every slot; a child only maps them. A slot is described by a JSON-able spec
(``SlotSpec``: shape, dtype, where it lives), so nothing a child sends back is ever unpickled by the grader.

* CPU: one file per slot in a private directory on ``/dev/shm`` (else the system temp directory), mapped
  shared by both sides with ``torch.from_file(..., shared=True)``.
* CUDA: the grader's tensors go to the child through CUDA IPC (``torch.multiprocessing``'s reductions,
  pickled by the grader and unpickled by the child); ``SlotSpec.ipc`` is the index into that list. CUDA IPC
  maps the whole allocator segment a tensor lies in, not just the tensor, so a set shared with untrusted code
  (``private=True``: the candidate's) is allocated from a memory pool of its own (``torch.cuda.MemPool``): its
  segments hold nothing but its own slots, never the reference's slots or the inputs drawn for later rounds.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from opforge.engine.tempdirs import make as make_tmp


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"float32"``."""
    return str(dtype).removeprefix("torch.")


def dtype_from(name: str) -> torch.dtype:
    """The inverse of ``dtype_name``. Raises ValueError for a name that is not a torch dtype."""
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"slots: {name!r} is not a torch dtype")
    return dt


@dataclass
class SlotSpec:
    """Where one shared tensor lives: ``shape`` (list of ints), ``dtype`` (``dtype_name``), and either
    ``path`` (CPU file) or ``ipc`` (index into the CUDA IPC list sent with the setup message)."""

    shape: list[int]
    dtype: str
    path: str | None = None
    ipc: int | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def slot_dir() -> Path:
    """A fresh private (0700) directory for CPU slot files, on ``/dev/shm`` where it exists, in the process tree's
    temporary session (``engine.tempdirs``: removed at its end even when a grader child is killed)."""
    return make_tmp("opforge-slots-", shm=True)


class SlotSet:
    """Grader-side allocator of slots for one device.

    Attributes:
        tensors: every slot allocated so far, in allocation order (the grader's own views).
        specs: their ``SlotSpec`` s, same order.
        pool: on CUDA with ``private``, the ``torch.cuda.MemPool`` every slot is allocated from (None otherwise,
            and on a torch without ``MemPool``, where the set shares the caching allocator's segments).
    """

    def __init__(self, device: str, directory: Path | None = None, private: bool = False):
        self.device = device
        self.cuda = device.startswith("cuda")
        self.directory = None if self.cuda else (directory or slot_dir())
        self.tensors: list[torch.Tensor] = []
        self.specs: list[SlotSpec] = []
        self.pool = torch.cuda.MemPool() if self.cuda and private and hasattr(torch.cuda, "use_mem_pool") else None

    def new(self, shape: tuple[int, ...] | torch.Size, dtype: torch.dtype) -> tuple[int, torch.Tensor]:
        """Allocate one slot (zero-filled); returns (index, tensor)."""
        shape = [int(s) for s in shape]
        numel = 1
        for s in shape:
            numel *= s
        index = len(self.tensors)
        if self.cuda:
            if self.pool is not None:
                with torch.cuda.use_mem_pool(self.pool):
                    t = torch.zeros(shape, dtype=dtype, device=self.device)
            else:
                t = torch.zeros(shape, dtype=dtype, device=self.device)
            spec = SlotSpec(shape, dtype_name(dtype), ipc=index)
        else:
            path = self.directory / f"slot{index}"
            flat = torch.from_file(str(path), shared=True, size=max(numel, 1), dtype=dtype)
            t = flat[:numel].view(shape)
            spec = SlotSpec(shape, dtype_name(dtype), path=str(path))
        self.tensors.append(t)
        self.specs.append(spec)
        return index, t

    def ipc_blob(self) -> bytes | None:
        """The CUDA tensors pickled for the child (None on CPU). Needs the grader to keep ``tensors`` alive
        for as long as the child uses them."""
        if not self.cuda:
            return None
        from multiprocessing.reduction import ForkingPickler

        from torch import multiprocessing  # noqa: F401 - registers the CUDA IPC reductions

        return bytes(ForkingPickler.dumps(self.tensors))

    def close(self) -> None:
        """Drop this set's tensors and its memory pool (its segments go back to the driver at the next
        ``torch.cuda.empty_cache`` once nothing holds them) and remove the CPU slot files (a child's mappings stay
        valid until it frees them)."""
        self.tensors = []
        self.pool = None
        if self.directory is not None:
            for p in self.directory.glob("slot*"):
                p.unlink(missing_ok=True)
            self.directory.rmdir()
            self.directory = None


def map_slots(specs: list[dict], ipc_blob: bytes | None) -> list[torch.Tensor]:
    """Child side: the tensors behind ``specs`` (``SlotSpec`` dicts). Raises ValueError for a spec that names
    neither a file nor an IPC index."""
    shared = None
    if ipc_blob is not None:
        import pickle

        from torch import multiprocessing  # noqa: F401 - the CUDA IPC rebuild functions

        shared = pickle.loads(ipc_blob)  # noqa: S301 - sent by the grader, which this child trusts
    out = []
    for raw in specs:
        spec = SlotSpec(**raw)
        dtype = dtype_from(spec.dtype)
        numel = 1
        for s in spec.shape:
            numel *= int(s)
        if spec.path is not None:
            flat = torch.from_file(spec.path, shared=True, size=max(numel, 1), dtype=dtype)
            out.append(flat[:numel].view(spec.shape))
        elif spec.ipc is not None and shared is not None:
            out.append(shared[spec.ipc])
        else:
            raise ValueError(f"slots: spec {raw} names no file and no CUDA IPC tensor")
    return out
