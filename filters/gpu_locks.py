"""Cross-process reader/writer locks over one physical GPU, for the sandboxes that share it.

Several sandbox children run tasks on one GPU at once, so that one task's compilation (CPU) overlaps
another's GPU work. Two locks per physical GPU coordinate them:

* ``compute``: every stretch of a task's GPU work (building the model, forward calls, output comparisons)
  holds it *shared*; timing holds it *exclusively*. Without MPS a GPU time-slices between processes, so a
  neighbour's kernel running during a timed call would land inside the CUDA-event window and inflate the
  measurement; with the lock, a timed call has the GPU to itself. Holds are kept to GPU work: Inductor's
  compilation (CPU) runs unlocked (``filters.torch_compile``), so timing never waits for a compile.
* ``memory``: every task holds it shared from start to end; a task that ran out of memory next to the
  others is re-run holding it exclusively (no other task's tensors on the GPU), so an ``oom`` verdict
  means the task does not fit alone.

Implementation: ``flock`` on ``$TMPDIR/opforge-gpu-<gpu>.<name>`` (shared / exclusive) behind a turnstile
file ``.<name>.turnstile``: an exclusive holder takes the turnstile before waiting, so a stream of shared
holders cannot starve it. Per process the state is re-entrant: ``shared`` inside ``shared`` or
``exclusive`` is a no-op, ``exclusive`` inside ``shared`` gives up the shared hold first (and takes it back
after), so two holders upgrading at once cannot deadlock. Before giving up a hold the ``before_release``
hook runs (``torch.cuda.synchronize`` for ``compute``: queued kernels still count as this holder's work).

``<gpu>`` is the physical GPU: the device's entry in ``CUDA_VISIBLE_DEVICES`` (``physical_gpu``), so
sandboxes pinned to the same card by different visible-device lists still meet on one lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import time
from collections.abc import Callable, Iterator


def visible_gpu_ids() -> list[str] | None:
    """The entries of ``CUDA_VISIBLE_DEVICES`` (indices or UUIDs, as given; ``-1`` and blanks dropped), or
    None when it is not set."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is None:
        return None
    return [v.strip() for v in env.split(",") if v.strip() and v.strip() != "-1"]


def physical_gpu(index: int | None = 0) -> str:
    """The id of the physical GPU behind visible device ``index``: its ``CUDA_VISIBLE_DEVICES`` entry
    (else the index itself)."""
    index = index or 0
    ids = visible_gpu_ids() or []
    return ids[index] if index < len(ids) else str(index)


# Called with True when a lock acquisition starts to block and with False when it got the lock; a sandbox
# child reports both to its parent, which stops the task's timeout clock in between (waiting for a
# neighbour is not the task's time).
on_wait: Callable[[bool], None] | None = None


class GpuLock:
    """One named reader/writer lock over one physical GPU (see the module docstring).

    Attributes:
        waited_s: seconds this process has spent waiting to acquire it (shared or exclusive).
        mode: None, "shared" or "exclusive" - what this process holds now.
    """

    def __init__(self, gpu: str, name: str, before_release: Callable[[], None] | None = None):
        base = os.path.join(tempfile.gettempdir(), f"opforge-gpu-{gpu}.{name}")
        self.paths = (base, base + ".turnstile")
        self.before_release = before_release
        self.mode: str | None = None
        self.waited_s = 0.0
        self._fh = self._turn = None

    # -- raw operations ----------------------------------------------------------------------------
    def _open(self) -> None:
        if self._fh is None:
            self._fh, self._turn = open(self.paths[0], "a"), open(self.paths[1], "a")  # noqa: SIM115

    def _flock(self, fh, mode: int) -> None:
        """``flock(fh, mode)``; when it would block, ``on_wait(True)`` before and ``on_wait(False)`` after."""
        try:
            fcntl.flock(fh, mode | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        if on_wait is not None:
            on_wait(True)
        try:
            fcntl.flock(fh, mode)
        finally:
            if on_wait is not None:
                on_wait(False)

    def _acquire(self, exclusive: bool) -> None:
        self._open()
        t0 = time.perf_counter()
        self._flock(self._turn, fcntl.LOCK_EX)
        if exclusive:
            self._flock(self._fh, fcntl.LOCK_EX)  # the turnstile stays held: later shared holders queue
        else:
            fcntl.flock(self._turn, fcntl.LOCK_UN)
            self._flock(self._fh, fcntl.LOCK_SH)
        self.waited_s += time.perf_counter() - t0
        self.mode = "exclusive" if exclusive else "shared"

    def _release(self) -> None:
        try:
            if self.before_release is not None:
                self.before_release()
        finally:
            fcntl.flock(self._fh, fcntl.LOCK_UN)
            if self.mode == "exclusive":
                fcntl.flock(self._turn, fcntl.LOCK_UN)
            self.mode = None

    # -- context managers --------------------------------------------------------------------------
    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        """Hold the lock shared (no-op when this process already holds it in any mode)."""
        if self.mode is not None:
            yield
            return
        self._acquire(exclusive=False)
        try:
            yield
        finally:
            self._release()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the lock exclusively; a shared hold of this process is given up first and taken back after."""
        if self.mode == "exclusive":
            yield
            return
        had_shared = self.mode == "shared"
        if had_shared:
            self._release()
        self._acquire(exclusive=True)
        try:
            yield
        finally:
            self._release()
            if had_shared:
                self._acquire(exclusive=False)

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._turn.close()
            self._fh = self._turn = None


_LOCKS: dict[tuple[str, str], GpuLock] = {}


def gpu_lock(name: str, gpu: str | None = None) -> GpuLock:
    """This process's ``GpuLock`` ``name`` ("compute" or "memory") over physical GPU ``gpu`` (default: the
    one behind visible device 0). ``compute`` synchronises CUDA before each release."""
    gpu = physical_gpu(0) if gpu is None else gpu
    key = (gpu, name)
    if key not in _LOCKS:
        sync = None
        if name == "compute":
            import torch

            sync = torch.cuda.synchronize
        _LOCKS[key] = GpuLock(gpu, name, sync)
    return _LOCKS[key]


def _is_cuda(device) -> bool:
    return str(device).startswith("cuda")


def gpu_work(device) -> contextlib.AbstractContextManager:
    """Context for GPU work that must not overlap a neighbour's timing: ``compute`` shared on CUDA,
    nothing on CPU."""
    return gpu_lock("compute").shared() if _is_cuda(device) else contextlib.nullcontext()


def gpu_timing(device) -> contextlib.AbstractContextManager:
    """Context for a timed measurement: ``compute`` exclusive on CUDA, nothing on CPU."""
    return gpu_lock("compute").exclusive() if _is_cuda(device) else contextlib.nullcontext()


def lock_waits() -> dict[str, float]:
    """Seconds waited so far in this process, per lock name (summed over GPUs)."""
    out: dict[str, float] = {}
    for (_, name), lock in _LOCKS.items():
        out[name] = out.get(name, 0.0) + lock.waited_s
    return out
