"""Warm model servers of a long-lived grader process (``harness.grader_child serve``): what one evaluation leaves
for the next, so an evaluation does not pay for starting Python, torch and CUDA, building the task's model and
compiling it with ``torch.compile`` every time.

* **Reference servers**, per setup: after an evaluation whose reference did nothing wrong, its server is kept,
  keyed by everything its setup depends on except the seed (``reference_key``: the task's code and id, its hidden
  shape variants, the device, threads, TF32, input sets, burst settings and GPU admission). Kept, it is *idle*: its
  slots and every CUDA graph captured on them released, its allocator cache emptied, and its GPU memory
  reservation (``harness.gpu_memory``) shrunk to what it still holds (its model, its compiled graph, its CUDA
  context). The next evaluation with the same key first admits the evaluation's whole reservation again (waiting
  as a fresh server's admission does), then sends a new ``setup`` with a fresh secret seed: the server draws the
  weights again in place (``harness.reference_process.reseed``; the same values as a fresh server given that seed)
  and keeps its model and its compiled graph. A reference that failed, timed out or ran out of memory is never
  kept; nor is one whose idle reservation is above ``MAX_IDLE_GIB``, whose evaluation reserved more than
  ``MAX_SHARE`` of the GPU's budget (there the idle reservations would cost the evaluations their turn), that
  dropped a hidden shape variant, or that goes idle while another evaluation waits for GPU memory; an ``alone``
  evaluation closes the kept ones first. At most ``MAX_REFERENCES`` are kept, least recently used first out. A kept
  server is woken (``SIGCONT``) when taken: another process of the same user may have stopped it.
* **A spare candidate server**: a fresh ``harness.server candidate`` process started after an evaluation ends
  (``prestart_candidate``, under the device's timing lock held shared until it answers a ``ping``), so the next
  evaluation's candidate has already imported torch (it makes no CUDA context before its setup: an idle spare
  holds no GPU memory). It has never seen
  candidate code; each evaluation's candidate still runs in a process of its own, killed when the evaluation
  ends, and the next spare is a new process.

The candidate never reaches a warm reference: the reference only maps the grader's reference slots, and the
grader sends the candidate only the reference's weights and its own slots, as with fresh servers. What an evaluation
measures is unchanged: both servers are the same code, stopped between their calls the same way; the reference's
``torch.compile`` graph was compiled by the same server on the same task.

Each kept server lives in a folder of its own (its working directory and log) under this object's folder,
removed with the server.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import tempfile
from collections import OrderedDict
from pathlib import Path
from typing import Any

from opforge.engine.oneshot import ServerProcess
from opforge.engine.tempdirs import make as make_tmp
from opforge.engine.tempdirs import remove as remove_tmp
from opforge.harness.grader import SERVER_ENV, SERVER_MODULE, SERVER_PRELOAD

# reference servers kept per grader process: a trainer's batch has several completions per task (GRPO's group), so
# the next evaluation on a grader is often the same task; a few cover interleaved tasks
MAX_REFERENCES = 2
# GiB of idle GPU memory reservation (harness.gpu_memory) above which a reference is not kept: with 16 grader
# processes on one GPU, idle references hold at most 16 x MAX_REFERENCES x MAX_IDLE_GIB = 32 GiB of a 141 GiB
# H200's 127 GiB budget (gpu_memory_fraction 0.9); in practice a CUDA context and the model, about 0.6 GiB
MAX_IDLE_GIB = 1.0
# the largest share of the GPU's memory budget an evaluation may reserve for its reference to be kept. Idle
# references' reservations, however small, cost the evaluations of a large task their turn: an evaluation reserving
# 59 GiB (three 1.5 GiB tensors per input / output set) fits twice in an H200's 127 GiB budget, but only once
# next to 16 idle references of 0.6 GiB each, and on one H200 a batch of 64 such evaluations took longer with
# references kept than without (150 s, cut off, against 119 s; measured 2026-11-29). Below this share the
# re-admission costs at most a small part of the budget's turns, and the evaluation saves its reference's start
# and torch.compile.
MAX_SHARE = 0.125
# seconds a spare candidate server may take to start (import torch and the server's modules)
SPARE_READY_S = 120.0


def reference_key(setup: dict[str, Any]) -> str:
    """The key of a reference server's setup message (``harness.reference_process.SETUP_KEYS``, the seed left
    out): SHA-256 of those fields as canonical JSON."""
    from opforge.harness.reference_process import SETUP_KEYS

    return hashlib.sha256(json.dumps({k: setup.get(k) for k in SETUP_KEYS}, sort_keys=True,
                                     default=str).encode()).hexdigest()


class WarmServers:
    """The warm reference servers and the spare candidate server of one grader process (see the module
    docstring). Not thread-safe: one evaluation at a time.

    Attributes:
        reused: evaluations that got a kept reference server.
    """

    def __init__(self, max_references: int = MAX_REFERENCES, max_idle_gib: float = MAX_IDLE_GIB):
        self.max_references, self.max_idle_gib = max_references, max_idle_gib
        self.root: Path | None = None
        self.references: OrderedDict[str, ServerProcess] = OrderedDict()
        self.spare: ServerProcess | None = None
        self.reused = 0
        self.refused = ""  # why the last reference offered was not kept

    def _folder(self, prefix: str) -> Path:
        """A fresh folder ``<prefix><random>`` under this object's folder (made on first use)."""
        if self.root is None:
            self.root = make_tmp("opforge-warm-")
        return Path(tempfile.mkdtemp(prefix=prefix, dir=self.root))

    def new_server(self, role: str) -> ServerProcess:
        """Start a ``role`` server (``reference`` trusted) in a fresh folder of its own."""
        folder = self._folder(f"{role}-")
        return ServerProcess(SERVER_MODULE, role, folder, folder / f"{role}.log", env=SERVER_ENV,
                             trusted=role == "reference", preload=SERVER_PRELOAD)

    def take_reference(self, key: str) -> ServerProcess | None:
        """The kept reference server of ``key`` (removed from the pool), or None when there is none alive."""
        server = self.references.pop(key, None)
        if server is None:
            return None
        if server.proc.poll() is not None:
            self.discard(server)
            return None
        server.resume()  # a process of the same user may have stopped it while it was idle
        self.reused += 1
        return server

    def keep_reference(self, key: str, server: ServerProcess, idle: dict[str, Any]) -> None:
        """Keep ``server`` (alive and idle: its slots released) for the next evaluation of ``key``, given its reply
        to ``idle`` (``gib``: its idle reservation; on CUDA ``full_gib``: the evaluation's, and ``capacity_gib``: the
        budget's; ``waiting``: evaluations waiting for GPU memory), unless ``gib`` is above ``max_idle_gib``,
        ``full_gib`` above ``MAX_SHARE`` of the budget, or an evaluation waits; the least recently used reference
        beyond ``max_references`` is closed."""
        gib, full = float(idle.get("gib") or 0.0), float(idle.get("full_gib") or 0.0)
        capacity, waiting = float(idle.get("capacity_gib") or 0.0), int(idle.get("waiting") or 0)
        large = capacity > 0 and full > MAX_SHARE * capacity
        if server.proc.poll() is not None or gib > self.max_idle_gib or large or waiting or self.max_references < 1:
            self.refused = (f"last not kept: exited {server.proc.poll() is not None}, {gib:.2f} GiB idle, "
                            f"{full:.2f} of {capacity:.2f} GiB while it ran, {waiting} waiting for memory")
            self.discard(server)
            return
        old = self.references.pop(key, None)
        if old is not None:
            self.discard(old)
        self.references[key] = server
        while len(self.references) > self.max_references:
            self.discard(self.references.popitem(last=False)[1])

    def take_candidate(self) -> ServerProcess:
        """The spare candidate server (started by ``prestart_candidate``), or a new one."""
        server, self.spare = self.spare, None
        if server is None or server.proc.poll() is not None:
            if server is not None:
                self.discard(server)
            server = self.new_server("candidate")
        server.resume()
        return server

    def prestart_candidate(self, lock=None) -> None:
        """Start the next evaluation's candidate server now (a fresh process; no-op when one is waiting) and wait
        until it has imported what it serves with (a ``ping``), holding ``lock`` shared meanwhile when given (the
        device's timing lock: the start is CPU work a neighbour's timed round must not share). A spare that does
        not answer within ``SPARE_READY_S`` is closed (the next evaluation starts its own)."""
        from opforge.engine.protocol import ProtocolError

        if self.spare is not None:
            return
        with lock.shared() if lock is not None else contextlib.nullcontext():
            self.spare = self.new_server("candidate")
            try:
                self.spare.request({"op": "ping"}, SPARE_READY_S)
            except ProtocolError:
                self.discard(self.spare)
                self.spare = None

    def close_references(self) -> None:
        """Close every kept reference server (before an ``alone`` evaluation: their reservations go back)."""
        for server in self.references.values():
            self.discard(server)
        self.references.clear()

    def discard(self, server: ServerProcess) -> None:
        """Kill ``server``'s process group and remove its folder (idempotent)."""
        server.close()
        if self.root is not None and server.log.parent.parent == self.root:
            remove_tmp(server.log.parent)

    def close(self) -> None:
        """Close every kept server and remove this object's folder."""
        for server in [*self.references.values(), *([self.spare] if self.spare else [])]:
            self.discard(server)
        self.references.clear()
        self.spare = None
        if self.root is not None:
            remove_tmp(self.root)
            self.root = None
