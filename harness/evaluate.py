"""``evaluate(task, solution) -> EvalResult``: the grader of one candidate, whose verdict nothing in the
candidate's process decides.

Steps:

1. the workspace (when given) against what ``opforge harness init`` recorded outside it
   (``harness.workspace``), and the harness's own modules by SHA-256 before and after;
2. ``model_new.py`` against the static rules (``harness.policy``) and the timing-tamper audit
   (``harness.timing_tamper``: patched or wrapped clocks, synchronisation, events or statistics; behaviour by
   call count, seed or repeated input);
3. the extension sources' tokens (``harness.symbols.denied_tokens``, with the library policy of
   ``harness.libraries``), then build ``kernels/`` into ``opforge_kernels`` (``harness.build``, cached by
   source hash) and audit the imported symbols of the ``.so`` (``harness.symbols``);
4. verification and timing by ``harness.grader.Grader``: the reference and the candidate each in a one-shot
   server process, every call verified on fresh inputs drawn from per-evaluation secret seeds, times taken
   by this process, baselines (eager, ``torch.compile``) in a process that never imported the candidate.

Statuses: ``build_error``, ``load_error`` (model_new.py does not import or build, weights do not load),
``incorrect``, ``hacked`` (any rule broken; ``hacks`` names which: ``protected_file:``, ``policy:``,
``timing:``, ``symbol:`` / ``source:``, ``torch_op:``, ``config:``, ``alias:``, ``input_modified:``, ``output:``,
``protocol:``), ``timeout``, ``oom`` (out of memory), ``correct``; ``harness.batch`` adds ``crash`` for an
evaluation whose Dask worker was lost (more than once). The reward follows ``harness.reward``.
Tolerances: by output dtype (``opforge.task.precision``; 1e-2 for float32, KernelBench's and CUDA-Agent's
tolerance) unless ``atol`` / ``rtol`` are given.
"""

from __future__ import annotations

import hashlib
import sys
import time
import types
from pathlib import Path
from typing import Any, Literal

from opforge.engine.settings import GpuAdmission
from opforge.engine.tempdirs import make as make_tmp
from opforge.engine.tempdirs import remove as remove_tmp
from opforge.engine.timing import BURST_TARGET_MS, MAX_BURST
from opforge.harness.build import FIXED_BINDING, BuildResult, build_extension
from opforge.harness.reward import reward_for
from opforge.harness.solution import Solution
from pydantic import BaseModel, ConfigDict, Field

HARNESS_DIR = Path(__file__).resolve().parent
ENGINE_DIR = HARNESS_DIR.parent / "engine"
# Version of the grader's deciding logic, part of the fingerprint of stored results (``harness.batch``):
# raise it when a change to the grader can change a result, so no stored result of the old grader is reused.
GRADER_VERSION = 7
# Where the grader runs (``_grade``): on CUDA in a grader process that runs one evaluation at a time
# (``harness.grader_child``: its CUDA IPC slots never share allocator segments with another evaluation's, and all of
# an evaluation's GPU memory is freed when it ends); in the calling process on CPU (slots are files; a process per
# evaluation would cost ~2 s of the CPU a timing shares).
GRADER_IN_CHILD = {"cuda": True, "cpu": False}
# set to 1 for long-lived grader processes with warm model servers (``warm_grader``, ``harness.grader_service``)
WARM_GRADER_ENV = "OPFORGE_WARM_GRADER"
# seconds a grader process may run beyond ``eval_timeout_s`` (its own deadline) before it is killed
GRADER_CHILD_MARGIN_S = 60.0


class EvalConfig(GpuAdmission):
    """Evaluation settings: the engine's GPU memory admission (``engine.settings.GpuAdmission``: device,
    ``gpu_memory_fraction``, ``gpu_admit_gib``, ``gpu_growth``, shared with the filter stage: evaluations
    on one GPU start only while their reservations fit) and the grader's own. Tolerances in absolute / relative units of ``torch.allclose`` (None: the
    tolerance of each reference output's dtype, ``opforge.task.precision``); times in s. Every call of the
    candidate is verified, so ``correct_trials`` / ``warmup`` / ``timing_trials`` / ``reverify_trials`` are
    rounds of one schedule (``harness.grader``). ``threads``: intra-op threads of both servers (None: the
    cores this process may use). ``input_sets``: rotating input slots of the single-call rounds (>= 2) of plain
    bursts (with CUDA graphs the rounds rotate over the sets the burst's graphs were captured on:
    ``harness.gpu_memory.slot_sets``).
    ``burst_target_ms``: a warm-up or timed round of each target is one burst of calls on fresh input sets,
    as many as make it last about this long (``engine.timing.burst_size``); 0 times one call per request.
    ``burst_calls``: that many calls per burst instead (at most what ``engine.timing.burst_cap`` allows for the
    task's input + output bytes), for measurements that compare evaluations at one burst size.
    ``cuda_graphs``: on CUDA, each burst of the public shape is the replay of CUDA graphs of its calls, captured
    in the untimed rounds, when every timed target (candidate, eager, ``torch.compile``) can be captured; else
    every target runs plain bursts (``harness.grader``)."""

    model_config = ConfigDict(extra="forbid")
    atol: float | None = None
    rtol: float | None = None
    correct_trials: int = Field(5, ge=5)
    reverify_trials: int = Field(2, ge=1)
    timing_trials: int = Field(20, ge=3)
    warmup: int = Field(3, ge=1)
    allow_tf32: bool = False
    profile_compile: bool = True
    max_speedup: float = 50.0  # speed-ups above this vs eager are flagged for review
    build_timeout_s: float = 600.0
    eval_timeout_s: float = 600.0
    reward: Literal["milestone", "speedup"] = "milestone"
    namespaces: tuple[str, ...] = ("opforge_kernels",)
    threads: int | None = Field(None, ge=1)
    input_sets: int = Field(4, ge=2)
    burst_target_ms: float = Field(BURST_TARGET_MS, ge=0)
    burst_calls: int | None = Field(None, ge=1, le=MAX_BURST)
    cuda_graphs: bool = True
    # hidden shape variants of the task row (its ``shape_variants``, compose.variants): checked in the final rounds
    shape_variants: bool = True
    variant_trials: int = Field(2, ge=1)


class EvalResult(BaseModel):
    """Outcome of one evaluation. Times in ms (``*_ms``) or seconds (``*_s``); speed-ups are
    reference median / candidate median (> 1 = faster)."""

    task_id: str
    data_source: str | None = None
    status: str
    reward: float
    correct: bool = False
    hacks: list[str] = []
    flags: list[str] = []
    error: str | None = None
    max_error: float | None = None
    eager_ms: float | None = None
    compile_ms: float | None = None
    candidate_ms: float | None = None
    speedup_eager: float | None = None
    speedup_compile: float | None = None
    build_s: float = 0.0
    build_cached: bool = False
    verify_s: float | None = None
    profile_s: float | None = None
    eval_s: float = 0.0
    precision: dict[str, Any] = {}
    # per function: median_ms (the time used), wall median / low quantile, hint median, min / max wall ms,
    # trials, and each timed round's walls_ms / hints_ms (harness.grader)
    timing: dict[str, Any] = {}
    overhead_ms: float | None = None  # low quantile of wall - hint of the reference's eager calls (harness.grader)
    burst: int = 1  # calls per warm-up and timed request (harness.grader, engine.timing.burst_size)
    graphs: bool = False  # every timed burst was a CUDA-graph replay (harness.grader, EvalConfig.cuda_graphs)
    variants_checked: int = 0  # hidden shape variants the candidate answered correctly (harness.grader)
    warm_reference: bool = False  # the reference server was kept from an earlier evaluation (harness.warm)
    # seconds of the grader's steps: admit, setup, rounds, draw, compile, teardown, total (harness.grader)
    phases_s: dict[str, float] = {}
    device: str = "cpu"
    logs: dict[str, str] = {}


def file_hashes(paths: list[Path]) -> dict[str, str]:
    """SHA-256 per existing file (missing files map to "missing")."""
    out = {}
    for p in paths:
        out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "missing"
    return out


def protected_files() -> list[Path]:
    """The harness's own modules and the engine's they run on (hashed before and after each evaluation: a
    candidate that edits the grader on disk would change later evaluations)."""
    return sorted(HARNESS_DIR.glob("*.py")) + sorted(ENGINE_DIR.glob("*.py"))


def evaluate(task: dict[str, Any], solution: Solution, config: EvalConfig | None = None, *,
             workspace: str | Path | None = None, build_root: str | Path | None = None,
             work_dir: str | Path | None = None, alone: bool = False,
             registry: str | Path | None = None) -> EvalResult:
    """Evaluate ``solution`` against ``task`` (a dict with ``task_id``, ``code`` and optionally
    ``data_source``: a dataset row, the reference). See the module docstring. Never raises for the
    candidate's faults.

    ``workspace``: a directory made by ``opforge harness init``; its protected files and task must still
    match what was recorded then (``harness.workspace.workspace_changes``; ``registry``: where the record
    is, default ``$OPFORGE_CACHE/workspaces``). ``alone`` reserves the whole GPU (a re-run of an ``oom``).
    Status ``oom``: out of GPU memory; with ``alone`` that is the candidate's (or task's) own need,
    otherwise it may be the neighbours' (``harness.batch`` re-runs those alone).

    With ``config.shape_variants`` (default) the row's hidden ``shape_variants`` (``compose.variants``) are checked
    too, ``config.variant_trials`` rounds each, in the final rounds; the workspace tools leave them out.

    Raises:
        ValueError: ``task`` lacks ``task_id`` or ``code``, or its ``shape_variants`` is malformed.
        WorkspaceError: ``workspace`` has no record (not made by ``opforge harness init``).
    """
    from opforge.harness.grader import timing_lock
    from opforge.harness.policy import policy_violations
    from opforge.harness.symbols import audit_extension, denied_tokens
    from opforge.harness.timing_tamper import timing_tampers
    from opforge.task.sizes import parse_variants

    config = config or EvalConfig()
    if not isinstance(task.get("code"), str) or not task.get("task_id"):
        raise ValueError("evaluate: task needs 'task_id' and 'code' (a row of an opforge dataset)")
    variants = [v["sizes"] for v in parse_variants(task.get("shape_variants"), f"task {task['task_id']}: "
                                                   "shape_variants")] if config.shape_variants else []
    t0 = time.perf_counter()
    protected = protected_files()
    before = file_hashes(protected)
    base = dict(task_id=str(task["task_id"]), data_source=task.get("data_source"), device=config.device)
    ws_check = None
    if workspace is not None:
        from opforge.harness.workspace import workspace_changes, workspace_record

        record = workspace_record(workspace, registry)
        ws_check = lambda: workspace_changes(workspace, record)  # noqa: E731
        changed = ws_check()
        if changed:
            return _finish(EvalResult(**base, status="hacked", reward=-1.0, hacks=[f"protected_file:{c}" for c in changed],
                                      error="the workspace's protected files or task changed since harness init"),
                           protected, before, config, ws_check, t0)
    broken = [f"policy:{b}" for b in policy_violations(solution.model_new)]
    broken += [f"timing:{t}" for t in timing_tampers(solution.model_new)]
    # the sources' tokens (harness.symbols, the library policy of harness.libraries) before any build: a denied
    # library or call is a hack even where its headers are missing and the build would fail
    own = {k: v for k, v in solution.sources.items() if k not in FIXED_BINDING}
    broken += [f"source:{t}" for t in denied_tokens(own)]
    if broken:
        return _finish(EvalResult(**base, status="hacked", reward=-1.0, hacks=broken,
                                  error=f"the solution breaks the rules: {broken[:5]}"),
                       protected, before, config, ws_check, t0)
    lock = timing_lock(config.device)
    try:
        with lock.shared() if config.device == "cpu" else _null():  # compilers load the CPU a timing would use
            build: BuildResult = build_extension(solution, build_root, config.build_timeout_s)
    finally:
        lock.close()
    logs = {"build": build.log} if build.log else {}
    if not build.ok:
        return _finish(EvalResult(**base, status="build_error", reward=-1.0, error=build.error,
                                  build_s=build.seconds, logs=logs), protected, before, config, ws_check, t0)
    try:
        audit = audit_extension(build.module_path, own)
    except RuntimeError as exc:
        audit, logs["audit"] = ["symbol:unreadable"], str(exc)
    if audit:
        return _finish(EvalResult(**base, status="hacked", reward=-1.0, hacks=audit, build_s=build.seconds,
                                  build_cached=build.cached, logs=logs,
                                  error="the extension reaches torch compute or steps around the guard"),
                       protected, before, config, ws_check, t0)
    tmp = Path(work_dir) if work_dir else make_tmp("opforge-eval-")
    try:
        fields = _grade(task, solution.model_new, build.module_path, config, tmp, alone, variants)
    finally:
        if not work_dir:  # our own folder: removed when the grading ends (OPFORGE_KEEP_TMP keeps it)
            remove_tmp(tmp)
    logs.update(fields.pop("logs", {}))
    timing = fields.get("timing") or {}
    if fields.get("status") == "correct":
        fields["eager_ms"] = timing["eager"]["median_ms"]
        fields["candidate_ms"] = timing["candidate"]["median_ms"]
        fields["speedup_eager"] = fields["eager_ms"] / max(fields["candidate_ms"], 1e-9)
        if "compile" in timing:
            fields["compile_ms"] = timing["compile"]["median_ms"]
            fields["speedup_compile"] = fields["compile_ms"] / max(fields["candidate_ms"], 1e-9)
    fields = {k: v for k, v in fields.items() if k in EvalResult.model_fields and k not in base}
    result = EvalResult(**base, **{"reward": -1.0, **fields}, build_s=build.seconds, build_cached=build.cached,
                        logs=logs)
    return _finish(result, protected, before, config, ws_check, t0)


def _grade(task: dict[str, Any], model_new: str, module_path: str | None, config: EvalConfig, work_dir: Path,
           alone: bool, variants: list[dict[str, int]]) -> dict[str, Any]:
    """``Grader.run``'s fields: with ``warm_grader()``, on any device, in a long-lived grader process
    (``harness.grader_service``, warm model servers kept between evaluations); else in a grader process of its own
    (``harness.grader_child grade``) where ``GRADER_IN_CHILD`` says so for the device, else here. A grader
    process that overruns the evaluation's time by ``GRADER_CHILD_MARGIN_S`` is killed with its servers
    (``engine.oneshot.kill_tree``; ``timeout``); one that dies gives ``crash``."""
    from opforge.harness.grader import Grader

    if not warm_grader() and not GRADER_IN_CHILD.get(config.device, True):
        return Grader(task, model_new, module_path, config, work_dir, alone=alone, variants=variants).run()
    request = {"task": {"task_id": str(task["task_id"]), "code": task["code"]}, "model_new": model_new,
               "module_path": module_path, "config": config.model_dump(mode="json"), "work_dir": str(work_dir),
               "alone": alone, "variants": variants}
    if warm_grader():
        from opforge.harness.grader_service import POOL

        if alone:  # the whole GPU: the idle grader processes' warm servers give their reservations back first
            POOL.close_idle()
        out = POOL.grade(request, config.eval_timeout_s + GRADER_CHILD_MARGIN_S)
    else:
        from opforge.engine.oneshot import run_child
        from opforge.harness.grader_child import PRELOAD as GRADER_PRELOAD

        _prestart_servers()

        # its request and result live in a private folder of their own, not beside the candidate's working folder
        private = make_tmp("opforge-grader-")
        try:
            out, _ = run_child("opforge.harness.grader_child", "grade", request, private,
                               config.eval_timeout_s + GRADER_CHILD_MARGIN_S, preload=GRADER_PRELOAD)
        finally:
            remove_tmp(private)
    log = out.pop("log", None)
    if out.pop("ok", False):
        out.setdefault("logs", {})["grader"] = log
        return out
    error = str(out.get("error"))
    return {"status": "timeout" if error.startswith("timeout") else "crash", "error": f"grader: {error[:800]}",
            "logs": {"grader": log}}


def prepare_fork_servers(device: str) -> dict[str, Any]:
    """Start this process's fork servers (``engine.forkserver``) for evaluations on ``device`` and wait until they
    listen: the model servers' one and, where evaluations run in grader processes of their own
    (``GRADER_IN_CHILD``, ``warm_grader``), the graders' one; the environments are those the evaluations will give
    them. What an evaluation would otherwise wait for at its start: Python's and torch's imports once per process
    and environment. Returns ``{"servers": bool, "grader": bool | None, "seconds": float}`` (whether each listens;
    None: not used on this device). ``harness.rl.KernelReward.prepare`` runs it on every Dask worker."""
    import threading

    from opforge.engine import forkserver
    from opforge.engine.oneshot import child_env, server_env
    from opforge.harness.grader import SERVER_PRELOAD
    from opforge.harness.grader_child import PRELOAD as GRADER_PRELOAD

    t0 = time.perf_counter()
    out: dict[str, Any] = {"grader": None}
    jobs = [("servers", SERVER_PRELOAD, _servers_fork_env())]
    if warm_grader():
        jobs.append(("grader", GRADER_PRELOAD, server_env()))
    elif GRADER_IN_CHILD.get(device, True):
        jobs.append(("grader", GRADER_PRELOAD, child_env()))

    def run(name: str, preload: tuple[str, ...], env: dict[str, str]) -> None:
        out[name] = forkserver.ensure(preload, env)

    threads = [threading.Thread(target=run, args=job, daemon=True) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out["seconds"] = round(time.perf_counter() - t0, 3)
    return out


def _servers_fork_env() -> dict[str, str]:
    """The environment a grader process started by this one (``engine.oneshot.child_env``) gives its model servers
    (``server_env`` of ``SERVER_ENV``): the key of their fork server."""
    from opforge.engine.oneshot import child_env, server_env
    from opforge.harness.grader import SERVER_ENV

    return server_env(SERVER_ENV, base=child_env())


_PRESTARTED: set[str] = set()


def _prestart_servers() -> None:
    """Once per process and environment: start the model servers' fork server (``engine.forkserver``) in the
    background, so that its imports (torch, torch._dynamo) overlap the grader process's start instead of following
    it. Its environment is the one the grader process will give its servers (``engine.oneshot.server_env`` over
    ``child_env``); were it to differ, the grader's servers would start their own fork server as without this."""
    from opforge.engine import forkserver
    from opforge.harness.grader import SERVER_PRELOAD

    env = _servers_fork_env()
    key = repr(sorted(env.items()))
    if key not in _PRESTARTED and forkserver.enabled():
        _PRESTARTED.add(key)
        forkserver.prestart(SERVER_PRELOAD, env)


def warm_grader() -> bool:
    """Whether a grader process serves many evaluations (``harness.grader_service``, with warm model servers:
    ``harness.warm``): when ``OPFORGE_WARM_GRADER`` is ``1``; otherwise one grader process per evaluation."""
    import os

    return os.environ.get(WARM_GRADER_ENV, "").strip() == "1"


def _null():
    import contextlib

    return contextlib.nullcontext()


def _finish(result: EvalResult, protected: list[Path], before: dict[str, str], config: EvalConfig,
            ws_check, t0: float) -> EvalResult:
    after = file_hashes(protected)
    changed = [Path(p).name for p in before if after.get(p) != before[p]]
    if ws_check is not None:
        changed += [c for c in ws_check() if c not in changed]
    if changed:
        result.hacks = [*result.hacks, *[f"protected_file:{n}" for n in changed if f"protected_file:{n}" not in
                                         result.hacks]]
        result.status = "hacked"
    if result.speedup_eager is not None and result.speedup_eager > config.max_speedup:
        result.flags = [*result.flags, "speedup_above_bound"]
    result.correct = result.status == "correct"
    result.reward = reward_for(result, config.reward)
    result.eval_s = time.perf_counter() - t0
    return result


class _EvaluateModule(types.ModuleType):
    """This module, callable as its ``evaluate`` function: the package exports the function under the
    module's own name, and Python's import system may bind either to ``opforge.harness.evaluate``."""

    def __call__(self, *args, **kwargs) -> EvalResult:
        return evaluate(*args, **kwargs)


sys.modules[__name__].__class__ = _EvaluateModule
