"""A Dask client that can be pickled: it travels as its scheduler's address and connects again where it lands.

Trainers copy their environment factories and reward functions into other processes (TRL's
``AsyncGRPOTrainer`` pickles them into a spawned rollout process); a ``distributed.Client`` holds an event loop
and asyncio tasks and cannot be pickled. ``SchedulerClient`` wraps one: pickled, it keeps only the scheduler's
address, and ``get()`` in the receiving process opens one client per address and reuses it.

An in-process cluster (``LocalCluster(processes=False)`` without ``protocol``) listens on ``inproc://``, which
only its own process can reach; start it with ``protocol="tcp://"`` (or ``processes=True``) when the trainer
spawns processes.
"""

from __future__ import annotations

import threading
from typing import Any

_CLIENTS: dict[str, Any] = {}  # scheduler address -> distributed.Client opened (or given) in this process
_LOCK = threading.Lock()


def _live(client: Any) -> bool:
    return client is not None and client.status not in ("closing", "closed")


class SchedulerClient:
    """A ``distributed.Client`` (or a scheduler address, e.g. ``tcp://10.0.0.1:8786``) that pickles as the
    address. ``get()`` returns a live client of that scheduler: the one given, in the process that gave it, else
    one opened on first use and shared by every ``SchedulerClient`` of the address in the process.

    Raises:
        TypeError: ``client`` is neither a client nor an address.
    """

    def __init__(self, client: Any):
        self._client = None
        if isinstance(client, str):
            self.address = client
        elif hasattr(client, "scheduler") and hasattr(client, "submit"):
            self.address = str(client.scheduler.address)
            self._client = client
            with _LOCK:
                if not _live(_CLIENTS.get(self.address)):
                    _CLIENTS[self.address] = client
        else:
            raise TypeError(f"expected a distributed.Client or a scheduler address, got {type(client).__name__}")

    @classmethod
    def wrap(cls, client: Any) -> SchedulerClient | None:
        """``client`` as a ``SchedulerClient`` (None stays None; a ``SchedulerClient`` is returned as is)."""
        if client is None or isinstance(client, SchedulerClient):
            return client
        return cls(client)

    def get(self):
        """The live ``distributed.Client`` of this scheduler in this process.

        Raises:
            ConnectionError: the scheduler cannot be reached from this process (the message names the address).
        """
        if _live(self._client):
            return self._client
        with _LOCK:
            client = _CLIENTS.get(self.address)
            if _live(client):
                return client
            from distributed import Client

            try:
                client = Client(self.address, set_as_default=False, timeout="20s")
            except (OSError, TimeoutError, ValueError) as exc:
                hint = (" (an inproc:// scheduler is reachable only from the process that started it: start the "
                        "cluster with protocol='tcp://' or processes=True)") if self.address.startswith("inproc") else ""
                raise ConnectionError(f"cannot reach the Dask scheduler at {self.address}{hint}: {exc}") from exc
            _CLIENTS[self.address] = client
            return client

    def __getstate__(self) -> dict[str, str]:
        return {"address": self.address}

    def __setstate__(self, state: dict[str, str]) -> None:
        self.address = state["address"]
        self._client = None

    def __repr__(self) -> str:
        return f"SchedulerClient({self.address!r})"
