"""Worker-resident sandboxes: a ``distributed.WorkerPlugin`` that owns each Dask worker's reusable sandbox
children, and the data they need, for one job and one set of settings.

The client registers one ``SandboxPool`` (``register``); Dask sends it to every worker, those that join
later included, and calls ``setup`` there: files the sandboxes read (e.g. the KernelBench index) travel
inside the plugin, are written into the worker's own local directory, and the settings name them there.
So workers need no access to the client's filesystem. A Dask task running on the worker takes a sandbox
with ``with pool_of_worker().sandbox() as box`` (an idle one, else a new one: at most one per task running on
the worker at once, i.e. its threads); the sandboxes' logs stay in the worker's directory until the client fetches them
(``fetch_logs``, through Dask). ``teardown`` (the plugin replaced or removed, the worker closing) stops
every child.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from distributed import Client, WorkerPlugin, get_worker
from opforge.engine.sandbox import Sandbox

PLUGIN_NAME = "opforge-sandboxes"
LOG_TAIL_BYTES = 1 << 20  # the most of each sandbox log fetched back to the client


class SandboxPool(WorkerPlugin):
    """Sandboxes of ``job`` with ``settings`` on one worker.

    Args:
        job: the sandbox job by import path (``engine.sandbox_child.SandboxJob``).
        settings: the job's settings dict; travels to every worker inside the plugin.
        files: settings field -> file content (bytes): written into the worker's directory at setup, and
            the field set to that file's path there.
    """

    name = PLUGIN_NAME
    idempotent = False

    def __init__(self, job: str, settings: dict[str, Any], files: dict[str, bytes] | None = None):
        self.job = job
        self.settings = dict(settings)
        self.files = dict(files or {})
        blob = json.dumps([job, settings], sort_keys=True, default=str).encode()
        for k in sorted(self.files):
            blob += k.encode() + hashlib.sha256(self.files[k]).digest()
        self.digest = hashlib.sha256(blob).hexdigest()[:16]
        self._idle: list[Sandbox] = []
        self._all: list[Sandbox] = []
        self._lock = threading.Lock()
        self.directory: Path | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_idle", "_all", "_lock")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._idle, self._all, self._lock = [], [], threading.Lock()

    # -- worker side ----------------------------------------------------------------------------------
    def setup(self, worker) -> None:
        self.directory = Path(worker.local_directory) / "opforge" / self.digest
        (self.directory / "logs").mkdir(parents=True, exist_ok=True)
        for field, data in self.files.items():
            path = self.directory / f"{field}.bin"
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(data)
            tmp.replace(path)
            self.settings[field] = str(path)
        self.files = {}  # written: not kept in the worker's memory twice

    def teardown(self, worker) -> None:
        """Stop every sandbox child of this worker, all at once: each may take up to ``Sandbox.close``'s wait
        to exit (a child with a CUDA context takes a moment), so one after the other the waits would add up
        over a worker's sandboxes."""
        with self._lock:
            boxes, self._all, self._idle = self._all, [], []
        if not boxes:
            return
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=len(boxes), thread_name_prefix="opforge-sandbox-close") as ex:
            list(ex.map(lambda box: box.close(), boxes))

    @contextlib.contextmanager
    def sandbox(self) -> Iterator[Sandbox]:
        """An idle sandbox of this worker (a new one when none is idle), returned to the pool afterwards."""
        with self._lock:
            box = self._idle.pop() if self._idle else None
            if box is None:
                log = self.directory / "logs" / f"sandbox-{len(self._all)}.log"
                box = Sandbox(self.job, self.settings, log_path=log)
                self._all.append(box)
        try:
            yield box
        finally:
            with self._lock:
                if box in self._all:  # not torn down meanwhile
                    self._idle.append(box)

    def logs(self) -> dict[str, str]:
        """File name -> the last ``LOG_TAIL_BYTES`` of each sandbox log of this worker."""
        out = {}
        for p in sorted((self.directory / "logs").glob("*.log")) if self.directory else []:
            with open(p, "rb") as fh:
                fh.seek(max(0, p.stat().st_size - LOG_TAIL_BYTES))
                out[p.name] = fh.read().decode(errors="replace")
        return out


def pool_of_worker() -> SandboxPool:
    """The ``SandboxPool`` of the worker running the calling Dask task. Raises RuntimeError when there is
    none (not registered, or not called in a Dask task)."""
    try:
        pool = get_worker().plugins.get(PLUGIN_NAME)
    except ValueError:
        pool = None
    if not isinstance(pool, SandboxPool):
        raise RuntimeError("no opforge sandbox pool on this worker: register one with engine.pool.register")
    return pool


def _digest_of_worker(dask_worker) -> str | None:
    pool = dask_worker.plugins.get(PLUGIN_NAME)
    return getattr(pool, "digest", None)


def register(client: Client, pool: SandboxPool) -> None:
    """Install ``pool`` on every worker of ``client`` (and on workers that join later), unless every worker
    already has one with the same job, settings and files (then its warm sandboxes are kept)."""
    current = client.run(_digest_of_worker)
    if current and all(d == pool.digest for d in current.values()):
        return
    client.register_plugin(pool, name=PLUGIN_NAME)


def unregister(client: Client) -> None:
    """Remove the pool from every worker (stopping its sandboxes)."""
    with contextlib.suppress(ValueError, KeyError):
        client.unregister_worker_plugin(PLUGIN_NAME)


def _logs_of_worker(dask_worker) -> dict[str, str]:
    pool = dask_worker.plugins.get(PLUGIN_NAME)
    return pool.logs() if isinstance(pool, SandboxPool) else {}


def fetch_logs(client: Client, log_dir: str | Path) -> int:
    """Copy the sandbox logs of every worker (through Dask, not a shared path) into
    ``log_dir/WORKER/NAME``; returns how many files were written. Workers that cannot answer are skipped."""
    try:
        per_worker = client.run(_logs_of_worker, on_error="return")
    except Exception:  # noqa: BLE001 - logs are best effort: a lost scheduler must not hide the run's own error
        return 0
    written = 0
    for address, logs in per_worker.items():
        if not isinstance(logs, dict):
            continue
        folder = Path(log_dir) / address.replace("://", "_").replace(":", "_").replace("/", "_")
        for name, text in logs.items():
            folder.mkdir(parents=True, exist_ok=True)
            (folder / name).write_text(text)
            written += 1
    return written
