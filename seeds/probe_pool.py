"""Harvest work in sandboxed child processes, in parallel over the machine's cores.

One ``pebble.ProcessPool`` of spawned workers (never forked: the parent may already run torch threads)
runs two kinds of unit: ``probe_unit`` (one draft, or one transformers block's drafts tried in turn, then
re-probed and dtype-probed) and ``family_unit`` (import one transformers model family and list its block
drafts). Each worker imports torch and the probe once, runs torch with one thread, sees no GPU and
discards its stdout / stderr.

What a unit cannot report itself becomes a ``SkipRecord`` (``ProbePool.unit_result``), and the pool
replaces the worker:

* ``timeout`` - no result within ``PoolSettings.timeout_s`` of the unit's start; the worker is killed;
* ``crash:<SIGNAL>`` (``crash:SIGSEGV``, ``crash:SIGABRT``...) or ``crash:exit<code>`` - the worker died;
* ``oom`` - an allocation failed against the memory bound: while a unit runs, the worker's address space
  (``RLIMIT_AS``) is capped at its size when the unit started plus ``PoolSettings.memory_gib``, so an
  allocation past it fails inside the probe (``MemoryError``, torch's "can't allocate memory") instead of
  exhausting the machine; a probe whose last error is such a failure is skipped as ``oom``, that error as
  its detail. A worker the kernel kills (``SIGKILL``) shows as ``crash:SIGKILL``.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import resource
import signal
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from opforge.seeds.seed_op import SeedOp, SkipRecord
from pebble import ProcessExpired, ProcessPool

# Substrings of an error that mean an allocation failed (torch's CPU allocator, Python, C++, errno ENOMEM).
_OOM_MARKERS = ("can't allocate memory", "memoryerror", "out of memory", "bad_alloc", "cannot allocate memory")


@dataclass(frozen=True)
class PoolSettings:
    """Shape and limits of the harvest's process pool.

    Attributes:
        workers: worker processes (None: ``usable_cores()``).
        timeout_s: wall-clock limit of one unit (a probe with its re-probe and dtype probe, or one family's
            import and listing), seconds, counted from the unit's start in its worker. The slowest units of
            the catalog (transformers 5 / torch 2.13: ``BambaDecoderLayer`` ~20 s of one core, hybrid Mamba
            and OLMo layers ~10 s) ran past 60 s on a 2-core machine shared by several jobs; 180 s keeps them.
        memory_gib: how far a worker's address space may grow during one unit, GiB (``RLIMIT_AS``). At 4 GiB
            one template is lost against an unbounded harvest: ``torch.diagflat`` of a 5-D input (a
            23,040 x 23,040 float32 output, twice); unbounded, that harvest peaked at 10 GiB resident.
    """

    workers: int | None = None
    timeout_s: float = 180.0
    memory_gib: float = 4.0

    def __post_init__(self):
        if self.workers is not None and self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")
        if self.timeout_s <= 0 or self.memory_gib <= 0:
            raise ValueError(f"timeout_s and memory_gib must be > 0, got {self.timeout_s}, {self.memory_gib}")


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity API (macOS)
        return os.cpu_count() or 1


# -- worker side --------------------------------------------------------------------------------------
def _init_worker() -> None:
    # probes run on CPU and ``meta``: no worker may create a CUDA context (GPU memory, and tens of GiB of
    # address space that the memory bound would refuse)
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    import warnings

    import opforge.seeds.probe  # noqa: F401 - imported once here, not inside the first unit's time limit
    import opforge.task.trace  # noqa: F401
    import torch
    from transformers.utils import logging as hf_logging

    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    hf_logging.set_verbosity_error()


@contextlib.contextmanager
def memory_bound(extra_bytes: int):
    """Cap this process's address space (soft ``RLIMIT_AS``) at its current size + ``extra_bytes`` inside
    the block, and restore the previous soft limit after it."""
    import psutil

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = psutil.Process().memory_info().vms + int(extra_bytes)
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def is_oom_error(text: str) -> bool:
    """Whether an error text says that an allocation failed."""
    t = text.lower()
    return any(m in t for m in _OOM_MARKERS)


def probe_unit(drafts: list[SeedOp], memory_bytes: int) -> SeedOp | SkipRecord:
    """Worker: probe ``drafts`` in turn until one validates, probe that op once more (a recipe must
    reproduce: the same output shape, else ``unstable``), then record its dtypes (``probe.probe_dtypes``).
    Returns the op or the last ``SkipRecord`` (``oom`` when its error is a failed allocation)."""
    from opforge.seeds.probe import probe, probe_dtypes

    result: SeedOp | SkipRecord | None = None
    try:
        with memory_bound(memory_bytes):
            for draft in drafts:
                result = probe(draft)
                if isinstance(result, SeedOp):
                    break
            if isinstance(result, SeedOp):
                again = probe(result)
                if not isinstance(again, SeedOp) or again.output_shape != result.output_shape:
                    result = SkipRecord(label=result.label, qualname=result.qualname, library=result.library,
                                        reason="unstable", detail=getattr(again, "detail", ""))
                else:
                    result = result.model_copy(update={"dtypes": probe_dtypes(result)})
    except MemoryError as exc:  # raised outside the probe's own handlers
        d = drafts[-1]
        return SkipRecord(label=d.label, qualname=d.qualname, library=d.library, reason="oom",
                          detail=f"MemoryError: {exc}"[:300])
    if isinstance(result, SkipRecord) and result.reason != "oom" and is_oom_error(result.detail):
        result = result.model_copy(update={"reason": "oom", "detail": f"{result.reason}: {result.detail}"[:300]})
    return result


def family_unit(version: str, family: str, memory_bytes: int) -> list[list[SeedOp] | SkipRecord]:
    """Worker: ``transformers_candidates.family_blocks`` of one model family, under the memory bound."""
    from opforge.seeds.transformers_candidates import family_blocks

    with memory_bound(memory_bytes):
        return family_blocks(version, family)


# -- parent side --------------------------------------------------------------------------------------
class ProbePool:
    """The harvest's worker pool (a context manager). ``submit_*`` return ``concurrent.futures.Future``s;
    read them with ``unit_result``, which turns a timeout or a dead worker into a ``SkipRecord``."""

    def __init__(self, settings: PoolSettings | None = None):
        self.settings = settings or PoolSettings()
        self.workers = self.settings.workers or usable_cores()
        self._bytes = int(self.settings.memory_gib * 2**30)
        self._pool = ProcessPool(max_workers=self.workers, initializer=_init_worker,
                                 context=multiprocessing.get_context("spawn"))

    def submit_probe(self, drafts: list[SeedOp]) -> Future:
        return self._pool.schedule(probe_unit, (drafts, self._bytes), timeout=self.settings.timeout_s)

    def submit_family(self, version: str, family: str) -> Future:
        return self._pool.schedule(family_unit, (version, family, self._bytes), timeout=self.settings.timeout_s)

    def close(self) -> None:
        self._pool.stop()
        self._pool.join()

    def __enter__(self) -> ProbePool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def unit_result(self, future: Future, label: str, qualname: str, library: str) -> Any:
        """``future``'s result, or a ``SkipRecord`` for ``label`` with reason ``timeout``, ``crash:<SIGNAL>``
        / ``crash:exit<code>`` or ``pool_error`` (any other exception, its text as detail)."""
        try:
            return future.result()
        except TimeoutError:
            reason, detail = "timeout", f"no result within {self.settings.timeout_s:g} s; worker killed"
        except ProcessExpired as exc:
            reason, detail = crash_reason(exc.exitcode), str(exc)
        except Exception as exc:  # noqa: BLE001 - e.g. an unpicklable result: still a record
            reason, detail = "pool_error", f"{type(exc).__name__}: {exc}"
        return SkipRecord(label=label, qualname=qualname, library=library, reason=reason, detail=detail[:300])


def crash_reason(exitcode: int | None) -> str:
    """``crash:SIGSEGV`` for a worker killed by a signal (negative exit code), else ``crash:exit<code>``."""
    if exitcode is not None and exitcode < 0:
        try:
            return f"crash:{signal.Signals(-exitcode).name}"
        except ValueError:
            return f"crash:signal{-exitcode}"
    return f"crash:exit{exitcode}"
