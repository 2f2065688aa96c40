"""The Dask cluster a run executes on; the client process never touches CUDA.

* ``device="cpu"``: an embedded ``SpecCluster`` of ``workers`` single-thread worker processes.
* ``device="cuda"``: an embedded ``SpecCluster`` with one worker process per GPU, each started by a ``Nanny`` with
  ``CUDA_VISIBLE_DEVICES`` set to its GPU and ``workers`` threads (= sandbox children sharing that GPU).
  The GPUs are the entries of ``CUDA_VISIBLE_DEVICES`` when it is set (``CUDA_VISIBLE_DEVICES=0 opforge
  ...`` uses one GPU of several), else all that ``nvidia-smi`` lists; never counted through torch.
* ``scheduler="tcp://host:port"``: join an existing cluster; its workers are used as they are (start them
  with ``CUDA_VISIBLE_DEVICES`` pinned, e.g. ``dask cuda worker``).
* ``cpu_workers=K``: K more single-thread worker processes that hold the Dask resource ``cpu_work`` and run
  CPU-only work beside the sandboxes (``ClusterHandle.cpu_workers``; on a joined cluster, the workers
  started with ``--resources cpu_work=1``); the sandbox work is then kept off them
  (``ClusterHandle.filter_workers``).

An embedded cluster's scheduler runs in a process of its own (``engine.scheduler_process``), so that the
client's own Python work does not slow down the assignment of tasks to the workers.

Dask's own memory management is off (``memory_limit=0``): the sandbox's memory guard is per task.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

from distributed import Client, Nanny, SpecCluster
from opforge.engine.gpu_locks import visible_gpu_ids
from opforge.engine.ledger import gpu_names
from opforge.engine.scheduler_process import SchedulerProcess

CPU_RESOURCE = "cpu_work"  # the Dask resource of the CPU-only workers (``cpu_workers``)


@dataclass
class ClusterHandle:
    """A connected client and, for embedded clusters, the cluster to close afterwards.

    ``slots``: sandbox tasks that can run at once. ``filter_workers``: addresses sandbox tasks are restricted
    to (None: any worker, when the cluster has no CPU-only workers). ``cpu_workers``: addresses of the
    CPU-only workers (empty: none)."""

    client: Client
    cluster: object | None
    description: str
    slots: int
    filter_workers: list[str] | None = None
    cpu_workers: list[str] = field(default_factory=list)

    def close(self) -> None:
        self.client.close()
        if self.cluster is not None:
            self.cluster.close()


# CUDA sandboxes per GPU leave this many of the GPU's share of cores to the client, the scheduler and the
# Dask worker: 14 sandboxes on one H200 with 16 cores is the setting of the GPU measurements
# (benchmarks/results/h200/filter_throughput.json: 305 verdicts/min, GPU 81-83 % busy); 18 and 22 were not
# faster in the one comparison made. A single sandbox leaves the GPU idle while it compiles.
CORES_KEPT_PER_GPU = 2
# At most this many CUDA sandboxes share one GPU by default, however many cores each GPU has: one H100 with
# 30 sandboxes gave 742 verdicts/min and was busy 91.7 % of the filter span (2 x H100 host, 32 vCPUs, one GPU
# visible), one H100 with 62 (the cores-per-GPU default of a 64-vCPU host, one GPU visible) 517/min, with 37
# timeouts and two thirds of the sandbox seconds running a task (benchmarks/results/h100/streaming_runs.json).
MAX_SANDBOXES_PER_GPU = 30


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity, e.g. under ``taskset``), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no sched_getaffinity on this platform
        return max(1, os.cpu_count() or 1)


def default_workers(device: str, gpus: int = 1) -> int:
    """CPU: one worker per usable core. CUDA: sandboxes per GPU = the usable cores per GPU minus
    ``CORES_KEPT_PER_GPU`` (14 on a 16-core single-GPU machine), at least 1 and at most
    ``MAX_SANDBOXES_PER_GPU``."""
    if device == "cpu":
        return usable_cores()
    return max(1, min(MAX_SANDBOXES_PER_GPU, usable_cores() // max(1, gpus) - CORES_KEPT_PER_GPU))


def open_cluster(device: str, workers: int | None = None, scheduler: str | None = None,
                 cpu_workers: int = 0) -> ClusterHandle:
    """Start or join the cluster for ``device``; see the module docstring.

    Raises:
        RuntimeError: ``device="cuda"`` without a visible GPU (per ``nvidia-smi``), or no workers.
    """
    if scheduler:
        client = Client(scheduler, timeout="60s")
        info = client.scheduler_info()["workers"]
        if not info:
            raise RuntimeError(f"scheduler {scheduler} has no workers")
        cpu = sorted(a for a, w in info.items() if CPU_RESOURCE in (w.get("resources") or {}))
        sandbox = {a: w["nthreads"] for a, w in info.items() if a not in cpu}
        if not sandbox:
            raise RuntimeError(f"scheduler {scheduler} has no workers for sandboxes (all hold {CPU_RESOURCE})")
        return ClusterHandle(client, None, f"scheduler {scheduler} ({len(info)} workers)", sum(sandbox.values()),
                             sorted(sandbox) if cpu else None, cpu)
    one = {"nthreads": 1, "memory_limit": 0, "silence_logs": logging.ERROR}
    # CPU-only workers see no GPU
    extra = {f"cpu-work-{i}": {"cls": Nanny, "options": {**one, "resources": {CPU_RESOURCE: 1},
                                                         "env": {"CUDA_VISIBLE_DEVICES": ""}}}
             for i in range(cpu_workers)}
    if device == "cpu":
        workers = workers or default_workers(device)
        specs = {i: {"cls": Nanny, "options": dict(one)} for i in range(workers)}
        description = f"cpu x{workers}" + (f" + {cpu_workers} CPU worker(s)" if cpu_workers else "")
    else:
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
        description = f"{len(ids)} x {gpus[0]}, {workers} sandbox(es) each" + (
            f" + {cpu_workers} CPU worker(s)" if cpu_workers else "")
    cluster = SpecCluster(workers={**specs, **extra}, scheduler={"cls": SchedulerProcess, "options": {}},
                          silence_logs=logging.ERROR)
    client = Client(cluster)
    return _handle(client, cluster, description, set(specs))


def _handle(client: Client, cluster, description: str, sandbox_names: set) -> ClusterHandle:
    """The handle of an embedded cluster whose sandbox workers are named ``sandbox_names`` (the others run
    CPU-only work): waits for every worker, so the addresses are known."""
    expected = len(cluster.worker_spec)
    client.wait_for_workers(expected, timeout=300)
    info = client.scheduler_info()["workers"]
    sandbox = sorted(a for a, w in info.items() if w.get("name") in sandbox_names)
    cpu = sorted(a for a in info if a not in sandbox)
    slots = sum(info[a]["nthreads"] for a in sandbox)
    return ClusterHandle(client, cluster, description, slots, sandbox if cpu else None, cpu)


def visible_gpus(count: int) -> list[str]:
    """GPU ids a CUDA run uses: the entries of ``CUDA_VISIBLE_DEVICES`` when set (indices or UUIDs, as
    given), else ``0 .. count-1``."""
    ids = visible_gpu_ids()
    return [str(i) for i in range(count)] if ids is None else ids
