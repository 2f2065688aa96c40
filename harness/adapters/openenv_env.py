"""OpenEnv adapter (``openenv-core``): ``KernelOpenEnv`` is an ``openenv.core.env_server.Environment`` with
``reset`` / ``step`` / ``state`` over ``harness.env.KernelEnv``, ``openenv_app(dataset)`` serves it with
OpenEnv's FastAPI server (one environment per WebSocket session on ``/ws``; ``/reset`` / ``/step`` over HTTP
make a fresh environment per request, as OpenEnv does for every environment) and ``KernelEnvClient`` is the
typed client of that server. The deployable OpenEnv environment directory (``openenv.yaml``, server app,
Dockerfile) is ``harness/opforge_env``; its app is ``openenv_app_from_environ``.

Actions are ``KernelAction(tool=..., path=..., content=...)`` with ``tool`` one of ``harness.env.TOOLS``;
observations carry the tool's text, ``done`` and ``reward`` (the grader's, once the episode is graded: after
``submit``, or when a budget ends it). ``reset(task_id=...)`` picks the task (``seed`` picks one by index when
no ``task_id`` is given); its text holds the kernel registration rules of RULES.md.

A request the environment cannot serve is the client's error, answered 4xx over HTTP (``KernelRequestError``:
400 for a reset without a task, 404 for an unknown task id, 409 for a step without an episode - every HTTP
``/step`` gets a fresh environment, so episodes run over ``/ws``); over ``/ws`` OpenEnv answers it with an error
message and keeps the session.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import pandas as pd
from openenv.core import EnvClient
from openenv.core.client_types import StepResult
from openenv.core.env_server import Action, Environment, Observation, State
from openenv.core.env_server.types import EnvironmentMetadata
from opforge.harness.dask_client import SchedulerClient
from opforge.harness.env import EnvConfig, EnvError, KernelEnv
from pydantic import Field


class KernelRequestError(EnvError):
    """A request the environment cannot serve; ``status_code`` is its HTTP status (4xx)."""

    def __init__(self, message: str, status_code: int = 400):
        super().__init__(message)
        self.status_code = status_code


class KernelAction(Action):
    """One tool call: ``tool`` and its arguments (``path`` for write_file / read_file, ``content`` for
    write_file)."""

    tool: Literal["write_file", "read_file", "list_files", "compile", "verify", "profile", "submit"] = Field(
        description="write_file (model_new.py or a kernels/ source; a kernel source includes registry.h and "
                    "registers its functions with OPFORGE_EXPORT(fn, \"doc\"), model_new.py calls them after "
                    "`import opforge_kernels`), read_file (model.py, RULES.md, kernels/registry.h...), list_files, "
                    "compile (kernels/ into opforge_kernels), verify, profile, submit (the final check; ends the "
                    "episode)")
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
            KernelRequestError: neither given (400), or an unknown task id (404).
        """
        tasks = self._env.tasks
        if task_id is None:
            if seed is None:
                raise KernelRequestError("reset needs task_id (or a seed to pick a task by index)", 400)
            task_id = str(tasks.index[int(seed) % len(tasks)])
        if str(task_id) not in tasks.index:
            raise KernelRequestError(f"no task {task_id!r} in the dataset ({len(tasks)} tasks)", 404)
        self._episode_id = episode_id or f"{task_id}-{id(self):x}"
        text = self._env.reset(str(task_id))
        return KernelObservation(text=text, task_id=self._env.task_id, turn=0, done=False, reward=None)

    def step(self, action: KernelAction, timeout_s: float | None = None, **kwargs: Any) -> KernelObservation:
        """Run ``action``'s tool; the reward is set once the episode is graded.

        Raises:
            KernelRequestError: no episode (409): reset first, in the same ``/ws`` session.
        """
        if self._env.workspace is None:
            raise KernelRequestError("no episode: reset(task_id=...) first, in the same session (every HTTP "
                                     "/step gets a fresh environment: run episodes over /ws)", 409)
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

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(
            name="opforge", version="1.0.0",
            description="Write faster C++ / CUDA kernels for a PyTorch task through tools (write_file, read_file, "
                        "list_files, compile, verify, profile, submit); the reward is opforge's grader's.")

    def close(self) -> None:
        self._env.close()


def openenv_factory(dataset: str | Path | pd.DataFrame, config: EnvConfig | None = None, client=None,
                    build_root: str | None = None) -> Callable[[], KernelOpenEnv]:
    """A zero-argument factory of ``KernelOpenEnv`` sharing one read of the dataset."""
    from opforge.harness.dataset import load_tasks

    dataset = load_tasks(dataset).reset_index(drop=True)
    return functools.partial(KernelOpenEnv, dataset, config, SchedulerClient.wrap(client), build_root)


def openenv_app(dataset: str | Path | pd.DataFrame, config: EnvConfig | None = None, client=None,
                build_root: str | None = None, max_concurrent_envs: int = 64):
    """OpenEnv's FastAPI app serving ``KernelOpenEnv`` (run it with ``uvicorn``); ``KernelRequestError`` is
    answered with its 4xx status."""
    from fastapi.responses import JSONResponse
    from openenv.core.env_server import create_fastapi_app

    app = create_fastapi_app(openenv_factory(dataset, config, client, build_root), KernelAction,
                             KernelObservation, max_concurrent_envs=max_concurrent_envs)

    async def request_error(request, exc: KernelRequestError):
        return JSONResponse(status_code=exc.status_code, content={"detail": str(exc)})

    app.add_exception_handler(KernelRequestError, request_error)
    return app


def openenv_app_from_environ(environ: dict[str, str] | None = None):
    """``openenv_app`` configured by environment variables (the OpenEnv directory's server app):
    ``OPFORGE_DATASET`` (required: Hub id, ``hf/`` folder or ``.parquet`` / ``.jsonl`` file), ``OPFORGE_DEVICE``
    (``cpu`` / ``cuda``, default cpu), ``OPFORGE_MAX_TURNS`` (tool calls per episode, default 200),
    ``OPFORGE_TIME_BUDGET_S`` (seconds per episode, default 3600), ``OPFORGE_SCHEDULER`` (a Dask scheduler's
    address; default: the heavy steps run in the server's process), ``OPFORGE_BUILD_ROOT``,
    ``OPFORGE_MAX_SESSIONS`` (concurrent ``/ws`` sessions, default 64).

    Raises:
        ValueError: ``OPFORGE_DATASET`` is not set, or a number is not a number (the message names it).
    """
    env = os.environ if environ is None else environ
    dataset = env.get("OPFORGE_DATASET")
    if not dataset:
        raise ValueError("set OPFORGE_DATASET to an opforge dataset (Hub id, hf/ folder or .parquet file)")

    def number(name: str, default: str, kind=int):
        try:
            return kind(env.get(name, default))
        except ValueError as exc:
            raise ValueError(f"{name}={env.get(name)!r} is not a number") from exc

    config = EnvConfig(device=env.get("OPFORGE_DEVICE", "cpu"), max_turns=number("OPFORGE_MAX_TURNS", "200"),
                       time_budget_s=number("OPFORGE_TIME_BUDGET_S", "3600", float))
    return openenv_app(dataset, config, env.get("OPFORGE_SCHEDULER") or None, env.get("OPFORGE_BUILD_ROOT"),
                       max_concurrent_envs=number("OPFORGE_MAX_SESSIONS", "64"))


class KernelEnvClient(EnvClient[KernelAction, KernelObservation, KernelState]):
    """Typed client of the server (``openenv_app``): one ``/ws`` session, one environment.

        async with KernelEnvClient(base_url="http://localhost:8000") as env:
            first = await env.reset(task_id="...")
            result = await env.step(KernelAction(tool="read_file", path="RULES.md"))

    ``.sync()`` gives the blocking form. A request the server cannot serve raises ``RuntimeError`` naming the
    server's message. ``message_timeout_s`` (s) bounds the wait for one reply; its default covers a build and
    a final check (``EvalConfig.build_timeout_s`` + ``eval_timeout_s``, 600 s each), not OpenEnv's 60 s.
    """

    def __init__(self, base_url: str, message_timeout_s: float = 1800.0, **kwargs: Any):
        super().__init__(base_url, message_timeout_s=message_timeout_s, **kwargs)

    def _step_payload(self, action: KernelAction) -> dict[str, Any]:
        return action.model_dump(exclude_none=True, exclude={"metadata"})

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[KernelObservation]:
        obs = KernelObservation(**payload.get("observation", {}), done=payload.get("done", False),
                                reward=payload.get("reward"))
        return StepResult(observation=obs, reward=payload.get("reward"), done=payload.get("done", False))

    def _parse_state(self, payload: dict[str, Any]) -> KernelState:
        return KernelState(**payload)
