"""The engine's dispatcher: keep a window of Dask futures in flight over a list of work items and hand each
final result to the caller as it arrives, with the engine's out-of-memory rule.

A result (a dict) is final unless it carries one of two marks set by the job that ran out of GPU memory
next to others (``engine.sandbox_child._run_on_gpu``, ``harness.batch.evaluate_one``):

* ``retry_gib``: submitted again at once, reserving that much GPU memory (it runs next to others as soon
  as that fits);
* ``retry_alone``: run again with ``alone=True`` (the whole GPU) once every other item is done: one drain
  at the end instead of one per out-of-memory.

A future that raises (a worker lost several times over, ``KilledWorker``...) becomes the item's result
through ``on_error``. A run killed before the end re-runs deferred items from scratch (nothing was
recorded for them).

``Dispatcher`` is the same loop for work that arrives while it runs (``add``; ``discard`` takes queued items
back out): deferred items run alone whenever nothing else is queued or in flight, and other futures the
caller waits for (``watch``) are handled in the same loop, so one client process can keep the workers fed
while it waits for more work. ``dispatch`` runs one fixed list through it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from distributed import Client, Future, as_completed
from tqdm.auto import tqdm


class Dispatcher:
    """A window of Dask futures over work items that may keep arriving; see the module docstring.

    Args:
        fn: the Dask task; called as ``fn(*args, alone, reserve_gib)``.
        on_result: called with each final result, in completion order; may return a dict for the progress
            bar's postfix.
        on_error: turns the exception of a failed future into that item's result.
        window: futures in flight (keeps workers busy, bounds the client's memory).
        key_prefix: Dask keys are ``{key_prefix}-{item_key}`` (plus ``-alone`` / ``-reserved``).
        workers: addresses the tasks may run on (None: any worker).
    """

    def __init__(self, client: Client, fn: Callable[..., dict[str, Any]],
                 on_result: Callable[[str, dict[str, Any]], dict[str, Any] | None],
                 on_error: Callable[[str, BaseException], dict[str, Any]], *, window: int, key_prefix: str,
                 workers: list[str] | None = None, desc: str = "run", unit: str = "task", progress: bool = True):
        self.client, self.fn, self.on_result, self.on_error = client, fn, on_result, on_error
        self.window, self.key_prefix, self.workers = max(1, window), key_prefix, workers
        self.args_of: dict[str, tuple] = {}
        self.queue: deque[str] = deque()
        self.retries: list[str] = []
        self.item_of: dict[str, str] = {}
        self.watched: dict[str, Callable[[Future], None]] = {}
        self.in_flight = 0
        self.finished = 0
        self.pending = as_completed()
        self.bar = tqdm(total=0, desc=desc, unit=unit, disable=not progress, dynamic_ncols=True)

    # -- feeding ---------------------------------------------------------------------------------------
    def add(self, items: Iterable[tuple[str, tuple]]) -> int:
        """Queue ``(item_key, args)`` work items (a key seen before is ignored) and submit up to the window.
        Returns how many were new."""
        new = 0
        for key, args in items:
            if key in self.args_of:
                continue
            self.args_of[key] = args
            self.queue.append(key)
            new += 1
        if new:
            self.bar.total += new
            self.bar.refresh()
        self._fill()
        return new

    def discard(self, keys: Iterable[str]) -> int:
        """Take the items of ``keys`` still queued (not submitted yet) out of the queue, forgotten as if never
        added (a later ``add`` queues them again); items in flight or deferred run on. Returns how many were
        taken out."""
        drop = {k for k in keys if k in self.args_of}
        gone = [k for k in self.queue if k in drop] if drop else []
        if gone:
            self.queue = deque(k for k in self.queue if k not in drop)
            for k in gone:
                del self.args_of[k]
            self.bar.total -= len(gone)
            self.bar.refresh()
        return len(gone)

    def watch(self, future: Future, callback: Callable[[Future], None]) -> None:
        """Handle ``future`` in this loop: ``callback(future)`` once it is done (finished, failed or
        cancelled)."""
        self.watched[future.key] = callback
        self.pending.add(future)

    @property
    def busy(self) -> bool:
        """Items queued, in flight or deferred."""
        return bool(self.queue or self.in_flight or self.retries)

    # -- the loop --------------------------------------------------------------------------------------
    def step(self) -> bool:
        """Handle the next done future (an item's or a watched one), waiting for it, and every other future
        already done. Returns False when nothing is pending.

        A done future keeps its place in the window until it is handled, so handling the done ones together
        lets the window refill at once when the caller does slow work between steps."""
        if self.pending.is_empty():
            return False
        self._handle(next(self.pending))
        while self.pending.has_ready():
            self._handle(next(self.pending))
        return True

    def _handle(self, future: Future) -> None:
        callback = self.watched.pop(future.key, None)
        if callback is not None:
            callback(future)
        elif future.key in self.item_of:
            self._done(future)

    def drain(self) -> None:
        """Step until no item is queued, in flight or deferred (watched futures are handled meanwhile)."""
        while self.busy and self.step():
            pass

    def close(self) -> None:
        self.bar.close()

    # -- internals -------------------------------------------------------------------------------------
    def _submit(self, item: str, alone: bool = False, reserve_gib: float | None = None) -> None:
        key = f"{self.key_prefix}-{item}" + ("-alone" if alone else "") + ("-reserved" if reserve_gib else "")
        future = self.client.submit(self.fn, *self.args_of[item], alone, reserve_gib, key=key, pure=False,
                                    workers=self.workers)
        self.item_of[future.key] = item
        self.in_flight += 1
        self.pending.add(future)

    def _fill(self) -> None:
        while self.queue and self.in_flight < self.window:
            self._submit(self.queue.popleft())
        if not self.queue and not self.in_flight and self.retries:  # nothing else to run: the GPU alone
            retries, self.retries = self.retries, []
            for item in retries:
                self._submit(item, alone=True)

    def _done(self, future: Future) -> None:
        item = self.item_of.pop(future.key)
        self.in_flight -= 1
        try:
            result = future.result()
        except Exception as exc:  # noqa: BLE001 - a lost worker (KilledWorker...) is this item's result
            result = self.on_error(item, exc)
        future.release()
        reserve = result.pop("retry_gib", None)
        if reserve:
            self._submit(item, reserve_gib=reserve)  # the re-run takes this slot
            return
        if result.pop("retry_alone", False):
            self.retries.append(item)
        else:
            postfix = self.on_result(item, result)
            self.finished += 1
            self.bar.update(1)
            if postfix is not None:
                self.bar.set_postfix({**postfix, "deferred": len(self.retries)}, refresh=False)
        self._fill()


def dispatch(client: Client, items: list[tuple[str, tuple]], fn: Callable[..., dict[str, Any]],
             on_result: Callable[[str, dict[str, Any]], dict[str, Any] | None],
             on_error: Callable[[str, BaseException], dict[str, Any]], *, window: int, key_prefix: str,
             desc: str = "run", unit: str = "task", progress: bool = True,
             workers: list[str] | None = None) -> None:
    """Run ``fn(*args, alone, reserve_gib)`` on the cluster for every ``(item_key, args)`` of ``items``
    (a ``Dispatcher`` fed once and drained).

    Args:
        items: work in submission order; ``item_key`` is unique among them (it names the Dask key
            ``{key_prefix}-{item_key}``).
        fn, on_result, on_error, window, key_prefix, workers: as for ``Dispatcher``.
    """
    d = Dispatcher(client, fn, on_result, on_error, window=window, key_prefix=key_prefix, workers=workers,
                   desc=desc, unit=unit, progress=progress)
    try:
        d.add(items)
        d.drain()
    finally:
        d.close()
