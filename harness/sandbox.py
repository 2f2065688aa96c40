"""Run a harness step (extension build, evaluation) in a child process with a timeout and a captured log.

The child is ``python -m opforge.harness.child STEP REQUEST.json RESULT.json``; its stdout and stderr go
to a log file. On timeout the child's whole process group is killed (compilers included). The parent
never imports the candidate's code.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def run_child(step: str, request: dict[str, Any], work_dir: Path, timeout_s: float,
              env: dict[str, str] | None = None) -> tuple[dict[str, Any], float]:
    """Run ``step`` ("build" or "evaluate") in a child; returns (result dict, wall seconds).

    A child that times out, dies or writes no result gives ``{"ok": False, "error": ..., "log": path}``.
    """
    work_dir.mkdir(parents=True, exist_ok=True)
    req, res, log = work_dir / f"{step}.request.json", work_dir / f"{step}.result.json", work_dir / f"{step}.log"
    req.write_text(json.dumps(request))
    res.unlink(missing_ok=True)
    t0 = time.perf_counter()
    with open(log, "wb") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "opforge.harness.child", step, str(req), str(res)],
                                stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"})
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return {"ok": False, "error": f"timeout: {step} ran past {timeout_s:g} s", "log": str(log)}, \
                time.perf_counter() - t0
    seconds = time.perf_counter() - t0
    if res.exists():
        out = json.loads(res.read_text())
        out["log"] = str(log)
        return out, seconds
    tail = log.read_text(errors="replace")[-800:]
    return {"ok": False, "error": f"{step} child exited with code {code} and no result: {tail}",
            "log": str(log)}, seconds
