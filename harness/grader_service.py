"""Long-lived grader processes, lent one per evaluation (``GraderPool``): ``grade`` sends an evaluation's request to
a ``harness.grader_child serve`` process and waits for its result, so an evaluation pays neither the grader's start
(Python, torch, CUDA) nor, where ``harness.warm`` can keep them, its model servers' start and the reference's
``torch.compile``. An evaluation goes preferably to a grader process that graded the same task lately.

A grader process is started on its first request and started again when it is gone: after it died, was
killed (an evaluation that overran ``timeout_s``: the process is killed with its model servers,
``engine.oneshot.kill_tree``, and the result says ``timeout``), retired itself (``harness.grader_child``), or sat idle
for ``RESTART_IDLE_S`` (it leaves on its own after ``harness.grader_child.IDLE_S``). Every grader process of this
process is killed at exit (``close_all``). The results are the same as those of a grader process per evaluation,
which stays the default: ``harness.evaluate`` uses this module when ``OPFORGE_WARM_GRADER=1``.
"""

from __future__ import annotations

import atexit
import threading
import time
from pathlib import Path
from typing import Any

from opforge.engine.oneshot import ServerProcess, kill_tree
from opforge.engine.protocol import ProtocolError
from opforge.engine.tempdirs import make as make_tmp
from opforge.engine.tempdirs import remove as remove_tmp
from opforge.harness.grader_child import PRELOAD
from opforge.harness.warm import MAX_REFERENCES

MODULE = "opforge.harness.grader_child"
# a grader process idle this long is replaced before the next request (it exits by itself at
# harness.grader_child.IDLE_S; the margin keeps a request from reaching one on its way out)
RESTART_IDLE_S = 90.0


class GraderService:
    """One long-lived grader process and its connection (see the module docstring). One request at a time."""

    def __init__(self) -> None:
        self.server: ServerProcess | None = None
        self.folder: Path | None = None
        self.last = 0.0
        self.started = 0  # grader processes started so far
        self.recent: list[str] = []  # affinity keys of its latest evaluations (GraderPool)

    def _start(self) -> ServerProcess:
        self.close()
        self.folder = make_tmp("opforge-grader-")
        self.server = ServerProcess(MODULE, "serve", self.folder, self.folder / "grader.log", trusted=True,
                                    preload=PRELOAD)
        self.started += 1
        return self.server

    def grade(self, request: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """The grader's result for ``request`` (``harness.grader_child``'s fields, ``ok`` True), or ``{"ok":
        False, "error": ...}`` when the grader process timed out (``timeout: ...``) or died; ``log``: its log."""
        server = self.server
        if server is None or server.proc.poll() is not None or time.monotonic() - self.last > RESTART_IDLE_S:
            server = self._start()
        log = str(server.log)
        try:
            reply, _ = server.request({"op": "grade", **request}, timeout_s)
        except ProtocolError as exc:
            self.close()
            text = str(exc)
            error = f"timeout: the grader ran past {timeout_s:g} s" if "no reply within" in text else \
                f"the grader process died: {text}"
            return {"ok": False, "error": error, "log": log}
        self.last = time.monotonic()
        if reply.pop("retire", None) or not reply.get("ok"):
            self.close()
        reply["log"] = log
        return reply

    def close(self) -> None:
        """Kill the grader process with its model servers and remove its folder (idempotent)."""
        if self.server is not None:
            kill_tree(self.server.proc.pid)
            self.server.close()
            self.server = None
        if self.folder is not None:
            remove_tmp(self.folder)
            self.folder = None


class GraderPool:
    """The grader processes of this process, lent one per evaluation (see the module docstring). An evaluation
    goes to an idle grader process that graded the same task under the same settings lately (``affinity``), whose
    warm reference server it can reuse (``harness.warm``), else to any idle one, else to a new one: so there are
    as many grader processes as evaluations ever ran at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.idle: list[GraderService] = []
        self.all: list[GraderService] = []

    def grade(self, request: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """``GraderService.grade`` of ``request`` on a lent grader process."""
        key = affinity(request)
        with self._lock:
            svc = next((s for s in reversed(self.idle) if key in s.recent), None) or \
                next((s for s in reversed(self.idle) if s.server is not None), None) or \
                (self.idle[-1] if self.idle else None)
            if svc is not None:
                self.idle.remove(svc)
            else:
                svc = GraderService()
                self.all.append(svc)
        try:
            out = svc.grade(request, timeout_s)
            svc.recent = [*[k for k in svc.recent if k != key], key][-MAX_REFERENCES:] if svc.server else []
            return out
        finally:
            with self._lock:
                self.idle.append(svc)

    def close_idle(self) -> None:
        """Close the grader processes no evaluation is using, with their warm servers and the GPU memory these
        reserve (before an evaluation that must have the whole GPU: an ``alone`` re-run)."""
        with self._lock:
            for svc in self.idle:
                svc.close()
                svc.recent = []

    def close(self) -> None:
        """Close every grader process of the pool."""
        with self._lock:
            for svc in self.all:
                svc.close()
                svc.recent = []


def affinity(request: dict[str, Any]) -> str:
    """What an evaluation's reference server depends on (the task, the settings, the hidden shape variants, an
    ``alone`` re-run): SHA-256 of those request fields as canonical JSON."""
    import hashlib
    import json

    fields = {k: request.get(k) for k in ("task", "config", "variants", "alone")}
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()


POOL = GraderPool()


def grade(request: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """``GraderPool.grade`` on this process's pool."""
    return POOL.grade(request, timeout_s)


@atexit.register
def close_all() -> None:
    """Close every grader process of this process (at exit; also when a caller wants the GPU memory back)."""
    POOL.close()
