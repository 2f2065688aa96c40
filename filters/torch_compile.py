"""``compile`` filter: the model runs under ``torch.compile`` (Inductor) and agrees with eager.

Each task starts from ``torch._dynamo.reset()`` so a worker that is reused across tasks neither hits
Dynamo's recompile limits nor keeps earlier tasks' graphs alive. The compiled model gets the ``eager``
filter's inputs after the same ``CALL_SEED`` and must be allclose to the eager outputs at the evaluation
tolerance (atol = rtol = 1e-2). The compiled model is left on ``TaskRun.compiled`` for the ``runtime``
filter, which times it with eager in one exclusive section.

On CUDA the default Inductor backend is wrapped so that only the compiled graph's execution holds the GPU's
``compute`` lock (shared, ``filters.gpu_locks``); Dynamo tracing and Inductor's compilation (FX passes,
code generation, Triton builds: seconds of CPU work) run unlocked, so a neighbour's timing never waits
for a compile. Output comparison holds it shared.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from opforge.filters.execution import TaskRun, failure_metrics, outputs_error
from opforge.filters.gpu_locks import gpu_work
from opforge.filters.verdict import Cost, Filter, Verdict


def _inductor_locking_execution(device: str):
    """An Inductor backend for ``torch.compile`` whose compiled graphs run holding the GPU's ``compute``
    lock shared, while Dynamo, AOTAutograd and Inductor themselves (CPU) run unlocked."""
    from torch._inductor.compile_fx import compile_fx

    def backend(gm, example_inputs):
        compiled = compile_fx(gm, example_inputs)

        def run(*args):
            with gpu_work(device):
                return compiled(*args)

        run._boxed_call = getattr(compiled, "_boxed_call", False)  # Dynamo's calling convention flag
        return run

    return backend


class CompileFilter(Filter):
    """Rejects ``compile_error:<ExceptionType>``, ``oom`` and ``compile_mismatch``.

    Thresholds: ``backend`` (default "inductor"), ``mode`` (None = default), ``max_err`` (1.0 = the
    evaluation tolerance).
    Metrics: ``compile_s`` (first compiled call, seconds), ``err_compile`` (tolerance units), ``error``.
    The compiled runtime (``compile_ms``) is measured by the ``runtime`` filter.
    """

    name = "compile"
    cost = Cost.DEVICE
    order = 50
    gpu_work_lock = False  # see the module docstring

    @classmethod
    def default_thresholds(cls) -> dict[str, Any]:
        return {"backend": "inductor", "mode": None, "max_err": 1.0}

    def score(self, run: TaskRun) -> dict[str, Any]:
        t = self.thresholds
        m: dict[str, Any] = {"error": None, "oom": False}
        torch._dynamo.reset()
        try:
            backend = t["backend"]
            locks_itself = backend == "inductor" and t["mode"] is None and run.device.startswith("cuda")
            if locks_itself:
                backend = _inductor_locking_execution(run.device)
            compiled = torch.compile(run.model, backend=backend, mode=t["mode"])
            start = time.perf_counter()
            # the default Inductor backend on CUDA locks only its graphs' execution; any other backend
            # holds the lock for the whole first call (compilation included)
            out = run.call(model=compiled, lock=not locks_itself)
            if run.device.startswith("cuda"):
                torch.cuda.synchronize()
            m["compile_s"] = time.perf_counter() - start
            m["err_compile"] = outputs_error(run.outputs, out)
            del out
            run.compiled = compiled
        except Exception as exc:  # noqa: BLE001 - any compiler failure is a verdict
            m.update(failure_metrics(exc))
            run.compiled = None
            torch._dynamo.reset()
        return m

    def decide(self, m: dict[str, Any]) -> Verdict:
        failed = self.reject_failure(m, "compile_error")
        if failed is not None:
            return failed
        if m["err_compile"] > self.thresholds["max_err"]:
            return self.reject("compile_mismatch", m)
        return self.accept(m)
