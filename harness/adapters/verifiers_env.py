"""verifiers adapter (``verifiers`` 0.4, ``verifiers.v1``): the opforge environment as a verifiers plugin - a
taskset, the env that runs its episodes and the harness that drives the model - loadable by the id
``opforge-verifiers`` (the top-level package ``opforge_verifiers`` that ships with opforge; ``pip install
"opforge[verifiers]"``):

    vf-eval opforge-verifiers --env.taskset.dataset PATH_OR_HUB_ID --model M --client.base-url URL --no-push

* ``KernelTaskset``: one task per dataset row. The task's prompt is the task text (``harness.env.task_text``:
  the task id and ``model.py``); its system prompt is the instruction (``harness.env.instruction``: what to
  write, the tools, the budgets, and RULES.md - in full, or its kernel registration part with
  ``include_rules`` off). Settings under ``--env.taskset.*``: ``dataset``, ``device``, ``max_turns`` (tool
  calls), ``time_budget_s``, ``final`` (the final check's ``EvalConfig``, e.g. ``--env.taskset.final.reward
  speedup``), ``scheduler`` (a Dask scheduler's address: the heavy steps of every episode run on its workers),
  ``build_root``, ``include_rules``.
* ``KernelVerifiersEnv``: one episode is one ``harness.env.KernelEnv`` reset on the row for the player's
  rollout; the player runs in the local (subprocess) runtime unless ``--env.player.runtime.type`` says
  otherwise. The rollout's reward ``kernel_reward`` is the grader's: the ``submit`` result, or - when the model
  stopped or ran out of budget first - the workspace graded as it stands (``KernelEnv.final_reward``); the
  grader's verdict (status, reward, speed-ups, times) is kept in the trace's ``info["kernel_result"]``
  (``not_graded`` when ``model_new.py`` was never written: -1).
* ``KernelHarness``: the model's tool loop, run in this process: each turn goes to the rollout's interception
  endpoint (OpenAI chat completions with the tools of ``harness.adapters.tools``: write_file, read_file,
  list_files, compile, verify, profile, submit) and the tool calls run on the episode's ``KernelEnv``; the loop
  ends on a reply without tool calls, at the end of the episode, or when the rollout is stopped (turn limits).
  The candidate's code never runs in the harness: the grader runs it in its own server processes.
"""

from __future__ import annotations

import asyncio
import functools
import json
from typing import Any, Literal

import verifiers.v1 as vf
from opforge.harness.env import TOOLS, EnvConfig, KernelEnv, instruction, task_text
from opforge.harness.evaluate import EvalConfig

# the grader's result fields kept on the trace (``info["kernel_result"]``)
RESULT_KEYS = ("status", "reward", "error", "hacks", "speedup_eager", "speedup_compile", "candidate_ms", "eager_ms",
               "compile_ms", "variants_checked")
# the KernelEnv of every live rollout, by trace id: the env registers it when the rollout's trace is minted, the
# harness runs the tools on it and the task's reward grades it; the env closes it when the episode ends
_EPISODES: dict[str, KernelEnv] = {}


class KernelTasksetConfig(vf.TasksetConfig):
    dataset: str = ""
    """An opforge dataset: Hub id, ``hf/`` folder or ``.parquet`` / ``.jsonl`` file."""
    device: Literal["cpu", "cuda"] = "cpu"
    """Where candidates run: ``cpu`` (C++ kernels) or ``cuda``."""
    max_turns: int = 200
    """Tool calls per episode; then the workspace is graded as it stands."""
    time_budget_s: float = 3600.0
    """Wall time per episode, in seconds, from its start."""
    final: EvalConfig | None = None
    """Settings of the final check (``harness.evaluate.EvalConfig``: reward scheme, timing rounds, hidden
    shape variants...); default: ``EvalConfig(device=device)``."""
    scheduler: str | None = None
    """Address of a Dask scheduler whose workers run compile / verify / profile / submit (None: this process)."""
    build_root: str | None = None
    """Extension build cache (default ``$OPFORGE_CACHE/extensions``)."""
    include_rules: bool = True
    """The system prompt holds RULES.md in full (else its kernel registration part and a pointer to it)."""

    def env_config(self) -> EnvConfig:
        """The ``harness.env.EnvConfig`` of these settings."""
        return EnvConfig(device=self.device, max_turns=self.max_turns, time_budget_s=self.time_budget_s,
                         final=self.final, include_rules=self.include_rules)


class KernelData(vf.TaskData):
    """One dataset row: its ``task_id`` (the episode's environment reads the row from the dataset)."""

    task_id: str


class KernelTask(vf.Task[KernelData]):
    """A dataset row; its reward is the grader's (see the module docstring)."""

    @property
    def key(self) -> str:
        return self.data.task_id

    @vf.reward(weight=1.0)
    async def kernel_reward(self, trace: vf.Trace) -> float:
        env = _EPISODES.get(trace.id)
        if env is None or env.task_id is None:
            raise RuntimeError(f"no opforge episode for trace {trace.id}: the task is graded by the env that "
                               "ran it (KernelVerifiersEnv, vf-eval opforge-verifiers)")
        reward = await asyncio.to_thread(env.final_reward)
        result = env.result or {"status": "not_graded", "reward": reward}
        trace.info["kernel_result"] = {k: result.get(k) for k in RESULT_KEYS if result.get(k) is not None}
        return reward


@functools.lru_cache(maxsize=4)
def _tasks(dataset: str):
    from opforge.harness.dataset import load_tasks

    return load_tasks(dataset)


class KernelTaskset(vf.Taskset[KernelTask, KernelTasksetConfig]):
    """The dataset's rows as tasks (see the module docstring)."""

    def load(self) -> list[KernelTask]:
        if not self.config.dataset:
            raise ValueError("set --env.taskset.dataset to an opforge dataset (Hub id, hf/ folder or .parquet file)")
        system = instruction(self.config.env_config())
        return [KernelTask(KernelData(name=str(task_id), id=str(task_id), task_id=str(task_id),
                                      prompt=task_text(str(task_id), row["code"]), system_prompt=system),
                           self.config.task)
                for task_id, row in _tasks(self.config.dataset).iterrows()]


class KernelEnvConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig(runtime=vf.SubprocessConfig())
    """The model under evaluation or training; its harness is ``KernelHarness`` unless pinned."""


class KernelVerifiersEnv(vf.Env[KernelEnvConfig]):
    """One episode per task: a ``KernelEnv`` for the player's rollout (see the module docstring)."""

    async def run(self, task: KernelTask, agents: vf.Agents) -> None:
        cfg: KernelTasksetConfig = self.taskset.config
        env = await asyncio.to_thread(KernelEnv, _tasks(cfg.dataset), cfg.env_config(), cfg.scheduler,
                                      cfg.build_root)
        traces: list[str] = []

        def register(trace: vf.Trace) -> None:  # each minted trace (a retried rollout mints a new one)
            env.reset(task.data.task_id)
            traces.append(trace.id)
            _EPISODES[trace.id] = env

        try:
            await agents.player.run(task, on_trace=register)
        finally:
            for trace_id in traces:
                _EPISODES.pop(trace_id, None)
            await asyncio.to_thread(env.close)


class KernelHarnessConfig(vf.HarnessConfig):
    request_timeout_s: float = 600.0
    """Seconds to wait for one model reply."""


class KernelHarness(vf.Harness[KernelHarnessConfig]):
    """The tool loop of the model (see the module docstring)."""

    APPENDS_SYSTEM_PROMPT = True
    EXECUTES_CODE = False  # no shell for the model; the candidate's code runs in the grader's servers
    NEEDS_CONTAINER = False

    async def launch(self, ctx: vf.ModelContext, trace: vf.Trace, runtime: vf.Runtime, endpoint: str,
                     secret: str, mcp_urls: dict[str, str], data: vf.TaskData, **_: Any) -> vf.ProgramResult:
        import httpx
        from opforge.harness.adapters.tools import KernelTools, tool_schemas

        env = _EPISODES.get(trace.id)
        if env is None:
            raise vf.HarnessError(f"no opforge episode for trace {trace.id}: this harness runs the tools of the "
                                  "opforge env (KernelVerifiersEnv, vf-eval opforge-verifiers)")
        tools, schemas = KernelTools(env), tool_schemas()
        system, prompt = self.resolve_prompt(data)
        messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": prompt})
        async with httpx.AsyncClient(timeout=httpx.Timeout(self.config.request_timeout_s, connect=10.0)) as http:
            while not env.done:
                response = await http.post(f"{endpoint}/chat/completions",
                                           headers={"Authorization": f"Bearer {secret}"},
                                           json={"model": ctx.model, "messages": messages, "tools": schemas})
                if response.status_code != 200:
                    if trace.stop_condition is not None:  # a turn or token limit ended the rollout
                        break
                    raise vf.HarnessError(f"model endpoint answered {response.status_code}: {response.text[:500]}")
                message = response.json()["choices"][0]["message"]
                messages.append({k: v for k, v in message.items() if v is not None})
                calls = message.get("tool_calls") or []
                if not calls:
                    break
                for call in calls:
                    text = await asyncio.to_thread(_run_tool, tools, call["function"])
                    messages.append({"role": "tool", "tool_call_id": call.get("id"), "content": text})
        return vf.ProgramResult(exit_code=0, stdout="", stderr="")


def _run_tool(tools: Any, function: dict[str, Any]) -> str:
    """One tool call's text; a bad call (unknown tool, arguments that are not a JSON object) is the model's
    mistake and comes back as text."""
    name = function.get("name")
    if name not in TOOLS:
        return f"error: unknown tool {name!r}"
    try:
        args = json.loads(function.get("arguments") or "{}")
    except json.JSONDecodeError as exc:
        return f"error: the arguments are not JSON ({exc}); resend the call"
    if not isinstance(args, dict):
        return "error: the arguments must be a JSON object"
    try:
        return getattr(tools, name)(**args)
    except TypeError as exc:
        return f"{name}: bad arguments ({exc})"


__all__ = ["KernelTaskset", "KernelVerifiersEnv", "KernelHarness"]
