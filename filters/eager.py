"""``eager`` filter: the task builds in ``eval()`` mode and its forward runs and returns finite tensors."""

from __future__ import annotations

import time
from typing import Any

import torch
from opforge.engine.execution import BUILD_SEED, CALL_SEED, TaskRun, failure_metrics
from opforge.engine.gpu_locks import gpu_work
from opforge.filters.verdict import Cost, Filter, Verdict


def unregistered_tensors(model) -> list[str]:
    """Names of tensor attributes with ``ndim > 0`` that are neither parameters nor buffers, on ``model``
    and its submodules. ``.to(device)`` does not move them, so such a task fails on the GPU when built on
    the CPU and moved (KernelBench's ``Model(*get_init_inputs()).cuda()``); 0-dim tensors are fine, torch
    accepts CPU scalars next to CUDA tensors."""
    if not isinstance(model, torch.nn.Module):
        return []
    found = []
    for prefix, mod in model.named_modules():
        for name, value in vars(mod).items():
            if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter) and value.ndim > 0:
                found.append(f"{prefix}.{name}" if prefix else name)
    return found


class EagerFilter(Filter):
    """Rejects ``eager_error:<ExceptionType>`` (import, build or forward raises, or no tensor comes back;
    ``eager_error:unregistered_tensor`` on a GPU when a tensor attribute that ``.to(device)`` does not move
    breaks the task built KernelBench's way, on the CPU then moved),
    ``oom`` (the build or forward runs out of memory) and ``non_finite`` (an output holds NaN or Inf).

    Side effect on ``TaskRun``: sets ``model`` (built after ``BUILD_SEED``, in ``eval()``), ``inputs``
    (after ``INPUT_SEED``) and ``outputs`` (the call after ``CALL_SEED``), which later filters reuse.
    Metrics: ``build_s``, ``first_call_s`` (seconds), ``outputs`` (shape and dtype of each output tensor),
    ``params`` (parameter count), ``non_finite_fraction``, ``error``.
    """

    name = "eager"
    cost = Cost.DEVICE
    gpu_work_lock = False  # TaskRun's steps hold the GPU lock one by one (see engine.execution)

    @classmethod
    def default_thresholds(cls) -> dict[str, Any]:
        return {"max_non_finite_fraction": 0.0}

    def score(self, run: TaskRun) -> dict[str, Any]:
        m: dict[str, Any] = {"error": None, "oom": False}
        try:
            t = time.perf_counter()
            run.model = run.build_model()
            run.inputs = run.draw_inputs()
            m["build_s"] = time.perf_counter() - t
            t = time.perf_counter()
            run.outputs = run.call(seed=CALL_SEED)
            if run.device.startswith("cuda"):
                torch.cuda.synchronize()
            m["first_call_s"] = time.perf_counter() - t
        except Exception as exc:  # noqa: BLE001 - any failure of the task's code is a verdict
            return {**m, **failure_metrics(exc)}
        stray = unregistered_tensors(run.model) if run.device != "cpu" else []
        if stray:
            # KernelBench-style consumers run ``Model(*init).cuda()``, which leaves these on the CPU: try
            # that way too, and reject only if it breaks (rotary caches kept as plain attributes are fine)
            m["unregistered_tensors"] = stray[:5]
            try:
                torch.manual_seed(BUILD_SEED)
                built = run.load().build()
                with gpu_work(run.device):
                    moved = built.to(run.device).eval()
                run.call(model=moved)
                del moved
            except Exception as exc:  # noqa: BLE001 - the task's failure is the verdict
                failed = failure_metrics(exc, limit=200)
                return {**m, **failed, "error_type": "unregistered_tensor",
                        "error": f"built on the CPU and moved, it fails ({failed['error']}); tensor "
                                 f"attribute(s) {', '.join(stray[:3])} are neither parameters nor buffers"}
        m["params"] = sum(p.numel() for p in run.model.parameters()) if isinstance(run.model, torch.nn.Module) \
            else 0
        m["outputs"] = [{"shape": list(o.shape), "dtype": str(o.dtype).removeprefix("torch.")}
                        for o in run.outputs]
        total = sum(o.numel() for o in run.outputs)
        with gpu_work(run.device):
            bad = sum(int((~torch.isfinite(o)).sum()) for o in run.outputs if o.is_floating_point() or o.is_complex())
        m["non_finite_fraction"] = bad / total if total else 0.0
        return m

    def decide(self, m: dict[str, Any]) -> Verdict:
        failed = self.reject_failure(m, "eager_error")
        if failed is not None:
            return failed
        if m["non_finite_fraction"] > self.thresholds["max_non_finite_fraction"]:
            return self.reject("non_finite", m)
        return self.accept(m)
