"""TRL adapters: ``GRPOTrainer(environment_factory=trl_environment_factory(dataset))`` for multi-turn rollouts
through the environment's tools, and ``trl_dataset`` for the training rows; the single-turn form is
``harness.rl.KernelReward`` as a reward function.

TRL (1.16) builds one ``KernelToolEnv`` per concurrent rollout and reuses it: ``reset(**row)`` starts the
episode of the row's ``task_id`` and returns the task prompt after a blank line (TRL appends it to the row's last
user message, the instruction), every public method other than ``reset`` / ``get_reward`` is offered to the
model as a tool (schema from its type hints and Google-style docstring, ``harness.adapters.tools``), and
``get_reward()`` - the environment owning its reward - is called once per finished rollout: the grader's reward
of the submitted workspace, or of the workspace as it stands when the model never called ``submit``
(``harness.env.KernelEnv.final_reward``).

``AsyncGRPOTrainer`` (``trl.experimental.async_grpo``) takes the same factory and runs the rollouts' tool calls
in parallel, in a spawned process; the factory pickles, a Dask client included (see
``trl_environment_factory``), so the heavy steps of every rollout still run on the cluster's workers.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
from opforge.harness.adapters.tools import KernelTools
from opforge.harness.dask_client import SchedulerClient
from opforge.harness.env import EnvConfig, KernelEnv

INSTRUCTION = ("Make the PyTorch task below faster with your own kernels. Work in the workspace with the tools: "
               "write your files, compile, verify, profile, then submit.")
SEPARATOR = "\n\n"  # between the row's instruction and the task text ``reset`` returns


class KernelToolEnv(KernelTools):
    """One rollout's environment for TRL's ``environment_factory`` (see the module docstring). Its public
    methods are the tools the model sees (``harness.adapters.tools.KernelTools``)."""

    def __init__(self, dataset: str | Path | pd.DataFrame, config: EnvConfig | None = None, client=None,
                 build_root: str | None = None):
        super().__init__(KernelEnv(dataset, config, client=client, build_root=build_root))

    @property
    def episode(self) -> KernelEnv:
        """The ``KernelEnv`` behind this rollout (its ``task_id``, ``reward``, ``result``, ``history``); a
        property, so TRL does not offer it as a tool."""
        return self._env

    def reset(self, **row: Any) -> str:
        """Start the episode of ``row["task_id"]`` (TRL passes every column of the training row); returns the
        task prompt after a blank line (TRL appends it to the row's instruction)."""
        if "task_id" not in row:
            raise ValueError("KernelToolEnv.reset: the training rows need a 'task_id' column (trl_dataset)")
        return SEPARATOR + self._env.reset(str(row["task_id"]))

    def get_reward(self) -> float:
        """The episode's reward (grader's milestone or speed-up scheme)."""
        return self._env.final_reward()

    def __del__(self):
        env = getattr(self, "_env", None)
        if env is not None:
            env.close()


def trl_environment_factory(dataset: str | Path | pd.DataFrame, config: EnvConfig | None = None, client=None,
                            build_root: str | None = None) -> Callable[[], KernelToolEnv]:
    """A zero-argument factory of ``KernelToolEnv`` for ``GRPOTrainer`` / ``AsyncGRPOTrainer``
    (``environment_factory=...``); the dataset is read once and shared by every environment it makes. It
    pickles (``AsyncGRPOTrainer`` copies it into its rollout process): the rows travel as a frame and
    ``client`` (a ``distributed.Client`` or a scheduler address) as its scheduler's address
    (``harness.dask_client.SchedulerClient``)."""
    from opforge.harness.dataset import load_tasks

    dataset = load_tasks(dataset).reset_index(drop=True)
    return functools.partial(KernelToolEnv, dataset, config, SchedulerClient.wrap(client), build_root)


def task_prompt(row: dict[str, Any]) -> str:
    """The single-turn prompt of a row for ``harness.rl.KernelReward``: the task and the answer format of
    RULES.md (one fenced block per file)."""
    from opforge.harness.workspace import TEMPLATES

    rules = (TEMPLATES / "RULES.md").read_text()
    return (f"Write `ModelNew` (model_new.py) and its kernels (kernels/) for this task.\n\nmodel.py:\n```python\n"
            f"{row['code']}```\n\n{rules}")


def trl_dataset(dataset: str | Path | pd.DataFrame, task_ids: list[str] | None = None, multi_turn: bool = True):
    """Training rows for ``GRPOTrainer``: ``prompt`` (conversational) and ``task_id``. ``multi_turn``: the prompt
    is the short instruction and the environment's ``reset`` appends the task; else the prompt holds the task
    (``task_prompt``) for ``KernelReward``. Returns a ``datasets.Dataset``.

    Raises:
        DatasetError: unreadable dataset or unknown task id.
    """
    import datasets
    from opforge.harness.dataset import get_task, load_tasks

    tasks = load_tasks(dataset)
    ids = [str(t) for t in (task_ids if task_ids is not None else tasks.index)]
    rows = []
    for t in ids:
        text = INSTRUCTION if multi_turn else task_prompt(get_task(tasks, t))
        rows.append({"prompt": [{"role": "user", "content": text}], "task_id": t})
    return datasets.Dataset.from_list(rows)
