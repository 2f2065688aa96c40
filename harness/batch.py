"""Evaluate many (task, solution) pairs in parallel on Dask workers, resumably.

Used by ``opforge eval`` (a directory of solutions) and by ``harness.rl`` (a batch of completions). Each
evaluation already runs its build and checks in child processes, so a worker thread per evaluation is
enough; on CUDA the cluster has one worker per GPU (``engine.cluster.open_cluster``). Dispatch and the
``oom`` rule are the engine's (``engine.dispatch``); results go to the engine's ledger
(``engine.ledger``), keyed by the task id and the hash of the task's code and the solution's files, under
the fingerprint of the ``EvalConfig`` and the environment: a re-run resumes what is unchanged and
evaluates again what changed (the solution, the task, a setting, a library).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from opforge.engine.ledger import Ledger, content_hash, environment, fingerprint
from opforge.harness.evaluate import GRADER_VERSION, EvalConfig, EvalResult, evaluate
from opforge.harness.solution import Solution


def evaluate_one(task: dict[str, Any], files: dict[str, str], config_json: str,
                 build_root: str | None = None, alone: bool = False, reserve_gib: float | None = None
                 ) -> dict[str, Any]:
    """Dask task: ``evaluate`` one solution given as files (``alone``: with the whole GPU, see
    ``harness.evaluate``; ``reserve_gib`` is the dispatcher's and unused here); returns the
    ``EvalResult`` as a dict, with ``retry_alone`` when it ran out of GPU memory next to others."""
    config = EvalConfig.model_validate_json(config_json)
    try:
        solution = Solution(files, origin=str(task.get("task_id")))
    except ValueError as exc:
        return EvalResult(task_id=str(task["task_id"]), data_source=task.get("data_source"), status="load_error",
                          reward=-1.0, error=str(exc), device=config.device).model_dump()
    result = evaluate(task, solution, config, build_root=build_root, alone=alone).model_dump()
    if result["status"] == "oom" and not alone and config.device == "cuda":
        result["retry_alone"] = True
    return result


def eval_fingerprint(config: EvalConfig) -> str:
    """Fingerprint of an evaluation's results: every ``EvalConfig`` field, the grader's version and the
    environment (``engine.ledger.environment``)."""
    return fingerprint({**environment(config.device), "grader": GRADER_VERSION}, config.model_dump(mode="json"))


def result_key(task: dict[str, Any], files: dict[str, str]) -> str:
    """Ledger key of one evaluation: ``TASK_ID-HASH``, HASH over the task's code and the solution's files."""
    return f"{task['task_id']}-{content_hash(task.get('code'), files)}"


def evaluate_many(pairs: list[tuple[dict[str, Any], dict[str, str]]], config: EvalConfig, client=None,
                  results_path: str | Path | None = None, build_root: str | None = None,
                  progress: bool = True, workers: int | None = None,
                  scheduler: str | None = None) -> list[dict[str, Any]]:
    """Evaluate ``(task row, solution files)`` pairs; results in input order.

    With ``results_path`` (JSONL, an ``engine.ledger.Ledger``), results already there under the same key
    (``result_key``) and fingerprint (``eval_fingerprint``) are reused and new ones are appended as they
    finish, so a killed run resumes and a changed solution, task or setting is evaluated again.
    ``client``: a ``distributed.Client`` (default: the cluster of ``engine.cluster.open_cluster`` for
    ``config.device`` with ``workers`` evaluations at once - on CUDA per GPU, default 4 - or the one at
    ``scheduler``; closed afterwards). An evaluation that ran out of GPU memory next to others (status
    ``oom``) is not recorded but run again alone on its GPU once all others are done; its second result is
    final.
    """
    from opforge.engine.dispatch import dispatch

    keys = [result_key(t, f) for t, f in pairs]
    ledger = Ledger(results_path, eval_fingerprint(config), key="key") if results_path is not None else None
    done = dict(ledger.done) if ledger is not None else {}
    fresh: dict[str, dict] = {}
    todo = {k: (t, f) for k, (t, f) in zip(keys, pairs, strict=True) if k not in done}
    handle = None
    if todo and client is None:
        from opforge.engine.cluster import open_cluster

        handle = open_cluster(config.device, workers or (4 if config.device == "cuda" else None), scheduler)
        client = handle.client
    config_json = config.model_dump_json()

    def on_result(key: str, result: dict[str, Any]) -> None:
        record = {**result, "key": key}
        fresh[key] = record
        if ledger is not None:
            ledger.append(record)

    def on_error(key: str, exc: BaseException) -> dict[str, Any]:
        task = todo[key][0]
        return EvalResult(task_id=str(task["task_id"]), data_source=task.get("data_source"), status="crash",
                          reward=-1.0, error=f"{type(exc).__name__}: {str(exc)[:300]}",
                          device=config.device).model_dump()

    try:
        if todo:
            items = [(k, (t, f, config_json, build_root)) for k, (t, f) in todo.items()]
            window = max(4, 2 * sum(client.nthreads().values()))
            dispatch(client, items, evaluate_one, on_result, on_error, window=window,
                     key_prefix=f"eval-{eval_fingerprint(config)}", desc="eval", unit="solution",
                     progress=progress)
    finally:
        if ledger is not None:
            ledger.close()
        if handle is not None:
            handle.close()
    out = []
    for k in keys:
        rec = dict(fresh.get(k) or done[k])
        rec.pop("key", None)
        rec.pop("fingerprint", None)
        out.append(rec)
    return out
