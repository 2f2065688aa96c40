"""``degenerate_output`` filter: an output a kernel could fake without computing it.

Per output tensor ``o`` (the ``eager`` filter's outputs) and ``o2`` (the outputs for a second input draw,
``ALT_INPUT_SEED``), all at the evaluation tolerance of the output's dtype (``opforge.task.precision``: 1e-2 for float32):

* ``all_zeros``: ``torch.allclose(o, zeros)`` holds in either argument order, i.e. a kernel that returns
  zeros would pass (KernelBench level 1 has such problems, e.g. outputs of order 1e-4).
* ``constant``: every element equals the first one within the tolerance (only judged for numel > 1).
* ``input_independent``: ``o2`` is allclose to ``o``; a kernel could return a stored answer.

The task is rejected when *every* output is one of these (the whole answer could be faked); an output
tuple with one trivial member (e.g. an RNN's final cell state that is all-zero) is kept.
Metrics keep the per-output kinds plus ``zero_pass_fraction`` (share of elements an all-zeros answer
would get right) so a stricter rule can be re-decided later without running anything.

Memory: when the ``determinism`` filter found the inputs reproducible (``TaskRun.inputs_reproducible``),
the task's own inputs are dropped during the call on the second draw and drawn again afterwards (same
seed, same values), so one input set at a time is alive next to the outputs. Otherwise this call is the
chain's memory peak, with the determinism filter's second call: the task's inputs and outputs plus a
whole forward call on other inputs. On a shared GPU that peak decides how many tasks fit at once
(``engine.gpu_locks.MemoryBudget``); a second draw costs one pass of the random generator.
"""

from __future__ import annotations

from typing import Any

import torch
from opforge.engine.execution import ALT_INPUT_SEED, TaskRun, error_stats, flat_view, tolerance_error
from opforge.engine.gpu_locks import gpu_work
from opforge.filters.verdict import Cost, Filter, Verdict


def _zero_error(o: torch.Tensor) -> tuple[float, float]:
    """(error of an all-zeros answer in tolerance units, share of elements it gets right).

    The better of both argument orders: ``allclose(o, 0)`` needs ``|o| <= atol``, ``allclose(0, o)`` needs
    ``|o| <= atol + rtol * |o|``; the second is ``error_stats(ref=o, out=0)``. One host sync.
    """
    if o.numel() == 0:
        return 0.0, 1.0
    worst, within = error_stats(o, torch.zeros(1, dtype=o.dtype, device=o.device))
    return worst, within / o.numel()


def _constant_error(o: torch.Tensor) -> float:
    """Error, in tolerance units, of answering every element with the first one; inf for numel <= 1."""
    if o.numel() <= 1:
        return float("inf")
    flat = flat_view(o)
    return error_stats(flat, flat[:1])[0]


class DegenerateFilter(Filter):
    """Rejects ``degenerate_output:all_zeros`` / ``:constant`` / ``:input_independent`` (see module doc).

    Metrics, one entry per output, errors in units of the evaluation tolerance: ``zero_err`` (an all-zeros
    answer), ``const_err`` (a constant answer), ``input_err`` (the answer for the other input draw), and
    ``zero_pass_fraction`` (0..1). The decision calls an output fakeable when an error is <= ``max_err``.
    """

    name = "degenerate"
    cost = Cost.DEVICE
    gpu_work_lock = False  # TaskRun's steps and the statistics below hold the GPU lock one by one

    @classmethod
    def default_thresholds(cls) -> dict[str, Any]:
        return {"max_err": 1.0}

    def score(self, run: TaskRun) -> dict[str, Any]:
        redraw = run.inputs_reproducible
        alt = run.draw_inputs(ALT_INPUT_SEED)
        if redraw:
            run.inputs = []  # one input set alive at a time (module docstring); drawn again below
        other = run.call(inputs=alt)
        del alt
        m: dict[str, list] = {"zero_err": [], "zero_pass_fraction": [], "const_err": [], "input_err": []}
        with gpu_work(run.device):
            self._statistics(run.outputs, other, m)
        del other
        if redraw:
            run.inputs = run.draw_inputs()
        return m

    @staticmethod
    def _statistics(outputs: list, other: list, m: dict[str, list]) -> None:
        for i, o in enumerate(outputs):
            zero_err, fraction = _zero_error(o)
            m["zero_err"].append(zero_err)
            m["zero_pass_fraction"].append(fraction)
            m["const_err"].append(_constant_error(o))
            m["input_err"].append(tolerance_error(o, other[i]) if i < len(other) else float("inf"))

    def kinds(self, m: dict[str, Any]) -> list[str | None]:
        """Per output: the first fakeable kind ("all_zeros", "constant", "input_independent") or None."""
        limit = self.thresholds["max_err"]
        out = []
        for z, c, e in zip(m["zero_err"], m["const_err"], m["input_err"], strict=True):
            out.append("all_zeros" if z <= limit else "constant" if c <= limit
                       else "input_independent" if e <= limit else None)
        return out

    def decide(self, m: dict[str, Any]) -> Verdict:
        kinds = self.kinds(m)
        if kinds and all(k is not None for k in kinds):
            return self.reject(f"degenerate_output:{kinds[0]}", m)
        return self.accept(m)
