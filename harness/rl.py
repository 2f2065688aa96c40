"""Batch reward for RL trainers: completions in, rewards out, evaluated in parallel on Dask workers.

``KernelReward(dataset)`` is a plain callable ``(completions, task_id=[...], **kwargs) -> list[float]``.
Its signature matches a TRL ``GRPOTrainer`` reward function (TRL passes ``prompts``, ``completions`` and
every dataset column, here ``task_id``, as keyword lists; conversational completions are lists of
messages, the last one's ``content`` is used). TRL is not needed to use it. A completion without a
``model_new.py`` block scores -1.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
from opforge.harness.dask_client import SchedulerClient
from opforge.harness.dataset import get_task, load_tasks
from opforge.harness.evaluate import EvalConfig
from opforge.harness.solution import SolutionError, extract_solution


def completion_text(completion: Any) -> str:
    """The text of a completion: a string, or the last message's ``content`` of a conversation."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    return str(completion)


class KernelReward:
    """Reward function over an opforge dataset (path, Hub folder, Hub id, or its rows as a ``pandas.DataFrame``).

    Args:
        config: evaluation settings (``reward="milestone"`` or ``"speedup"``, device, tolerances).
        client: a ``distributed.Client`` (or its scheduler's address) to evaluate on (default: a local cluster
            per call); held as a ``harness.dask_client.SchedulerClient``, so the reward pickles into a trainer's
            worker processes with it.
        build_root: extension build cache directory.

    Attributes:
        last_results: the ``EvalResult`` dicts of the last batch (for logging).
    """

    __name__ = "opforge_kernel_reward"  # TRL logs reward functions by name

    def __init__(self, dataset: str | Path | pd.DataFrame, config: EvalConfig | None = None, client=None,
                 build_root: str | None = None):
        self.dataset = "<frame>" if isinstance(dataset, pd.DataFrame) else dataset
        self.tasks = load_tasks(dataset)
        self.config = config or EvalConfig()
        self.scheduler = SchedulerClient.wrap(client)
        self.build_root = build_root
        self.last_results: list[dict[str, Any]] = []

    def __call__(self, completions: list[Any], task_id: list[str] | None = None, prompts=None,
                 **kwargs) -> list[float]:
        """Rewards for ``completions[i]`` against task ``task_id[i]``.

        Raises:
            ValueError: ``task_id`` missing or of another length than ``completions``.
            DatasetError: an unknown task id.
        """
        from opforge.harness.batch import evaluate_many

        if task_id is None or len(task_id) != len(completions):
            raise ValueError("KernelReward needs task_id=[...] with one id per completion "
                             "(a 'task_id' column in the training dataset)")
        rewards: list[float | None] = [None] * len(completions)
        pairs, index = [], []
        for i, (c, t) in enumerate(zip(completions, task_id, strict=True)):
            task = get_task(self.tasks, t, self.dataset)
            try:
                files = extract_solution(completion_text(c)).files
            except SolutionError:
                rewards[i] = -1.0
                continue
            pairs.append((task, files))
            index.append(i)
        client = self.scheduler.get() if self.scheduler is not None else None
        results = evaluate_many(pairs, self.config, client=client, build_root=self.build_root,
                                progress=False) if pairs else []
        for i, res in zip(index, results, strict=True):
            rewards[i] = float(res["reward"])
        self.last_results = results
        return [float(r) for r in rewards]
