"""``opforge filter``: verdict every task of an input file on a Dask cluster, resumably.

Input: JSONL or Parquet with a ``code`` column and optional ``task_id`` (kept as given), ``ops``,
``data_source``; other columns are ignored. Rows with the same ``task_id`` are run once and share the
verdict. Output in ``RUN_DIR``: ``ledger.jsonl`` (appended as results arrive; what makes a re-run resume),
``verdicts.parquet`` (one row per input row, input order) and ``funnel.json``.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from distributed import as_completed, get_worker
from opforge.filters.chain import FILTER_NAMES, FilterSettings, check_thresholds, make_corpus_filters
from opforge.filters.sandbox import Sandbox
from opforge.pipeline.cluster import ClusterHandle, open_cluster, usable_cores
from opforge.pipeline.ledger import Ledger, environment, fingerprint
from opforge.task.task_file import InputError, read_tasks  # noqa: F401 - InputError is part of this API
from tqdm.auto import tqdm

# -- worker side --------------------------------------------------------------------------------------
_SANDBOXES: dict[tuple[int, str], Sandbox] = {}
_LOCK = threading.Lock()


def _sandbox(settings_json: str, log_dir: str | None) -> Sandbox:
    key = (threading.get_ident(), settings_json)
    with _LOCK:
        box = _SANDBOXES.get(key)
        if box is None:
            for k in [k for k in _SANDBOXES if k[0] == key[0]]:  # settings changed: replace this thread's
                _SANDBOXES.pop(k).close()
            log = Path(log_dir) / f"sandbox-{threading.get_ident()}.log" if log_dir else None
            box = _SANDBOXES[key] = Sandbox(json.loads(settings_json), log_path=log)
    return box


def verdict_task(task_id: str, code: Any, settings_json: str, log_dir: str | None = None,
                 alone: bool = False, reserve_gib: float | None = None) -> dict[str, Any]:
    """Dask task: run the filter chain on one task in this worker thread's sandbox child (``alone``: with
    no other task on its GPU; ``reserve_gib``: its GPU memory reservation; both for ``oom`` re-runs).

    Returns the ``run_chain`` dict plus ``task_id``, ``worker`` and ``start_s``.
    """
    box = _sandbox(settings_json, log_dir)
    code = code if isinstance(code, str) else ""
    result = box.run(task_id, code, timeout_s=box.settings["timeout_s"], alone=alone, reserve_gib=reserve_gib)
    try:
        worker = get_worker().name
    except ValueError:
        worker = "local"
    return {**result, "task_id": task_id, "worker": str(worker)}


def warm_sandbox(settings_json: str, log_dir: str | None = None) -> dict[str, Any]:
    """Dask task: start this worker thread's sandbox child now (importing torch, the CUDA context and, on
    CUDA, a first small compile: see ``filters.sandbox_child``), so that the first ``verdict_task`` on this
    thread finds it ready. Returns ``{"start_s": seconds, "error": None or the SandboxError text}``."""
    box = _sandbox(settings_json, log_dir)
    try:
        return {"start_s": box.start(), "error": None}
    except RuntimeError as exc:  # SandboxError: the task that needs this sandbox tries again and reports it
        return {"start_s": box.start_seconds, "error": str(exc)[:300]}


# -- client side --------------------------------------------------------------------------------------
def prepare_settings(settings: FilterSettings, run_dir: str | Path, handle: ClusterHandle | None = None,
                     progress: bool = True) -> FilterSettings:
    """The settings the sandboxes of a filter run in ``run_dir`` get: with ``contamination``, the KernelBench
    index located (built once and cached, copied to ``RUN_DIR/kernelbench_index.pkl``); on CPU with an open
    cluster ``handle``, ``cpu_threads`` set to this machine's cores per sandbox. Fields already set are
    kept, so ``run_filter`` given the result computes the same settings (and reuses warm sandboxes).

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


def warm_sandboxes(handle: ClusterHandle, settings: FilterSettings, run_dir: str | Path) -> list:
    """Start the sandbox children of every worker thread of ``handle`` in the background (``warm_sandbox``,
    one Dask task per thread), for a filter run in ``run_dir`` with ``settings`` (from ``prepare_settings``).
    Returns the futures: keep them until the filter stage has started (a released future is cancelled).
    ``opforge run`` calls this before composing, so the children start while the composer works."""
    log_dir = Path(run_dir) / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    settings_json = settings.model_dump_json()
    futures = []
    for address, threads in handle.client.nthreads().items():  # each thread of each worker: one start
        futures += [handle.client.submit(warm_sandbox, settings_json, str(log_dir), key=f"warm-sandbox-{address}-{i}",
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
        workers / scheduler: cluster shape, see ``pipeline.cluster.open_cluster``.
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
    verdicts = _verdict_table(tasks, ledger, corpus)
    funnel = _funnel(tasks, verdicts, ledger, corpus, corpus_stats, wall, len(todo), skipped, settings, env, fp)
    verdicts.to_parquet(run_dir / "verdicts.parquet", index=False)
    (run_dir / "funnel.json").write_text(json.dumps(funnel, indent=2, sort_keys=True))
    return FilterRunResult(verdicts, funnel, run_dir, skipped, failures)


def _drive(handle: ClusterHandle, todo: pd.DataFrame, settings: FilterSettings, ledger: Ledger,
           run_dir: Path, progress: bool, failures: list[str]) -> None:
    """Keep ``window`` verdict futures in flight; ledger each result as it arrives. A GPU ``oom`` result
    with ``retry_gib`` is not ledgered: the task is submitted again at once, reserving that much GPU memory
    (it runs next to others as soon as that fits); one marked ``retry_alone`` (the re-run ran out of
    memory too) is run again alone on its GPU after all others (one drain at the end instead of one per
    oom). A run killed before that re-runs such tasks from scratch."""
    settings_json = settings.model_dump_json()
    log_dir = run_dir / "logs"
    log_dir.mkdir(exist_ok=True)
    window = max(4, 4 * handle.slots)  # futures in flight: keeps workers busy, bounds client memory
    code_of = dict(zip(todo["task_id"], todo["code"], strict=True))
    queue = iter(todo["task_id"])
    retries: list[str] = []
    counts: Counter = Counter()
    bar = tqdm(total=len(todo), desc="filter", unit="task", disable=not progress, dynamic_ncols=True)

    task_of: dict[str, str] = {}

    def submit(task_id: str, alone: bool = False, reserve_gib: float | None = None):
        key = f"verdict-{task_id}-{ledger.fingerprint}" + ("-alone" if alone else "") + \
            ("-reserved" if reserve_gib else "")
        future = handle.client.submit(verdict_task, task_id, code_of[task_id], settings_json, str(log_dir),
                                      alone, reserve_gib, key=key, pure=False)
        task_of[future.key] = task_id
        return future

    def next_future():
        for task_id in queue:
            return submit(task_id)
        return None

    pending = as_completed([f for f in (next_future() for _ in range(window)) if f is not None])
    for future in pending:
        try:
            result = future.result()
        except Exception as exc:  # noqa: BLE001 - a lost worker (KilledWorker...) is this task's crash
            task_id = task_of[future.key]
            failures.append(f"{task_id}: {type(exc).__name__}: {exc}")
            result = {"task_id": task_id, "accepted": False, "reason": f"crash:{type(exc).__name__}",
                      "filter": None, "metrics": {}, "seconds": {}, "worker": None, "start_s": 0.0}
        reserve = result.pop("retry_gib", None)
        if reserve:
            pending.add(submit(result["task_id"], reserve_gib=reserve))
            continue  # the re-run takes this slot; the next new task comes when a verdict frees one
        if result.pop("retry_alone", False):
            retries.append(result["task_id"])
        else:
            ledger.append(result)
            counts["accepted" if result["accepted"] else result["reason"].split(":")[0]] += 1
            bar.update(1)
            bar.set_postfix({**_progress_postfix(counts), "deferred": len(retries)}, refresh=False)
        nxt = next_future()
        if nxt is not None:
            pending.add(nxt)
        elif pending.is_empty() and retries:  # everything else is done: the GPU can be had alone
            pending.update([submit(t, alone=True) for t in retries])
            retries = []
    bar.close()


def _corpus_verdicts(tasks: pd.DataFrame, settings: FilterSettings, progress: bool
                     ) -> tuple[dict[int, dict], dict[str, dict]]:
    """Run the corpus filters (``duplicate``) over all rows on the client. Returns (row -> record of each
    rejected row, in the ledger's record shape; filter name -> {"ran": rows, "seconds": total}).
    Deterministic in the input, so recomputed on every (re-)run."""
    out: dict[int, dict] = {}
    stats: dict[str, dict] = {}
    for f in make_corpus_filters(settings):
        t0 = time.perf_counter()
        live = tasks[~tasks["row"].isin(out)]
        verdicts = f.run_corpus(list(live["code"]), progress=progress)
        stats[f.name] = {"ran": len(live), "seconds": time.perf_counter() - t0}
        per_row = stats[f.name]["seconds"] / max(1, len(live))
        for row, v in zip(live["row"], verdicts, strict=True):
            if not v.accepted:
                metrics = dict(v.metrics)
                if "duplicate_of" in metrics:  # position among the live rows -> input row number
                    metrics["duplicate_of"] = int(live["row"].iloc[metrics["duplicate_of"]])
                out[int(row)] = {"accepted": False, "reason": v.reason, "filter": f.name,
                                 "metrics": {f.name: metrics}, "seconds": {f.name: per_row}, "worker": "client"}
    return out, stats


def _verdict_table(tasks: pd.DataFrame, ledger: Ledger, corpus: dict[int, dict]) -> pd.DataFrame:
    recs = []
    for row, task_id in zip(tasks["row"], tasks["task_id"], strict=True):
        rec = corpus.get(int(row)) or ledger.done.get(task_id)
        if rec is None:
            continue
        metrics = rec.get("metrics", {})
        kb = metrics.get("contamination", {})
        recs.append({
            "row": int(row), "task_id": task_id, "accepted": bool(rec["accepted"]), "reason": rec["reason"],
            "filter": rec["filter"], "metrics": json.dumps(metrics, sort_keys=True),
            "eager_ms": _num(metrics.get("runtime", {}).get("eager_ms")),
            "compile_s": _num(metrics.get("compile", {}).get("compile_s")),
            "compile_ms": _num(metrics.get("runtime", {}).get("compile_ms")),
            "kernelbench_nearest": kb.get("kernelbench_nearest"),
            "kernelbench_similarity": _num(kb.get("kernelbench_similarity")),
            "seconds": float(sum(rec.get("seconds", {}).values())), "worker": rec.get("worker"),
        })
    return pd.DataFrame(recs, columns=["row", "task_id", "accepted", "reason", "filter", "metrics", "eager_ms",
                                       "compile_s", "compile_ms", "kernelbench_nearest",
                                       "kernelbench_similarity", "seconds", "worker"])


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
