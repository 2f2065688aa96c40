"""``trivial`` filter: a task a kernel could pass while skipping part of the work, or with nothing to fuse.

All comparisons at the evaluation tolerance of the reference output's dtype (``opforge.task.precision``;
errors in units of it, ``execution.tolerance_error``; <= ``max_err`` = 1 means "allclose passes"), on two
input draws: the task's inputs (``INPUT_SEED``, whose outputs the ``eager`` filter left) and a second draw
(``ALT_INPUT_SEED``, as the ``degenerate`` filter's), made only when the first draw finds something, so a
coincidence of one draw never rejects.

* ``trivial:identity``: an output equals one of the inputs of the same shape on both draws; a kernel
  could return its input.
* ``trivial:noop``: the task still gives every output when one op is taken out, or a run of adjacent
  shape / layout ops that undo each other (``filters.ablation``: a ``torch.fx`` trace of ``Model.forward``;
  bypass, pure copy, layout run, knockout). On the task's own inputs such an op does nothing, so a kernel
  may skip it: ``relu`` after ``relu``, ``abs`` after ``relu``, ``clamp(0, 1)`` after a sigmoid, a pad by
  zero, ``tile`` by ones, two transposes that cancel, ``BatchNorm`` in eval with default statistics
  (``x / sqrt(1 + eps)``), ``topk -> zeros_like``, a ``clone`` / ``detach`` / ``.contiguous()`` of a
  contiguous tensor / ``.to`` of the same dtype. A numerical-safety constant (``+ eps`` before ``rsqrt``,
  ``sqrt``, ``log`` or a division) is part of the computation and never taken out. A task whose forward cannot be traced, or whose traced
  graph does not give the eager outputs (``trace_err`` > ``max_trace_err``), is not judged by this rule
  (``trace_error`` says why).
* ``trivial:dominated`` (CUDA only): one op takes >= ``max_share`` (0.99) of the task's kernel time, so
  there is nothing to fuse; or a GEMM, convolution, attention or recurrent op (``task.realism.is_heavy`` of
  the op's ``task.op_names.label_op``: ``top_heavy`` in the metrics) takes >= ``max_heavy_share`` (0.6) of
  it. Such an op runs in a vendor library (cuBLAS, cuDNN, a fused attention kernel) that a hand-written kernel
  does not beat, and fusing everything around it at no cost wins at most 1 / share over eager (1.67x at 0.6):
  one big GEMM or convolution with a cheap epilogue. Only for tasks of >= ``min_ops`` (2) ops. Measured with
  a CUDA event pair around each op node of the traced graph (``timing_passes`` passes after an L2 flush each,
  per-op sums), inside one exclusive hold of the GPU (``engine.gpu_locks.gpu_timing``, as ``engine.timing``
  does). On CPU the metrics are absent and the rule does not apply. Measured only when identity and noop
  found nothing.

The 99 % rule and the classes of no-op come from opforge issue #21 (a reading of 25 composed candidates and
a roofline count over 6,000). The 0.6 heavy-op bound: three blind reads of 30 published rows each, by three
fresh readers (three GPU runs, one on 2 x H100 and two on 2 x H200; ``benchmarks/dominance_read.py``,
``benchmarks/results/cpu-2core/dominance_read.json``), judged 4 of the 11 rows whose heavy op took >= 0.6 of
the kernel time a fusion worth writing, and 69 of the 79 others; on those runs it rejects 6-9 % of the accepted
rows.

Cost: one forward of the traced graph (recording shapes), one per candidate removal (at most
``max_ablations``), and on a hit one eager call and one call per hit on the second draw; on CUDA
``timing_passes`` timed passes. GPU memory: besides the task's inputs and outputs, one output set of a run
with an op removed, and on a hit the second draw's inputs and outputs.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from opforge.engine.execution import (
    ALT_INPUT_SEED,
    CALL_SEED,
    TaskRun,
    is_oom,
    outputs_error,
    tolerance_error,
)
from opforge.engine.gpu_locks import gpu_timing, gpu_work
from opforge.engine.timing import l2_flush_buffer
from opforge.filters.ablation import DEFAULT_EXEMPT, MAX_EPS, Removal, TracedTask, TraceFailure, trace_task
from opforge.filters.verdict import Cost, Filter, Verdict
from opforge.task.op_names import label_op
from opforge.task.realism import is_heavy

MAX_LISTED_OPS = 64  # ``ops`` metric: labels of at most this many op nodes (``op_count`` counts them all)


class TrivialFilter(Filter):
    """Rejects ``trivial:identity``, ``trivial:noop`` and ``trivial:dominated`` (see the module docstring).

    Thresholds: ``max_err`` (tolerance units), ``max_trace_err`` (most error of the traced graph against
    the eager outputs for ablation to be trusted), ``max_ablations`` (candidate removals tried, in the
    order of ``TracedTask.removals``), ``exempt`` (op names never taken out alone), ``max_eps`` (the
    largest numerical-safety constant kept, ``filters.ablation``), ``max_share``, ``max_heavy_share`` (None:
    off) and ``min_ops`` (the dominated rule), ``timing_passes``.

    Metrics: ``identity`` (per output / input pair of equal shape: ``output``, ``input`` indices, ``err``,
    ``err_alt`` on the second draw or None when not measured); ``trace_error`` (None when traced);
    ``trace_err``; ``ops`` (labels of the op nodes, in order) and ``op_count``; ``ablations`` (per removal
    tried: ``how``, ``ops`` as ``{"op", "node", "line"}``, ``err``, ``err_alt``, ``error`` when the run
    raised); ``ablation_calls``; ``seconds``. On CUDA, when measured: ``kernel_ms`` (sum over ops, per
    pass), ``top_op`` (``{"op", "node", "line"}``), ``top_share`` (0..1), or ``timing_error``. The verdict's metrics add
    ``removable``: the ablations within ``max_err`` on both draws, and ``top_heavy``: the heavy class of the
    top op (``gemm``, ``conv``, ``attention``, ``rnn``) or None.
    """

    name = "trivial"
    cost = Cost.DEVICE
    version = 3
    gpu_work_lock = False  # each GPU step holds the lock by itself; the timing holds it exclusively

    @classmethod
    def default_thresholds(cls) -> dict[str, Any]:
        return {"max_err": 1.0, "max_trace_err": 0.1, "max_ablations": 32, "exempt": list(DEFAULT_EXEMPT),
                "max_eps": MAX_EPS, "max_share": 0.99, "max_heavy_share": 0.6, "min_ops": 2, "timing_passes": 1}

    def score(self, run: TaskRun) -> dict[str, Any]:
        t, start = self.thresholds, time.perf_counter()
        if run.model is None:  # a chain without the eager filter (``--only trivial``): build and call here
            run.model, run.inputs = run.build_model(), run.draw_inputs()
            run.outputs = run.call()
        m: dict[str, Any] = {"identity": self._identity(run), "trace_error": None, "trace_err": None,
                             "ops": [], "op_count": 0, "ablations": [], "ablation_calls": 0}
        traced = self._trace(run, m)
        tried = []
        if traced is not None:
            try:
                tried = self._ablate(run, traced, m)
            except Exception as exc:  # noqa: BLE001 - ablation's own failure must not reject the task
                if is_oom(exc):
                    raise
                m["trace_error"] = f"ablation: {type(exc).__name__}: {str(exc)[:200]}"
                tried, traced = [], None
        hits = [(entry, removal) for entry, removal in tried if entry["err"] <= t["max_err"]]
        near = [p for p in m["identity"] if p["err"] <= t["max_err"]]
        if hits or near:
            self._second_draw(run, traced, hits, near)
        elif traced is not None and run.device.startswith("cuda") and m["op_count"] >= t["min_ops"]:
            try:
                m.update(self._dominance(run, traced))
            except Exception as exc:  # noqa: BLE001 - no measurement, no verdict from it
                if is_oom(exc):
                    raise
                m["timing_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        m["seconds"] = round(time.perf_counter() - start, 4)
        return m

    # -- identity ---------------------------------------------------------------------------------------
    @staticmethod
    def _identity(run: TaskRun) -> list[dict[str, Any]]:
        pairs = []
        with gpu_work(run.device):
            for i, o in enumerate(run.outputs):
                for j, x in enumerate(run.inputs):
                    if isinstance(x, torch.Tensor) and x.shape == o.shape:
                        pairs.append({"output": i, "input": j, "err": tolerance_error(o, x), "err_alt": None})
        return pairs

    # -- ablation ---------------------------------------------------------------------------------------
    def _trace(self, run: TaskRun, m: dict[str, Any]) -> TracedTask | None:
        try:
            traced = trace_task(run.model, run.code, run.task_id)
            out = run.call(model=lambda *xs: traced.record(list(xs)))  # one forward step of the task
        except TraceFailure as exc:
            m["trace_error"] = str(exc)
            return None
        except Exception as exc:  # noqa: BLE001 - the graph failed where eager did not: not judged
            if is_oom(exc):
                raise
            m["trace_error"] = f"graph run: {type(exc).__name__}: {str(exc)[:200]}"
            return None
        m["trace_err"] = outputs_error(run.outputs, out)
        del out
        m["ops"] = [traced.describe(n)["op"] for n in traced.ops[:MAX_LISTED_OPS]]
        m["op_count"] = len(traced.ops)
        if not m["trace_err"] <= self.thresholds["max_trace_err"]:
            m["trace_error"] = "the traced graph does not reproduce the eager outputs"
            return None
        return traced

    def _ablate(self, run: TaskRun, traced: TracedTask, m: dict[str, Any]) -> list[tuple[dict, Removal]]:
        """Run every candidate removal (at most ``max_ablations``) on the first draw; fills
        ``m["ablations"]`` and returns (entry, removal) pairs."""
        t = self.thresholds
        every = traced.removals(tuple(t["exempt"]), max_eps=t["max_eps"])
        m["candidates"] = len(every)
        tried = []
        for removal in every[:t["max_ablations"]]:
            entry = {"how": removal.how, "ops": [traced.describe(n) for n in removal.nodes()],
                     "err": float("inf"), "err_alt": None}
            entry["err"] = self._ablated_error(run, traced, removal, run.inputs, run.outputs, entry)
            m["ablation_calls"] += 1
            m["ablations"].append(entry)
            tried.append((entry, removal))
        return tried

    def _ablated_error(self, run: TaskRun, traced: TracedTask, removal: Removal, inputs: list, ref: list,
                       entry: dict[str, Any]) -> float:
        try:
            # one forward step of the task (``CALL_SEED``, GPU lock held shared, ``no_grad``)
            out = run.call(model=lambda *xs: traced.run(list(xs), removal), inputs=inputs)
        except Exception as exc:  # noqa: BLE001 - a removal the task cannot run without: the op matters
            if is_oom(exc):
                raise
            entry["error"] = f"{type(exc).__name__}: {str(exc)[:120]}"
            return float("inf")
        err = outputs_error(ref, out)
        del out
        return err

    # -- second draw ------------------------------------------------------------------------------------
    def _second_draw(self, run: TaskRun, traced: TracedTask | None, hits: list[tuple[dict, Removal]],
                     near: list[dict]) -> None:
        """Measure ``err_alt`` of the identity pairs and ablations the first draw found within ``max_err``,
        with one extra input set (and its eager outputs) alive."""
        alt = run.draw_inputs(ALT_INPUT_SEED)
        alt_out = run.call(inputs=alt)
        if near:
            with gpu_work(run.device):
                for p in near:
                    x, o = alt[p["input"]], alt_out[p["output"]] if p["output"] < len(alt_out) else None
                    p["err_alt"] = (tolerance_error(o, x) if isinstance(x, torch.Tensor) and o is not None
                                    else float("inf"))
        for entry, removal in hits:
            entry["err_alt"] = self._ablated_error(run, traced, removal, alt, alt_out, entry)
        del alt, alt_out

    # -- dominance --------------------------------------------------------------------------------------
    def _dominance(self, run: TaskRun, traced: TracedTask) -> dict[str, Any]:
        """Per-op kernel time of ``timing_passes`` passes of the traced graph (CUDA event pairs around each
        op node, L2 flushed before each pass), inside one exclusive hold of the GPU."""
        events: dict = {}
        ops = set(traced.ops)
        device = torch.device(run.device)
        with gpu_timing(run.device):
            for _ in range(self.thresholds["timing_passes"]):
                l2_flush_buffer(device).zero_()
                torch.manual_seed(CALL_SEED)
                out = traced.run(run.inputs, timed=ops, events=events)
                del out
            torch.cuda.synchronize(device)
            per_op = {n: sum(s.elapsed_time(e) for s, e in pairs) for n, pairs in events.items()}
        total = sum(per_op.values())
        if not per_op or total <= 0:
            return {"kernel_ms": 0.0, "top_op": None, "top_share": None}
        top = max(per_op, key=per_op.get)
        passes = self.thresholds["timing_passes"]
        return {"kernel_ms": round(total / passes, 4), "top_op": traced.describe(top),
                "top_share": round(per_op[top] / total, 5)}

    # -- decision ---------------------------------------------------------------------------------------
    def decide(self, m: dict[str, Any]) -> Verdict:
        t = self.thresholds
        m = dict(m)

        def both(entry) -> bool:
            return entry["err"] <= t["max_err"] and entry["err_alt"] is not None and entry["err_alt"] <= t["max_err"]

        m["removable"] = [a for a in m["ablations"] if both(a)]
        if any(both(p) for p in m["identity"]):
            return self.reject("trivial:identity", m)
        if m["removable"]:
            return self.reject("trivial:noop", m)
        share = m.get("top_share")
        top = (m.get("top_op") or {}).get("op")
        m["top_heavy"] = is_heavy(label_op(str(top))) if top else None
        if share is not None and m["op_count"] >= t["min_ops"]:
            heavy_bound = t["max_heavy_share"]
            if share >= t["max_share"] or (m["top_heavy"] and heavy_bound is not None and share >= heavy_bound):
                return self.reject("trivial:dominated", m)
        return self.accept(m)
