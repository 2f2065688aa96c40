"""OpenEnv adapter (``openenv-core``): ``KernelOpenEnv`` is an ``openenv.core.env_server.Environment`` with
``reset`` / ``step`` / ``state`` over ``harness.env.KernelEnv``, and ``openenv_app(dataset)`` serves it with
OpenEnv's FastAPI server (one environment per WebSocket session on ``/ws``; ``/reset`` / ``/step`` over HTTP
make a fresh environment per request, as OpenEnv does for every environment).

Actions are ``KernelAction(tool=..., path=..., content=...)`` with ``tool`` one of ``harness.env.TOOLS``;
observations carry the tool's text, ``done`` and ``reward`` (the grader's, once the episode is graded: after
``submit``, or when a budget ends it). ``reset(task_id=...)`` picks the task (``seed`` picks one by index when
no ``task_id`` is given).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import pandas as pd
from openenv.core.env_server import Action, Environment, Observation, State
from opforge.harness.env import EnvConfig, KernelEnv
from pydantic import Field


class KernelAction(Action):
    """One tool call: ``tool`` and its arguments (``path`` for write_file / read_file, ``content`` for
    write_file)."""

    tool: Literal["write_file", "read_file", "list_files", "compile", "verify", "profile", "submit"]
    path: str | None = Field(default=None, description="workspace path (write_file, read_file)")
    content: str | None = Field(default=None, description="the whole file (write_file)")


class KernelObservation(Observation):
    """The tool's text (the task prompt after ``reset``), the task id and the turn count; ``done`` and
    ``reward`` as OpenEnv defines them."""

    text: str = ""
    task_id: str | None = None
    turn: int = 0


class KernelState(State):
    """``episode_id``, ``step_count`` (OpenEnv's), the task id, and the reward once graded."""

    task_id: str | None = None
    reward: float | None = None
    done: bool = False


class KernelOpenEnv(Environment[KernelAction, KernelObservation, KernelState]):
    """``KernelEnv`` behind OpenEnv's interface (see the module docstring). Each instance has its own workspace,
    so concurrent sessions are isolated."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, dataset: str | Path | pd.DataFrame, config: EnvConfig | None = None, client=None,
                 build_root: str | None = None):
        super().__init__()
        self._env = KernelEnv(dataset, config, client=client, build_root=build_root)
        self._episode_id: str | None = None

    def reset(self, seed: int | None = None, episode_id: str | None = None, task_id: str | None = None,
              **kwargs: Any) -> KernelObservation:
        """Start an episode on ``task_id`` (or the task at index ``seed`` modulo the dataset's length).

        Raises:
            EnvError: neither given, or an unknown task id.
        """
        from opforge.harness.env import EnvError

        if task_id is None:
            if seed is None:
                raise EnvError("reset needs task_id (or a seed to pick a task by index)")
            task_id = str(self._env.tasks.index[int(seed) % len(self._env.tasks)])
        self._episode_id = episode_id or f"{task_id}-{id(self):x}"
        text = self._env.reset(str(task_id))
        return KernelObservation(text=text, task_id=self._env.task_id, turn=0, done=False, reward=None)

    def step(self, action: KernelAction, timeout_s: float | None = None, **kwargs: Any) -> KernelObservation:
        """Run ``action``'s tool; the reward is set once the episode is graded."""
        args = {k: v for k, v in (("path", action.path), ("content", action.content)) if v is not None}
        text = self._env.call(action.tool, **args)
        reward = None
        if self._env.done:
            reward = self._env.final_reward()
        return KernelObservation(text=text, task_id=self._env.task_id, turn=self._env.turns, done=self._env.done,
                                 reward=reward)

    @property
    def state(self) -> KernelState:
        return KernelState(episode_id=self._episode_id, step_count=self._env.turns, task_id=self._env.task_id,
                           reward=self._env.reward, done=self._env.done)

    def close(self) -> None:
        self._env.close()


def openenv_factory(dataset: str | Path | pd.DataFrame, config: EnvConfig | None = None, client=None,
                    build_root: str | None = None) -> Callable[[], KernelOpenEnv]:
    """A zero-argument factory of ``KernelOpenEnv`` sharing one read of the dataset."""
    import functools

    from opforge.harness.dataset import load_tasks

    dataset = load_tasks(dataset).reset_index(drop=True)
    return functools.partial(KernelOpenEnv, dataset, config, client, build_root)


def openenv_app(dataset: str | Path | pd.DataFrame, config: EnvConfig | None = None, client=None,
                build_root: str | None = None, max_concurrent_envs: int = 64):
    """OpenEnv's FastAPI app serving ``KernelOpenEnv`` (run it with ``uvicorn``)."""
    from openenv.core.env_server import create_fastapi_app

    return create_fastapi_app(openenv_factory(dataset, config, client, build_root), KernelAction,
                              KernelObservation, max_concurrent_envs=max_concurrent_envs)
