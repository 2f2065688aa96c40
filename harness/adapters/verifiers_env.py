"""verifiers adapter (``verifiers`` 0.4, ``verifiers.v1``): a taskset plugin over an opforge dataset whose
environment plays the user of a text conversation, the way verifiers' own game tasksets do.

The module exports ``KernelTaskset`` and ``KernelVerifiersEnv`` through ``__all__``, the plugin layout verifiers
loads. verifiers 0.4 resolves ``--env.taskset.id`` to a top-level module (``verifiers.v1.utils.loaders``), so
expose this one under a top-level name (a module ``opforge_kernels_taskset.py`` holding
``from opforge.harness.adapters.verifiers_env import *`` and ``... import __all__``) and pass ``--env.taskset.id opforge_kernels_taskset
--env.taskset.dataset PATH_OR_HUB_ID``. Each task is one dataset row; its prompt is the task (``model.py``) and the answer protocol. ``KernelVerifiersEnv.run``
opens the model's interaction and, reply after reply (``play``): the fenced files of the reply (the answer format
of RULES.md, ``harness.solution.extract_solution``'s blocks) are written to the workspace of a
``harness.env.KernelEnv``, compiled and verified, and the tools' text comes back as the next user turn; a reply
with a line ``SUBMIT`` (or ``max_turns`` replies) runs the final check, whose reward is recorded on the trace as
``kernel_reward``.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from typing import Any

import verifiers.v1 as vf
from opforge.harness.env import EnvConfig, KernelEnv

PROTOCOL = ("Answer with your files, one fenced block per file with the path after the language "
            "(```cpp kernels/my_op.cpp and ```python model_new.py). Each reply's files are written, compiled and "
            "verified, and you get the result. When you are done, reply with a line SUBMIT: the final check "
            "runs on fresh inputs of this shape and of other input shapes, and its reward ends the episode.")
_FENCE = re.compile(r"```[^\n`]*\n.*?```", re.S)


class KernelData(vf.TaskData):
    """One dataset row: its ``task_id`` (the workspace and the grader read the row from the dataset)."""

    task_id: str


class KernelTasksetConfig(vf.TasksetConfig):
    dataset: str = ""
    """An opforge dataset: Hub id, ``hf/`` folder or ``.parquet`` / ``.jsonl`` file."""
    device: str = "cpu"
    """Where candidates run: ``cpu`` or ``cuda``."""
    max_turns: int = 20
    """Replies per episode before the final check runs on the workspace as it stands."""
    build_root: str | None = None
    """Extension build cache (default ``$OPFORGE_CACHE/extensions``)."""


class KernelTask(vf.Task[KernelData]):
    pass


class KernelTaskset(vf.Taskset[KernelTask, KernelTasksetConfig]):
    """The dataset's rows as tasks (see the module docstring)."""

    def load(self) -> Iterator[KernelTask]:
        from opforge.harness.dataset import load_tasks

        if not self.config.dataset:
            raise ValueError("set --env.taskset.dataset to an opforge dataset")
        tasks = load_tasks(self.config.dataset)
        for task_id, row in tasks.iterrows():
            prompt = (f"Write `ModelNew` (model_new.py) and its kernels (kernels/) so that it computes what `Model` "
                      f"computes, faster.\n\nmodel.py:\n```python\n{row['code']}```\n\n{PROTOCOL}")
            yield KernelTask(KernelData(name=str(task_id), id=str(task_id), task_id=str(task_id), prompt=prompt),
                             self.config.task)


class KernelEnvConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig()


async def play(env: KernelEnv, interaction: Any, max_turns: int) -> float:
    """The episode loop over an open verifiers ``Interaction`` (see the module docstring); returns the reward.
    ``env`` must be reset on the task already."""
    segment = await interaction.turn()
    for _ in range(max_turns):
        if segment.terminated:
            break
        reply = segment.last_reply
        feedback = []
        for block in _FENCE.findall(reply):
            try:
                from opforge.harness.solution import extract_solution

                files = extract_solution(block + "\n").files
            except ValueError:  # a block without model_new.py: read it as one kernel file
                files = _single_file(block)
            for path, text in files.items():
                feedback.append(await asyncio.to_thread(env.write_file, path, text))
        if re.search(r"^\s*SUBMIT\s*$", reply, re.M):
            break
        if not feedback:
            segment = await interaction.turn("No file in your reply. " + PROTOCOL)
            continue
        built = await asyncio.to_thread(env.compile)
        feedback.append(built)
        if built.startswith("compiled"):
            feedback.append(await asyncio.to_thread(env.verify))
        segment = await interaction.turn("\n\n".join(feedback))
    return await asyncio.to_thread(env.final_reward)


def _single_file(block: str) -> dict[str, str]:
    first, _, body = block.partition("\n")
    m = re.search(r"([\w./-]+\.(?:py|cpp|cc|cu|cuh|h|hpp))\s*$", first.strip("`").strip())
    return {m.group(1): body.rsplit("```", 1)[0]} if m else {}


class KernelVerifiersEnv(vf.Env[KernelEnvConfig]):
    """Plays the user of the ``player``'s conversation with a ``KernelEnv`` (see ``play``)."""

    async def run(self, task: KernelTask, agents: vf.Agents) -> None:
        cfg = self.taskset.config
        env = KernelEnv(cfg.dataset, EnvConfig(device=cfg.device, include_rules=False), build_root=cfg.build_root)
        try:
            env.reset(task.data.task_id)
            async with agents.player.interaction(task) as interaction:
                reward = await play(env, interaction, cfg.max_turns)
            interaction.trace.record_reward("kernel_reward", reward, 1.0)
            interaction.trace.info["kernel_status"] = (env.result or {}).get("status", "not_graded")
        finally:
            env.close()


__all__ = ["KernelTaskset", "KernelVerifiersEnv"]
