"""Batch reward for RL trainers: completions in, rewards out, evaluated in parallel on Dask workers.

``KernelReward(dataset)`` is a plain callable ``(completions, task_id=[...], **kwargs) -> list[float]``.
Its signature matches a TRL ``GRPOTrainer`` reward function (TRL passes ``prompts``, ``completions`` and
every dataset column, here ``task_id``, as keyword lists; conversational completions are lists of
messages, the last one's ``content`` is used). TRL is not needed to use it. A completion without a
``model_new.py`` block scores -1.

Without a ``client`` the reward opens one local Dask cluster at its first call and keeps it for its life
(``close()``, or ``with KernelReward(...) as reward:``; it is closed at exit otherwise). Its workers are spawned
processes, which import the calling script again: a script that calls the reward outside an
``if __name__ == "__main__":`` block gets, on CPU, an in-process cluster of threads instead (the evaluations
still run in child processes of their own), and on CUDA a one-line error saying to add the guard.
"""

from __future__ import annotations

import ast
import atexit
import logging
import os
import sys
from pathlib import Path
from typing import Any

from opforge.harness.dask_client import SchedulerClient
from opforge.harness.dataset import get_task, load_tasks
from opforge.harness.evaluate import EvalConfig
from opforge.harness.solution import SolutionError, extract_solution


def completion_text(completion: Any) -> str:
    """The text of a completion: a string, or the last message's ``content`` of a conversation."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    return str(completion)


def unguarded_main_call(depth: int = 1) -> bool:
    """True when the caller runs, through the top level of the ``__main__`` script (a file), outside an
    ``if __name__ == "__main__":`` block: a process spawned by ``multiprocessing`` imports that script again and
    would run the same code. False in an interactive session, ``python -c``, a notebook, or when the script's
    source cannot be read. ``depth``: frames above this function's caller to start from."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or not path or not os.path.isfile(path):
        return False
    frame, line = sys._getframe(depth), None
    while frame is not None:  # the outermost frame of the script's own top-level code
        if frame.f_globals is main.__dict__ and frame.f_code.co_name == "<module>":
            line = frame.f_lineno
        frame = frame.f_back
    if line is None:
        return False
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "__name__" in ast.unparse(node.test) and "__main__" in ast.unparse(node.test):
            if node.body[0].lineno <= line <= (node.body[-1].end_lineno or node.body[-1].lineno):
                return False
    return True


class KernelReward:
    """Reward function over an opforge dataset: a path (Hub folder, ``.parquet``, ``.jsonl``), a Hub id, or rows in
    memory (the ``datasets.Dataset`` that ``load_dataset(..., split="train")`` returns, a ``DatasetDict``, a
    ``pandas.DataFrame``); see ``harness.dataset.load_tasks``.

    Args:
        config: evaluation settings (``reward="milestone"`` or ``"speedup"``, device, tolerances).
        client: a ``distributed.Client`` (or its scheduler's address) to evaluate on (default: one local cluster
            opened at the first call and kept until ``close()``); held as a
            ``harness.dask_client.SchedulerClient``, so the reward pickles into a trainer's worker processes with it.
        build_root: extension build cache directory.
        workers: evaluations at once on the local cluster (default: ``engine.cluster.default_workers``).

    Attributes:
        last_results: the ``EvalResult`` dicts of the last batch (for logging).

    Raises:
        DatasetError: the dataset cannot be read, or is of a type it cannot be read from (the message names it).
    """

    __name__ = "opforge_kernel_reward"  # TRL logs reward functions by name

    def __init__(self, dataset: Any, config: EvalConfig | None = None, client=None,
                 build_root: str | None = None, workers: int | None = None):
        self.dataset = dataset if isinstance(dataset, str | Path) else f"<{type(dataset).__name__}>"
        self.tasks = load_tasks(dataset)
        self.config = config or EvalConfig()
        self.scheduler = SchedulerClient.wrap(client)
        self.build_root = build_root
        self.workers = workers
        self.last_results: list[dict[str, Any]] = []
        self._own = None  # the local cluster this reward opened (a ClusterHandle or a LocalCluster + Client)

    def _client(self):
        """The client to evaluate on: the one given, else this reward's own local cluster (opened once)."""
        if self.scheduler is not None:
            return self.scheduler.get()
        if self._own is None:
            if unguarded_main_call(depth=3):
                if self.config.device != "cpu":
                    raise RuntimeError('KernelReward starts Dask worker processes, which import this script again: '
                                       'put the code that calls it under `if __name__ == "__main__":` '
                                       '(or pass client=...)')
                from distributed import Client, LocalCluster
                from opforge.engine.cluster import default_workers

                # threads in this process (the evaluations run in child processes of their own), on tcp so a
                # trainer's spawned processes reach it
                cluster = LocalCluster(n_workers=1, threads_per_worker=self.workers or default_workers("cpu"),
                                       processes=False, protocol="tcp://", host="127.0.0.1",
                                       dashboard_address=None, silence_logs=logging.ERROR)
                self._own = (cluster, Client(cluster))
            else:
                from opforge.engine.cluster import open_cluster

                handle = open_cluster(self.config.device, self.workers)
                self._own = (handle.cluster, handle.client)
            self.scheduler = SchedulerClient(self._own[1])
            atexit.register(self.close)
        return self._own[1]

    def prepare(self) -> dict[str, Any]:
        """Make every worker of the cluster ready to evaluate (opening this reward's own cluster if it has none):
        start its fork servers (``harness.evaluate.prepare_fork_servers``: torch and torch._dynamo imported once
        per machine) and wait until they listen, about 5-10 s once. A trainer calls it once before its first step;
        otherwise the first batch's evaluations wait for the same start. Returns each worker's
        ``prepare_fork_servers`` result by its address."""
        from opforge.harness.evaluate import prepare_fork_servers

        return self._client().run(prepare_fork_servers, self.config.device)

    def close(self) -> None:
        """Close the local cluster this reward opened (nothing when it was given a client); a later call opens
        a new one."""
        own, self._own = self._own, None
        if own is None:
            return
        self.scheduler = None
        atexit.unregister(self.close)
        cluster, client = own
        for part in (client, cluster):
            try:
                part.close()
            except Exception:  # noqa: BLE001 - closing at exit: a cluster already gone is fine
                pass

    def __enter__(self) -> KernelReward:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_own"] = None  # a copy in another process reaches the cluster through ``scheduler`` (its address)
        return state

    def __call__(self, completions: list[Any], task_id: list[str] | None = None, prompts=None,
                 **kwargs) -> list[float]:
        """Rewards for ``completions[i]`` against task ``task_id[i]``.

        Raises:
            ValueError: ``task_id`` missing or of another length than ``completions``.
            DatasetError: an unknown task id.
        """
        from opforge.harness.batch import evaluate_many

        if task_id is None or len(task_id) != len(completions):
            raise ValueError("KernelReward needs task_id=[...] with one id per completion "
                             "(a 'task_id' column in the training dataset)")
        rewards: list[float | None] = [None] * len(completions)
        pairs, index = [], []
        for i, (c, t) in enumerate(zip(completions, task_id, strict=True)):
            task = get_task(self.tasks, t, self.dataset)
            try:
                files = extract_solution(completion_text(c)).files
            except SolutionError:
                rewards[i] = -1.0
                continue
            pairs.append((task, files))
            index.append(i)
        results = evaluate_many(pairs, self.config, client=self._client(), build_root=self.build_root,
                                progress=False) if pairs else []
        for i, res in zip(index, results, strict=True):
            rewards[i] = float(res["reward"])
        self.last_results = results
        return [float(r) for r in rewards]
