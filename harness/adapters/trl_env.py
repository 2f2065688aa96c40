"""TRL adapters: ``GRPOTrainer(environment_factory=trl_environment_factory(dataset))`` for multi-turn rollouts
through the environment's tools, and ``trl_dataset`` for the training rows; the single-turn form is
``harness.rl.KernelReward`` as a reward function.

TRL (1.16) builds one ``KernelToolEnv`` per concurrent rollout and reuses it: ``reset(**row)`` starts the
episode of the row's ``task_id`` and returns the task prompt (appended to the row's last user message), every
public method other than ``reset`` / ``get_reward`` is offered to the model as a tool (schema from its type hints
and Google-style docstring), and ``get_reward()`` - the environment owning its reward - is called once per
finished rollout: the grader's reward of the submitted workspace, or of the workspace as it stands when the
model never called ``submit`` (``harness.env.KernelEnv.final_reward``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
from opforge.harness.env import EnvConfig, KernelEnv

INSTRUCTION = ("Make the PyTorch task below faster with your own kernels. Work in the workspace with the tools: "
               "write your files, compile, verify, profile, then submit.")


class KernelToolEnv:
    """One rollout's environment for TRL's ``environment_factory`` (see the module docstring). Its public
    methods are the tools the model sees."""

    def __init__(self, dataset: str | Path | pd.DataFrame, config: EnvConfig | None = None, client=None,
                 build_root: str | None = None):
        self._env = KernelEnv(dataset, config, client=client, build_root=build_root)

    @property
    def episode(self) -> KernelEnv:
        """The ``KernelEnv`` behind this rollout (its ``task_id``, ``reward``, ``result``, ``history``); a
        property, so TRL does not offer it as a tool."""
        return self._env

    def reset(self, **row: Any) -> str:
        """Start the episode of ``row["task_id"]`` (TRL passes every column of the training row); returns the
        task prompt."""
        if "task_id" not in row:
            raise ValueError("KernelToolEnv.reset: the training rows need a 'task_id' column (trl_dataset)")
        return self._env.reset(str(row["task_id"]))

    def get_reward(self) -> float:
        """The episode's reward (grader's milestone or speed-up scheme)."""
        return self._env.final_reward()

    def write_file(self, path: str, content: str) -> str:
        """Write one file of your solution into the workspace, replacing it.

        Args:
            path: `model_new.py` or a kernel source under `kernels/` (.cpp, .cu, .h, .cuh).
            content: The whole text of the file.

        Returns:
            What was written, or why it was refused.
        """
        return self._env.write_file(path, content)

    def read_file(self, path: str) -> str:
        """Read a file of the workspace, e.g. `model.py` (the task) or `RULES.md` (what is allowed).

        Args:
            path: Path relative to the workspace.

        Returns:
            The file's text.
        """
        return self._env.read_file(path)

    def list_files(self) -> str:
        """List the workspace's files.

        Returns:
            One path per line.
        """
        return self._env.list_files()

    def compile(self) -> str:
        """Build the sources under `kernels/` into the module `opforge_kernels`.

        Returns:
            Whether it built, or the compiler's errors.
        """
        return self._env.compile()

    def verify(self) -> str:
        """Check `ModelNew` against `Model` on fresh random inputs, with every rule of RULES.md.

        Returns:
            correct, or what is wrong (mismatch, rule broken, build or load error).
        """
        return self._env.verify()

    def profile(self) -> str:
        """Verify, then time your version against eager PyTorch and torch.compile.

        Returns:
            The verdict, the median times, the speed-ups and the reward on the task's shape.
        """
        return self._env.profile()

    def submit(self) -> str:
        """Run the final check (fresh inputs of the task's shape and of other input shapes) and end the episode.

        Returns:
            The verdict and the episode's reward.
        """
        return self._env.submit()

    def __del__(self):
        env = getattr(self, "_env", None)
        if env is not None:
            env.close()


def trl_environment_factory(dataset: str | Path | pd.DataFrame, config: EnvConfig | None = None, client=None,
                            build_root: str | None = None) -> Callable[[], KernelToolEnv]:
    """A zero-argument factory of ``KernelToolEnv`` for ``GRPOTrainer(environment_factory=...)``; the dataset
    is read once and shared by every environment it makes."""
    from opforge.harness.dataset import load_tasks

    dataset = load_tasks(dataset).reset_index(drop=True)
    return functools.partial(KernelToolEnv, dataset, config, client, build_root)


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
