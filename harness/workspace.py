"""``opforge harness init``: a task workspace in the layout of CUDA-Agent's ``agent_workdir`` (model.py,
model_new.py, kernels/, tools/), with our own rules, binding and tools.

Layout written to ``out``::

    model.py                 the task (protected)
    model_new.py             starting point for the candidate
    kernels/binding.cpp      fixed module definition (protected)
    kernels/registry.h       OPFORGE_EXPORT registration helper (protected)
    RULES.md                 what the agent must do and must not do (protected)
    tools/compile.py|verify.py|profile.py   build / check / time the workspace (protected)
    .opforge/task.json       the dataset row (task_id, code, data_source), for the agent to read
    .opforge/protected.json  the protected paths

The record that decides (``workspace_record``) is kept outside the workspace: ``init_workspace`` writes the
dataset row and the SHA-256 of every protected file to ``<registry>/<key>.json`` (``registry`` default
``$OPFORGE_CACHE/workspaces``, i.e. ``~/.cache/opforge/workspaces``; ``key``: SHA-256 of the workspace's
absolute path). The tools evaluate against the recorded row, and every evaluation of the workspace compares
the protected files with the recorded hashes before and after (``workspace_changes``), so an edit of
``model.py``, ``tools/`` or ``.opforge/task.json`` between tool runs is ``hacked``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from opforge.harness.dataset import get_task, load_tasks

TEMPLATES = Path(__file__).resolve().parent / "templates"
PROTECTED = ["model.py", "RULES.md", "kernels/binding.cpp", "kernels/registry.h", "tools/compile.py",
             "tools/verify.py", "tools/profile.py", ".opforge/task.json"]


class WorkspaceError(ValueError):
    """The output directory cannot be used (exists and is not empty, or is not a workspace)."""


def registry_path(workspace: str | Path, registry: str | Path | None = None) -> Path:
    """Where the record of ``workspace`` lives (see the module docstring)."""
    root = Path(registry) if registry else Path(os.environ.get("OPFORGE_CACHE", Path.home() / ".cache" / "opforge")
                                                ) / "workspaces"
    key = hashlib.sha256(str(Path(workspace).resolve()).encode()).hexdigest()[:24]
    return root / f"{key}.json"


def _hashes(workspace: Path) -> dict[str, str]:
    out = {}
    for rel in PROTECTED:
        p = workspace / rel
        out[rel] = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "missing"
    return out


def workspace_record(workspace: str | Path, registry: str | Path | None = None) -> dict:
    """The record ``init_workspace`` wrote: ``{"workspace", "task": row, "hashes": {path: sha256}}``.

    Raises:
        WorkspaceError: no record (not made by ``opforge harness init``, or another registry).
    """
    path = registry_path(workspace, registry)
    if not path.is_file():
        raise WorkspaceError(f"{workspace}: no record of this workspace at {path} (make it with "
                             "`opforge harness init`)")
    return json.loads(path.read_text())


def workspace_changes(workspace: str | Path, record: dict) -> list[str]:
    """Protected paths whose content differs from the record (edited, removed or added), in PROTECTED order."""
    now = _hashes(Path(workspace))
    return [rel for rel, h in record["hashes"].items() if now.get(rel) != h]


def init_workspace(dataset: str | Path, task_id: str, out: str | Path, force: bool = False,
                   registry: str | Path | None = None) -> Path:
    """Materialise the workspace of ``task_id`` from ``dataset`` (see ``harness.dataset.load_tasks``) and
    record it in ``registry`` (see the module docstring).

    Raises:
        DatasetError: unreadable dataset or unknown task id.
        WorkspaceError: ``out`` exists and is not empty (unless ``force``: then it is replaced).
    """
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        if not force:
            raise WorkspaceError(f"{out}: exists and is not empty (use --force to replace it)")
        shutil.rmtree(out)
    return write_workspace(get_task(load_tasks(dataset), task_id, dataset), out, str(dataset), registry)


def write_workspace(task: dict, out: str | Path, dataset: str = "", registry: str | Path | None = None) -> Path:
    """The workspace of one dataset row (``task_id``, ``code``, ``data_source``) in ``out`` (created; must not
    exist or be empty), recorded in ``registry``; what ``init_workspace`` writes. Only the public task goes in:
    ``model.py`` and ``.opforge/task.json`` hold the row's ``code`` (never its hidden ``shape_variants``).

    Raises:
        WorkspaceError: ``out`` exists and is not empty.
    """
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise WorkspaceError(f"{out}: exists and is not empty")
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
    row = {"task_id": str(task["task_id"]), "code": task["code"], "data_source": task.get("data_source"),
           "dataset": str(dataset)}
    (out / ".opforge" / "task.json").write_text(json.dumps(row, indent=1))
    (out / ".opforge" / "protected.json").write_text(json.dumps(PROTECTED, indent=1))
    rec = registry_path(out, registry)
    rec.parent.mkdir(parents=True, exist_ok=True)
    rec.write_text(json.dumps({"workspace": str(out.resolve()), "task": row, "hashes": _hashes(out)}))
    return out


def run_tool(tool: str, workspace: Path, registry: str | Path | None = None) -> int:
    """What ``tools/<tool>.py`` does: ``compile`` (build kernels/), ``verify`` (correctness and every
    anti-hacking check, short timing) or ``profile`` (the full evaluation with reward), against the task
    recorded at init (not the workspace's copy). Prints a summary; returns the exit code (0 = built /
    correct).

    Raises:
        WorkspaceError: ``workspace`` was not made by ``opforge harness init`` (no record).
    """
    from opforge.harness.build import build_extension
    from opforge.harness.evaluate import EvalConfig, evaluate
    from opforge.harness.solution import Solution

    task = workspace_record(workspace, registry)["task"]
    solution = Solution.from_dir(workspace)
    if tool == "compile":
        res = build_extension(solution)
        print("built" if res.ok else f"build failed: {res.error}\nlog: {res.log}")
        return 0 if res.ok else 1
    import torch

    cfg = EvalConfig(device="cuda" if torch.cuda.is_available() else "cpu",
                     profile_compile=tool == "profile", timing_trials=20 if tool == "profile" else 3)
    res = evaluate(task, solution, cfg, workspace=workspace, registry=registry)
    keys = ["status", "reward", "hacks", "error", "max_error"] + (
        ["eager_ms", "compile_ms", "candidate_ms", "speedup_eager", "speedup_compile"] if tool == "profile" else [])
    print(json.dumps({k: getattr(res, k) for k in keys}, indent=1))
    return 0 if res.correct else 1
