"""Entry point of a sandbox child: ``python -m opforge.engine.sandbox_child RESULT_FD``.

Protocol (length-prefixed pickles, see ``engine.sandbox``): the parent sends ``("job", "MODULE:CLASS",
settings dict)`` first; the child imports torch, applies the engine's settings (memory guard, threads,
CUDA), builds the job (``load_job``: the class named by import path, e.g. the filter chain, called with the
settings) and answers ``("ready", info)``. Then for each ``("task", task_id, code)`` it sends
``("stage", name)`` before every stage of the job (a filter), ``("lock_wait",
True / False)`` when it starts / stops waiting for a GPU lock (the parent's timeout clock stops in
between), ``("gpu_hold", True, {"mode", "kind", "path"})`` / ``("gpu_hold", False)`` when it starts /
stops holding one (one GPU step: the parent ends the task when a step outlasts ``gpu_step_limit_s``, or
a shared "forward" step had more than ``gpu_share_limit_s`` of the GPU, see ``engine.sandbox``), and
finally the job's result dict.
``("task", task_id, code, alone, reserve_gib)``: ``alone`` runs it with no other task on its GPU,
``reserve_gib`` sets its memory reservation (see ``_run_on_gpu``). ``("stop",)`` or a closed stdin ends
the child; so does the parent's death (checked every second), so an orphaned child never keeps a GPU
busy.
"""

from __future__ import annotations

import os
import resource
import sys
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any, Protocol


class SandboxJob(Protocol):
    """What a sandbox child runs (named by import path, ``MODULE:CLASS``, built as ``CLASS(settings)``).

    Attributes:
        device_stages: names of the stages that use the GPU (admission comes before the first of them).
    """

    device_stages: frozenset[str]

    def warm_up(self) -> dict[str, Any]:
        """One-time work of a fresh child (e.g. a first compile); returns facts for the ready message."""

    def run(self, task_id: str, code: str, on_stage: Callable[[str], None]) -> dict[str, Any]:
        """The verdict dict of one task (``accepted``, ``reason``, ``filter``, ``metrics``, ``seconds``);
        ``on_stage(name)`` before each stage. Never raises for the task's faults."""

    def release(self) -> None:
        """Drop every object of the last task."""


def load_job(path: str, settings: dict[str, Any]) -> SandboxJob:
    """``CLASS(settings)`` for ``path`` = ``"package.module:CLASS"``. Raises ValueError for a malformed path."""
    import importlib

    module, sep, name = path.partition(":")
    if not (sep and module and name):
        raise ValueError(f"sandbox job {path!r}: expected 'package.module:Class'")
    return getattr(importlib.import_module(module), name)(settings)


def _exit_with_parent(ppid: int) -> None:
    while True:
        if os.getppid() != ppid:
            os._exit(3)
        time.sleep(1.0)


def _apply(settings: dict) -> dict:
    """Memory guard, threads and compiler settings; returns facts about this child for the parent."""
    import torch
    import torch._inductor.config as inductor_config

    # parallelism comes from the sandboxes, not from each compile, unless the run asks for more
    inductor_config.compile_threads = int(settings.get("compile_threads") or 1)
    info = {"pid": os.getpid(), "torch": torch.__version__, "device": settings["device"]}
    if settings["device"] == "cpu":
        if settings.get("address_space_cap", True) and settings["memory_gib"] > 0:
            # address-space cap above what the imports already mapped: an oversized allocation fails inside
            # the task and comes back as an "oom" verdict without losing the child
            limit = _vm_size() + int(settings["memory_gib"] * 2**30)
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
            info["address_space_limit"] = limit
        torch.set_num_threads(max(1, settings.get("cpu_threads") or 1))
        info["threads"] = torch.get_num_threads()
    else:
        if not torch.cuda.is_available():
            raise RuntimeError("device 'cuda' asked for, but torch.cuda.is_available() is False")
        torch.empty(1, device="cuda")  # create the CUDA context now, so the memory baseline includes it
        info["gpu"] = torch.cuda.get_device_name(0)
        info["visible"] = os.environ.get("CUDA_VISIBLE_DEVICES")
        info["alloc_conf"] = os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
        # pinned precision (docs/DESIGN.md §4): no TF32 unless the run says otherwise
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    info["rss"] = _status_bytes("VmRSS")
    return info


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _vm_size() -> int:
    return _status_bytes("VmSize")


def main() -> None:
    from opforge.engine.sandbox import read_message, send_message

    out = os.fdopen(int(sys.argv[1]), "wb")
    inp = sys.stdin.buffer.fileno()
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    warnings.filterwarnings("ignore")
    try:
        kind, job_path, settings = read_message(inp)
    except EOFError:
        return
    if kind != "job":
        raise SystemExit(f"sandbox child: expected the job message first, got {kind!r}")
    if settings["device"] == "cuda":
        # several sandboxes share the GPU: expandable segments keep each one's cached memory unfragmented
        # (allocator peak 1.06x the tensors' peak against 1.24x with the default allocator, and fewer tasks
        # out of memory next to each other; 700 tasks, 14 sandboxes on one H200, measured 2026-11-22; record
        # in the git history of docs/benchmark-log.md).
        os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    info = _apply(settings)
    job = load_job(job_path, settings)
    from opforge.engine import gpu_locks

    gpu_locks.COMPUTE_SLOTS = int(settings.get("gpu_concurrency") or 0)
    gpu_locks.on_wait = lambda waiting: send_message(out, ("lock_wait", waiting))

    def on_hold(holding: bool, lock) -> None:
        if holding:
            send_message(out, ("gpu_hold", True, {"mode": lock.mode, "kind": lock.kind, "path": lock.paths[0]}))
            return
        send_message(out, ("gpu_hold", False))
        if _after_gpu_step is not None:
            _after_gpu_step()

    gpu_locks.on_hold = on_hold
    info.update(job.warm_up())
    if settings["device"] == "cuda":
        from opforge.engine.execution import warm_up_cuda_libraries

        info["library_warm_up"] = warm_up_cuda_libraries("cuda")
    info["gc_frozen"] = _freeze_start_up_objects()
    send_message(out, ("ready", info))
    while True:
        try:
            msg = read_message(inp)
        except EOFError:
            _exit_now()
        if msg[0] == "stop":
            _exit_now()
        _, task_id, code, *rest = msg
        alone = bool(rest and rest[0])
        reserve_gib = rest[1] if len(rest) > 1 else None

        def stage(name: str) -> None:
            send_message(out, ("stage", name))

        if settings["device"] == "cuda":
            result = _run_on_gpu(job, task_id, code, stage, alone, settings, reserve_gib)
        else:
            result = job.run(task_id, code, stage)
            job.release()
        send_message(out, result)
        if result.get("cuda_broken"):
            # a device-side assert or illegal access poisons this process's CUDA context for good: end
            # the child so the parent starts a fresh one for the next task
            out.flush()
            os._exit(4)


# While a task runs on the GPU: called after each of its GPU steps (a lock hold, after the synchronisation)
_after_gpu_step: Callable[[], None] | None = None


def _run_on_gpu(job, task_id: str, code: str, stage, alone: bool, settings: dict,
                reserve_gib: float | None = None) -> dict:
    """``job.run`` on a GPU shared with other sandboxes, under the GPU's memory admission
    (``engine.gpu_locks.MemoryBudget``): the task reserves ``reserve_gib`` (default: ``gpu_admit_predicted``
    x its predicted eager peak, ``engine.memory_estimate``, or ``gpu_admit_gib`` when that cannot be
    predicted; the whole budget when ``alone``) before its first device stage (``job.device_stages``: a task
    the CPU stages reject never waits for memory), grows the reservation to ``gpu_growth`` x
    the memory it has held so far after each GPU step (one forward call, build or comparison) and before
    each filter, and frees its memory afterwards. Growing after every step, not only between filters, keeps
    the sum of the reservations close to what the tasks hold: a task starts with an estimate, and until
    its reservation catches up, new tasks are admitted into memory it already uses, which is how
    neighbours run out of memory.

    An ``oom`` next to other tasks may be the neighbours' fault. The first such result comes back with
    ``retry_gib``: ``gpu_growth`` x (what the allocator held + the allocation that failed), at least twice
    the start reservation, and the dispatcher runs the task again at once reserving that much; an ``oom``
    of that re-run comes back with ``retry_alone: True`` and the task runs a last time ``alone`` once the
    others are done (``retried_alone: True``). ``lock_wait_s`` says how long the task waited for each
    lock (``memory``: admission), ``gpu_hold_t0`` / ``gpu_hold_ms`` when it held the GPU's ``compute`` lock
    (``engine.gpu_locks.encode_spans`` of ``take_hold_spans``), ``gpu_peak_gib`` the most GPU memory its
    tensors held at once, ``gpu_reserved_gib`` the most the allocator held, ``admit_gib`` its start
    reservation (None when no device filter ran) and ``predicted_peak_gib`` the prediction (GiB, None when not
    predicted), and ``release_s`` the seconds spent handing the task's memory back afterwards (garbage
    collection, ``empty_cache``), while it still held its reservation.
    """
    import torch
    from opforge.engine.gpu_locks import (
        ADMIT_MIN_GIB,
        admitted_on_gpu,
        encode_spans,
        grow_to_peak,
        lock_holds,
        lock_waits,
        take_hold_spans,
    )

    before, held_before = lock_waits(), lock_holds()
    take_hold_spans()  # holds before this task (start-up warm-up, an earlier task's leftovers) are not its own
    device_filters = set(job.device_stages)
    budget = start_gib = predicted = None

    def admit() -> None:
        nonlocal budget, start_gib, predicted
        if reserve_gib is None and not alone and settings.get("gpu_admit_predicted"):
            from opforge.engine.memory_estimate import predict_peak_bytes

            predicted = predict_peak_bytes(code, "cuda", task_id)
        if reserve_gib:
            start_gib = reserve_gib
        elif predicted is not None:
            start_gib = max(ADMIT_MIN_GIB, settings["gpu_admit_predicted"] * predicted / 2**30)
        else:
            start_gib = settings["gpu_admit_gib"]
        budget = admitted_on_gpu(settings["gpu_memory_fraction"], start_gib, alone)

    def grow() -> None:
        if budget is not None:
            grow_to_peak(budget, settings["gpu_growth"])

    def admit_or_grow_then_stage(name: str) -> None:
        if budget is None and name in device_filters:
            admit()  # the CPU filters before the first GPU one (static, contamination) reserve nothing
        grow()
        stage(name)

    global _after_gpu_step
    _after_gpu_step = grow
    try:
        torch.cuda.reset_peak_memory_stats()
        result = job.run(task_id, code, admit_or_grow_then_stage)
        result["gpu_peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
        result["gpu_reserved_gib"] = round(torch.cuda.max_memory_reserved() / 2**30, 3)
        released = time.perf_counter()
        job.release()
        try:
            _release_gpu_memory()
        except Exception as exc:  # noqa: BLE001 - the context is unusable: say so, the child then exits
            result["cuda_broken"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        result["release_s"] = round(time.perf_counter() - released, 4)
    finally:
        _after_gpu_step = None
        if budget is not None:
            budget.release()
    if alone:
        result["retried_alone"] = True
    elif result["reason"] == "oom" and reserve_gib is None:
        error = str(result["metrics"].get(result["filter"] or "", {}).get("error", ""))
        need = (result["gpu_reserved_gib"] + _failed_allocation_gib(error)) * settings["gpu_growth"]
        result["retry_gib"] = round(max(need, 2 * (start_gib or 0.0)), 3)
    elif result["reason"] == "oom":
        result["retry_alone"] = True
    result["lock_wait_s"] = {k: round(v - before.get(k, 0.0), 4) for k, v in lock_waits().items()}
    result["lock_hold_s"] = {k: round(v - held_before.get(k, 0.0), 4) for k, v in lock_holds().items()}
    result["gpu_hold_t0"], result["gpu_hold_ms"] = encode_spans(take_hold_spans())
    result["admit_gib"] = None if start_gib is None else round(start_gib, 3)
    result["predicted_peak_gib"] = None if predicted is None else round(predicted / 2**30, 3)
    return result


def _failed_allocation_gib(error: str) -> float:
    """GiB of the allocation a CUDA out-of-memory message names ("Tried to allocate 2.50 GiB"), else 0."""
    import re

    m = re.search(r"Tried to allocate ([0-9.]+) (B|KiB|MiB|GiB|TiB)", error)
    if not m:
        return 0.0
    return float(m.group(1)) * {"B": 2**-30, "KiB": 2**-20, "MiB": 2**-10, "GiB": 1.0, "TiB": 1024.0}[m.group(2)]


def _freeze_start_up_objects() -> int:
    """Move every object alive after start-up (torch, Inductor, the warm-up compile: ~450k objects) out of
    reach of the cyclic garbage collector (``gc.freeze``) and return how many there were.

    Each GPU task ends in a full ``gc.collect`` (``_release_gpu_memory``), and Python's own collector runs
    full passes too; traversing the start-up objects cost ~0.23 s per pass (2-core CI machine, torch
    2.13), against ~0.01 s for what the tasks themselves leave. Start-up objects stay alive for the
    child's life anyway, so freezing them keeps nothing alive that would have been freed; a task's objects
    are created after this and are collected as before (on the GPU each task's survivors are frozen in turn,
    ``_release_gpu_memory``).
    """
    import gc

    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def _release_gpu_memory() -> None:
    """Hand cached blocks back to the driver: sandboxes share the GPU, and one task's cache must not
    make the next task of another sandbox run out of memory.

    The full collection that frees the task's objects is followed by ``gc.freeze``: what survives it is
    reachable from the process (modules imported on a task's first use, and what Dynamo, fake tensors and
    Inductor keep across tasks: ~500 objects a task, measured over 45 tasks on CPU), so later passes need
    not traverse it again. Without it a pass grew with the child's age: ``release_s`` p50 0.06 s in a
    child's first minute and 0.27 s in its seventh (40 sandboxes on 4 x H200, ``benchmarks/results/h200/
    streaming_runs.json``), ~17 % of the sandboxes' seconds."""
    import gc

    import torch

    gc.collect()
    gc.freeze()
    torch.cuda.synchronize()  # raises when a kernel of the task broke the context
    torch.cuda.empty_cache()


def _exit_now() -> None:
    """End the child at once, skipping the interpreter's shutdown (exit handlers, freeing every object): every
    result is sent already, and the worker closing its sandboxes waits for the exit (a warm CPU child took
    0.17-0.22 s to exit on its own, 0.03-0.07 s this way, cpu-2core)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(0)


if __name__ == "__main__":
    main()
