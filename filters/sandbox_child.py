"""Entry point of a sandbox child: ``python -m opforge.filters.sandbox_child RESULT_FD``.

Protocol (length-prefixed pickles, see ``filters.sandbox``): the parent sends ``("settings", dict)`` first;
the child imports torch, applies the settings and answers ``("ready", info)``. Then for each
``("task", task_id, code)`` it sends ``("stage", filter_name)`` before every filter and finally the
``run_chain`` result dict. ``("stop",)`` or a closed stdin ends the child; so does the parent's death
(checked every second), so an orphaned child never keeps a GPU busy.
"""

from __future__ import annotations

import os
import resource
import sys
import threading
import time
import warnings


def _exit_with_parent(ppid: int) -> None:
    while True:
        if os.getppid() != ppid:
            os._exit(3)
        time.sleep(1.0)


def _apply(settings: dict) -> dict:
    """Memory guard, threads and compiler settings; returns facts about this child for the parent."""
    import torch
    import torch._inductor.config as inductor_config

    inductor_config.compile_threads = 1  # parallelism comes from the sandboxes, not from each compile
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
        # pinned precision (DESIGN.md §4): no TF32 unless the run says otherwise
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
    from opforge.filters.sandbox import read_message, send_message

    out = os.fdopen(int(sys.argv[1]), "wb")
    inp = sys.stdin.buffer.fileno()
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    warnings.filterwarnings("ignore")
    try:
        kind, settings = read_message(inp)
    except EOFError:
        return
    if kind != "settings":
        raise SystemExit(f"sandbox child: expected the settings message first, got {kind!r}")
    info = _apply(settings)

    from opforge.filters.chain import FilterSettings, make_chain, run_chain
    from opforge.filters.execution import TaskRun

    chain = make_chain(FilterSettings.model_validate(settings))
    if settings["device"] == "cuda":
        import torch
        from opforge.filters.timing import physical_gpu

        gpu = physical_gpu(torch.device("cuda"))
    send_message(out, ("ready", info))
    while True:
        try:
            msg = read_message(inp)
        except EOFError:
            return
        if msg[0] == "stop":
            return
        _, task_id, code = msg
        run = TaskRun(code=code, task_id=task_id, device=settings["device"])

        def stage(name: str) -> None:
            send_message(out, ("stage", name))

        if settings["device"] == "cuda":
            from opforge.filters.timing import gpu_memory_share

            with gpu_memory_share(gpu):  # shared with the other sandboxes on this GPU
                result = run_chain(run, chain, on_stage=stage)
                del run
                _release_gpu_memory()
            result = _retry_oom_alone(result, task_id, code, chain, stage, gpu)
        else:
            result = run_chain(run, chain, on_stage=stage)
            del run
        send_message(out, result)


def _release_gpu_memory() -> None:
    """Hand cached blocks back to the driver: sandboxes share the GPU, and one task's cache must not
    make the next task of another sandbox run out of memory."""
    import gc

    import torch

    gc.collect()
    torch.cuda.empty_cache()


def _retry_oom_alone(result: dict, task_id: str, code: str, chain, stage, gpu: str) -> dict:
    """An ``oom`` on a shared GPU may be the neighbours' fault: run the task once more holding the GPU's
    memory lock exclusively (``filters.timing.gpu_memory_share``: no other sandbox's task is on the GPU)."""
    from opforge.filters.chain import run_chain
    from opforge.filters.execution import TaskRun
    from opforge.filters.timing import gpu_memory_share

    if result["reason"] != "oom":
        return result
    with gpu_memory_share(gpu, exclusive=True):
        _release_gpu_memory()
        again = run_chain(TaskRun(code=code, task_id=task_id, device="cuda"), chain, on_stage=stage)
        _release_gpu_memory()
    again["retried_alone"] = True
    return again


if __name__ == "__main__":
    main()
