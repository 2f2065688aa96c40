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
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from distributed import Client, as_completed
from tqdm.auto import tqdm


def dispatch(client: Client, items: list[tuple[str, tuple]], fn: Callable[..., dict[str, Any]],
             on_result: Callable[[str, dict[str, Any]], dict[str, Any] | None],
             on_error: Callable[[str, BaseException], dict[str, Any]], *, window: int, key_prefix: str,
             desc: str = "run", unit: str = "task", progress: bool = True) -> None:
    """Run ``fn(*args, alone, reserve_gib)`` on the cluster for every ``(item_key, args)`` of ``items``.

    Args:
        items: work in submission order; ``item_key`` is unique among them (it names the Dask key
            ``{key_prefix}-{item_key}``).
        fn: the Dask task; its last two positional arguments are ``alone`` (bool) and ``reserve_gib``
            (float or None).
        on_result: called with each final result, in completion order; may return a dict for the progress
            bar's postfix.
        on_error: turns the exception of a failed future into that item's result.
        window: futures in flight (keeps workers busy, bounds the client's memory).
    """
    args_of = dict(items)
    queue = iter(args_of)
    retries: list[str] = []
    item_of: dict[str, str] = {}
    bar = tqdm(total=len(args_of), desc=desc, unit=unit, disable=not progress, dynamic_ncols=True)

    def submit(item: str, alone: bool = False, reserve_gib: float | None = None):
        key = f"{key_prefix}-{item}" + ("-alone" if alone else "") + ("-reserved" if reserve_gib else "")
        future = client.submit(fn, *args_of[item], alone, reserve_gib, key=key, pure=False)
        item_of[future.key] = item
        return future

    def next_future():
        for item in queue:
            return submit(item)
        return None

    pending = as_completed([f for f in (next_future() for _ in range(max(1, window))) if f is not None])
    for future in pending:
        item = item_of[future.key]
        try:
            result = future.result()
        except Exception as exc:  # noqa: BLE001 - a lost worker (KilledWorker...) is this item's result
            result = on_error(item, exc)
        future.release()
        reserve = result.pop("retry_gib", None)
        if reserve:
            pending.add(submit(item, reserve_gib=reserve))
            continue  # the re-run takes this slot; the next new item comes when a result frees one
        if result.pop("retry_alone", False):
            retries.append(item)
        else:
            postfix = on_result(item, result)
            bar.update(1)
            if postfix is not None:
                bar.set_postfix({**postfix, "deferred": len(retries)}, refresh=False)
        nxt = next_future()
        if nxt is not None:
            pending.add(nxt)
        elif pending.is_empty() and retries:  # everything else is done: the GPU can be had alone
            pending.update([submit(item, alone=True) for item in retries])
            retries = []
    bar.close()
