"""The work behind the environment's heavy tools, as one function a Dask worker runs (``harness.env``).

``run_step(kind, task, files, config_json, build_root)`` takes everything as values - the dataset row, the
solution's files, the evaluation settings as JSON - so nothing assumes a filesystem shared between the
trainer and the workers, and returns a JSON-able dict; the compiler's diagnostics are read from the build log
on the worker.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

STEPS = ("compile", "verify", "profile", "submit")


def run_step(kind: str, task: dict[str, Any], files: dict[str, str], config_json: str,
             build_root: str | None = None) -> dict[str, Any]:
    """One tool step on ``files`` (``model_new.py`` and ``kernels/...``) for ``task`` (a dataset row):

    * ``compile``: build the extension (``harness.build``, cached by source hash); returns ``ok``, ``seconds``,
      ``cached``, ``module`` (None without sources), ``error`` and ``compiler`` (the log's diagnostics);
    * ``verify`` / ``profile`` / ``submit``: ``harness.batch.evaluate_one`` with ``config_json`` (an
      ``EvalConfig``); returns the ``EvalResult`` dict.

    Never raises for the candidate's faults; raises ValueError for an unknown ``kind``.
    """
    if kind not in STEPS:
        raise ValueError(f"unknown step {kind!r}; known: {', '.join(STEPS)}")
    if kind != "compile":
        from opforge.harness.batch import evaluate_one

        return evaluate_one(task, files, config_json, build_root)
    from opforge.harness.build import build_extension
    from opforge.harness.evaluate import EvalConfig
    from opforge.harness.feedback import compiler_excerpt
    from opforge.harness.solution import Solution, SolutionError

    config = EvalConfig.model_validate_json(config_json)
    try:
        solution = Solution(files, origin="workspace")
    except SolutionError as exc:
        return {"ok": False, "seconds": 0.0, "cached": False, "module": None, "error": str(exc), "compiler": ""}
    res = build_extension(solution, build_root, config.build_timeout_s)
    build_dir = str(Path(res.log).parent) if res.log else None
    return {"ok": res.ok, "seconds": res.seconds, "cached": res.cached,
            "module": Path(res.module_path).name if res.module_path else None,
            "error": None if res.ok else (res.error or "build failed")[-1500:],
            "compiler": "" if res.ok else compiler_excerpt(res.log, build_dir)}
