"""``opforge filter``: verdict every task of an input file on a Dask cluster, resumably.

Input: JSONL or Parquet with a ``code`` column and optional ``task_id`` (kept as given), ``ops``,
``data_source``; other columns are ignored. Rows with the same ``task_id`` are run once and share the
verdict. Output in ``RUN_DIR``: ``ledger.jsonl`` (appended as results arrive; what makes a re-run resume),
``verdicts.parquet`` (one row per input row, input order) and ``funnel.json``.

``FilterStream`` is the same stage for rows that arrive while it runs (``opforge run`` composes while the
filter works): the corpus filters scan the rows in arrival order, the other rows are dispatched at once, and
``result`` computes the verdict table of the whole input exactly as ``run_filter`` would (the corpus filters
again over the final input, any task still missing dispatched), so a streamed stage and a one-shot stage
give the same verdicts. ``result`` waits only for the input's own tasks: rows added for a later input keep
the workers busy meanwhile, and rows added that the caller then leaves out of every input are taken back
out of the queue (``discard``) or, when already running, only recorded in the ledger.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from distributed import get_worker
from opforge.engine.cluster import ClusterHandle, open_cluster, usable_cores
from opforge.engine.dispatch import Dispatcher, dispatch
from opforge.engine.gpu_locks import decode_spans
from opforge.engine.ledger import Ledger, environment, fingerprint
from opforge.engine.pool import SandboxPool, fetch_logs, pool_of_worker, register
from opforge.filters.chain import (
    CHAIN_JOB,
    FILTER_NAMES,
    FilterSettings,
    check_thresholds,
    make_corpus_filters,
)
from opforge.task.task_file import InputError, read_tasks  # noqa: F401 - InputError is part of this API


# -- worker side --------------------------------------------------------------------------------------
def verdict_task(task_id: str, code: Any, alone: bool = False, reserve_gib: float | None = None
                 ) -> dict[str, Any]:
    """Dask task: run the filter chain on one task in a sandbox child of this worker's pool
    (``engine.pool.SandboxPool``; ``alone``: with no other task on its GPU; ``reserve_gib``: its GPU memory
    reservation; both for ``oom`` re-runs, see ``engine.dispatch``).

    Returns the ``run_chain`` dict plus ``task_id``, ``worker``, ``start_s`` and ``started_at`` / ``ended_at``
    (Unix seconds, on the worker's clock).
    """
    pool = pool_of_worker()
    code = code if isinstance(code, str) else ""
    started = time.time()
    with pool.sandbox() as box:
        result = box.run(task_id, code, timeout_s=box.settings["timeout_s"], alone=alone, reserve_gib=reserve_gib)
    return {**result, "task_id": task_id, "worker": str(get_worker().name), "started_at": round(started, 3),
            "ended_at": round(time.time(), 3)}


def warm_sandbox(seconds: float = 0.0) -> dict[str, Any]:
    """Dask task: start a sandbox child of this worker's pool now (importing torch, the CUDA context and,
    on CUDA, a first small compile: see ``engine.sandbox_child``) so that a ``verdict_task`` finds it
    ready. Holds the sandbox ``seconds`` longer, so that concurrent warm tasks of one worker start one
    child each. Returns ``{"start_s": seconds, "error": None or the SandboxError text}``."""
    with pool_of_worker().sandbox() as box:
        try:
            out = {"start_s": box.start(), "error": None}
        except RuntimeError as exc:  # SandboxError: the task that needs this sandbox tries again and reports it
            out = {"start_s": box.start_seconds, "error": str(exc)[:300]}
        time.sleep(seconds)
    return out


# -- client side --------------------------------------------------------------------------------------
def prepare_settings(settings: FilterSettings, run_dir: str | Path, handle: ClusterHandle | None = None,
                     progress: bool = True) -> FilterSettings:
    """The settings the sandboxes of a filter run in ``run_dir`` get: with ``contamination``, the KernelBench
    index located (built once and cached, copied to ``RUN_DIR/kernelbench_index.pkl``; the workers get its
    content through Dask, see ``sandbox_pool``); on CPU with an open cluster ``handle``, ``cpu_threads`` set
    to this machine's cores per sandbox. Fields already set are kept, so ``run_filter`` given the result
    computes the same settings (and reuses warm sandboxes).

    Raises:
        ReferenceLoadError: the KernelBench reference cannot be loaded.
    """
    if "contamination" in settings.names() and settings.kernelbench_index is None:
        from opforge.filters.kernelbench import index_for_run

        path, index = index_for_run(run_dir, settings.kernelbench, settings.kernelbench_levels, progress)
        settings = settings.model_copy(update={"kernelbench_index": str(path.resolve()),
                                               "kernelbench_identity": index.identity()})
    if handle is not None and settings.device == "cpu" and settings.cpu_threads is None:
        # share this machine's cores among the sandboxes (an external cluster's machines may differ)
        settings = settings.model_copy(update={"cpu_threads": max(1, usable_cores() // handle.slots)})
    return settings


def sandbox_pool(settings: FilterSettings) -> SandboxPool:
    """The worker plugin of a filter run: the chain job with ``settings``; the KernelBench index file (a
    path on the client) travels inside it and is rewritten on each worker."""
    files = {}
    if settings.kernelbench_index is not None:
        files["kernelbench_index"] = Path(settings.kernelbench_index).read_bytes()
    return SandboxPool(CHAIN_JOB, settings.model_dump(mode="json"), files)


def warm_sandboxes(handle: ClusterHandle, settings: FilterSettings, run_dir: str | Path) -> list:
    """Install the run's sandbox pool on every worker of ``handle`` and start one sandbox child per worker
    thread in the background (``warm_sandbox``), for a filter run with ``settings`` (from
    ``prepare_settings``). Returns the futures: keep them until the filter stage has started (a released
    future is cancelled). ``opforge run`` calls this before composing, so the children start while the
    composer works."""
    register(handle.client, sandbox_pool(settings))
    futures = []
    for address, threads in handle.client.nthreads().items():  # each thread of each worker: one start
        if handle.filter_workers is not None and address not in handle.filter_workers:
            continue  # a CPU-only worker runs no sandbox
        futures += [handle.client.submit(warm_sandbox, 1.0, key=f"warm-sandbox-{address}-{i}",
                                         workers=[address], allow_other_workers=False, pure=False)
                    for i in range(threads)]
    return futures


@dataclass
class FilterRunResult:
    """Summary of one ``opforge filter`` run (also written to ``funnel.json``)."""

    verdicts: pd.DataFrame
    funnel: dict[str, Any]
    run_dir: Path
    skipped_done: int = 0
    failures: list[str] = field(default_factory=list)


def _progress_postfix(counts: Counter) -> dict[str, Any]:
    rejected = {k: v for k, v in counts.items() if k != "accepted"}
    top = ", ".join(f"{k}={v}" for k, v in Counter(rejected).most_common(3))
    return {"ok": counts.get("accepted", 0), "rej": sum(rejected.values()), "top": top}


def run_filter(input_path: str | Path, run_dir: str | Path, settings: FilterSettings, *,
               workers: int | None = None, scheduler: str | None = None, progress: bool = True,
               limit: int | None = None, handle: ClusterHandle | None = None) -> FilterRunResult:
    """Verdict every task of ``input_path`` into ``run_dir`` (see the module docstring).

    Args:
        settings: filter chain settings (device, window, timeout...).
        workers / scheduler: cluster shape, see ``engine.cluster.open_cluster``.
        limit: only the first ``limit`` input rows (for smoke runs).
        handle: an already open cluster to use (then not closed here).

    Raises:
        InputError: unreadable input. ValueError: bad settings (e.g. an unknown threshold, before anything
            is written).
    """
    check_thresholds(settings.thresholds)  # before anything is written
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    tasks = read_tasks(input_path)
    if limit is not None:
        tasks = tasks.head(limit)
    corpus, corpus_stats = _corpus_verdicts(tasks, settings, progress)
    settings = prepare_settings(settings, run_dir, progress=progress)
    env = environment(settings.device)
    fp = fingerprint(env, settings.fingerprint_fields())
    ledger = Ledger(run_dir / "ledger.jsonl", fp)
    unique = tasks[~tasks["row"].isin(corpus)].drop_duplicates("task_id")
    todo = unique[~unique["task_id"].isin(ledger.done)]
    skipped = len(unique) - len(todo)
    t0 = time.perf_counter()
    failures: list[str] = []
    if len(todo):
        own = handle is None
        handle = handle or open_cluster(settings.device, workers, scheduler)
        settings = prepare_settings(settings, run_dir, handle, progress)
        try:
            _drive(handle, todo, settings, ledger, run_dir, progress, failures)
        finally:
            ledger.close()
            if own:
                handle.close()
    wall = time.perf_counter() - t0
    return _finish(tasks, ledger, corpus, corpus_stats, wall, len(todo), skipped, settings, env, fp, run_dir,
                   failures)


class FilterStream:
    """The filter stage of one run directory fed while it runs (see the module docstring).

    ``add`` takes rows in input order (``task_id``, ``code``), scans them with the corpus filters and
    dispatches the tasks neither rejected there nor in the ledger (``engine.dispatch.Dispatcher``; tasks run
    on ``handle.filter_workers``); ``step`` keeps the loop going (also for futures the caller ``watch``-es);
    ``result`` gives the verdicts of a whole input. The ledger is appended as verdicts arrive,
    so a stream killed at any point resumes like ``run_filter``.

    Attributes:
        settings: the prepared settings (``prepare_settings``).
        rows: rows added so far (the next row's input number).
        verdicted: tasks verdicted by this stream; ``accepted``: of them, accepted.
        first_submit / last_result: Unix seconds of the first dispatched task and of the latest verdict
            (None before); ``busy_s``: the sandbox seconds of the verdicts received; ``waited_s``: seconds the
            last ``result`` spent waiting for verdicts (the ``meanwhile`` calls included).
        spans: (worker, started_at, ended_at, lock_hold_s, compute-lock hold spans) of each verdict received,
            for the stage timeline (``engine.gpu_locks.decode_spans`` of its ``gpu_hold_t0`` / ``gpu_hold_ms``).
        after_result: called with (task_id, record) after each verdict is recorded (None: nothing), e.g. to
            compose more.
    """

    def __init__(self, run_dir: str | Path, settings: FilterSettings, handle: ClusterHandle, progress: bool = True):
        check_thresholds(settings.thresholds)  # before anything is written
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.handle, self.progress = handle, progress
        self.settings = prepare_settings(settings, self.run_dir, handle, progress)
        self.env = environment(self.settings.device)
        self.fp = fingerprint(self.env, self.settings.fingerprint_fields())
        self.ledger = Ledger(self.run_dir / "ledger.jsonl", self.fp)
        self.corpus = CorpusScan(self.settings)
        self.rows = 0
        self.verdicted = self.accepted = 0
        self.busy_s = self.waited_s = 0.0
        self.first_submit: float | None = None
        self.last_result: float | None = None
        self.spans: list[tuple] = []
        self.failures: list[str] = []
        self._counts: Counter = Counter()
        self._round_ran, self._round_t0 = 0, None
        self._waiting_for: set[str] = set()  # the tasks ``result`` waits for
        self._table_rows: dict[str, dict] = {}  # task id -> verdict-table fields of its ledger record
        self.after_result: Callable[[str, dict[str, Any]], None] | None = None
        register(handle.client, sandbox_pool(self.settings))
        self.dispatcher = Dispatcher(handle.client, verdict_task, self._on_result, self._on_error,
                                     window=max(4, 4 * handle.slots), key_prefix=f"verdict-{self.fp}",
                                     workers=handle.filter_workers, desc="filter", unit="task", progress=progress)

    # -- results ---------------------------------------------------------------------------------------
    def _on_result(self, task_id: str, result: dict[str, Any]) -> dict[str, Any]:
        self.ledger.append(result)
        self._waiting_for.discard(task_id)
        self.verdicted += 1
        self._round_ran += 1
        self.accepted += bool(result["accepted"])
        self.busy_s += float(sum((result.get("seconds") or {}).values())) + float(result.get("start_s") or 0.0)
        self.last_result = time.time()
        if result.get("ended_at"):
            self.spans.append((result.get("worker"), result.get("started_at"), result["ended_at"],
                               result.get("lock_hold_s") or {},
                               decode_spans(result.get("gpu_hold_t0"), result.get("gpu_hold_ms"))))
        self._counts["accepted" if result["accepted"] else result["reason"].split(":")[0]] += 1
        if self.after_result is not None:
            self.after_result(task_id, result)
        return _progress_postfix(self._counts)

    def _on_error(self, task_id: str, exc: BaseException) -> dict[str, Any]:
        self.failures.append(f"{task_id}: {type(exc).__name__}: {exc}")
        return {"task_id": task_id, "accepted": False, "reason": f"crash:{type(exc).__name__}",
                "filter": None, "metrics": {}, "seconds": {}, "worker": None, "start_s": 0.0}

    # -- feeding ---------------------------------------------------------------------------------------
    def add(self, rows: pd.DataFrame) -> int:
        """Scan ``rows`` (``task_id``, ``code``; the next rows of the input) and dispatch their new tasks.
        Returns how many tasks were dispatched."""
        tasks = pd.DataFrame({"row": range(self.rows, self.rows + len(rows)), "task_id": list(rows["task_id"]),
                              "code": list(rows["code"])})
        self.rows += len(rows)
        if any(f.name == "duplicate" for f in self.corpus.filters):
            prefill_fingerprints(self.handle.client, self.handle.cpu_workers, tasks["code"])
        rejected = self.corpus.add(tasks)
        return self._dispatch(tasks[~tasks["row"].isin(rejected)])

    def _dispatch(self, live: pd.DataFrame) -> int:
        todo = live.drop_duplicates("task_id")
        todo = todo[~todo["task_id"].isin(self.ledger.done)]
        n = self.dispatcher.add((t, (t, c)) for t, c in zip(todo["task_id"], todo["code"], strict=True))
        if n:
            now = time.time()
            self.first_submit = self.first_submit or now
            self._round_t0 = self._round_t0 or time.perf_counter()
        return n

    def discard(self, task_ids) -> int:
        """Take the tasks of ``task_ids`` that are still queued back out (``Dispatcher.discard``): rows added
        that no input will hold. Returns how many were taken out."""
        return self.dispatcher.discard(task_ids)

    def watch(self, future, callback) -> None:
        """Handle ``future`` in the stream's loop (``Dispatcher.watch``)."""
        self.dispatcher.watch(future, callback)

    def step(self) -> bool:
        """Handle the next done future; False when nothing is pending."""
        return self.dispatcher.step()

    @property
    def pending(self) -> int:
        """Tasks dispatched and not yet verdicted."""
        return len(self.dispatcher.queue) + self.dispatcher.in_flight + len(self.dispatcher.retries)

    @property
    def deferred(self) -> int:
        """Tasks that ran out of GPU memory next to others and wait to run alone (they start once nothing
        else is queued or in flight)."""
        return len(self.dispatcher.retries)

    # -- the whole input -------------------------------------------------------------------------------
    def result(self, input_path: str | Path, meanwhile: Callable[[], None] | None = None) -> FilterRunResult:
        """The verdicts of the input at ``input_path`` (all rows, as ``run_filter`` reads them): the corpus
        filters run again over it, tasks not in the ledger yet are dispatched and waited for (only those: tasks
        added for later inputs run on), and ``verdicts.parquet`` / ``funnel.json`` are written. ``meanwhile``
        is called after each result received while waiting (e.g. to add the next input's rows as they are
        composed). The funnel's ``ran_this_time`` and ``wall_s`` count the tasks verdicted by this stream since
        the previous ``result``.

        Raises:
            RuntimeError: a task of the input has no verdict and nothing is left to wait for.
        """
        tasks = read_tasks(input_path)
        corpus, corpus_stats = _corpus_verdicts(tasks, self.settings, False)
        live = tasks[~tasks["row"].isin(corpus)]
        self._dispatch(live)
        unique = live.drop_duplicates("task_id")
        self._waiting_for = {t for t in unique["task_id"] if t not in self.ledger.done}
        t_wait = time.perf_counter()
        while self._waiting_for:
            if not self.step():
                raise RuntimeError(f"filter stream: {len(self._waiting_for)} task(s) of {input_path} have no "
                                   f"verdict and none is running, e.g. {sorted(self._waiting_for)[0]}")
            if meanwhile is not None:
                meanwhile()
        self.waited_s = time.perf_counter() - t_wait
        ran = self._round_ran
        wall = time.perf_counter() - self._round_t0 if self._round_t0 is not None else 0.0
        self._round_ran, self._round_t0 = 0, None
        return _finish(tasks, self.ledger, corpus, corpus_stats, wall, ran, max(0, len(unique) - ran),
                       self.settings, self.env, self.fp, self.run_dir, list(self.failures), self._table_rows)

    def close(self) -> None:
        """Close the ledger and fetch the sandbox logs into ``RUN_DIR/logs``."""
        self.dispatcher.close()
        self.ledger.close()
        fetch_logs(self.handle.client, self.run_dir / "logs")


def _finish(tasks, ledger, corpus, corpus_stats, wall, ran, skipped, settings, env, fp, run_dir, failures,
            table_rows: dict | None = None) -> FilterRunResult:
    """The verdict table and funnel of ``tasks`` (written to ``verdicts.parquet`` and ``funnel.json``);
    ``table_rows`` as for ``_verdict_table``."""
    verdicts = _verdict_table(tasks, ledger, corpus, table_rows)
    funnel = _funnel(tasks, verdicts, ledger, corpus, corpus_stats, wall, ran, skipped, settings, env, fp)
    verdicts.to_parquet(run_dir / "verdicts.parquet", index=False)
    (run_dir / "funnel.json").write_text(json.dumps(funnel, indent=2, sort_keys=True))
    return FilterRunResult(verdicts, funnel, run_dir, skipped, failures)


def _drive(handle: ClusterHandle, todo: pd.DataFrame, settings: FilterSettings, ledger: Ledger,
           run_dir: Path, progress: bool, failures: list[str]) -> None:
    """Verdict ``todo`` through the engine's dispatcher (``engine.dispatch``: ``oom`` re-runs with a larger
    reservation, then alone); ledger each verdict as it arrives; fetch the sandbox logs into
    ``RUN_DIR/logs`` afterwards (through Dask)."""
    register(handle.client, sandbox_pool(settings))
    counts: Counter = Counter()

    def on_result(task_id: str, result: dict[str, Any]) -> dict[str, Any]:
        ledger.append(result)
        counts["accepted" if result["accepted"] else result["reason"].split(":")[0]] += 1
        return _progress_postfix(counts)

    def on_error(task_id: str, exc: BaseException) -> dict[str, Any]:
        failures.append(f"{task_id}: {type(exc).__name__}: {exc}")
        return {"task_id": task_id, "accepted": False, "reason": f"crash:{type(exc).__name__}",
                "filter": None, "metrics": {}, "seconds": {}, "worker": None, "start_s": 0.0}

    items = [(t, (t, c)) for t, c in zip(todo["task_id"], todo["code"], strict=True)]
    try:
        dispatch(handle.client, items, verdict_task, on_result, on_error, window=max(4, 4 * handle.slots),
                 key_prefix=f"verdict-{ledger.fingerprint}", desc="filter", unit="task", progress=progress,
                 workers=handle.filter_workers)
    finally:
        fetch_logs(handle.client, run_dir / "logs")


def _corpus_verdicts(tasks: pd.DataFrame, settings: FilterSettings, progress: bool
                     ) -> tuple[dict[int, dict], dict[str, dict]]:
    """Run the corpus filters (``duplicate``) over all rows on the client. Returns (row -> record of each
    rejected row, in the ledger's record shape; filter name -> {"ran": rows, "seconds": total}).
    Deterministic in the input, so recomputed on every (re-)run."""
    scan = CorpusScan(settings, progress)
    scan.add(tasks)
    return scan.rejected, scan.stats


# Fingerprints of the duplicate filter (filters.duplicate.fingerprint) by the SHA-1 of the source: a run
# scores the same rows again at every round (and a stream once more at its end); at most this many are kept.
_FINGERPRINTS: dict[bytes, object] = {}
FINGERPRINT_CACHE_ROWS = 200_000


# A batch holding at least this many sources not fingerprinted yet is fingerprinted on the cluster's CPU workers,
# FINGERPRINT_CHUNK sources per Dask task, instead of on the client (about 1.7 ms a source on cpu-2core): a
# resumed run reads each finished round (thousands of rows) at once. Reading back 11 rounds (33,000 candidates)
# took 114 s on cpu-2core, half of it fingerprints, and 141 s on a 4 x H200 host before the filter got its
# first new task (2026-11-27).
PARALLEL_FINGERPRINT_ROWS, FINGERPRINT_CHUNK = 600, 250


def _fingerprint_chunk(codes: list[str]) -> list:
    """``filters.duplicate.fingerprint`` of each source (runs on a Dask worker)."""
    from opforge.filters.duplicate import fingerprint

    return [fingerprint(code) for code in codes]


def prefill_fingerprints(client, workers: list[str], codes) -> int:
    """Fingerprint the sources of ``codes`` not in the client's cache on ``workers`` (Dask addresses) and cache
    them, when there are at least ``PARALLEL_FINGERPRINT_ROWS`` of them and any workers; a chunk whose task
    fails is left to the client (``_fingerprints`` computes what is missing). Returns how many were cached."""
    todo: dict[bytes, str] = {}
    for code in codes:
        if isinstance(code, str):
            key = _fingerprint_key(code)
            if key not in _FINGERPRINTS:
                todo.setdefault(key, code)
    if len(todo) < PARALLEL_FINGERPRINT_ROWS or not workers:
        return 0
    keys, sources = list(todo), list(todo.values())
    starts = range(0, len(keys), FINGERPRINT_CHUNK)
    futures = [client.submit(_fingerprint_chunk, sources[i:i + FINGERPRINT_CHUNK], workers=list(workers),
                             pure=False) for i in starts]
    cached = 0
    for i, future in zip(starts, futures, strict=True):
        try:
            fps = future.result()
        except Exception:  # noqa: BLE001 - a lost worker: the client fingerprints these itself
            continue
        for key, fp in zip(keys[i:i + FINGERPRINT_CHUNK], fps, strict=True):
            _cache_fingerprint(key, fp)
        cached += len(fps)
    return cached


def cache_fingerprints(codes: list[str | None], fps: list) -> None:
    """Keep the duplicate filter's fingerprints ``fps`` (``filters.duplicate.fingerprint``, computed elsewhere,
    e.g. by the composer shards) of the sources ``codes``, so the client's corpus scan does not compute them;
    pairs with no source or no fingerprint (a composer index no graph fits) are skipped."""
    for code, fp in zip(codes, fps, strict=True):
        if isinstance(code, str) and fp is not None:
            _cache_fingerprint(_fingerprint_key(code), fp)


def _fingerprint_key(code: str) -> bytes:
    """The key of ``code``'s fingerprint in ``_FINGERPRINTS`` (the SHA-1 of the source)."""
    return hashlib.sha1(code.encode()).digest()


def _cache_fingerprint(key: bytes, fp) -> None:
    """Keep ``fp`` under ``key``, emptying the cache first when it holds ``FINGERPRINT_CACHE_ROWS``."""
    if len(_FINGERPRINTS) >= FINGERPRINT_CACHE_ROWS:
        _FINGERPRINTS.clear()
    _FINGERPRINTS[key] = fp


def _fingerprints(codes: list) -> list:
    from opforge.filters.duplicate import fingerprint

    out = []
    for code in codes:
        if not isinstance(code, str):
            out.append(None)
            continue
        key = _fingerprint_key(code)
        fp = _FINGERPRINTS.get(key)
        if fp is None:
            fp = fingerprint(code)
            _cache_fingerprint(key, fp)
        out.append(fp)
    return out


class CorpusScan:
    """The corpus filters over rows that arrive in input order (``add``): each filter sees the rows no earlier
    corpus filter rejected and decides a row from the rows before it (``DuplicateFilter.scanner``), so adding
    the input in pieces rejects the same rows as adding it at once.

    Attributes:
        rejected: input row -> record of each rejected row (the ledger's record shape, ``worker="client"``).
        stats: filter name -> {"ran": rows, "seconds": total}.
    """

    def __init__(self, settings: FilterSettings, progress: bool = False):
        self.filters = make_corpus_filters(settings)
        self.scanners = [f.scanner() if hasattr(f, "scanner") else None for f in self.filters]
        self.seen: list[list[int]] = [[] for _ in self.filters]  # per filter: input row of each row scanned
        self.codes: list[list] = [[] for _ in self.filters]  # per filter without a scanner: the codes so far
        self.rejected: dict[int, dict] = {}
        self.stats: dict[str, dict] = {f.name: {"ran": 0, "seconds": 0.0} for f in self.filters}
        self.progress = progress

    def add(self, tasks: pd.DataFrame) -> dict[int, dict]:
        """Scan ``tasks`` (``row``, ``code``; rows after every row added before). Returns the records of the
        rows of ``tasks`` rejected."""
        new: dict[int, dict] = {}
        for f, scanner, seen, codes in zip(self.filters, self.scanners, self.seen, self.codes, strict=True):
            t0 = time.perf_counter()
            live = tasks[~tasks["row"].isin(self.rejected)]
            batch = list(live["code"])
            if scanner is not None:
                fps = _fingerprints(batch) if f.name == "duplicate" else None
                verdicts = [f.decide(m) for m in scanner.scan(batch, self.progress, fps)]
            else:  # a corpus filter without a scanner: run again over everything it has seen
                codes.extend(batch)
                verdicts = f.run_corpus(codes, progress=self.progress)[len(codes) - len(batch):]
            seen.extend(int(r) for r in live["row"])
            secs = time.perf_counter() - t0
            self.stats[f.name]["ran"] += len(live)
            self.stats[f.name]["seconds"] += secs
            per_row = secs / max(1, len(live))
            for row, v in zip(live["row"], verdicts, strict=True):
                if not v.accepted:
                    metrics = dict(v.metrics)
                    if "duplicate_of" in metrics:  # position among the rows this filter saw -> input row
                        metrics["duplicate_of"] = seen[metrics["duplicate_of"]]
                    self.rejected[int(row)] = new[int(row)] = {
                        "accepted": False, "reason": v.reason, "filter": f.name, "metrics": {f.name: metrics},
                        "seconds": {f.name: per_row}, "worker": "client"}
        return new


def _verdict_table(tasks: pd.DataFrame, ledger: Ledger, corpus: dict[int, dict],
                   table_rows: dict[str, dict] | None = None) -> pd.DataFrame:
    """One row per input row with a verdict: its corpus record, else its ledger record. ``table_rows`` (task id
    -> the table fields of its ledger record), when given, keeps what is derived from ledger records between
    calls (a stream builds the table of a growing input once a round; a ledger record never changes)."""
    recs = []
    for row, task_id in zip(tasks["row"], tasks["task_id"], strict=True):
        rec = corpus.get(int(row))
        if rec is not None:
            recs.append({"row": int(row), "task_id": task_id, **_table_fields(rec)})
            continue
        fields = table_rows.get(task_id) if table_rows is not None else None
        if fields is None:
            rec = ledger.done.get(task_id)
            if rec is None:
                continue
            fields = _table_fields(rec)
            if table_rows is not None:
                table_rows[task_id] = fields
        recs.append({"row": int(row), "task_id": task_id, **fields})
    return pd.DataFrame(recs, columns=["row", "task_id", "accepted", "reason", "filter", "metrics", "eager_ms",
                                       "compile_s", "compile_ms", "roofline_ms", "fusion_gain",
                                       "kernelbench_nearest", "kernelbench_similarity", "seconds", "worker"])


def _table_fields(rec: dict[str, Any]) -> dict[str, Any]:
    """The verdict table's fields of one ledger or corpus record (less ``row`` and ``task_id``)."""
    metrics = rec.get("metrics", {})
    kb = metrics.get("contamination", {})
    return {"accepted": bool(rec["accepted"]), "reason": rec["reason"], "filter": rec["filter"],
            "metrics": json.dumps(metrics, sort_keys=True),
            "eager_ms": _num(metrics.get("runtime", {}).get("eager_ms")),
            "compile_s": _num(metrics.get("compile", {}).get("compile_s")),
            "compile_ms": _num(metrics.get("runtime", {}).get("compile_ms")),
            "roofline_ms": _num(metrics.get("roofline", {}).get("roofline_ms")),
            "fusion_gain": _num(metrics.get("roofline", {}).get("fusion_gain")),
            "kernelbench_nearest": kb.get("kernelbench_nearest"),
            "kernelbench_similarity": _num(kb.get("kernelbench_similarity")),
            "seconds": float(sum(rec.get("seconds", {}).values())), "worker": rec.get("worker")}


def _num(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) else None


def _funnel(tasks, verdicts, ledger, corpus, corpus_stats, wall, ran, skipped, settings, env, fp
            ) -> dict[str, Any]:
    """Counts per task: each corpus-rejected row is one task, then each distinct task_id of the rest."""
    live = tasks[~tasks["row"].isin(corpus)]
    recs = list(corpus.values()) + [ledger.done[t] for t in dict.fromkeys(live["task_id"]) if t in ledger.done]
    by_filter = {}
    for name in FILTER_NAMES:
        secs = [r["seconds"][name] for r in recs if name in r.get("seconds", {})]
        n, total = len(secs), sum(secs)
        if name in corpus_stats:  # scored once over all rows on the client
            n, total = corpus_stats[name]["ran"], corpus_stats[name]["seconds"]
        by_filter[name] = {"ran": n, "rejected": sum(1 for r in recs if r["filter"] == name and
                                                     not r["accepted"]),
                           "seconds_total": round(total, 3),
                           "seconds_mean": round(total / n, 4) if n else None}
    reasons = Counter(r["reason"] for r in recs if not r["accepted"])
    start_total = sum(r.get("start_s", 0.0) for r in recs)
    waits: Counter = Counter()
    for r in recs:
        waits.update(r.get("lock_wait_s", {}))
    return {
        "input_rows": len(tasks), "unique_tasks": int(tasks["task_id"].nunique()),
        "verdicted_rows": len(verdicts), "accepted_tasks": sum(1 for r in recs if r["accepted"]),
        "rejected_tasks": sum(1 for r in recs if not r["accepted"]),
        "accepted_rows": int(verdicts["accepted"].sum()) if len(verdicts) else 0,
        "by_reason": dict(Counter(r.split(":")[0] for r in reasons.elements()).most_common()),
        "by_reason_detail": dict(reasons.most_common()),
        "by_filter": by_filter, "sandbox_start_s_total": round(start_total, 3),
        "gpu_lock_wait_s_total": {k: round(v, 3) for k, v in sorted(waits.items())},
        "oom_rerun_alone": sum(1 for r in recs if r.get("retried_alone")),
        "ran_this_time": ran, "resumed_from_ledger": skipped, "wall_s": round(wall, 3),
        "tasks_per_min": round(60 * ran / wall, 2) if ran and wall else None,
        "truncated_ledger_lines": ledger.truncated_lines,
        "fingerprint": fp, "environment": env, "settings": json.loads(settings.model_dump_json()),
    }


def format_funnel(f: dict[str, Any]) -> str:
    """Human-readable funnel table for the terminal."""
    lines = [f"input rows {f['input_rows']}  unique tasks {f['unique_tasks']}  accepted {f['accepted_tasks']}"
             f"  rejected {f['rejected_tasks']}  (resumed {f['resumed_from_ledger']}, ran {f['ran_this_time']}"
             f" in {f['wall_s']:.1f} s, {f['tasks_per_min'] or 0:.1f} tasks/min)"]
    lines.append(f"{'filter':<12}{'ran':>8}{'rejected':>10}{'total s':>11}{'mean s':>9}")
    for name, d in f["by_filter"].items():
        mean = f"{d['seconds_mean']:.3f}" if d["seconds_mean"] is not None else "-"
        lines.append(f"{name:<12}{d['ran']:>8}{d['rejected']:>10}{d['seconds_total']:>11.1f}{mean:>9}")
    lines.append("rejections by reason:")
    lines += [f"  {k:<40}{v:>7}" for k, v in f["by_reason_detail"].items()]
    return "\n".join(lines)
