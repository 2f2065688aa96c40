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
  kept; nor is one whose idle reservation is above ``MAX_IDLE_GIB``. At most ``MAX_REFERENCES`` are kept, least
  recently used first out.
* **A spare candidate server**: a fresh ``harness.server candidate`` process started after an evaluation ends
  (``prestart_candidate``), so the next evaluation's candidate has already imported torch and, on CUDA, made its
  CUDA context (about 0.5 GiB of GPU memory per spare, outside the memory budget, which keeps a tenth of the GPU
  for such contexts and library workspaces). It has never seen
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

import hashlib
import json
import tempfile
from collections import OrderedDict
from pathlib import Path
from typing import Any

from opforge.engine.oneshot import ServerProcess
from opforge.engine.tempdirs import make as make_tmp
from opforge.engine.tempdirs import remove as remove_tmp

SERVER_MODULE = "opforge.harness.server"
# environment of both model servers (harness.grader.SERVER_ENV)
SERVER_ENV = {"OMP_WAIT_POLICY": "PASSIVE"}
# reference servers kept per grader process: a trainer's batch has several completions per task (GRPO's group), so
# the next evaluation on a grader is often the same task; a few cover interleaved tasks
MAX_REFERENCES = 2
# GiB of idle GPU memory reservation (harness.gpu_memory) above which a reference is not kept: with 16 grader
# processes on one GPU, idle references hold at most 16 x MAX_REFERENCES x MAX_IDLE_GIB of a 141 GiB H200's
# 127 GiB budget (gpu_memory_fraction 0.9), leaving room for the evaluations that run
MAX_IDLE_GIB = 2.0


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

    def new_server(self, role: str, preinit: bool = False) -> ServerProcess:
        """Start a ``role`` server (``reference`` trusted) in a fresh folder of its own; ``preinit``: it makes its
        CUDA context before its first message."""
        from opforge.harness.server import PREINIT_ENV

        folder = self._folder(f"{role}-")
        env = {**SERVER_ENV, PREINIT_ENV: "cuda" if preinit else ""}
        return ServerProcess(SERVER_MODULE, role, folder, folder / f"{role}.log", env=env,
                             trusted=role == "reference")

    def take_reference(self, key: str) -> ServerProcess | None:
        """The kept reference server of ``key`` (removed from the pool), or None when there is none alive."""
        server = self.references.pop(key, None)
        if server is None:
            return None
        if server.proc.poll() is not None:
            self.discard(server)
            return None
        self.reused += 1
        return server

    def keep_reference(self, key: str, server: ServerProcess, gib: float) -> None:
        """Keep ``server`` (alive and idle: its slots released, ``gib`` reserved) for the next evaluation of ``key``,
        unless ``gib`` is above ``max_idle_gib``; the least recently used reference beyond ``max_references`` is
        closed."""
        if server.proc.poll() is not None or gib > self.max_idle_gib or self.max_references < 1:
            self.refused = f"last not kept: exited {server.proc.poll() is not None}, {gib:.2f} GiB reserved"
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
        return server

    def prestart_candidate(self, device: str = "cpu") -> None:
        """Start the next evaluation's candidate server now (a fresh process; no-op when one is waiting). On
        ``cuda`` it makes its CUDA context while it waits (``harness.server.PREINIT_ENV``)."""
        if self.spare is None:
            self.spare = self.new_server("candidate", preinit=device == "cuda")

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
