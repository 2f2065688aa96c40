"""A fork server per machine and set of modules: a process that has imported torch (and the modules its callers
name) once, and forks every new child of theirs from there, so a child starts in milliseconds instead of paying
the interpreter's start and torch's import. On an H200 host that import is about 4 s, and ``torch._dynamo`` (which
the reference's ``FakeTensorMode`` and ``torch.compile`` need) about 5 s more; an evaluation starts three such
processes (its grader, the reference's and the candidate's model servers), and a batch of evaluations started at
once spends most of its first seconds importing torch on every core.

``spawn(target, argv, preload=...)`` returns a ``ForkedProcess`` (the subset of ``subprocess.Popen`` the engine
uses: ``pid``, ``poll``, ``wait``, ``returncode``), or None where no fork server can serve (the caller starts the
child the usual way: ``python -m``). ``prestart(preload, env)`` starts a fork server in the background ahead of need;
``ensure`` starts one and waits until it listens. The child is what ``python -m MODULE ARGV...`` would be, with
these differences: its modules of ``preload`` (and what they import) were imported before the fork, in the same
environment; its ``/proc/PID/cmdline`` is the fork server's (its ``comm``, what ``ps`` and ``psutil.Process.name``
show, is ``name``); it calls ``target``'s function (``module:function``) instead of running the module as
``__main__``.

Rules:

* **One fork server per key**: the Python executable, ``preload`` and the child's whole environment (``env``, less
  ``KEY_IGNORES``: variables that change per call and that no import reads). A caller with another environment gets
  a fork server of its own, started with that environment, so a module that reads a variable at import sees the
  value a fresh ``python -m`` would. It listens on a Unix socket
  ``$TMPDIR/opforge-forkserver-<uid>/<key>.sock`` (folder 0700); the first caller starts it (a file lock keeps
  callers from starting two) and waits for it (``START_TIMEOUT_S``). The server detaches from that caller (it is in
  nobody's process tree). One that failed to start (``REFUSED_S``) is not tried again for a while.
* **Never stale**: before each fork the server compares the size and modification time of every module file it
  has loaded with what it loaded; when one changed (an edited opforge source, an upgraded torch) it refuses the
  request, removes its socket and exits once its last child has; the caller starts a fresh one.
* **The child**: its own session (a process group killed as one, as ``start_new_session``), the caller's working
  folder, stdout and stderr on the caller's file descriptor, stdin on ``/dev/null``, the file descriptors
  ``pass_fds`` under the same numbers as in the caller (nothing else of the server's), ``sys.argv`` =
  ``[module, *argv]``, ``random`` reseeded; at the end the exit handlers run and the process exits with the
  function's exit status (``SystemExit``'s code; 1 and the traceback on stderr after another exception).
* **It dies with its caller**: the child is the server's child, not the caller's, so ``psutil``'s tree of the
  caller does not hold it. The server watches the caller (the socket's peer, ``SO_PEERCRED``) through a pidfd and
  kills the child's process group when the caller is gone; a child also dies with the server itself
  (``PR_SET_PDEATHSIG``).
* Only modules of the ``opforge`` package (``TARGET_PREFIXES``) may be a target; only the server's own user may
  connect.
* A fork server exits after ``IDLE_S`` (``OPFORGE_FORKSERVER_IDLE_S``) with no child and no request.
* Its imports must not initialise the CUDA driver (an initialised driver is unusable in a forked child; a loaded one
  is fine): one whose imports did refuses to serve and exits, and its callers start their children the usual way
  for ``REFUSED_S``.

``OPFORGE_FORKSERVER=0`` turns fork servers off (every child is a fresh ``python -m``). Linux only (``os.pidfd_open``,
``SCM_RIGHTS``); elsewhere ``spawn`` returns None.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ENV = "OPFORGE_FORKSERVER"
# seconds a fork server with no child waits for a request before it exits (OPFORGE_FORKSERVER_IDLE_S in its
# environment overrides it): a trainer's generation phase between two reward batches takes minutes
IDLE_S = 300.0
IDLE_ENV = "OPFORGE_FORKSERVER_IDLE_S"
# seconds a caller waits for a fork server it started to listen (its imports, on a loaded machine)
START_TIMEOUT_S = 180.0
# seconds after a fork server failed to start (its imports failed or initialised CUDA, or it did not listen within
# START_TIMEOUT_S) during which its callers start their children the usual way instead of trying again
REFUSED_S = 600.0
# environment variables left out of a fork server's key: they change from call to call and no import reads them
# (pytest sets PYTEST_CURRENT_TEST for each phase of each test); a child still gets its caller's value
KEY_IGNORES = frozenset({"PYTEST_CURRENT_TEST"})
# modules whose functions a fork server runs
TARGET_PREFIXES = ("opforge.",)
MAX_MESSAGE = 1 << 20
PR_SET_NAME, PR_SET_PDEATHSIG = 15, 1


def enabled() -> bool:
    """Whether ``spawn`` may use fork servers: Linux with pidfds, and ``OPFORGE_FORKSERVER`` not ``0``."""
    return (sys.platform == "linux" and hasattr(os, "pidfd_open") and hasattr(socket, "send_fds")
            and os.environ.get(ENV, "").strip() != "0")


def _key(preload: tuple[str, ...], env: dict[str, str]) -> str:
    blob = json.dumps([sys.executable, sorted(preload), sorted((k, v) for k, v in env.items() if k not in KEY_IGNORES)])
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def _folder() -> Path:
    base = Path(tempfile.gettempdir())
    if len(str(base)) > 60:  # a Unix socket's path is at most 107 bytes
        base = Path("/tmp")
    folder = base / f"opforge-forkserver-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    if folder.stat().st_uid != os.getuid() or folder.stat().st_mode & 0o077:
        raise PermissionError(f"fork server folder {folder} is not private to this user")
    return folder


class ForkedProcess:
    """A child of a fork server, as the caller sees it (the ``subprocess.Popen`` subset the engine uses).

    ``returncode``: None while it runs, then its exit status (negative: killed by that signal; -9 when the fork
    server went away before it could say)."""

    def __init__(self, pid: int, conn: socket.socket):
        self.pid, self._conn, self.returncode = pid, conn, None

    def _read(self, timeout_s: float | None) -> bool:
        import select

        if self.returncode is not None:
            return True
        poller = select.poll()  # not select(): a caller's descriptors may number above FD_SETSIZE
        poller.register(self._conn, select.POLLIN)
        if not poller.poll(None if timeout_s is None else max(0, int(timeout_s * 1000))):
            return False
        try:
            data = self._conn.recv(4096)
        except OSError:
            data = b""
        try:
            self.returncode = int(json.loads(data)["exit"]) if data else -signal.SIGKILL
        except (ValueError, KeyError, TypeError):
            self.returncode = -signal.SIGKILL
        self._conn.close()
        return True

    def poll(self) -> int | None:
        self._read(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """The exit status; raises ``subprocess.TimeoutExpired`` after ``timeout`` seconds."""
        if not self._read(timeout):
            raise subprocess.TimeoutExpired(f"forked child {self.pid}", timeout)
        return self.returncode

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self._conn.close()


def spawn(target: str, argv: list[str], *, preload: tuple[str, ...], cwd: str | Path, env: dict[str, str],
          stdout: int, pass_fds: tuple[int, ...] = (), name: str = "") -> ForkedProcess | None:
    """Start ``target`` (``module:function``) with ``sys.argv = [module, *argv]`` in a child of the fork server
    for ``preload`` and ``env`` (started if there is none; see the module docstring). ``stdout``: a file descriptor
    for the child's stdout and stderr; ``pass_fds``: descriptors the child gets under the same numbers; ``name``:
    its ``comm`` (15 bytes at most). Returns None when fork servers are off or cannot serve here; raises
    ``ValueError`` for a target outside ``TARGET_PREFIXES``."""
    module, _, func = target.partition(":")
    if not module.startswith(TARGET_PREFIXES) or not func:
        raise ValueError(f"fork server target {target!r}: must be 'module:function' in {TARGET_PREFIXES}")
    if not enabled():
        return None
    request = json.dumps({"target": target, "argv": [str(a) for a in argv], "cwd": str(cwd), "env": env,
                          "pass": list(pass_fds), "name": name}).encode()
    if len(request) > MAX_MESSAGE:
        return None
    try:
        folder = _folder()
    except OSError:
        return None
    key = _key(preload, env)
    sock_path = folder / f"{key}.sock"
    for _ in range(3):  # a server that exits (idle, stale) between our connect and its reply: start another
        conn = _connect(sock_path)
        if conn is None:
            try:
                conn = _start(folder, key, preload, env)
            except OSError:
                return None
            if conn is None:
                return None
        try:
            socket.send_fds(conn, [request], [stdout, *pass_fds])
            conn.settimeout(60.0)
            reply = conn.recv(4096)
            conn.settimeout(None)
            pid = int(json.loads(reply)["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            conn.close()
            continue
        return ForkedProcess(pid, conn)
    return None


def ensure(preload: tuple[str, ...], env: dict[str, str]) -> bool:
    """Start the fork server of ``preload`` and ``env`` unless one listens, and wait until it does (at most
    ``START_TIMEOUT_S``). Returns whether one listens (False where fork servers are off or it failed to start)."""
    if not enabled():
        return False
    try:
        conn = _start(_folder(), _key(preload, env), preload, env)
    except OSError:
        return False
    if conn is None:
        return False
    conn.close()
    return True


def prestart(preload: tuple[str, ...], env: dict[str, str]) -> None:
    """Start the fork server of ``preload`` and ``env`` in the background when none listens, so that its imports
    overlap the caller's other work; returns at once (a later ``spawn`` waits for it under the same lock). Does
    nothing where fork servers are off."""
    import threading

    if not enabled():
        return

    threading.Thread(target=ensure, args=(preload, env), name="opforge-forkserver-prestart", daemon=True).start()


def _connect(path: Path) -> socket.socket | None:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        conn.connect(str(path))
    except OSError:
        conn.close()
        return None
    return conn


def _start(folder: Path, key: str, preload: tuple[str, ...], env: dict[str, str]) -> socket.socket | None:
    """Connect to the fork server of ``key``, starting it first (under a file lock) if nobody has."""
    import fcntl

    sock_path, log, refused = folder / f"{key}.sock", folder / f"{key}.log", folder / f"{key}.refused"
    with open(folder / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        conn = _connect(sock_path)
        if conn is not None:
            return conn
        with contextlib.suppress(OSError):
            if time.time() - refused.stat().st_mtime < REFUSED_S:  # it failed lately: no second try yet
                return None
        with contextlib.suppress(FileNotFoundError):
            sock_path.unlink()
        # the server detaches (it forks and its first process exits), so it is in no caller's process tree: a
        # caller killed with its descendants (engine.oneshot.kill_tree) never takes it, nor with it every other
        # caller's children
        try:
            with open(log, "ab") as fh:
                subprocess.run([sys.executable, "-m", "opforge.engine.forkserver", str(sock_path), *preload],
                               stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT, cwd="/", env=env,
                               start_new_session=True, check=False, timeout=60)
        except subprocess.SubprocessError:  # its first process did not even detach
            refused.touch()
            return None
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            conn = _connect(sock_path)
            if conn is not None:
                return conn
            if refused.exists():
                return None
            time.sleep(0.05)
        refused.touch()
        return None


# -- the fork server -----------------------------------------------------------------------------------------
def _loaded_files() -> dict[str, tuple[int, int]]:
    out = {}
    for mod in list(sys.modules.values()):
        path = getattr(mod, "__file__", None)
        if path:
            with contextlib.suppress(OSError):
                st = os.stat(path)
                out[path] = (st.st_size, st.st_mtime_ns)
    return out


def _stale(files: dict[str, tuple[int, int]]) -> str | None:
    for path, seen in files.items():
        try:
            st = os.stat(path)
        except OSError:
            return path
        if (st.st_size, st.st_mtime_ns) != seen:
            return path
    return None


def _cuda_initialised() -> bool:
    """Whether the CUDA driver has been initialised in this process (torch's CUDA state, or ``cuInit`` called by
    anything): a loaded but uninitialised driver is fine to fork, an initialised one is unusable in the child.
    ``cuDeviceGetCount`` answers ``CUDA_ERROR_NOT_INITIALIZED`` (3) before ``cuInit``, and initialises nothing."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return True
    with open("/proc/self/maps") as fh:
        paths = {line.split()[-1] for line in fh if "libcuda.so" in line}
    if not paths:
        return False
    import ctypes

    count = ctypes.c_int(0)
    for path in paths:
        try:
            lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD)
        except OSError:
            return True
        if lib.cuDeviceGetCount(ctypes.byref(count)) != 3:
            return True
    return False


def _prctl(option: int, arg) -> None:
    import ctypes

    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(option, arg, 0, 0, 0)


def _child(req: dict[str, Any], fds: list[int], server_pid: int, ready: int) -> None:
    """In the forked child: become ``python -m target argv`` (see the module docstring); never returns."""
    code = 1
    try:
        os.setsid()
        os.close(ready)  # the server replies with this child's pid once it leads its own session
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != server_pid:
            os._exit(1)
        if req.get("name"):
            _prctl(PR_SET_NAME, str(req["name"]).encode()[:15])
        # the caller's descriptors above everything they will replace, then nothing else of the server's
        floor = max(1000, max(req["pass"], default=0) + 1)
        high = [_dup_above(fd, floor) for fd in fds]
        keep = set(high)
        for fd in _open_fds():
            if fd > 2 and fd not in keep:
                with contextlib.suppress(OSError):
                    os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.dup2(high[0], 1)
        os.dup2(high[0], 2)
        for fd, number in zip(high[1:], req["pass"], strict=True):
            os.dup2(fd, number)
        for fd in high:
            if fd not in req["pass"]:
                os.close(fd)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        import random

        random.seed()
        module, _, func = req["target"].partition(":")
        sys.argv = [module, *req["argv"]]
        import importlib

        try:
            getattr(importlib.import_module(module), func)()
            code = 0
        except SystemExit as exc:  # as the interpreter: None is 0, an int itself, anything else printed and 1
            code = 0 if exc.code is None else exc.code if isinstance(exc.code, int) else 1
            if code == 1 and not isinstance(exc.code, int):
                print(exc.code, file=sys.stderr)
        except BaseException:  # noqa: BLE001 - as the interpreter would: the traceback, then exit 1
            import traceback

            traceback.print_exc()
            code = 1
        import atexit

        with contextlib.suppress(BaseException):
            atexit._run_exitfuncs()
    finally:
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _kill(pid: int) -> None:
    """SIGKILL a child and its process group (the child may not have made its session yet)."""
    for kill in (os.killpg, os.kill):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            kill(pid, signal.SIGKILL)


def _dup_above(fd: int, floor: int) -> int:
    """A duplicate of ``fd`` numbered ``floor`` or above."""
    import fcntl

    return fcntl.fcntl(fd, fcntl.F_DUPFD, floor)


def _open_fds() -> list[int]:
    return [int(n) for n in os.listdir("/proc/self/fd")]


def serve(sock_path: str, preload: list[str]) -> int:
    """The fork server's loop (``python -m opforge.engine.forkserver SOCKET MODULE...``); see the module docstring."""
    import gc
    import importlib
    import selectors
    import struct
    import warnings

    if os.fork():  # detach: the starting caller returns at once, this server is reparented (see _start)
        os._exit(0)
    refused = Path(sock_path).with_suffix(".refused")  # as _start names it
    warnings.filterwarnings("ignore", message=r".*fork\(\) may lead to deadlocks.*", category=DeprecationWarning)
    try:
        for name in preload:
            importlib.import_module(name)
    except BaseException:
        refused.touch()
        raise
    if _cuda_initialised():
        print("opforge fork server: importing the preloaded modules initialised the CUDA driver; not serving",
              file=sys.stderr)
        refused.touch()
        return 1
    with contextlib.suppress(FileNotFoundError):
        refused.unlink()
    files = _loaded_files()
    gc.collect()
    gc.freeze()  # the children's collections leave the server's objects (and their shared pages) alone
    tmp = f"{sock_path}.{os.getpid()}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(tmp)
    listener.listen(64)
    os.rename(tmp, sock_path)  # callers see the socket only once it is listening
    inode = os.stat(sock_path).st_ino
    me = os.getpid()
    idle_s = float(os.environ.get(IDLE_ENV) or IDLE_S)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, ("listen", None))
    children: dict[int, dict[str, Any]] = {}  # pid -> conn, child pidfd, owner pidfd
    last = time.monotonic()
    closing = False

    def unlink() -> None:
        with contextlib.suppress(OSError):
            if os.stat(sock_path).st_ino == inode:  # never a later server's socket
                os.unlink(sock_path)

    def finish(pid: int) -> None:
        info = children.pop(pid)
        with contextlib.suppress(ChildProcessError):
            _, status = os.waitpid(pid, 0)
            with contextlib.suppress(OSError):
                info["conn"].send(json.dumps({"exit": os.waitstatus_to_exitcode(status)}).encode())
        for fd in (info["pidfd"], info["owner"]):
            if fd is not None:
                with contextlib.suppress(KeyError, ValueError):
                    sel.unregister(fd)
                os.close(fd)
        info["conn"].close()

    def fork(conn: socket.socket) -> None:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        peer, uid, _ = struct.unpack("3i", creds)
        conn.settimeout(5.0)  # a caller sends its request right after it connects
        try:
            msg, fds, _, _ = socket.recv_fds(conn, MAX_MESSAGE, 64)
        except OSError:
            conn.close()
            return
        conn.settimeout(None)
        try:
            if uid != os.getuid():
                raise ValueError("another user")
            req = json.loads(msg)
            module = str(req["target"]).partition(":")[0]
            if not module.startswith(TARGET_PREFIXES) or len(fds) != 1 + len(req["pass"]):
                raise ValueError("bad request")
        except (ValueError, KeyError, TypeError):
            conn.close()
            for fd in fds:
                os.close(fd)
            return
        sys.stdout.flush()
        sys.stderr.flush()
        wait_r, wait_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(wait_r)
            _child(req, fds, me, wait_w)
        os.close(wait_w)
        for fd in fds:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.read(wait_r, 1)  # end of file: the child has its session (or died)
        os.close(wait_r)
        pidfd = os.pidfd_open(pid)
        try:
            owner = os.pidfd_open(peer)
        except OSError:  # the caller is gone already
            owner = None
            _kill(pid)
        children[pid] = {"conn": conn, "pidfd": pidfd, "owner": owner}
        sel.register(pidfd, selectors.EVENT_READ, ("exit", pid))
        if owner is not None:
            sel.register(owner, selectors.EVENT_READ, ("owner", pid))
        try:
            conn.send(json.dumps({"pid": pid}).encode())
        except OSError:
            pass

    try:
        while True:
            events = sel.select(timeout=5.0)
            for key, _ in events:
                what, pid = key.data
                if what == "listen":
                    conn, _ = listener.accept()
                    last = time.monotonic()
                    if _stale(files) is not None:
                        # a module changed on disk: a fresh server serves the next callers; this one exits when its
                        # last child has
                        conn.close()
                        sel.unregister(listener)
                        unlink()
                        listener.close()
                        closing = True
                        continue
                    fork(conn)
                elif what == "owner" and pid in children:
                    _kill(pid)
                    sel.unregister(children[pid]["owner"])
                    os.close(children[pid]["owner"])
                    children[pid]["owner"] = None
                elif what == "exit" and pid in children:
                    finish(pid)
                    last = time.monotonic()
            if not children and (closing or time.monotonic() - last > idle_s):
                return 0
    finally:
        unlink()  # its children, if any are left, die with it (PR_SET_PDEATHSIG)


if __name__ == "__main__":
    sys.exit(serve(sys.argv[1], sys.argv[2:]))
