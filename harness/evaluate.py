"""``evaluate(task, solution) -> EvalResult``: build, verify and profile one candidate, sandboxed.

Steps (each in a child process with its own timeout, see ``harness.sandbox``):

1. build ``kernels/`` into ``opforge_kernels`` (``harness.build``; cached by source hash);
2. in a fresh child: pin precision (TF32 off unless ``allow_tf32``), build the reference ``Model`` and
   the candidate ``ModelNew`` from the same seed and ``get_init_inputs()``, load the reference's
   ``state_dict`` into the candidate, then
   * verify on ``correct_trials`` (>= 5) fresh input draws: outputs allclose at ``atol`` / ``rtol``
     (default: by output dtype, ``opforge.task.precision``; 1e-2 for float32, KernelBench's and
     CUDA-Agent's tolerance), under the anti-hacking suite
     (``harness.guard``: dispatcher allow-list, no aliasing of inputs / parameters / buffers, precision
     flags unchanged);
   * profile eager, ``torch.compile`` (Inductor, default mode) and the candidate, interleaved
     (``harness.timing``), the candidate still under the guard;
   * re-verify on ``reverify_trials`` new draws after timing (defeats cached or lazily computed outputs);
   * check the clocks and timing entry points were not replaced;
3. around both: the SHA-256 of every protected file (the harness's own modules, and a workspace's
   ``model.py``, ``tools/``, ``RULES.md``, binding template) before and after.

Statuses: ``build_error``, ``load_error`` (model_new.py does not import or build, weights do not load),
``incorrect``, ``hacked`` (any anti-hacking check), ``timeout``, ``oom`` (out of memory), ``correct``.
The reward follows ``harness.reward``.
"""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path
from typing import Any, Literal

from opforge.filters.gpu_locks import ADMIT_FRACTION, ADMIT_GIB, ADMIT_GROWTH
from opforge.harness.build import BuildResult, build_extension
from opforge.harness.reward import reward_for
from opforge.harness.sandbox import run_child
from opforge.harness.solution import Solution
from pydantic import BaseModel, ConfigDict, Field

HARNESS_DIR = Path(__file__).resolve().parent


class EvalConfig(BaseModel):
    """Evaluation settings. Tolerances in absolute / relative units of ``torch.allclose`` (None: the
    tolerance of each reference output's dtype, ``opforge.task.precision``); times in s."""

    model_config = ConfigDict(extra="forbid")
    device: Literal["cpu", "cuda"] = "cpu"
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
    # GPU memory admission shared with the filter stage (filters.gpu_locks.MemoryBudget): evaluations on
    # one GPU start only while their reservations fit, so a batch never runs out of memory by crowding
    gpu_memory_fraction: float = Field(ADMIT_FRACTION, gt=0, le=1)
    gpu_admit_gib: float = Field(ADMIT_GIB, gt=0)
    gpu_growth: float = Field(ADMIT_GROWTH, ge=1)


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
    timing: dict[str, Any] = {}  # per function: median / min / max / wall median ms, trials
    device: str = "cpu"
    logs: dict[str, str] = {}


def file_hashes(paths: list[Path]) -> dict[str, str]:
    """SHA-256 per existing file (missing files map to "missing")."""
    out = {}
    for p in paths:
        out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "missing"
    return out


def protected_files(workspace: str | Path | None = None) -> list[Path]:
    """The harness's own Python modules plus a workspace's protected files (``.opforge/protected.json``
    lists them, written by ``harness.workspace.init_workspace``)."""
    files = sorted(HARNESS_DIR.glob("*.py"))
    if workspace is not None:
        import json

        manifest = Path(workspace) / ".opforge" / "protected.json"
        if manifest.is_file():
            files += [Path(workspace) / rel for rel in json.loads(manifest.read_text())]
    return files


def evaluate(task: dict[str, Any], solution: Solution, config: EvalConfig | None = None, *,
             workspace: str | Path | None = None, build_root: str | Path | None = None,
             work_dir: str | Path | None = None, alone: bool = False) -> EvalResult:
    """Evaluate ``solution`` against ``task`` (a dict with ``task_id``, ``code`` and optionally
    ``data_source``: a dataset row). See the module docstring. Never raises for the candidate's faults.

    On CUDA the evaluation is admitted to its GPU by memory (``EvalConfig.gpu_*``); ``alone`` reserves
    the whole GPU (a re-run of an ``oom``). Status ``oom``: the evaluation ran out of GPU memory; with
    ``alone`` that is the candidate's (or task's) own need, otherwise it may be the neighbours'
    (``harness.batch`` re-runs those alone).

    Raises:
        ValueError: ``task`` lacks ``task_id`` or ``code``.
    """
    config = config or EvalConfig()
    if not isinstance(task.get("code"), str) or not task.get("task_id"):
        raise ValueError("evaluate: task needs 'task_id' and 'code' (a row of an opforge dataset)")
    protected = protected_files(workspace)
    before = file_hashes(protected)
    base = dict(task_id=str(task["task_id"]), data_source=task.get("data_source"), device=config.device)
    build: BuildResult = build_extension(solution, build_root, config.build_timeout_s)
    logs = {"build": build.log} if build.log else {}
    if not build.ok:
        return _finish(EvalResult(**base, status="build_error", reward=-1.0, error=build.error,
                                  build_s=build.seconds, logs=logs), protected, before, config)
    tmp = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="opforge-eval-"))
    request = {"task_id": base["task_id"], "task_code": task["code"], "model_new": solution.model_new,
               "module_path": build.module_path, "config": config.model_dump(mode="json"), "alone": alone}
    out, seconds = run_child("evaluate", request, tmp, config.eval_timeout_s)
    logs["evaluate"] = out.get("log")
    fields = {k: v for k, v in out.items() if k in EvalResult.model_fields and k not in base}
    if not out.get("ok", False) and "status" not in out:
        status = "timeout" if str(out.get("error", "")).startswith("timeout") else "load_error"
        fields = {"status": status, "error": out.get("error")}
    result = EvalResult(**base, **{"reward": -1.0, **fields}, build_s=build.seconds, build_cached=build.cached,
                        eval_s=seconds, logs=logs)
    return _finish(result, protected, before, config)


def _finish(result: EvalResult, protected: list[Path], before: dict[str, str], config: EvalConfig) -> EvalResult:
    after = file_hashes(protected)
    changed = [Path(p).name for p in before if after.get(p) != before[p]]
    if changed:
        result.hacks = [*result.hacks, *[f"protected_file:{n}" for n in changed]]
        result.status = "hacked"
    if result.speedup_eager is not None and result.speedup_eager > config.max_speedup:
        result.flags = [*result.flags, "speedup_above_bound"]
    result.correct = result.status == "correct"
    result.reward = reward_for(result, config.reward)
    return result
