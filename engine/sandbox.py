"""The engine's reuse sandbox: a job (e.g. the filter chain) in a reusable child process with a hard timeout
and a memory guard.

The parent (a Dask worker thread, a test, a benchmark) never imports torch for this: the child is a plain
``python -m opforge.engine.sandbox_child`` process started with ``subprocess`` (Dask runs workers as
daemonic processes, which ``multiprocessing`` forbids from having children). Requests go over the child's
stdin, results come back over a dedicated pipe, so whatever a task prints cannot corrupt the protocol;
the child's stdout / stderr go to ``log_path`` (or nowhere).

Outcomes the child cannot report itself become verdicts here:

* ``timeout`` - no result within ``timeout_s``, not counting time the child reported waiting for a GPU
  lock (``engine.gpu_locks``, up to ``max_lock_wait_s``); the child's whole process group is killed;
  ``timeout:gpu_step`` when one GPU step holds a GPU lock longer than the settings' ``gpu_step_limit_s``
  (metrics ``gpu_step_s``, ``gpu_step_limit_s``), ``timeout:gpu_share`` when one forward call after the
  task's first has had more GPU time than ``gpu_share_limit_s`` (``gpu_share_s``, ``gpu_share_limit_s``;
  see ``GpuStepWatch``): a neighbour that wants to time waits for every such step;
* ``crash:<SIGNAL>`` or ``crash:exit<code>`` - the child died (``os.abort()``, a segfault in a kernel...);
* a result flagged ``cuda_broken`` (a task's kernel broke the child's CUDA context) keeps its verdict,
  and the child is replaced before the next task;
* ``oom`` - the child's resident memory (with its own children) grew by more than ``memory_gib`` over its
  size when it reported ready (checked every ``poll_s``); on CPU the child also caps its address space at
  the same margin, so most allocations fail *inside* the task and come back as an ``oom`` verdict from
  the filter itself, without losing the child.

A child is reused across tasks (importing torch takes seconds) and replaced after any of the above.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, BinaryIO

import psutil

_HEADER = struct.Struct("!Q")


def send_message(stream: BinaryIO, obj: Any) -> None:
    """Write one length-prefixed pickle to ``stream`` and flush it."""
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def read_exact(fd: int, n: int) -> bytes:
    """Read exactly ``n`` bytes from ``fd``. Raises EOFError when the writer is gone first."""
    chunks, need = [], n
    while need:
        chunk = os.read(fd, min(need, 1 << 20))
        if not chunk:
            raise EOFError("pipe closed")
        chunks.append(chunk)
        need -= len(chunk)
    return b"".join(chunks)


def read_message(fd: int) -> Any:
    """Read one length-prefixed pickle from ``fd`` (blocking). Raises EOFError on a closed pipe."""
    (n,) = _HEADER.unpack(read_exact(fd, _HEADER.size))
    return pickle.loads(read_exact(fd, n))


class SandboxError(RuntimeError):
    """The child could not be started (it died or did not report ready within ``start_timeout_s``)."""


class Sandbox:
    """One child process that runs a job on tasks, one at a time.

    Args:
        job: the job the child runs, by import path (``"package.module:Class"``, see
            ``engine.sandbox_child.SandboxJob``), e.g. ``filters.chain.CHAIN_JOB``.
        settings: the job's settings as a dict (an ``engine.settings.EngineSettings`` subclass dumped with
            ``model_dump()``), passed to the child.
        env: extra environment for the child (e.g. ``CUDA_VISIBLE_DEVICES``).
        log_path: file that receives the child's stdout and stderr (appended); None discards them.
        start_timeout_s: limit for importing torch and building the chain in a fresh child.
        poll_s: how often the parent checks the child's memory and liveness while it works.
        max_lock_wait_s: most seconds of GPU-lock waiting per task that do not count towards its timeout.

    Attributes:
        starts: how many children were started (1 + replacements).
        start_seconds: total seconds spent starting children.
    """

    def __init__(self, job: str, settings: dict[str, Any], env: dict[str, str] | None = None,
                 log_path: str | Path | None = None, start_timeout_s: float = 300.0, poll_s: float = 0.2,
                 max_lock_wait_s: float = 600.0):
        self.job = job
        self.settings = settings
        self.env = env or {}
        self.log_path = Path(log_path) if log_path else None
        self.start_timeout_s = start_timeout_s
        self.poll_s = poll_s
        self.max_lock_wait_s = max_lock_wait_s
        self.proc: subprocess.Popen | None = None
        self._rfd: int | None = None
        self.starts = 0
        self.start_seconds = 0.0
        self.child_info: dict[str, Any] = {}

    # a child that fails to start is tried again after these pauses (seconds): on a GPU shared by many
    # sandboxes a replacement child can find the memory momentarily full, so that its CUDA context does
    # not fit (one of 1,095 tasks was lost that way on two H200s with 14 sandboxes each)
    START_RETRY_S = (2.0, 5.0)

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> float:
        """Start a child if none is alive; return the seconds it took (0.0 when one was alive), pauses
        between tries included. Raises ``SandboxError`` when ``1 + len(START_RETRY_S)`` tries failed."""
        if self.proc is not None and self.proc.poll() is None:
            return 0.0
        t0 = time.perf_counter()
        try:
            for pause in (*self.START_RETRY_S, None):
                try:
                    self._start_child()
                    break
                except SandboxError as exc:
                    if pause is None:
                        raise SandboxError(f"{exc} ({1 + len(self.START_RETRY_S)} tries)") from None
                    time.sleep(pause)
        finally:
            seconds = time.perf_counter() - t0
            self.start_seconds += seconds
        return seconds

    def _start_child(self) -> None:
        self._reap()
        rfd, wfd = os.pipe()
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "opforge.engine.sandbox_child", str(wfd)],
                stdin=subprocess.PIPE, stdout=out, stderr=out, pass_fds=(wfd,),
                env={**os.environ, **self.env, "PYTHONUNBUFFERED": "1"}, start_new_session=True)
        finally:
            os.close(wfd)
            if out is not subprocess.DEVNULL:
                out.close()
        self._rfd = rfd
        self.child_info = {}  # no memory baseline until the new child reports ready
        send_message(self.proc.stdin, ("job", self.job, self.settings))
        msg = self._wait(self.start_timeout_s, watch_steps=False)
        if not (isinstance(msg, tuple) and msg[0] == "ready"):
            failure = msg if isinstance(msg, dict) else {"reason": str(msg)}
            self.close()
            raise SandboxError(f"sandbox child did not start: {failure}")
        self.child_info = msg[1]
        self.starts += 1

    def close(self) -> None:
        """Stop the child (its whole process group) and release the pipe."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                send_message(self.proc.stdin, ("stop",))
                self.proc.wait(timeout=2)
            except (OSError, subprocess.TimeoutExpired, ValueError):
                pass
        self._kill()
        self._reap()

    def __enter__(self) -> Sandbox:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- work ------------------------------------------------------------------------------------
    def run(self, task_id: str, code: str, timeout_s: float, alone: bool = False,
            reserve_gib: float | None = None) -> dict[str, Any]:
        """Verdict of the job on one task, as the job's dict plus ``start_s`` (seconds spent
        starting a child for this task) and, when the task held a GPU lock, ``gpu_step_max_s`` (seconds of
        its longest GPU step) and ``gpu_share_max_s`` (the largest GPU-time bound of one forward call, when
        one was watched). ``alone``: on a GPU, run it with no other task on that GPU;
        ``reserve_gib``: the GPU memory it reserves before it starts (default: the settings'
        ``gpu_admit_gib``); see ``sandbox_child._run_on_gpu``. Never raises for anything the task does."""
        start_s = self.start()
        try:
            send_message(self.proc.stdin, ("task", task_id, code, alone, reserve_gib))
        except (BrokenPipeError, OSError):
            result = self._failure("crash", "send")
        else:
            result = self._wait(timeout_s)
        if not isinstance(result, dict):  # a stray protocol message: treat as a crash of the child
            result = self._failure("crash:protocol", "")
        elif result.get("cuda_broken"):  # the child ends itself (its CUDA context is lost): replace it
            self._kill()
            self._reap()
        result["start_s"] = start_s
        return result

    def _wait(self, timeout_s: float, watch_steps: bool = True) -> Any:
        """Next non-progress message from the child, or a failure verdict (timeout / crash / oom).
        ``watch_steps`` False (the child's start: its warm-up) leaves GPU steps unlimited."""
        deadline = time.monotonic() + timeout_s
        paused_at: float | None = None  # the child is waiting for a GPU lock since then
        waited = 0.0  # lock-waiting seconds already credited or refused

        def credit(now: float) -> float:
            """Seconds of the current lock wait that do not count, within ``max_lock_wait_s`` in all."""
            return min(now - paused_at, max(0.0, self.max_lock_wait_s - waited)) if paused_at is not None else 0.0

        stage = ""
        limits = ((self.settings.get("gpu_step_limit_s") or 0.0, self.settings.get("gpu_share_limit_s") or 0.0)
                  if watch_steps else (0.0, 0.0))
        step = GpuStepWatch(*limits)
        margin = self.settings.get("memory_gib", 0) * 2**30
        # the guard is relative to the child's size at start; while it starts, only the timeout applies
        limit = self.child_info["rss"] + margin if margin and "rss" in self.child_info else 0
        while True:
            now = time.monotonic()
            left = deadline - now + credit(now)  # while the child waits for a lock, the clock stands
            if left <= 0:
                return self._failure("timeout", stage)
            over = step.over(now)
            if over is not None:
                which = "gpu_share" if "gpu_share_s" in over else "gpu_step"
                failure = self._failure(f"timeout:{which}", stage)
                failure["metrics"][stage or "sandbox"].update(over)
                return failure
            poll = min(self.poll_s, GpuStepWatch.POLL_S) if step.watching_share() else self.poll_s
            ready, _, _ = select.select([self._rfd], [], [], min(poll, left))
            if ready:
                try:
                    msg = read_message(self._rfd)
                except (EOFError, OSError, pickle.UnpicklingError):
                    return self._failure(self._death_reason(), stage)
                if isinstance(msg, tuple) and msg[0] == "stage":
                    stage = msg[1]
                    continue
                if isinstance(msg, tuple) and msg[0] == "gpu_hold":
                    if msg[1]:
                        step.start(msg[2] if len(msg) > 2 else {}, time.monotonic())
                    else:
                        step.stop(time.monotonic())
                    continue
                if isinstance(msg, tuple) and msg[0] == "lock_wait":
                    # time spent waiting for a neighbour on a shared GPU is not the task's: stop the clock,
                    # up to max_lock_wait_s in all
                    now = time.monotonic()
                    if msg[1]:
                        paused_at = now
                    elif paused_at is not None:
                        deadline += credit(now)
                        waited += now - paused_at
                        paused_at = None
                    continue
                if isinstance(msg, dict) and step.longest:
                    msg["gpu_step_max_s"] = round(step.longest, 4)
                    if step.share_max:
                        msg["gpu_share_max_s"] = round(step.share_max, 4)
                return msg
            if self.proc.poll() is not None:
                return self._failure(self._death_reason(), stage)
            if limit and self._rss() > limit:
                return self._failure("oom", stage)

    def _rss(self) -> int:
        try:
            p = psutil.Process(self.proc.pid)
            return sum(q.memory_info().rss for q in [p, *p.children(recursive=True)])
        except psutil.Error:
            return 0

    def _death_reason(self) -> str:
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return "crash:hung_after_eof"
        if code < 0:
            try:
                return f"crash:{signal.Signals(-code).name}"
            except ValueError:
                return f"crash:signal{-code}"
        return f"crash:exit{code}"

    def _failure(self, reason: str, stage: str) -> dict[str, Any]:
        self._kill()
        self._reap()
        return {"accepted": False, "reason": reason, "filter": stage or None,
                "metrics": {stage or "sandbox": {"error": reason}}, "seconds": {}}

    def _kill(self) -> None:
        """SIGKILL the child's process group (the child and e.g. compiler workers it started)."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            if self.proc.poll() is None:
                self.proc.kill()
        self.proc.wait()

    def _reap(self) -> None:
        if self._rfd is not None:
            os.close(self._rfd)
            self._rfd = None
        if self.proc is not None:
            if self.proc.stdin:
                try:
                    self.proc.stdin.close()
                except OSError:
                    pass
            self.proc = None


class GpuStepWatch:
    """The child's current GPU step as its parent sees it (``("gpu_hold", ...)`` messages), and the two
    limits on it: ``step_limit`` seconds of holding a GPU lock, and, for a shared "forward" step (a forward
    call of the task after its first, ``TaskRun.call``), ``share_limit`` seconds of GPU time. A task's first
    call ("first_forward") carries one-time costs (cuDNN plans for its shapes, kernels loaded on first use:
    an ``nn.LSTM`` or ``nn.MultiheadAttention`` task with a 35-42 ms forward had more than 0.2 s on its first
    call on an H200, measured 2026-11-22: benchmarks/results/h200/filter_throughput.json, call 2), so only
    the step limit applies to it.

    The GPU time of a forward step is bounded from below by ``sum(dt / holders)``: over each interval the
    GPU time-slices between the processes with work, all of which hold the lock shared
    (``gpu_locks.shared_holders``; the larger of the counts at the interval's two ends is used, and a
    holder running no kernels only leaves more to the others). A forward that had more GPU time than
    ``share_limit`` (default 2 x the window's upper edge, ``FilterSettings.gpu_share_limit_s``) alone
    takes longer than that, so it is certainly too slow, and it is ended as soon as the count shows it,
    before every neighbour that wants to time has queued behind it. The count is read every ``POLL_S``
    while such a step runs; where ``/proc/locks`` cannot be read, or does not show the child's own hold,
    only ``step_limit`` applies.

    Attributes:
        longest: seconds of the task's longest GPU step so far.
        share_max: the largest GPU-time bound of one forward step so far, seconds.
    """

    POLL_S = 0.05

    def __init__(self, step_limit: float, share_limit: float):
        self.step_limit, self.share_limit = step_limit, share_limit
        self.since: float | None = None
        self.info: dict = {}
        self.share = self.longest = self.share_max = 0.0
        self._at, self._holders = 0.0, 1

    def start(self, info: dict, now: float) -> None:
        self.since, self.info, self.share, self._at = now, info, 0.0, now
        if self.watching_share():
            self._holders = self._count()

    def stop(self, now: float) -> None:
        if self.since is not None:
            self._accrue(now)
            self.longest = max(self.longest, now - self.since)
        self.since = None

    def watching_share(self) -> bool:
        return bool(self.since is not None and self.share_limit and self.info.get("mode") == "shared"
                    and self.info.get("kind") == "forward" and self.info.get("path"))

    def _count(self) -> int:
        from opforge.engine.gpu_locks import shared_holders

        n = shared_holders(self.info["path"])
        if not n:
            # no /proc/locks, or it does not show the child's own hold (a file system whose locks it lists
            # under other device numbers): this step keeps only the step limit
            self.info = {**self.info, "path": None}
            return 1
        return n

    def _accrue(self, now: float) -> None:
        if not self.watching_share():
            return
        holders = self._count()
        self.share += (now - self._at) / max(holders, self._holders)
        self.share_max = max(self.share_max, self.share)
        self._at, self._holders = now, holders

    def over(self, now: float) -> dict | None:
        """Metrics of the limit the current step has passed (``gpu_step_s`` with ``gpu_step_limit_s``, or
        with ``gpu_share_s`` and ``gpu_share_limit_s``), or None."""
        if self.since is None:
            return None
        self._accrue(now)
        held = round(now - self.since, 3)
        if self.step_limit and now - self.since > self.step_limit:
            return {"gpu_step_s": held, "gpu_step_limit_s": self.step_limit}
        if self.watching_share() and self.share > self.share_limit:
            return {"gpu_step_s": held, "gpu_share_s": round(self.share, 3), "gpu_share_limit_s": self.share_limit}
        return None
