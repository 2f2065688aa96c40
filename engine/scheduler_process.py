"""The Dask scheduler of an embedded cluster, in a process of its own.

A scheduler started inside the client's process (``LocalCluster``, or ``SpecCluster`` with an in-process
``Scheduler``) shares its interpreter lock with the client: while the client's main thread runs Python (a
round's selection and signature checks, the duplicate filter's corpus scan, the ledger), the scheduler
assigns tasks slowly. Measured with 8 worker threads running 0.05-s tasks while the client's main thread
computed for 4 s (2-core machine): 256 tasks started in those 4 s with the scheduler in the client's process,
613 (of at most 640) with it in its own. On a 4 x H200 host, with the scheduler in the client's process, the
sandboxes of ``opforge run`` idled 14-24 s at two round ends while the client fingerprinted the next round's
rows (``benchmarks/results/h200/streaming_runs.json``).

``SchedulerProcess`` is the ``SpecCluster`` scheduler spec that runs ``python -m
opforge.engine.scheduler_process ADDRESS_FILE PARENT_PID``: a ``distributed.Scheduler`` on 127.0.0.1 (a
free port, no dashboard) that writes its address to ``ADDRESS_FILE`` once listening and stops when the
cluster closes it or its parent process is gone (a client killed outright leaves no scheduler behind). Its
output goes to ``os.devnull``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

from distributed.deploy.spec import ProcessInterface
from opforge.engine.tempdirs import session_dir

PARENT_POLL_S = 1.0  # how often the scheduler process checks that its parent is alive


class SchedulerProcess(ProcessInterface):
    """A ``distributed.Scheduler`` in a child process, as ``SpecCluster``'s ``scheduler`` spec::

        SpecCluster(workers=..., scheduler={"cls": SchedulerProcess, "options": {}})

    Args:
        timeout_s: seconds to wait for the scheduler to listen.

    Raises (from ``start``):
        RuntimeError: the process exited, or did not listen within ``timeout_s``.
    """

    def __init__(self, timeout_s: float = 60.0):
        super().__init__()
        self.timeout_s = timeout_s
        self.process: subprocess.Popen | None = None
        # in the process tree's temporary session (engine.tempdirs): removed with it if this process dies early
        self._file = session_dir() / f"opforge-scheduler-{uuid.uuid4().hex}.json"

    async def start(self) -> None:
        self.process = subprocess.Popen(  # noqa: ASYNC220 - returns at once; the wait below is async
            [sys.executable, "-m", "opforge.engine.scheduler_process", str(self._file), str(os.getpid())],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + self.timeout_s
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"the Dask scheduler process exited with code {self.process.returncode} "
                                   "before listening")
            try:
                self.address = json.loads(self._file.read_text())["address"]
                break
            except (OSError, ValueError, KeyError):
                pass
            if time.monotonic() > deadline:
                self._stop()
                raise RuntimeError(f"the Dask scheduler process did not listen within {self.timeout_s:.0f} s")
            await asyncio.sleep(0.05)
        self._file.unlink(missing_ok=True)
        await super().start()

    def _stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._file.unlink(missing_ok=True)

    async def close(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self._stop)
        await super().close()


async def _serve(address_file: Path, parent: int) -> None:
    from distributed import Scheduler

    async with Scheduler(host="127.0.0.1", port=0, dashboard_address=None) as scheduler:
        tmp = address_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"address": scheduler.address}))
        tmp.replace(address_file)
        finished = asyncio.ensure_future(scheduler.finished())
        while not finished.done():
            if os.getppid() != parent:  # the client is gone
                break
            await asyncio.wait([finished], timeout=PARENT_POLL_S)


def main(argv: list[str] | None = None) -> None:
    """``python -m opforge.engine.scheduler_process ADDRESS_FILE PARENT_PID``."""
    address_file, parent = (argv if argv is not None else sys.argv[1:])[:2]
    logging.getLogger("distributed").setLevel(logging.ERROR)
    asyncio.run(_serve(Path(address_file), int(parent)))


if __name__ == "__main__":
    main()
