"""The engine's one-shot sandbox mode: a child process per job, for untrusted code (a candidate's build
or model), killed as a process group when it is done. The caller names the child's module by import path,
so this module imports none of its users.

* ``run_child``: ``python -m MODULE STEP REQUEST.json RESULT.json`` (e.g. the harness's extension build),
  stdout and stderr in a log file; on timeout the child's whole process group is killed (compilers
  included), and so are the groups of its descendants (``kill_tree``).
* ``ServerProcess``: ``python -m MODULE ROLE FD``, a server that answers messages (``engine.protocol``) over
  a socket pair until it is closed (the harness runs its candidate in one, its reference in another).

The process that starts these children never imports the code they run.
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


def child_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a ``run_child`` child: this process's, ``env`` over it, Python unbuffered."""
    return {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}


def server_env(env: dict[str, str] | None = None, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a ``ServerProcess`` child started by a process whose environment is ``base`` (default:
    this one's): ``env`` over it, Python unbuffered, its working folder not on ``sys.path``."""
    return {**(os.environ if base is None else base), **(env or {}), "PYTHONUNBUFFERED": "1", "PYTHONSAFEPATH": "1"}


def run_child(module: str, step: str, request: dict[str, Any], work_dir: Path, timeout_s: float,
              env: dict[str, str] | None = None, preload: tuple[str, ...] = ()) -> tuple[dict[str, Any], float]:
    """Run ``python -m module step REQUEST RESULT`` in a child; returns (result dict, wall seconds). With
    ``preload``, the child is forked from the fork server that has imported those modules (``engine.forkserver``;
    it calls ``module.main()``), where one can serve.

    A child that times out, dies or writes no result gives ``{"ok": False, "error": ..., "log": path}``.
    """
    work_dir.mkdir(parents=True, exist_ok=True)
    req, res, log = work_dir / f"{step}.request.json", work_dir / f"{step}.result.json", work_dir / f"{step}.log"
    req.write_text(json.dumps(request))
    res.unlink(missing_ok=True)
    t0 = time.perf_counter()
    with open(log, "wb") as fh:
        argv, full_env = [step, str(req), str(res)], child_env(env)
        proc = _start(module, argv, preload, Path.cwd(), full_env, fh.fileno(), (), step) if preload else None
        proc = proc or subprocess.Popen([sys.executable, "-m", module, *argv], stdout=fh, stderr=subprocess.STDOUT,
                                        start_new_session=True, env=full_env)
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid)
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


def _start(module: str, argv: list[str], preload: tuple[str, ...], cwd: Path, env: dict[str, str], out: int,
           pass_fds: tuple[int, ...], name: str):
    """``module.main()`` in a child of the fork server for ``preload`` (``engine.forkserver``), or None."""
    from opforge.engine import forkserver

    return forkserver.spawn(f"{module}:main", argv, preload=preload, cwd=cwd, env=env, stdout=out,
                            pass_fds=pass_fds, name=f"opf-{name}"[:15])


def kill_tree(pid: int) -> None:
    """SIGKILL the process group of ``pid`` and of every process descended from it, found from the process
    table (never from a file a child could write): a child's own one-shot servers start sessions of their
    own, so killing the child's group alone would leave them running (a stopped one for ever). A child that a fork
    server started for ``pid`` (``engine.forkserver``) is not in that table's tree: the fork server kills it when
    ``pid`` is gone."""
    import psutil

    try:
        descendants = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        descendants = []
    groups = {pid}
    for d in descendants:
        try:
            groups.add(os.getpgid(d.pid))
        except OSError:
            continue
    groups.discard(os.getpgrp())  # never this process's own group
    for g in groups:
        try:
            os.killpg(g, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


class ServerProcess:
    """A one-shot server child (``python -m MODULE ROLE FD``) and its connection.

    With ``preload``, the child is forked from the fork server that has imported those modules
    (``engine.forkserver``; it calls ``module.main()``), where one can serve.

    The child gets one end of a socket pair as ``FD``, its own session (killed as a process group on
    ``close``), ``cwd`` as working directory, and stdout / stderr in ``log``. It runs with ``PYTHONSAFEPATH=1``:
    its working directory is not on ``sys.path``, so a file a candidate wrote there (or, for a server whose folder
    is a candidate's parent, next to it) is never imported by a later lazy import. Use as a context manager.

    ``request(msg)`` sends one message and waits for one reply (``engine.protocol``); a child that exits,
    times out or replies malformed raises ``ProtocolError`` (the caller turns it into a verdict).
    """

    def __init__(self, module: str, role: str, cwd: Path, log: Path, env: dict[str, str] | None = None,
                 trusted: bool = False, preload: tuple[str, ...] = ()):
        import socket
        from multiprocessing.connection import Connection

        self.role, self.log, self.trusted = role, log, trusted
        ours, theirs = socket.socketpair()
        cwd.mkdir(parents=True, exist_ok=True)
        self._log = open(log, "wb")  # noqa: SIM115 - closed in close()
        try:
            argv = [role, str(theirs.fileno())]
            full_env = server_env(env)
            proc = _start(module, argv, preload, cwd, full_env, self._log.fileno(), (theirs.fileno(),), role) \
                if preload else None
            self.proc = proc or subprocess.Popen(
                [sys.executable, "-m", module, *argv], pass_fds=(theirs.fileno(),), stdout=self._log,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, cwd=str(cwd), env=full_env)
        finally:
            theirs.close()
        self.conn = Connection(ours.detach())

    def request(self, msg: dict[str, Any], timeout_s: float, blob: bytes | None = None
                ) -> tuple[dict[str, Any], bytes | None]:
        """Send ``msg`` (+ ``blob``), return the reply (and its blob: only a trusted server may send one)."""
        from opforge.engine.protocol import ProtocolError, recv, send

        try:
            send(self.conn, msg, blob)
        except OSError as exc:
            raise ProtocolError(f"{self.role} server is gone ({exc})") from None
        try:
            return recv(self.conn, timeout_s, allow_blob=self.trusted)
        except ProtocolError as exc:
            code = self.proc.poll()
            raise ProtocolError(f"{self.role} server: {exc}" + (f" (exited with code {code})" if code is not None
                                                                else "")) from None

    def pause(self) -> None:
        """Stop the child's whole process group (``SIGSTOP``): nothing of it runs until ``resume``."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        """Let a paused process group run again (``SIGCONT``)."""
        self._signal(signal.SIGCONT)

    def _signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass

    def log_tail(self, chars: int = 1500) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def close(self) -> None:
        """Kill the child's process group and close the connection (idempotent)."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()
        self.conn.close()
        self._log.close()

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
