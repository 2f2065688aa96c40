"""Evaluation / RL environment over opforge tasks: workspaces, sandboxed build and evaluation of candidate
kernels, anti-hacking checks, rewards and reports (``opforge harness init``, ``opforge harness eval``).

``evaluate(task, solution, EvalConfig(...))`` grades one candidate and returns an ``EvalResult`` (status,
reward, speed-ups); ``KernelReward(dataset)`` is a batch reward function for TRL's ``GRPOTrainer`` or any
trainer; ``evaluate_many`` runs a batch on Dask workers; ``init_workspace`` writes an agent's workspace;
``KernelEnv(dataset)`` is a multi-turn tool environment for trainers (``run_episodes`` runs many at once;
adapters for TRL, OpenEnv and verifiers in ``opforge.harness.adapters``);
``opforge.harness.report.report`` summarises results (pass rate, faster-than rates, geomean speed-ups).
"""

from __future__ import annotations

from opforge.task.exports import lazy_exports

# Nothing is imported eagerly: the candidate's server process imports ``opforge.harness.server`` and so runs
# this file, and must not load the grader's modules. ``evaluate`` is both a submodule and its main function;
# the submodule is callable as the function (``harness.evaluate``), so ``opforge.harness.evaluate(...)``
# works whichever of the two the name holds.
# public name -> module that defines it (imported on first use)
_EXPORTS = {
    "evaluate": "opforge.harness.evaluate",
    "EvalConfig": "opforge.harness.evaluate",
    "EvalResult": "opforge.harness.evaluate",
    "KernelReward": "opforge.harness.rl",
    "evaluate_many": "opforge.harness.batch",
    "Solution": "opforge.harness.solution",
    "SolutionError": "opforge.harness.solution",
    "extract_solution": "opforge.harness.solution",
    "format_completion": "opforge.harness.solution",
    "DatasetError": "opforge.harness.dataset",
    "get_task": "opforge.harness.dataset",
    "load_tasks": "opforge.harness.dataset",
    "WorkspaceError": "opforge.harness.workspace",
    "init_workspace": "opforge.harness.workspace",
    "KernelEnv": "opforge.harness.env",
    "EnvConfig": "opforge.harness.env",
    "run_episodes": "opforge.harness.episodes",
}
__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
