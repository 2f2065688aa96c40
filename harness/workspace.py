"""``opforge harness init``: a task workspace in the layout of CUDA-Agent's ``agent_workdir`` (model.py,
model_new.py, kernels/, tools/), with our own rules, binding and tools.

Layout written to ``out``::

    model.py                 the task (protected)
    model_new.py             starting point for the candidate
    kernels/binding.cpp      fixed module definition (protected)
    kernels/registry.h       OPFORGE_EXPORT registration helper (protected)
    RULES.md                 what the agent must do and must not do (protected)
    tools/compile.py|verify.py|profile.py   build / check / time the workspace (protected)
    .opforge/task.json       the dataset row (task_id, code, data_source)
    .opforge/protected.json  the protected paths, hashed before and after each evaluation
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from opforge.harness.dataset import get_task, load_tasks

TEMPLATES = Path(__file__).resolve().parent / "templates"
PROTECTED = ["model.py", "RULES.md", "kernels/binding.cpp", "kernels/registry.h", "tools/compile.py",
             "tools/verify.py", "tools/profile.py", ".opforge/task.json"]


class WorkspaceError(ValueError):
    """The output directory cannot be used (exists and is not empty, or is not a workspace)."""


def init_workspace(dataset: str | Path, task_id: str, out: str | Path, force: bool = False) -> Path:
    """Materialise the workspace of ``task_id`` from ``dataset`` (see ``harness.dataset.load_tasks``).

    Raises:
        DatasetError: unreadable dataset or unknown task id.
        WorkspaceError: ``out`` exists and is not empty (unless ``force``: then it is replaced).
    """
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        if not force:
            raise WorkspaceError(f"{out}: exists and is not empty (use --force to replace it)")
        shutil.rmtree(out)
    task = get_task(load_tasks(dataset), task_id, dataset)
    (out / "kernels").mkdir(parents=True)
    (out / "tools").mkdir()
    (out / ".opforge").mkdir()
    (out / "model.py").write_text(task["code"], encoding="utf-8")
    for name in ("RULES.md", "model_new.py"):
        shutil.copy(TEMPLATES / name, out / name)
    for name in ("binding.cpp", "registry.h"):
        shutil.copy(TEMPLATES / name, out / "kernels" / name)
    for tool in ("compile", "verify", "profile"):
        shutil.copy(TEMPLATES / "tools" / f"{tool}.py", out / "tools" / f"{tool}.py")
    row = {"task_id": task["task_id"], "code": task["code"], "data_source": task.get("data_source"),
           "dataset": str(dataset)}
    (out / ".opforge" / "task.json").write_text(json.dumps(row, indent=1))
    (out / ".opforge" / "protected.json").write_text(json.dumps(PROTECTED, indent=1))
    return out


def run_tool(tool: str, workspace: Path) -> int:
    """What ``tools/<tool>.py`` does: ``compile`` (build kernels/), ``verify`` (correctness and every
    anti-hacking check, no timing) or ``profile`` (the full evaluation with reward). Prints a summary;
    returns the exit code (0 = built / correct)."""
    from opforge.harness.build import build_extension
    from opforge.harness.evaluate import EvalConfig, evaluate
    from opforge.harness.solution import Solution

    meta = workspace / ".opforge" / "task.json"
    if not meta.is_file():
        raise WorkspaceError(f"{workspace}: not an opforge workspace (no .opforge/task.json)")
    task = json.loads(meta.read_text())
    solution = Solution.from_dir(workspace)
    if tool == "compile":
        res = build_extension(solution)
        print("built" if res.ok else f"build failed: {res.error}\nlog: {res.log}")
        return 0 if res.ok else 1
    import torch

    cfg = EvalConfig(device="cuda" if torch.cuda.is_available() else "cpu",
                     profile_compile=tool == "profile", timing_trials=20 if tool == "profile" else 3)
    res = evaluate(task, solution, cfg, workspace=workspace)
    keys = ["status", "reward", "hacks", "error", "max_error"] + (
        ["eager_ms", "compile_ms", "candidate_ms", "speedup_eager", "speedup_compile"] if tool == "profile" else [])
    print(json.dumps({k: getattr(res, k) for k in keys}, indent=1))
    return 0 if res.correct else 1
