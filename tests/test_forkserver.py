"""Fork servers (engine/forkserver.py) and their use by engine/oneshot.py, on CPU, with tiny preloads (a fork
server of ``json`` starts in a fraction of a second; torch is never preloaded here).

Every test has an environment of its own (``OPFORGE_TEST_FS=<uuid>``), so fork servers of its own; they and their
children are killed at its end. The children run ``opforge.fs_selftest``: a module each test writes into a folder
of its own that it puts on the children's ``PYTHONPATH`` (``opforge`` is a namespace package, so that folder's
``opforge/`` joins it); nothing is written into the package.
"""

import contextlib
import fcntl
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest
from opforge.engine import forkserver
from opforge.engine.forkserver import ForkedProcess
from opforge.engine.oneshot import ServerProcess, run_child

pytestmark = pytest.mark.skipif(sys.platform != "linux" or not hasattr(os, "pidfd_open"),
                                reason="fork servers are Linux only (pidfds)")

TARGET = "opforge.fs_selftest:main"
PRELOAD = ("json",)
NAME = "fs-selftest"

# the children's module: ``python -m opforge.fs_selftest ARGS`` or a fork server's child calling ``main()``
HELPER = '''"""A fork server's test child (tests/test_forkserver.py)."""
import json
import os
import sys
import time

VERSION = 1


def _open_fds():
    listed = [int(n) for n in os.listdir("/proc/self/fd")]  # includes the listing's own descriptor, closed now
    out = []
    for fd in listed:
        try:
            os.fstat(fd)
        except OSError:
            continue
        out.append(fd)
    return sorted(out)


def _serve(fd):
    """ServerProcess's child (ROLE FD): answer each message until the connection closes."""
    from multiprocessing.connection import Connection

    from opforge.engine.protocol import ProtocolError, recv, send

    conn = Connection(fd)
    while True:
        try:
            msg, _ = recv(conn)
        except ProtocolError:
            return
        send(conn, {"ok": True, "echo": msg.get("value"), "role": sys.argv[1], "cwd": os.getcwd(),
                    "marker": os.environ.get("OPFORGE_TEST_FS"), "safepath": os.environ.get("PYTHONSAFEPATH"),
                    "stdin": os.readlink("/proc/self/fd/0"), "version": VERSION})


def main():
    """ARGS: "fd=N" writes a line to descriptor N; the last one says how to end: "exit=N", "raise" or "sleep"."""
    args = sys.argv[1:]
    if args and args[0] == "serve":
        return _serve(int(args[1]))
    for arg in args:
        if arg.startswith("fd="):
            os.write(int(arg[3:]), f"to fd {arg[3:]}\\n".encode())
    report = {"argv": sys.argv, "cwd": os.getcwd(), "marker": os.environ.get("OPFORGE_TEST_FS"),
              "stdin": os.readlink("/proc/self/fd/0"), "fds": _open_fds(), "version": VERSION}
    print(json.dumps(report), flush=True)
    print("selftest on stderr", file=sys.stderr, flush=True)
    action = args[-1] if args else "exit=0"
    if action == "sleep":
        time.sleep(600)
    if action == "raise":
        raise RuntimeError("selftest raised")
    sys.exit(int(action.partition("=")[2]))


if __name__ == "__main__":
    main()
'''

# a caller of its own: spawns ARGS with ENV and PRELOAD (JSON), prints the child's pid, then waits or sleeps
CALLER = """
import json, os, sys, time
from opforge.engine import forkserver
env, preload, args, log, then = json.loads(sys.argv[1])
out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
proc = forkserver.spawn("opforge.fs_selftest:main", args, preload=tuple(preload), cwd="/", env=env, stdout=out)
print(proc.pid, flush=True)
if then == "sleep":
    time.sleep(600)
sys.exit(proc.wait(60))
"""


@pytest.fixture
def fs_env(tmp_path, monkeypatch):
    """An environment of this test's own (fork servers on, the helper module on ``PYTHONPATH``); at the end its
    fork servers and their children are killed and their files removed."""
    monkeypatch.delenv(forkserver.ENV, raising=False)
    if not forkserver.enabled():
        pytest.skip("fork servers cannot serve on this machine")
    folder = tmp_path / "pythonpath"
    (folder / "opforge").mkdir(parents=True)
    (folder / "opforge" / "fs_selftest.py").write_text(HELPER)
    marker = uuid.uuid4().hex
    paths = [str(folder), *filter(None, [os.environ.get("PYTHONPATH")])]
    yield {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "OPFORGE_TEST_FS": marker}
    _kill_marked(marker)


def _kill_marked(marker: str) -> None:
    for proc in psutil.process_iter():
        try:
            if proc.pid == os.getpid() or proc.environ().get("OPFORGE_TEST_FS") != marker:
                continue
            cmdline = proc.cmdline()
            proc.kill()
        except psutil.Error:
            continue
        if "opforge.engine.forkserver" in cmdline:
            sock = Path(cmdline[cmdline.index("opforge.engine.forkserver") + 1])
            for path in (sock, sock.with_suffix(".lock"), sock.with_suffix(".log")):
                path.unlink(missing_ok=True)


def _spawn(env, args, out, preload=PRELOAD, cwd="/", pass_fds=()) -> ForkedProcess:
    proc = forkserver.spawn(TARGET, args, preload=preload, cwd=cwd, env=env, stdout=out.fileno(),
                            pass_fds=pass_fds, name=NAME)
    assert isinstance(proc, ForkedProcess)
    return proc


def _until(predicate, timeout_s: float = 30.0) -> bool:
    """Poll ``predicate`` until it holds (True) or ``timeout_s`` passed (False); generous, never a timing check."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def _report(log: Path) -> dict:
    """The helper's report (its first line in ``log``), waiting for it."""
    assert _until(lambda: log.exists() and log.read_text().endswith("\n")), log
    return json.loads(log.read_text().splitlines()[0])


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _server_of(pid: int) -> psutil.Process:
    """The fork server whose child ``pid`` is (its parent, a ``python -m opforge.engine.forkserver``)."""
    server = psutil.Process(pid).parent()
    assert "opforge.engine.forkserver" in server.cmdline()
    return server


def _sock_of(server: psutil.Process) -> str:
    """A fork server's socket (``python -m opforge.engine.forkserver SOCKET MODULE...``)."""
    cmdline = server.cmdline()
    return cmdline[cmdline.index("opforge.engine.forkserver") + 1]


def _high_fd(fd: int, at_least: int) -> int:
    high = fcntl.fcntl(fd, fcntl.F_DUPFD, at_least)
    os.close(fd)
    return high


def test_child_gets_argv_cwd_env_stdio_and_passed_descriptors(fs_env, tmp_path):
    """The child is ``python -m opforge.fs_selftest ARGS`` as its caller would start it: sys.argv = [module,
    *argv], the caller's working folder and environment, stdout and stderr on the caller's descriptor, stdin on
    /dev/null, the passed descriptors under the caller's numbers (each its own file) and nothing else open."""
    work = tmp_path / "work"
    work.mkdir()
    read1, write1 = os.pipe()
    read2, write2 = os.pipe()
    write1, write2 = _high_fd(write1, 50), _high_fd(write2, 70)
    args = ["alpha", "two words", f"fd={write1}", f"fd={write2}", "exit=0"]
    log = tmp_path / "child.log"
    with open(log, "wb") as out:
        proc = _spawn(fs_env, args, out, cwd=work, pass_fds=(write2, write1))
        assert proc.wait(60) == 0 and proc.returncode == 0 and proc.poll() == 0
    os.close(write1)
    os.close(write2)
    assert os.read(read1, 100) == f"to fd {write1}\n".encode()
    assert os.read(read2, 100) == f"to fd {write2}\n".encode()
    os.close(read1)
    os.close(read2)
    report = _report(log)
    assert report["argv"] == ["opforge.fs_selftest", *args]
    assert report["cwd"] == str(work)
    assert report["marker"] == fs_env["OPFORGE_TEST_FS"]
    assert report["stdin"] == "/dev/null"
    assert report["fds"] == sorted([0, 1, 2, write1, write2])
    assert "selftest on stderr" in log.read_text()


def test_wait_reports_exit_codes_exceptions_and_signals_as_popen_does(fs_env, tmp_path):
    """``wait()``: the function's ``SystemExit`` code (0, 3), 1 and the traceback for another exception, and
    minus the signal for a child killed through its process group (``os.killpg``, as ``ServerProcess.close``)."""
    log = tmp_path / "child.log"
    with open(log, "wb") as out:
        assert _spawn(fs_env, ["exit=0"], out).wait(60) == 0
        assert _spawn(fs_env, ["exit=3"], out).wait(60) == 3
        raised = _spawn(fs_env, ["raise"], out)
        assert raised.wait(60) == 1
        assert "RuntimeError: selftest raised" in log.read_text()
    sleeper_log = tmp_path / "sleeper.log"
    with open(sleeper_log, "wb") as out:
        sleeper = _spawn(fs_env, ["sleep"], out)
    _report(sleeper_log)  # it runs the function: its session is made
    assert sleeper.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        sleeper.wait(0.1)
    os.killpg(sleeper.pid, signal.SIGKILL)
    assert sleeper.wait(60) == -signal.SIGKILL
    assert sleeper.poll() == -signal.SIGKILL


def test_child_has_its_name_its_own_session_and_is_outside_the_callers_tree(fs_env, tmp_path):
    """With a fork server another process started, a child is the server's: its ``comm`` is the given name, it
    leads its own session and process group, and it is no descendant of its caller (psutil's tree of the test)."""
    log = tmp_path / "child.log"
    started = subprocess.run([sys.executable, "-c", CALLER, json.dumps([fs_env, PRELOAD, ["exit=0"], str(log),
                                                                        "wait"])], env=fs_env, timeout=120)
    assert started.returncode == 0
    sleeper_log = tmp_path / "sleeper.log"
    with open(sleeper_log, "wb") as out:
        proc = _spawn(fs_env, ["sleep"], out)
    _report(sleeper_log)
    assert psutil.Process(proc.pid).name() == NAME
    assert os.getsid(proc.pid) == proc.pid and os.getpgid(proc.pid) == proc.pid
    assert _server_of(proc.pid).pid not in {p.pid for p in psutil.Process().children(recursive=True)}
    assert proc.pid not in {p.pid for p in psutil.Process().children(recursive=True)}
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait(60) == -signal.SIGKILL


def test_first_caller_does_not_hold_the_fork_server_in_its_tree(fs_env, tmp_path):
    """The caller that starts a fork server does not hold it (nor the children it forks) in its process tree:
    ``engine.oneshot.kill_tree`` of that caller must not kill a server other callers' children depend on."""
    with open(tmp_path / "child.log", "wb") as out:
        proc = _spawn(fs_env, ["sleep"], out)
    try:
        tree = {p.pid for p in psutil.Process().children(recursive=True)}
        assert _server_of(proc.pid).pid not in tree
        assert proc.pid not in tree
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(60)


def test_child_leads_its_session_as_soon_as_spawn_returns(fs_env, tmp_path):
    """As with ``subprocess.Popen(start_new_session=True)``, the child's process group exists when ``spawn``
    returns: ``os.killpg(pid, SIGKILL)`` right away kills it (``ServerProcess.close`` does just that)."""
    missed = []
    with open(tmp_path / "child.log", "wb") as out:
        for _ in range(5):
            proc = _spawn(fs_env, ["sleep"], out)
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                missed.append(proc.pid)
                os.kill(proc.pid, signal.SIGKILL)
            assert proc.wait(60) == -signal.SIGKILL
    assert missed == []


def test_wait_works_in_a_caller_with_many_open_descriptors(fs_env, tmp_path):
    """A caller with more than 1024 descriptors open (a busy engine process) can ``poll`` and ``wait`` for its
    child: the connection's descriptor number is no limit."""
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < 1200:
        pytest.skip("the descriptor limit is below 1200")
    filler = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        with open(tmp_path / "child.log", "wb") as out:
            proc = _spawn(fs_env, ["exit=0"], out)
        assert proc._conn.fileno() >= 1024
        assert proc.wait(60) == 0
    finally:
        for fd in filler:
            os.close(fd)


def test_passed_descriptors_numbered_above_1000_keep_their_files(fs_env, tmp_path):
    """Passed descriptors keep their files whatever their numbers: a caller's descriptors 1002 and 1001 are,
    in the child, 1002 and 1001 of the same pipes."""
    numbers = (1002, 1001)
    for number in numbers:
        with pytest.raises(OSError):
            os.fstat(number)  # free in this process
    pipes = [os.pipe() for _ in numbers]
    for (_, write), number in zip(pipes, numbers, strict=True):
        os.dup2(write, number)
        os.close(write)
    try:
        with open(tmp_path / "child.log", "wb") as out:
            proc = _spawn(fs_env, [*(f"fd={n}" for n in numbers), "exit=0"], out, pass_fds=numbers)
            assert proc.wait(60) == 0
    finally:
        for number in numbers:
            os.close(number)
    got = []
    for read, _ in pipes:
        with os.fdopen(read, "rb") as fh:
            got.append(fh.read())
    assert got == [f"to fd {n}\n".encode() for n in numbers]


def test_same_preload_and_env_share_a_fork_server_and_another_env_gets_its_own(fs_env, tmp_path):
    """Two spawns with the same preload and environment are forked by one fork server (one process on that
    key's socket), also when only a variable of ``KEY_IGNORES`` differs (pytest's per-test one); a spawn with
    another environment starts a second server on a socket of its own."""
    other_env = {**fs_env, "OPFORGE_TEST_FS_OTHER": "1"}
    procs = []
    with open(tmp_path / "child.log", "wb") as out:
        procs.append(_spawn({**fs_env, "PYTEST_CURRENT_TEST": "test_a (call)"}, ["sleep"], out))
        procs.append(_spawn({**fs_env, "PYTEST_CURRENT_TEST": "test_b (setup)"}, ["sleep"], out))
        procs.append(_spawn(other_env, ["sleep"], out))
    first, second, other = (_server_of(p.pid) for p in procs)
    assert first.pid == second.pid and other.pid != first.pid
    sock, other_sock = _sock_of(first), _sock_of(other)
    assert sock != other_sock
    assert Path(sock).is_socket() and Path(other_sock).is_socket()
    # a fork server's children show its command line too: the servers are those whose parent does not
    on_sock = {p.pid: p.ppid() for p in psutil.process_iter() if _cmdline_has(p, sock)}
    assert [pid for pid, parent in on_sock.items() if parent not in on_sock] == [first.pid]
    assert sorted(pid for pid, parent in on_sock.items() if parent == first.pid) == sorted(p.pid for p in procs[:2])
    for proc in procs:
        os.killpg(proc.pid, signal.SIGKILL)
        assert proc.wait(60) == -signal.SIGKILL


def _cmdline_has(proc: psutil.Process, text: str) -> bool:
    try:
        return text in proc.cmdline()
    except psutil.Error:
        return False


def test_child_dies_with_its_caller(fs_env, tmp_path):
    """A caller killed with SIGKILL takes its child with it (the fork server watches the caller), while the fork
    server itself stays to serve other callers."""
    log = tmp_path / "child.log"
    with open(log, "wb") as out:  # the server is the test's, not the caller's: the caller's death is all it sees
        assert _spawn(fs_env, ["exit=0"], out).wait(60) == 0
    caller = subprocess.Popen([sys.executable, "-c", CALLER, json.dumps([fs_env, PRELOAD, ["sleep"], str(log),
                                                                         "sleep"])],
                              env=fs_env, stdout=subprocess.PIPE)
    try:
        child = int(caller.stdout.readline())
        server = _server_of(child)
        assert _until(lambda: log.read_text().count("selftest on stderr") == 2)  # it runs the function
        assert not _gone(child)
        caller.kill()
        caller.wait(60)
        assert _until(lambda: _gone(child)), "the child outlived its caller"
        assert not _gone(server.pid)
    finally:
        caller.kill()
        caller.wait(60)
        caller.stdout.close()


def test_an_edited_module_gets_a_fresh_fork_server_and_the_old_one_exits_after_its_children(fs_env, tmp_path):
    """Never stale: once a module the fork server loaded changes on disk, the next spawn is forked by a new fork
    server that runs the new code; the old one serves no more and exits when its last child has."""
    preload = ("opforge.fs_selftest",)
    old_log, new_log = tmp_path / "old.log", tmp_path / "new.log"
    with open(old_log, "wb") as out:
        old = _spawn(fs_env, ["sleep"], out, preload=preload)
    assert _report(old_log)["version"] == 1
    old_server = _server_of(old.pid)
    helper = Path(fs_env["PYTHONPATH"].split(os.pathsep)[0]) / "opforge" / "fs_selftest.py"
    helper.write_text(HELPER.replace("VERSION = 1", "VERSION = 22"))  # another size
    with open(new_log, "wb") as out:
        new = _spawn(fs_env, ["sleep"], out, preload=preload)
    assert _report(new_log)["version"] == 22
    new_server = _server_of(new.pid)
    assert new_server.pid != old_server.pid
    assert _sock_of(new_server) == _sock_of(old_server)  # the same key's socket, now the new server's
    assert not _gone(old_server.pid)  # its child still runs
    with open(tmp_path / "again.log", "wb") as out:
        again = _spawn(fs_env, ["exit=0"], out, preload=preload)
        assert _server_of(again.pid).pid == new_server.pid
        assert again.wait(60) == 0
    os.killpg(old.pid, signal.SIGKILL)
    assert old.wait(60) == -signal.SIGKILL
    assert _until(lambda: _gone(old_server.pid)), "the stale fork server outlived its last child"
    assert not _gone(new_server.pid)
    os.killpg(new.pid, signal.SIGKILL)
    assert new.wait(60) == -signal.SIGKILL


def test_spawn_refuses_other_targets_and_steps_aside_when_turned_off(fs_env, tmp_path, monkeypatch):
    """``spawn`` raises ValueError for a target outside ``opforge.`` (or with no function); the server itself
    refuses such a request sent to its socket directly (no child); ``OPFORGE_FORKSERVER=0`` makes ``spawn``
    return None (the caller starts ``python -m``)."""
    with open(tmp_path / "child.log", "wb") as out:
        for target in ("json:dumps", "opforge_evil.x:main", "opforge.fs_selftest", "opforge.fs_selftest:"):
            with pytest.raises(ValueError):
                forkserver.spawn(target, [], preload=PRELOAD, cwd="/", env=fs_env, stdout=out.fileno())
        proc = _spawn(fs_env, ["exit=0"], out)
        server = _server_of(proc.pid)
        assert proc.wait(60) == 0
        sock = _sock_of(server)
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        conn.connect(sock)
        request = {"target": "json:dumps", "argv": [], "cwd": "/", "env": fs_env, "pass": [], "name": ""}
        socket.send_fds(conn, [json.dumps(request).encode()], [out.fileno()])
        conn.settimeout(60)
        assert conn.recv(4096) == b""  # closed, no pid
        conn.close()
        assert server.children() == []
        monkeypatch.setenv(forkserver.ENV, "0")
        assert forkserver.spawn(TARGET, ["exit=0"], preload=PRELOAD, cwd="/", env=fs_env,
                                stdout=out.fileno()) is None


def _serve_once(fs_env, tmp_path, tag: str) -> tuple[type, dict, int]:
    work = tmp_path / f"server-{tag}"
    with ServerProcess("opforge.fs_selftest", "serve", work, tmp_path / f"{tag}.log", env=fs_env,
                       preload=("opforge.engine.protocol",)) as server:
        reply, _ = server.request({"op": "echo", "value": 7}, 60)
        kind = type(server.proc)
    return kind, reply, server.proc.returncode


def test_server_process_with_preload_is_forked_and_falls_back_to_python_m(fs_env, tmp_path, monkeypatch):
    """``ServerProcess(..., preload=...)`` runs its server in a fork server's child, and a fresh ``python -m``
    with fork servers off; both answer alike (working folder, environment, PYTHONSAFEPATH, stdin) and are
    killed as a process group on ``close``."""
    forked_kind, forked, forked_code = _serve_once(fs_env, tmp_path, "forked")
    monkeypatch.setenv(forkserver.ENV, "0")
    plain_kind, plain, plain_code = _serve_once(fs_env, tmp_path, "plain")
    assert forked_kind is ForkedProcess and plain_kind is subprocess.Popen
    assert forked["echo"] == 7 and forked["role"] == "serve" and forked["safepath"] == "1"
    assert forked["cwd"] == str(tmp_path / "server-forked") and plain["cwd"] == str(tmp_path / "server-plain")
    assert {**forked, "cwd": None} == {**plain, "cwd": None}
    assert forked_code == plain_code == -signal.SIGKILL


def test_run_child_with_preload_is_forked_and_falls_back_to_python_m(fs_env, tmp_path, monkeypatch):
    """``run_child(..., preload=...)`` runs ``opforge.harness.child``'s ``main`` (STEP REQUEST RESULT) in a fork
    server's child, and a fresh ``python -m`` with fork servers off; the result is the same."""
    spawned = []
    spawn = forkserver.spawn

    def spy(*args, **kwargs):
        spawned.append(spawn(*args, **kwargs))
        return spawned[-1]

    monkeypatch.setattr(forkserver, "spawn", spy)
    env = {"OPFORGE_TEST_FS": fs_env["OPFORGE_TEST_FS"]}
    forked, _ = run_child("opforge.harness.child", "nostep", {"x": 1}, tmp_path / "forked", 60, env=env,
                          preload=PRELOAD)
    monkeypatch.setenv(forkserver.ENV, "0")
    plain, _ = run_child("opforge.harness.child", "nostep", {"x": 1}, tmp_path / "plain", 60, env=env,
                         preload=PRELOAD)
    assert len(spawned) == 2 and isinstance(spawned[0], ForkedProcess) and spawned[1] is None
    assert forked.pop("log") != plain.pop("log")
    assert forked == plain == {"ok": False, "error": "ValueError: unknown step 'nostep' (only 'build')"}


def test_prestart_starts_the_server_that_a_later_spawn_uses(fs_env, tmp_path):
    """``prestart`` returns at once and starts, in the background, the fork server of that preload and environment;
    the next ``spawn`` with them is forked by that server (not by one of its own)."""
    sock = forkserver._folder() / f"{forkserver._key(PRELOAD, fs_env)}.sock"
    assert not sock.exists()
    forkserver.prestart(PRELOAD, fs_env)
    assert _until(sock.exists), "prestart started no fork server"
    servers = [p for p in psutil.process_iter() if _cmd(p)[:1] and str(sock) in _cmd(p)]
    assert len(servers) == 1
    with open(tmp_path / "child.log", "wb") as out:
        proc = _spawn(fs_env, ["exit=0"], out)
        assert _server_of(proc.pid).pid == servers[0].pid
        assert proc.wait(60) == 0


def _cmd(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []


def test_a_fork_server_that_cannot_start_is_not_tried_again_and_its_callers_fall_back(fs_env, tmp_path):
    """A fork server whose preload fails to import leaves a ``.refused`` mark: ``spawn`` returns None (the caller
    starts its child with ``python -m``), and for ``REFUSED_S`` later calls do not start another server."""
    preload = ("opforge_fs_test_no_such_module",)
    key = forkserver._key(preload, fs_env)
    folder = forkserver._folder()
    log, refused = folder / f"{key}.log", folder / f"{key}.refused"
    try:
        with open(tmp_path / "child.log", "wb") as out:
            first = forkserver.spawn(TARGET, ["exit=0"], preload=preload, cwd="/", env=fs_env, stdout=out.fileno())
            assert first is None and refused.exists()
            starts = log.read_text().count("ModuleNotFoundError")
            assert starts == 1
            again = forkserver.spawn(TARGET, ["exit=0"], preload=preload, cwd="/", env=fs_env, stdout=out.fileno())
            assert again is None
            assert log.read_text().count("ModuleNotFoundError") == starts  # no second server was started
        server = ServerProcess("opforge.fs_selftest", "serve", tmp_path / "server", tmp_path / "server.log",
                               env=fs_env, preload=preload)
        with server:
            assert isinstance(server.proc, subprocess.Popen)
            assert server.request({"value": 3}, 60)[0]["echo"] == 3
    finally:
        for path in (log, refused, folder / f"{key}.lock", folder / f"{key}.sock"):
            path.unlink(missing_ok=True)
