"""``determinism`` filter: the same inputs give the same outputs, and randomness is not hidden by a seed.

Three extra forward calls on the ``eager`` filter's model and inputs, compared with its outputs ``o``
(all errors in units of the evaluation tolerance, see ``execution.tolerance_error``):

* ``err_call``: call again *without* re-seeding. RNG use inside ``forward`` (``randn_like``, dropout in
  training mode, ``bernoulli``...) changes the output here even when a fixed seed made the first call
  reproducible. When the ``runtime_screen`` filter ran first, its call (also unseeded) is used instead of
  a new one (``TaskRun.unseeded_outputs``).
* ``err_reseed``: re-seed with ``CALL_SEED`` and call again: numeric run-to-run drift (atomics, split-K,
  state mutated by ``forward``).
* ``err_rebuild``: build a second model and draw inputs again from the same seeds: drift from a
  constructor that does not follow ``torch.manual_seed`` (stale ``torch.empty`` memory, Python's
  ``random``...). When the new draw equals the task's inputs (``execution.same_inputs``, metric
  ``same_inputs``), the second model is called on the task's own inputs instead: the same values, so the
  same computation, with one input set less in GPU memory. Such inputs are marked
  ``TaskRun.inputs_reproducible`` (the ``degenerate`` filter then draws them again instead of keeping
  them through its own call).

``err_reseed`` is only measured when it can change the verdict: when ``err_call > 0`` (the stochastic
rule needs it) or ``err_rebuild > max_drift`` (it names the cause). With ``err_call == 0`` the forward
repeats itself exactly from the same state, so a re-seeded call cannot differ either, and a rebuild within
``max_drift`` already bounds the run-to-run drift the re-seeded call measures (the rebuilt model's call is
one more run, after the same seed). That saves one forward call and one comparison per accepted task.

Decision: ``stochastic`` when ``err_call > 0`` and the difference goes away with the seed
(``err_call > stochastic_ratio * err_reseed``); otherwise ``nondeterministic`` when ``err_reseed`` or
``err_rebuild`` exceeds ``max_drift`` = 0.1, i.e. a tenth of the evaluation tolerance, so that the
reference's own drift can never decide whether a candidate kernel passes.
"""

from __future__ import annotations

from typing import Any

from opforge.engine.execution import TaskRun, outputs_error, same_inputs
from opforge.filters.verdict import Cost, Filter, Verdict


class DeterminismFilter(Filter):
    """Rejects ``stochastic:runtime`` and ``nondeterministic:reseed`` / ``nondeterministic:rebuild``.

    Metrics: ``err_call``, ``err_reseed``, ``err_rebuild`` (floats in units of the evaluation tolerance;
    ``inf`` when shapes change or NaNs appear on one side only; ``err_reseed`` None when not needed, see
    the module docstring), ``same_inputs`` (bool: a second draw of the inputs equalled the first).
    """

    name = "determinism"
    cost = Cost.DEVICE
    gpu_work_lock = False  # TaskRun's steps and outputs_error hold the GPU lock one by one

    @classmethod
    def default_thresholds(cls) -> dict[str, Any]:
        return {"stochastic_ratio": 10.0, "max_drift": 0.1}

    def score(self, run: TaskRun) -> dict[str, Any]:
        # one extra output set alive at a time: large tasks must not need 4x their output memory
        unseeded = run.unseeded_outputs if run.unseeded_outputs is not None else run.call(seed=None)
        run.unseeded_outputs = None
        m = {"err_call": outputs_error(run.outputs, unseeded), "err_reseed": None}
        del unseeded
        inputs = run.draw_inputs()
        m["same_inputs"] = same_inputs(run.inputs, inputs)
        if m["same_inputs"]:
            inputs = run.inputs  # equal values: the same call, without a second input set alive
            run.inputs_reproducible = True
        m["err_rebuild"] = outputs_error(run.outputs, run.call(model=run.build_model(), inputs=inputs))
        del inputs
        if m["err_call"] > 0 or m["err_rebuild"] > self.thresholds["max_drift"]:
            m["err_reseed"] = outputs_error(run.outputs, run.call())
        return m

    def decide(self, m: dict[str, Any]) -> Verdict:
        t = self.thresholds
        reseed = m["err_reseed"]
        if reseed is not None and m["err_call"] > 0 and m["err_call"] > t["stochastic_ratio"] * reseed:
            return self.reject("stochastic:runtime", m)
        if reseed is not None and reseed > t["max_drift"]:
            return self.reject("nondeterministic:reseed", m)
        if m["err_rebuild"] > t["max_drift"]:
            return self.reject("nondeterministic:rebuild", m)
        return self.accept(m)
