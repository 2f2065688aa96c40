"""A multi-turn environment over an opforge dataset: one episode is one task, worked on through tools.

``KernelEnv(dataset).reset(task_id)`` materialises a fresh workspace (``harness.workspace.write_workspace``:
``model.py``, ``RULES.md``, ``model_new.py``, ``kernels/`` with the fixed binding) in a private temporary
directory and returns the task prompt. The agent then calls tools, each returning the text a model sees
(``harness.feedback``):

| tool | does |
|---|---|
| ``write_file(path, content)`` | writes ``model_new.py`` or a source under ``kernels/`` (``.cpp .cc .cu .cuh .h .hpp``; not the fixed binding) |
| ``read_file(path)`` | any file of the workspace (``model.py``, ``RULES.md``...) |
| ``list_files()`` | the workspace's files |
| ``compile()`` | builds ``kernels/`` (compiler diagnostics on failure) |
| ``verify()`` | correctness and every anti-hacking check on fresh inputs of the public shape, short timing |
| ``profile()`` | verify, then timing against eager and ``torch.compile``, speed-ups and the reward on the public shape |
| ``submit()`` | the final check (``harness.evaluate`` with the row's hidden ``shape_variants``): the episode's reward; ends the episode |

The episode's reward is the grader's (``harness.reward``: -1 wrong / hacked / broken, 1 correct, 2 faster than
eager, 3 faster than eager and ``torch.compile``; or the ``speedup`` scheme). Budgets: ``max_turns`` tool calls
(CUDA-Agent's agent loop runs up to 200 turns, arXiv 2602.24286) and ``time_budget_s`` of wall time from
``reset``; when one runs out the episode ends, and ``final_reward()`` grades the workspace as it stands (unless
``grade_unsubmitted`` is off, or ``model_new.py`` was never written: -1).

Heavy steps (compile, verify, profile, submit) run through ``harness.env_steps.run_step``: on a
``distributed.Client``'s workers when one is given (held as a ``harness.dask_client.SchedulerClient``, so an
environment's settings pickle into a trainer's worker processes) (``engine.cluster.open_cluster``: one worker per GPU on
CUDA, so many environments share the machine's GPUs and cores the way ``opforge eval`` does), else in this
process (each evaluation still runs the candidate in its own server process, ``harness.grader``). The files
travel as values, so the workers need no shared filesystem. On a client, a step's Dask key is the hash of its
kind, row, files and settings: identical steps in flight at the same time (episodes that compile, verify or
submit the same code for the same row) run once and share the result, as ``harness.rl.KernelReward`` grades each
distinct completion once; a step asked again after that runs again. The workspace and its record are deleted by the
next ``reset``, by ``close()``, or when the environment is garbage-collected; the environment's folder
(``opforge-env-*``) lives in the process tree's temporary session (``engine.tempdirs``), so one never closed - in a
rollout process that ends through ``os._exit`` or a signal - is removed when the tree's first process exits.
``OPFORGE_KEEP_TMP=1`` keeps the folder at ``close()``.

Only tool calls touch the workspace; ``model.py`` shows the public shape only, and the hidden variants stay in
the row this object holds (never written to the workspace or shown in a tool's text).
"""

from __future__ import annotations

import shutil
import time
import weakref
from pathlib import Path, PurePosixPath
from typing import Any, Literal

import pandas as pd
from opforge.engine.tempdirs import make as make_tmp
from opforge.engine.tempdirs import remove as remove_tmp
from opforge.harness.dask_client import SchedulerClient
from opforge.harness.evaluate import EvalConfig
from opforge.harness.solution import EXTENSION_SUFFIXES
from pydantic import BaseModel, ConfigDict, Field

TOOLS = ("write_file", "read_file", "list_files", "compile", "verify", "profile", "submit")
FIXED = ("kernels/binding.cpp", "kernels/registry.h")


class EnvError(ValueError):
    """A call the environment cannot serve (no episode, unknown task or tool); the message says which."""


class EnvConfig(BaseModel):
    """Settings of ``KernelEnv``. Times in seconds, sizes in characters.

    Attributes:
        device: where candidates run (``cpu`` or ``cuda``).
        max_turns: tool calls per episode.
        time_budget_s: wall time per episode, from ``reset``.
        grade_unsubmitted: ``final_reward()`` grades an episode that ended without ``submit``.
        final: settings of ``submit`` (hidden variants checked); ``verify`` / ``profile`` use copies with fewer
            rounds and without the variants (``tool_config``).
        verify_timing_trials / profile_timing_trials: timed rounds of ``verify`` / ``profile``.
        max_file_chars: the largest file ``write_file`` accepts.
        max_output_chars: the longest text a tool returns (compiler logs, verdicts).
        max_read_chars: the longest file text ``read_file`` returns (RULES.md is about 8,500 characters, a task's
            ``model.py`` a few thousand: an agent needs them whole).
        include_rules: the prompt holds RULES.md in full (else its registration part, ``registration_rules``,
            and a pointer to the rest).
    """

    model_config = ConfigDict(extra="forbid")
    device: Literal["cpu", "cuda"] = "cpu"
    max_turns: int = Field(200, ge=1)
    time_budget_s: float = Field(3600.0, gt=0)
    grade_unsubmitted: bool = True
    final: EvalConfig | None = None
    verify_timing_trials: int = Field(3, ge=3)
    profile_timing_trials: int = Field(20, ge=3)
    max_file_chars: int = Field(200_000, ge=1)
    max_output_chars: int = Field(4000, ge=200)
    max_read_chars: int = Field(32_000, ge=200)
    include_rules: bool = True

    def tool_config(self, kind: str) -> EvalConfig:
        """The ``EvalConfig`` of step ``kind`` (``verify``, ``profile`` or ``submit``)."""
        final = self.final or EvalConfig(device=self.device)
        if final.device != self.device:
            final = final.model_copy(update={"device": self.device})
        if kind == "submit":
            return final
        if kind == "profile":
            return final.model_copy(update={"shape_variants": False, "timing_trials": self.profile_timing_trials})
        return final.model_copy(update={"shape_variants": False, "profile_compile": False,
                                        "timing_trials": self.verify_timing_trials, "warmup": 1})


def registration_rules() -> str:
    """The part of RULES.md that says how a kernel is registered and called (its section "Where the work must
    happen": sources under ``kernels/``, ``#include "registry.h"``, ``OPFORGE_EXPORT(fn, "doc")``, ``import
    opforge_kernels``), with its heading."""
    from opforge.harness.workspace import TEMPLATES

    text = (TEMPLATES / "RULES.md").read_text()
    start = text.index("## Where the work must happen")
    end = text.index("\n## ", start + 1)
    return text[start:end].strip()


def task_text(task_id: str, code: str) -> str:
    """The task part of a prompt: the task id and its ``model.py`` (public shape only)."""
    return f"Task {task_id}: make `Model` in model.py faster.\n\nmodel.py:\n```python\n{code}```"


def instruction(config: EnvConfig) -> str:
    """The task-independent part of a prompt: what to write, the tools, the budgets of ``config``, and the
    rules (RULES.md in full when ``config.include_rules``, else the evaluation contract
    (``harness.contract.contract_text``), ``registration_rules`` and a pointer to RULES.md)."""
    from opforge.harness.contract import contract_text
    from opforge.harness.workspace import TEMPLATES

    # RULES.md holds the evaluation contract (harness.contract); without RULES.md the prompt states it itself
    rules = (TEMPLATES / "RULES.md").read_text() if config.include_rules else (
        f"{contract_text()}\n\n{registration_rules()}\n\nEverything else that is allowed or forbidden is in "
        "RULES.md (read_file('RULES.md')): read it before you write code.")
    return (
        f"Write `ModelNew` in model_new.py, with your own C++{' / CUDA' if config.device == 'cuda' else ''} "
        "kernels under kernels/, so that it computes what `Model` in model.py computes, faster.\n\n"
        "Tools: write_file(path, content), read_file(path), list_files(), compile(), verify(), profile(), "
        "submit(). submit() runs the final check - correctness on fresh inputs of the shape in model.py and "
        "of other input shapes that get_inputs() could produce with other sizes - and ends the episode with "
        f"its reward. Budget: {config.max_turns} tool calls, {config.time_budget_s:g} s.\n\n{rules}")


class KernelEnv:
    """One agent's environment (see the module docstring); not shared between threads.

    Args:
        dataset: an opforge dataset (path, Hub folder, Hub id) or its rows as a ``pandas.DataFrame``
            (``harness.dataset.load_tasks``; ``shape_variants`` is used when present).
        config: ``EnvConfig``.
        client: a ``distributed.Client``, a scheduler address or a ``SchedulerClient`` whose workers run the
            heavy steps (None: this process).
        build_root: extension build cache (default ``$OPFORGE_CACHE/extensions``), shared by episodes.

    Attributes after ``reset``: ``task_id``, ``workspace`` (Path), ``turns``, ``done``, ``reward`` (None until
    graded), ``result`` (the final ``EvalResult`` dict), ``history`` (one dict per tool call: tool, seconds,
    status).
    """

    def __init__(self, dataset: str | Path | pd.DataFrame, config: EnvConfig | None = None, client=None,
                 build_root: str | Path | None = None):
        from opforge.harness.dataset import load_tasks

        self.tasks = load_tasks(dataset)
        self.dataset_label = "<frame>" if isinstance(dataset, pd.DataFrame) else str(dataset)
        self.config = config or EnvConfig()
        self.scheduler = SchedulerClient.wrap(client)
        self.build_root = str(build_root) if build_root else None
        self._root = str(make_tmp("opforge-env-"))
        self._finalizer = weakref.finalize(self, remove_tmp, self._root)
        self._episode = 0
        self._row: dict[str, Any] | None = None
        self.workspace: Path | None = None
        self.task_id: str | None = None
        self.turns = 0
        self.done = True
        self.reward: float | None = None
        self.result: dict[str, Any] | None = None
        self.history: list[dict[str, Any]] = []
        self._t0 = 0.0

    # -- episode -----------------------------------------------------------------------------------
    def reset(self, task_id: str | None = None, task: dict[str, Any] | None = None) -> str:
        """Start an episode on ``task_id`` (a row of the dataset) or on ``task`` (a row given directly); the
        previous episode's workspace is deleted. Returns the prompt: what to do, the tools, ``model.py`` and
        RULES.md.

        Raises:
            EnvError: neither or an unknown ``task_id``.
        """
        from opforge.harness.workspace import write_workspace

        if task is None:
            if task_id is None:
                raise EnvError("reset needs a task_id (or a task row)")
            if str(task_id) not in self.tasks.index:
                raise EnvError(f"{self.dataset_label}: no task {task_id!r} ({len(self.tasks)} tasks)")
            task = self.tasks.loc[str(task_id)].to_dict()
        if not isinstance(task.get("code"), str) or not task.get("task_id"):
            raise EnvError("a task row needs 'task_id' and 'code'")
        self._clear()
        self._episode += 1
        self._row = dict(task)
        self.task_id = str(task["task_id"])
        self.workspace = Path(self._root) / f"episode-{self._episode}" / "workspace"
        write_workspace(self._row, self.workspace, self.dataset_label, Path(self._root) / "registry")
        self.turns, self.done, self.reward, self.result, self.history = 0, False, None, None, []
        self._t0 = time.monotonic()
        return self.prompt()

    def prompt(self) -> str:
        """The task prompt of the current episode: ``task_text`` (the task id and ``model.py``), a blank line,
        ``instruction`` (what to do, the tools, the budgets, the rules)."""
        ws = self._ws()
        return f"{task_text(str(self.task_id), (ws / 'model.py').read_text())}\n\n{instruction(self.config)}"

    def close(self) -> None:
        """Delete the environment's folder with every workspace (kept with ``OPFORGE_KEEP_TMP=1``); the object
        may not be used afterwards."""
        self.workspace = None
        self._finalizer()

    def _clear(self) -> None:
        if self.workspace is not None:
            shutil.rmtree(self.workspace.parent, ignore_errors=True)
        self.workspace = None

    def _ws(self) -> Path:
        if self.workspace is None or self._row is None:
            raise EnvError("no episode: call reset(task_id) first")
        return self.workspace

    # -- tools -------------------------------------------------------------------------------------
    def call(self, tool: str, **args: Any) -> str:
        """Run ``tool`` with ``args`` (see the module docstring's table) and return its text; one turn.

        Raises:
            EnvError: no episode, or an unknown tool. Bad arguments come back as text (the model's mistake).
        """
        self._ws()
        if tool not in TOOLS:
            raise EnvError(f"unknown tool {tool!r}; tools: {', '.join(TOOLS)}")
        if self.done:
            return f"the episode is over (reward {self.reward if self.reward is not None else 'not graded'})"
        if time.monotonic() - self._t0 > self.config.time_budget_s:
            self.done = True
            return f"time budget of {self.config.time_budget_s:g} s exhausted: the episode is over"
        self.turns += 1
        t0 = time.perf_counter()
        try:
            text, status = getattr(self, f"_tool_{tool}")(**args)
        except TypeError as exc:  # wrong arguments from the model
            text, status = f"{tool}: bad arguments ({exc})", "bad_arguments"
        entry = {"tool": tool, "seconds": round(time.perf_counter() - t0, 3), "status": status}
        build, self._build_info = getattr(self, "_build_info", None), None
        self.history.append({**entry, **(build or {})})
        if not self.done and self.turns >= self.config.max_turns:
            self.done = True
            text += f"\n(turn budget of {self.config.max_turns} tool calls exhausted: the episode is over)"
        return text

    def write_file(self, path: str, content: str) -> str:
        return self.call("write_file", path=path, content=content)

    def read_file(self, path: str) -> str:
        return self.call("read_file", path=path)

    def list_files(self) -> str:
        return self.call("list_files")

    def compile(self) -> str:
        return self.call("compile")

    def verify(self) -> str:
        return self.call("verify")

    def profile(self) -> str:
        return self.call("profile")

    def submit(self) -> str:
        return self.call("submit")

    def final_reward(self) -> float:
        """The episode's reward: the ``submit`` result's, else (episode over or not) the grade of the workspace
        as it stands when ``grade_unsubmitted`` (-1 when ``model_new.py`` is still the template), else -1."""
        self._ws()
        if self.reward is None:
            if self.config.grade_unsubmitted and self._written():
                self.result = self._run("submit")
                self.reward = float(self.result["reward"])
            else:
                self.reward = -1.0
            self.done = True
        return self.reward

    # -- tool implementations: (text, status) ------------------------------------------------------
    def _clean_path(self, path: Any) -> PurePosixPath | None:
        if not isinstance(path, str) or not path.strip():
            return None
        p = PurePosixPath(path.strip().removeprefix("./"))
        if p.is_absolute() or ".." in p.parts:
            return None
        return p

    def _tool_write_file(self, path: str, content: str) -> tuple[str, str]:
        p = self._clean_path(path)
        if p is None:
            return f"write_file: {path!r} is not a path inside the workspace", "refused"
        key = str(p)
        allowed = key == "model_new.py" or (len(p.parts) >= 2 and p.parts[0] == "kernels"
                                            and p.suffix in EXTENSION_SUFFIXES and key not in FIXED)
        if not allowed:
            return (f"write_file: {key} cannot be written: only model_new.py and kernels/*"
                    f"{{{','.join(EXTENSION_SUFFIXES)}}} other than {', '.join(FIXED)}"), "refused"
        if not isinstance(content, str):
            return "write_file: content must be text", "refused"
        if len(content) > self.config.max_file_chars:
            return f"write_file: {len(content)} characters, more than {self.config.max_file_chars}", "refused"
        target = self._ws() / key
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")
        return f"wrote {len(content)} characters to {key}", "ok"

    def _tool_read_file(self, path: str) -> tuple[str, str]:
        p = self._clean_path(path)
        ws = self._ws()
        target = (ws / str(p)).resolve() if p is not None else None
        if target is None or not target.is_relative_to(ws.resolve()) or not target.is_file():
            return f"read_file: no file {path!r} in the workspace (list_files() lists them)", "missing"
        return _clip(target.read_text(errors="replace"), self.config.max_read_chars), "ok"

    def _tool_list_files(self) -> tuple[str, str]:
        ws = self._ws()
        files = sorted(str(f.relative_to(ws)) for f in ws.rglob("*") if f.is_file() and ".opforge" not in f.parts)
        return "\n".join(files), "ok"

    def _tool_compile(self) -> tuple[str, str]:
        from opforge.harness.feedback import compile_text

        step = self._run("compile")
        # the build's own seconds (0 when the module came from the cache), kept in the call's history entry
        self._build_info = {"build_s": step.get("seconds"), "build_cached": step.get("cached")}
        return compile_text(step, self.config.max_output_chars), "ok" if step.get("ok") else "build_error"

    def _tool_verify(self) -> tuple[str, str]:
        return self._eval_tool("verify")

    def _tool_profile(self) -> tuple[str, str]:
        return self._eval_tool("profile")

    def _tool_submit(self) -> tuple[str, str]:
        from opforge.harness.feedback import eval_text

        self.result = self._run("submit")
        self.reward = float(self.result["reward"])
        self.done = True
        return eval_text("submit", self.result, self.config.max_output_chars), str(self.result.get("status"))

    def _eval_tool(self, kind: str) -> tuple[str, str]:
        from opforge.harness.feedback import eval_text

        res = self._run(kind)
        return eval_text(kind, res, self.config.max_output_chars), str(res.get("status"))

    # -- plumbing ----------------------------------------------------------------------------------
    def _files(self) -> dict[str, str]:
        from opforge.harness.solution import Solution

        return Solution.from_dir(self._ws()).files

    def _written(self) -> bool:
        from opforge.harness.workspace import TEMPLATES

        path = self._ws() / "model_new.py"
        return path.is_file() and path.read_text() != (TEMPLATES / "model_new.py").read_text()

    def _run(self, kind: str) -> dict[str, Any]:
        """``harness.env_steps.run_step`` for the current workspace, on the client's workers or here."""
        from opforge.harness.env_steps import run_step
        from opforge.harness.solution import SolutionError

        try:
            files = self._files()
        except SolutionError as exc:
            files = None
            error = str(exc)
        if files is None:
            if kind == "compile":
                return {"ok": False, "error": error, "compiler": ""}
            return {"task_id": self.task_id, "status": "load_error", "reward": -1.0, "error": error}
        config_json = self.config.tool_config("submit" if kind == "compile" else kind).model_dump_json()
        row = {k: _plain(v) for k, v in (self._row or {}).items()}
        if self.scheduler is None:
            return run_step(kind, row, files, config_json, self.build_root)
        # keyed by content: identical steps in flight at once (other episodes' same code) are graded once
        from opforge.engine.ledger import content_hash
        from opforge.harness.evaluate import GRADER_VERSION

        key = f"run_step-{content_hash(kind, row, files, config_json, self.build_root, GRADER_VERSION)}"
        return self.scheduler.get().submit(run_step, kind, row, files, config_json, self.build_root,
                                           key=key).result()


def _plain(v: Any) -> Any:
    """A dataset cell as a plain Python value (numpy scalars and NaN from pandas rows)."""
    import math

    if hasattr(v, "item") and not isinstance(v, (list, dict, str)):
        try:
            v = v.item()
        except (ValueError, AttributeError):
            return v
    if isinstance(v, float) and math.isnan(v):
        return None
    return v


def _clip(text: str, limit: int) -> str:
    from opforge.harness.feedback import clip

    return clip(text, limit)
