"""Evaluate many (task, solution) pairs in parallel on Dask workers, resumably.

Used by ``opforge eval`` (a directory of solutions) and by ``harness.rl`` (a batch of completions). Each
evaluation already runs its build and checks in child processes, so a worker thread per evaluation is
enough; on CUDA the cluster has one worker per GPU (``pipeline.cluster.open_cluster``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from opforge.harness.evaluate import EvalConfig, EvalResult, evaluate
from opforge.harness.solution import Solution


def evaluate_one(task: dict[str, Any], files: dict[str, str], config_json: str,
                 build_root: str | None = None, alone: bool = False) -> dict[str, Any]:
    """Dask task: ``evaluate`` one solution given as files (``alone``: with the whole GPU, see
    ``harness.evaluate``); returns the ``EvalResult`` as a dict."""
    config = EvalConfig.model_validate_json(config_json)
    try:
        solution = Solution(files, origin=str(task.get("task_id")))
    except ValueError as exc:
        return EvalResult(task_id=str(task["task_id"]), data_source=task.get("data_source"), status="load_error",
                          reward=-1.0, error=str(exc), device=config.device).model_dump()
    return evaluate(task, solution, config, build_root=build_root, alone=alone).model_dump()


def evaluate_many(pairs: list[tuple[dict[str, Any], dict[str, str]]], config: EvalConfig, client=None,
                  results_path: str | Path | None = None, build_root: str | None = None,
                  progress: bool = True, workers: int | None = None) -> list[dict[str, Any]]:
    """Evaluate ``(task row, solution files)`` pairs; results in input order.

    With ``results_path`` (JSONL), results already there (same ``task_id``) are reused and new ones are
    appended as they finish, so a killed run resumes. ``client``: a ``distributed.Client`` (default: a
    local cluster for ``config.device`` with ``workers`` evaluations at once - on CUDA per GPU, default 4 -
    closed afterwards). An evaluation that ran out of GPU memory next to others (status ``oom``) is not
    recorded but run again alone on its GPU once all others are done; its second result is final.
    """
    from distributed import as_completed
    from tqdm.auto import tqdm

    done: dict[str, dict] = {}
    if results_path is not None and Path(results_path).exists():
        for line in Path(results_path).read_text().splitlines():
            try:
                rec = json.loads(line)
                done[rec["task_id"]] = rec
            except (json.JSONDecodeError, KeyError):
                continue  # a line cut by a kill
    todo = [(i, t, f) for i, (t, f) in enumerate(pairs) if str(t["task_id"]) not in done]
    results: dict[int, dict] = {i: done[str(t["task_id"])] for i, (t, _) in enumerate(pairs)
                                if str(t["task_id"]) in done}
    handle = None
    if todo and client is None:
        from opforge.pipeline.cluster import open_cluster

        handle = open_cluster(config.device, workers or (4 if config.device == "cuda" else None))
        client = handle.client
    try:
        if todo:
            out = open(results_path, "a") if results_path else None  # noqa: SIM115
            bar = tqdm(total=len(todo), desc="eval", unit="solution", disable=not progress)

            def submit(batch, alone: bool) -> dict:
                return {client.submit(evaluate_one, t, f, config.model_dump_json(), build_root, alone,
                                      pure=False): (i, t, f) for i, t, f in batch}

            futures, alone = submit(todo, False), False
            while futures:
                retry = []
                for fut in as_completed(futures):
                    res = fut.result()
                    i, t, f = futures[fut]
                    if res.get("status") == "oom" and not alone and config.device == "cuda":
                        retry.append((i, t, f))
                        continue
                    results[i] = res
                    if out:
                        out.write(json.dumps(res) + "\n")
                        out.flush()
                    bar.update(1)
                futures, alone = submit(retry, True), True
            bar.close()
            if out:
                out.close()
    finally:
        if handle is not None:
            handle.close()
    return [results[i] for i in range(len(pairs))]
