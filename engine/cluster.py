"""The Dask cluster a run executes on; the client process never touches CUDA.

* ``device="cpu"``: an embedded ``LocalCluster`` of ``workers`` single-thread worker processes.
* ``device="cuda"``: a ``SpecCluster`` with one worker process per GPU, each started by a ``Nanny`` with
  ``CUDA_VISIBLE_DEVICES`` set to its GPU and ``workers`` threads (= sandbox children sharing that GPU).
  The GPUs are the entries of ``CUDA_VISIBLE_DEVICES`` when it is set (``CUDA_VISIBLE_DEVICES=0 opforge
  ...`` uses one GPU of several), else all that ``nvidia-smi`` lists; never counted through torch.
* ``scheduler="tcp://host:port"``: join an existing cluster; its workers are used as they are (start them
  with ``CUDA_VISIBLE_DEVICES`` pinned, e.g. ``dask cuda worker``).

Dask's own memory management is off (``memory_limit=0``): the sandbox's memory guard is per task.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from distributed import Client, LocalCluster, Nanny, Scheduler, SpecCluster
from opforge.engine.gpu_locks import visible_gpu_ids
from opforge.engine.ledger import gpu_names


@dataclass
class ClusterHandle:
    """A connected client and, for embedded clusters, the cluster to close afterwards."""

    client: Client
    cluster: object | None
    description: str
    slots: int  # tasks that can run at once

    def close(self) -> None:
        self.client.close()
        if self.cluster is not None:
            self.cluster.close()


# CUDA sandboxes per GPU leave this many of the GPU's share of cores to the client, the scheduler and the
# Dask worker: 14 sandboxes on one H200 with 16 cores is the setting of the GPU measurements
# (benchmarks/results/h200/filter_throughput.json: 305 verdicts/min, GPU 81-83 % busy); 18 and 22 were not
# faster in the one comparison made. A single sandbox leaves the GPU idle while it compiles.
CORES_KEPT_PER_GPU = 2


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity, e.g. under ``taskset``), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no sched_getaffinity on this platform
        return max(1, os.cpu_count() or 1)


def default_workers(device: str, gpus: int = 1) -> int:
    """CPU: one worker per usable core. CUDA: sandboxes per GPU = the usable cores per GPU minus
    ``CORES_KEPT_PER_GPU`` (14 on a 16-core single-GPU machine), at least 1."""
    if device == "cpu":
        return usable_cores()
    return max(1, usable_cores() // max(1, gpus) - CORES_KEPT_PER_GPU)


def open_cluster(device: str, workers: int | None = None, scheduler: str | None = None) -> ClusterHandle:
    """Start or join the cluster for ``device``; see the module docstring.

    Raises:
        RuntimeError: ``device="cuda"`` without a visible GPU (per ``nvidia-smi``), or no workers.
    """
    quiet = {"silence_logs": logging.ERROR, "dashboard_address": None}
    if scheduler:
        client = Client(scheduler, timeout="60s")
        nthreads = client.nthreads()
        if not nthreads:
            raise RuntimeError(f"scheduler {scheduler} has no workers")
        return ClusterHandle(client, None, f"scheduler {scheduler} ({len(nthreads)} workers)",
                             sum(nthreads.values()))
    if device == "cpu":
        workers = workers or default_workers(device)
        cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, memory_limit=0, **quiet)
        return ClusterHandle(Client(cluster), cluster, f"LocalCluster cpu x{workers}", workers)
    gpus = gpu_names()
    if not gpus:
        raise RuntimeError("--device cuda: nvidia-smi lists no GPU")
    ids = visible_gpus(len(gpus))
    if not ids:
        raise RuntimeError("--device cuda: CUDA_VISIBLE_DEVICES is set but names no GPU")
    workers = workers or default_workers(device, len(ids))
    specs = {f"gpu{g}": {"cls": Nanny, "options": {"nthreads": workers, "memory_limit": 0,
                                                    "env": {"CUDA_VISIBLE_DEVICES": g}}}
             for g in ids}
    cluster = SpecCluster(workers=specs, scheduler={"cls": Scheduler, "options": {"dashboard_address": None}},
                          silence_logs=logging.ERROR)
    return ClusterHandle(Client(cluster), cluster, f"{len(ids)} x {gpus[0]}, {workers} sandbox(es) each",
                         len(ids) * workers)


def visible_gpus(count: int) -> list[str]:
    """GPU ids a CUDA run uses: the entries of ``CUDA_VISIBLE_DEVICES`` when set (indices or UUIDs, as
    given), else ``0 .. count-1``."""
    ids = visible_gpu_ids()
    return [str(i) for i in range(count)] if ids is None else ids
