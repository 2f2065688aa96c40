"""Many episodes of ``harness.env.KernelEnv`` at once: one environment per episode, driven by an agent in a
thread of this process, every heavy step on the Dask cluster's workers (``engine.cluster.open_cluster``:
one worker process per GPU on CUDA, with one thread per concurrent evaluation), the way a trainer runs its
rollouts.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any

import pandas as pd
from opforge.harness.env import EnvConfig, KernelEnv

Agent = Callable[[KernelEnv, str], None]


def run_episode(agent: Agent, task_id: str, tasks: pd.DataFrame, config: EnvConfig, client=None,
                build_root: str | None = None) -> dict[str, Any]:
    """One episode: ``reset(task_id)``, ``agent(env, prompt)``, ``final_reward()``; the workspace is deleted
    afterwards. Returns ``task_id``, ``agent`` (its ``__name__``), ``reward``, ``status`` (the final result's,
    ``not_graded`` without one), ``turns``, ``seconds`` (wall), ``tools`` (the call history) and ``error``
    (an exception of the agent itself, which scores -1)."""
    env = KernelEnv(tasks, config, client=client, build_root=build_root)
    t0 = time.perf_counter()
    error = None
    try:
        prompt = env.reset(task_id)
        try:
            agent(env, prompt)
        except Exception as exc:  # noqa: BLE001 - a broken agent is this episode's outcome, not the run's
            error = f"{type(exc).__name__}: {exc}"
        reward = env.final_reward() if error is None else -1.0
        return {"task_id": str(task_id), "agent": getattr(agent, "__name__", "agent"), "reward": reward,
                "status": (env.result or {}).get("status", "not_graded"), "turns": env.turns,
                "seconds": time.perf_counter() - t0, "tools": env.history, "error": error}
    finally:
        env.close()


def run_episodes(agents: Sequence[Agent], task_ids: Sequence[str], tasks: pd.DataFrame, config: EnvConfig,
                 client=None, parallel: int = 64, workers: int | None = None, build_root: str | None = None,
                 progress: bool = True, on_result: Callable[[int, dict[str, Any]], None] | None = None
                 ) -> list[dict[str, Any]]:
    """Episode ``i`` runs ``agents[i]`` on ``task_ids[i]``, ``parallel`` episodes at once; results in input order
    (``run_episode``'s dicts). ``client``: a ``distributed.Client`` (default: a cluster for ``config.device``
    with ``workers`` evaluations at once - on CUDA per GPU, default ``engine.cluster.default_workers`` - closed
    afterwards). ``on_result(i, result)`` is called as each episode ends (e.g. to keep what finished when a
    time-limited run is cut).

    Raises:
        ValueError: ``agents`` and ``task_ids`` differ in length.
    """
    from tqdm.auto import tqdm

    if len(agents) != len(task_ids):
        raise ValueError(f"{len(agents)} agents for {len(task_ids)} task ids")
    handle = None
    if client is None:
        from opforge.engine.cluster import open_cluster

        handle = open_cluster(config.device, workers)
        client = handle.client
    results: dict[int, dict[str, Any]] = {}
    try:
        with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool, \
                tqdm(total=len(agents), desc="episodes", unit="episode", disable=not progress) as bar:
            futures = {pool.submit(run_episode, a, t, tasks, config, client, build_root): i
                       for i, (a, t) in enumerate(zip(agents, task_ids, strict=True))}
            for fut in as_completed(futures):
                results[futures[fut]] = fut.result()
                if on_result is not None:
                    on_result(futures[fut], results[futures[fut]])
                bar.update(1)
    finally:
        if handle is not None:
            handle.close()
    return [results[i] for i in range(len(agents))]


def episode_summary(results: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
    """Episodes, episodes per minute over ``seconds`` of wall time, reward distribution (count per value,
    mean), statuses, and per agent the mean reward; turn and episode-time medians."""
    import statistics

    rewards = [float(r["reward"]) for r in results]
    per_agent: dict[str, list[float]] = {}
    for r in results:
        per_agent.setdefault(r["agent"], []).append(float(r["reward"]))
    statuses: dict[str, int] = {}
    for r in results:
        statuses[r["status"]] = statuses.get(r["status"], 0) + 1
    return {
        "episodes": len(results), "seconds": round(seconds, 2),
        "episodes_per_min": round(60.0 * len(results) / seconds, 2) if seconds > 0 else None,
        "reward_counts": {f"{v:g}": rewards.count(v) for v in sorted(set(rewards))},
        "reward_mean": round(statistics.fmean(rewards), 4) if rewards else None,
        "status_counts": dict(sorted(statuses.items())),
        "per_agent_mean_reward": {k: round(statistics.fmean(v), 4) for k, v in sorted(per_agent.items())},
        "turns_median": statistics.median([r["turns"] for r in results]) if results else None,
        "episode_seconds_median": round(statistics.median([r["seconds"] for r in results]), 2) if results else None,
    }
