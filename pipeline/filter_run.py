"""``opforge filter``: verdict every task of an input file on a Dask cluster, resumably.

Input: JSONL or Parquet with a ``code`` column and optional ``task_id`` (kept as given), ``ops``,
``data_source``; other columns are ignored. Rows with the same ``task_id`` are run once and share the
verdict. Output in ``RUN_DIR``: ``ledger.jsonl`` (appended as results arrive; what makes a re-run resume),
``verdicts.parquet`` (one row per input row, input order) and ``funnel.json``.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from distributed import get_worker
from opforge.engine.cluster import ClusterHandle, open_cluster, usable_cores
from opforge.engine.dispatch import dispatch
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

    Returns the ``run_chain`` dict plus ``task_id``, ``worker`` and ``start_s``.
    """
    pool = pool_of_worker()
    code = code if isinstance(code, str) else ""
    with pool.sandbox() as box:
        result = box.run(task_id, code, timeout_s=box.settings["timeout_s"], alone=alone, reserve_gib=reserve_gib)
    return {**result, "task_id": task_id, "worker": str(get_worker().name)}


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
    verdicts = _verdict_table(tasks, ledger, corpus)
    funnel = _funnel(tasks, verdicts, ledger, corpus, corpus_stats, wall, len(todo), skipped, settings, env, fp)
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
                 key_prefix=f"verdict-{ledger.fingerprint}", desc="filter", unit="task", progress=progress)
    finally:
        fetch_logs(handle.client, run_dir / "logs")


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
            "roofline_ms": _num(metrics.get("roofline", {}).get("roofline_ms")),
            "fusion_gain": _num(metrics.get("roofline", {}).get("fusion_gain")),
            "kernelbench_nearest": kb.get("kernelbench_nearest"),
            "kernelbench_similarity": _num(kb.get("kernelbench_similarity")),
            "seconds": float(sum(rec.get("seconds", {}).values())), "worker": rec.get("worker"),
        })
    return pd.DataFrame(recs, columns=["row", "task_id", "accepted", "reason", "filter", "metrics", "eager_ms",
                                       "compile_s", "compile_ms", "roofline_ms", "fusion_gain",
                                       "kernelbench_nearest", "kernelbench_similarity", "seconds", "worker"])


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
