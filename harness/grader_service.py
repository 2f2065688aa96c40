"""Long-lived grader processes, one per thread of the calling process: ``grade`` sends an evaluation's request to
this thread's ``harness.grader_child serve`` process and waits for its result, so an evaluation pays neither the
grader's start (Python, torch, CUDA) nor, where ``harness.warm`` can keep them, its model servers' start and the
reference's ``torch.compile``.

A thread's grader process is started on its first request and started again when it is gone: after it died, was
killed (an evaluation that overran ``timeout_s``: the process is killed with its model servers,
``engine.oneshot.kill_tree``, and the result says ``timeout``), retired itself (``harness.grader_child``), or sat idle
for ``RESTART_IDLE_S`` (it leaves on its own after ``harness.grader_child.IDLE_S``). Every grader process of this
process is killed at exit (``close_all``). The results are the same as those of a grader process per evaluation
(``OPFORGE_WARM_GRADER=0`` selects that: ``harness.evaluate``).
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

    def _start(self) -> ServerProcess:
        self.close()
        self.folder = make_tmp("opforge-grader-")
        self.server = ServerProcess(MODULE, "serve", self.folder, self.folder / "grader.log", trusted=True)
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


_LOCAL = threading.local()
_ALL: list[GraderService] = []
_ALL_LOCK = threading.Lock()


def service() -> GraderService:
    """This thread's ``GraderService`` (made on first use)."""
    svc = getattr(_LOCAL, "service", None)
    if svc is None:
        svc = _LOCAL.service = GraderService()
        with _ALL_LOCK:
            _ALL.append(svc)
    return svc


def grade(request: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """``GraderService.grade`` on this thread's grader process."""
    return service().grade(request, timeout_s)


@atexit.register
def close_all() -> None:
    """Close every thread's grader process (at exit; also when a caller wants the GPU memory back)."""
    with _ALL_LOCK:
        for svc in _ALL:
            svc.close()
