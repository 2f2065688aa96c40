"""``opforge run``: harvest -> compose -> filter -> select -> Hub folder, in one resumable run directory.

Run directory::

    config.yaml                  the resolved configuration (a re-run must match its identity fields)
    seeds/catalog.parquet        seed catalog (harvested once, or copied from ``seeds_catalog``)
    candidates/round-NNNN.parquet  composed candidates, ``round_size`` per round, candidate indices
                                 ``NNNN * round_size ...`` (so a round is the same whenever it is composed)
    candidates/decisions.jsonl   what each finished round decided, replayed by a resumed run (``RoundDecisions``)
    candidates.parquet           all rounds so far (the filter stage's input), less the candidates of a round
                                 whose (op set, dtype) signature already held ``max_per_signature`` accepted
                                 tasks from earlier rounds, and the heavy-op ones of a round composed only to
                                 hold the heavy-op cap (``skip_full_signatures``)
    filter/                      ledger.jsonl, verdicts.parquet, funnel.json (see ``opforge filter``)
    selection.json               what selection chose and why
    hf/                          the Hub folder (see ``pipeline.hub_folder``)
    run.json                     stages, timings, stop reason, the stage timeline (``pipeline.timeline``)

The stages overlap: a round is composed in shards as Dask tasks on the cluster's CPU workers
(``pipeline.compose_tasks``), each shard goes to the filter as soon as it is composed, in whatever order the
shards finish (``filter_run.FilterStream``; the round file keeps index order), and the next rounds (up to
``AHEAD_ROUNDS``, one composing at a time) are composed while the filter works when the yield so far projects
fewer accepted tasks than the target needs, or the last selection fell short of it. While a round's last
verdicts come in and its selection is made, the next round's composed shards already go to the filter (behind
every task of the round), so the workers do not idle at a round's end; candidates that round's decisions
then skip are taken back out of the queue, and verdicts of a round the run never reaches stay in the ledger
only. A round is still the unit of every decision: its
skipped signatures come from the verdicts of the rounds before it, its verdicts are computed over the whole
``candidates.parquet`` once all are in, and the run stops after the round that reaches the target (or, while
the selection's heavy-op cap ``max_heavy_share`` is not held, up to ``cap_rounds`` rounds later; those rounds
filter only candidates without a heavy op, as more heavy-op tasks cannot help the cap), so the
verdicts, the selection and the Hub folder are those of composing and filtering the rounds one after the
other.

Every stage skips what is already on disk: finished rounds are not recomposed, verdicts in the ledger are not
recomputed, so re-running the same command after an interruption (also in the middle of a streamed round,
which is composed again identically) finishes the work and redoes nothing finished. Selection and the Hub
folder are rebuilt at the end of every run (seconds).
"""

from __future__ import annotations

import json
import shutil
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from opforge.pipeline.run_config import IDENTITY_FIELDS, ConfigError, RunConfig, save_config


@dataclass
class RunResult:
    """Outcome of ``run_pipeline``: the Hub folder, how many tasks it holds and why composing stopped."""

    run_dir: Path
    hf_dir: Path
    selected: int
    accepted: int
    candidates: int
    stop_reason: str
    seconds: dict[str, float]


def _check_same_run(cfg: RunConfig, run_dir: Path) -> None:
    import yaml

    path = run_dir / "config.yaml"
    if not path.exists():
        return
    old = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    new = cfg.model_dump(mode="json")
    diff = [f for f in IDENTITY_FIELDS if old.get(f) != new.get(f)]
    if diff:
        raise ConfigError(f"{path}: this run directory holds a run with other {', '.join(diff)} "
                          f"({', '.join(f'{f}={old.get(f)!r}' for f in diff)}); use another --out")


def _check_rounds(run_dir: Path) -> None:
    """Raise ``ConfigError`` when a round file already in ``run_dir`` was composed by another composer version
    (its ``generator`` column is not ``compose.composer.GENERATOR``): such a round would be filtered in place of
    the one this composer makes. Reads only that column of each file."""
    from opforge.compose.composer import GENERATOR

    for path in round_files(run_dir):
        try:
            made = set(pd.read_parquet(path, columns=["generator"])["generator"].dropna().astype(str))
        except Exception as exc:  # noqa: BLE001 - unreadable, or a file without the column
            raise ConfigError(f"{path}: not a readable round of candidates ({type(exc).__name__}: {exc}); "
                              "delete it to compose it again") from exc
        if made - {GENERATOR}:
            raise ConfigError(f"{path}: composed by {', '.join(sorted(made))}, not {GENERATOR} (this opforge's "
                              "composer): delete the run directory's candidates/round-*.parquet to compose them "
                              "again (the filter ledger is kept), or use another --out")


def _check_seeds_catalog(cfg: RunConfig, run_dir: Path) -> None:
    """Raises ConfigError when the run still has to copy ``cfg.seeds_catalog`` and that file does not exist."""
    if (cfg.seeds_catalog is not None and not (run_dir / "seeds" / "catalog.parquet").exists()
            and not Path(cfg.seeds_catalog).is_file()):
        raise ConfigError(f"seeds_catalog: {cfg.seeds_catalog}: no such file")


def _harvest(cfg: RunConfig, run_dir: Path, progress: bool = True) -> Path:
    _check_seeds_catalog(cfg, run_dir)
    catalog = run_dir / "seeds" / "catalog.parquet"
    if catalog.exists():
        return catalog
    catalog.parent.mkdir(parents=True, exist_ok=True)
    if cfg.seeds_catalog is not None:
        shutil.copyfile(cfg.seeds_catalog, catalog)
        vocab = Path(cfg.seeds_catalog).with_name("shape_vocabulary.json")
        if vocab.is_file():  # the shape vocabulary written beside it by `opforge seeds harvest`
            shutil.copyfile(vocab, catalog.with_name(vocab.name))
        return catalog
    from opforge.seeds.catalog import harvest, write_catalog, write_skip_report
    from opforge.seeds.probe_pool import PoolSettings
    from opforge.seeds.specs_loader import SPECS_DIR
    from opforge.seeds.vocabulary import start_vocabulary_harvest

    # the shape vocabulary (transformers configs, torchvision ladders) is read in a child meanwhile
    vocab_path = catalog.with_name("shape_vocabulary.json")
    executor, vocab = start_vocabulary_harvest(vocab_path)
    try:
        # CPU runs: ``workers`` processes; CUDA runs (``workers`` = sandboxes per GPU): all usable cores
        pool = PoolSettings(workers=cfg.workers if cfg.device == "cpu" else None)
        res = harvest(None if cfg.replace_specs else SPECS_DIR, progress=progress, pool=pool,
                      with_transformers=cfg.harvest_transformers, extra_specs=cfg.specs or ())
        tmp = catalog.with_suffix(".tmp.parquet")
        write_catalog(res.ops, tmp)
        write_skip_report(res.skips, catalog.with_name("catalog_skipped.csv"))
        try:
            vocab.result()
        except Exception as exc:  # noqa: BLE001 - any failure of the child: size with the packaged vocabulary
            vocab_path.unlink(missing_ok=True)
            warnings.warn(f"shape vocabulary harvest failed ({type(exc).__name__}: {exc}); sizing with the "
                          "packaged vocabulary", stacklevel=2)
    finally:
        executor.shutdown(wait=False, cancel_futures=True)
    tmp.replace(catalog)  # the catalog appears only once complete
    return catalog


def compose_rounds(cfg: RunConfig, rounds: int, workers: int | None = None, progress: bool = True) -> list[Path]:
    """Compose rounds ``0 .. rounds - 1`` of the run ``cfg`` describes into its run directory
    (``candidates/round-NNNN.parquet``; rounds already there are kept) and stop: no cluster, no filter.

    A round's file is the one ``run_pipeline`` would compose (a round depends only on the seed catalog, the
    composer options and its index), so rounds composed on a CPU machine are filtered later by ``opforge run``
    with the same config on a GPU machine, which composes only the missing ones. ``workers``: composer
    processes (default: usable cores). Returns the round files.

    Raises:
        ConfigError: the run directory holds another run, or ``rounds`` < 1.
    """
    import os

    from opforge.compose.composer import ComposeConfig, compose, composer_pool
    from opforge.seeds.catalog import read_catalog

    if rounds < 1:
        raise ConfigError(f"compose rounds: {rounds}: give at least 1")
    cfg = cfg.resolved()
    run_dir = Path(cfg.out)
    run_dir.mkdir(parents=True, exist_ok=True)
    _check_same_run(cfg, run_dir)
    _check_rounds(run_dir)
    save_config(cfg, run_dir / "config.yaml")
    catalog = _harvest(cfg, run_dir, progress)
    ops = read_catalog(catalog)
    workers = workers or cfg.compose_workers or len(os.sched_getaffinity(0))
    options = {**_compose_options(cfg), "n": cfg.round_size, "vocabulary": _vocabulary_path(cfg, catalog),
               "motif_library": cfg.motif_library}
    paths = [_round_path(run_dir, k) for k in range(rounds)]
    missing = [k for k, path in enumerate(paths) if not path.exists()]
    # one pool for every round, its processes started once: on the 4 x H200 host (64 workers) a pool per round
    # composed fewer than four rounds of 3,000 in 150 s, for about 4 s of composing a round (0.02 CPU s a
    # candidate)
    with composer_pool(ops, ComposeConfig(**options), workers if missing else 1) as pool:
        for k in missing:
            cfg_k = ComposeConfig(**options, start_index=k * cfg.round_size)
            _write_round(paths[k], compose(ops, cfg_k, workers=workers, progress=progress, pool=pool))
    return paths


def _warm_up_summary(futures: list, composers: list | None = None) -> dict[str, Any] | None:
    """What the sandboxes started before composing (``warm_sandbox`` futures) reported: how many started,
    the slowest start (s) and the first errors; with ``composers`` (``warm_composer`` futures), the slowest
    composer warm-up (s; None when none finished)."""
    done = [f.result() for f in futures if f.done() and f.status == "finished"]
    out = {"started": sum(1 for r in done if r["error"] is None), "of": len(futures),
           "slowest_start_s": round(max((r["start_s"] for r in done), default=0.0), 2),
           "errors": [r["error"] for r in done if r["error"]][:3]}
    if composers:
        secs = [f.result() for f in composers if f.done() and f.status == "finished"]
        out["composers_warm_s"] = round(max(secs), 2) if secs else None
    return out


def _round_path(run_dir: Path, k: int) -> Path:
    return run_dir / "candidates" / f"round-{k:04d}.parquet"


def round_files(run_dir: str | Path) -> list[Path]:
    """The run directory's round files (``candidates/round-NNNN.parquet``, ``_round_path``'s names) in round
    order; a temporary file a writer left (``round-NNNN.tmp.parquet``) is none."""
    import re

    return sorted(p for p in (Path(run_dir) / "candidates").glob("round-*.parquet")
                  if re.fullmatch(r"round-\d{4}\.parquet", p.name))


def _write_round(path: Path, frame: pd.DataFrame) -> None:
    """Write a round's candidates to ``path`` atomically (the file appears only once complete)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.parquet")
    frame.to_parquet(tmp, index=False)
    tmp.replace(path)


def _compose_options(cfg: RunConfig) -> dict[str, Any]:
    """The ``compose.composer.ComposeConfig`` fields of the run's composition, less ``n``, ``start_index`` and
    the file options (``vocabulary``, ``motif_library``: the workers' own copies, ``pipeline.compose_tasks``)."""
    return {"seed": cfg.seed, "op_mix": cfg.op_mix, "device_profile": cfg.device_profile,
            "transformers_share": cfg.transformers_share, "dtype_mix": cfg.dtype_mix, "op_weights": cfg.op_weights,
            "include_internal": cfg.include_internal, "heavy_start": cfg.heavy_start,
            "window_ms": cfg.runtime_window_ms, "motif_share": cfg.motif_share}


def default_compose_workers(device: str) -> int:
    """CPU workers composing beside the filter when ``compose_workers`` is not set: one per GPU (at least 2) on
    CUDA, where each GPU's sandboxes leave ``engine.cluster.CORES_KEPT_PER_GPU`` cores; 1 on CPU, where the
    sandboxes take the cores and a composer outpaces the CPU filter many times over."""
    if device != "cuda":
        return 1
    from opforge.engine.cluster import visible_gpus
    from opforge.engine.ledger import gpu_names

    return max(2, len(visible_gpus(len(gpu_names()))))


# Compose the next round ahead while the accepted tasks projected from the yield so far stay below this many
# times the target (selection's quotas and signature cap leave part of the accepted pool unused).
AHEAD_MARGIN = 1.5
# Rounds composed ahead of the one filtered, at most: late in a large run duplicates and full signatures skip
# most of a round, so one round ahead may leave the filter waiting for candidates (4 x H200, continuing to
# --target 6000: 1,149 verdicts/min over a call against 1,928 at --target 2000; not yet measured with two).
AHEAD_ROUNDS = 2


class _StreamedJob:
    """The cluster of a run with its filter stream (``filter_run.FilterStream``) and composer shards
    (``compose_tasks.ShardFeed``): the shards of a round go to the filter as they are composed, the next round
    is composed ahead while the projected yield falls short of the target, and the timeline is recorded."""

    def __init__(self, cfg: RunConfig, run_dir: Path, settings, timeline, progress: bool):
        from opforge.engine.cluster import open_cluster
        from opforge.pipeline.filter_run import FilterStream, prepare_settings, warm_sandboxes

        self.cfg, self.run_dir, self.timeline, self.progress = cfg, run_dir, timeline, progress
        self.warming: list = []  # the sandboxes' warm-up futures (``warm_sandbox``), kept until the filter starts
        self.composers_warming: list = []  # the composer workers' (``warm_composer``)
        self.warm_up = None
        self.handle = self.stream = self.feed = self.variants = None
        self.rows_by_task: dict[str, dict[str, Any]] = {}
        # rounds added to the filter ahead of the round loop (``prefeed``): the shards taken per round (by shard
        # index), and the rows taken from a round file already on disk; ``prefed``: tasks dispatched ahead in all
        self.early_shards: dict[int, dict[int, list]] = {}
        self.early_rows: dict[int, int] = {}
        self._early_file: tuple[int, pd.DataFrame] | None = None  # (round, rows) of the round file read ahead
        self.prefed = 0
        self.short = False  # the last selection fell short of the target (``compose_ahead`` composes on)
        timeline.begin("cluster_start")
        workers = cfg.compose_workers or default_compose_workers(cfg.device)
        self.handle = open_cluster(cfg.device, cfg.workers, cfg.scheduler,
                                   cpu_workers=0 if cfg.scheduler else workers)
        try:
            from opforge.pipeline.compose_tasks import warm_composer

            # the composer workers import the composer and read the packaged motif library meanwhile too
            self.composers_warming = [self.handle.client.submit(warm_composer, cfg.motif_library is None,
                                                                workers=[a], key=f"warm-composer-{a}", pure=False)
                                      for a in self.handle.cpu_workers]
            settings = prepare_settings(settings, run_dir / "filter", self.handle, progress)
            # the sandboxes start while the run harvests and composes its first round, or reads back the rounds
            # it filtered before (started only at the first new task, they took 30 s on a 4 x H200 host; started
            # after the harvest, 27-37 s, the last of them after the first candidates)
            self.warming = warm_sandboxes(self.handle, settings, run_dir / "filter")
            self.stream = FilterStream(run_dir / "filter", settings, self.handle, progress)
            from opforge.compose.variants import VariantPool, VariantSettings

            # the settings `opforge variants` uses, as the publication below
            self.variants = VariantPool(run_dir / "variants.jsonl", VariantSettings(), workers=workers)
        except BaseException:
            self.close()
            raise
        timeline.end("cluster_start")

    def compose_from(self, catalog: Path) -> None:
        """Compose from the seed catalog ``catalog`` on the cluster's CPU workers (the ``ComposerFiles``
        plugin; ``ShardFeed``)."""
        from opforge.pipeline.compose_tasks import PLUGIN_NAME, ShardFeed, composer_files

        cfg = self.cfg
        plugin = composer_files(catalog, _vocabulary_path(cfg, catalog), cfg.motif_library)
        self.handle.client.register_plugin(plugin, name=PLUGIN_NAME)
        self.feed = ShardFeed(self.handle.client, _compose_options(cfg), cfg.round_size,
                              self.handle.cpu_workers or None, self.stream.watch, plugin.digest + f"-{cfg.seed}",
                              fingerprints="duplicate" in self.stream.settings.names())

    def pieces(self, k: int):
        """Round ``k``'s candidates in index order, as (rows, added): the round file when it exists, else each
        shard as it is composed (the round file is written once all are); ``added`` is True for rows
        ``prefeed`` already gave the filter. Keeps the filter loop turning while it waits."""
        from opforge.compose.composer import rows_frame
        from opforge.pipeline.compose_tasks import shards_of_round

        path = _round_path(self.run_dir, k)
        if path.exists():
            self.timeline.mark("first_candidates")
            read, self._early_file = self._early_file, None  # the frame ``prefeed`` read, when it read this one
            frame = read[1] if read is not None and read[0] == k else pd.read_parquet(path)
            frame, ahead = self._known(frame), self.early_rows.pop(k, 0)
            if ahead:
                yield frame.iloc[:ahead], True
            if ahead < len(frame):
                yield frame.iloc[ahead:], False
            return
        self.timeline.begin("compose")
        self.feed.submit(k)
        n_shards = len(shards_of_round(k, self.cfg.round_size))
        early = self.early_shards.pop(k, {})
        by_shard: dict[int, list] = {}
        # the shards go to the filter as they arrive, in any order (a verdict does not depend on it); the round
        # file keeps index order
        while len(by_shard) < n_shards:
            if early:
                j = min(early)
                got, added = early.pop(j), True
            else:
                while (taken := self.feed.take_any(k)) is None:
                    if not self.stream.step():
                        lost = sorted(set(range(n_shards)) - set(by_shard))
                        raise RuntimeError(f"round {k} shards {lost}: their compose tasks are lost")
                (j, got), added = taken, False
            self.timeline.mark("first_candidates")
            by_shard[j] = got
            piece = rows_frame(got)
            if len(piece):
                yield self._known(piece), added
        rows = [row for j in range(n_shards) for row in by_shard[j]]
        missing = sum(r is None for r in rows)
        if missing:
            warnings.warn(f"{missing} of {len(rows)} candidate indices found no graph that fits (left out)",
                          stacklevel=2)
        _write_round(path, rows_frame(rows))
        self.timeline.end("compose", at=self.feed.last_done, busy_s=self.feed.busy_s)

    def prefeed(self, k: int) -> None:
        """Give the filter the next rows of round ``k`` ahead of the round loop, when there are any: the next
        shard of the round file on disk, or the next composed shard of a round sent to the composers (one
        shard per call, as the shards arrive; the loop's ``pieces(k)`` yields them again marked as added). Adds
        nothing while a task waits to run alone (it starts only once the queue is empty)."""
        from opforge.compose.composer import rows_frame
        from opforge.pipeline.compose_tasks import SHARD_SIZE

        if self.stream.deferred:
            return
        path = _round_path(self.run_dir, k)
        if k not in self.early_shards and path.exists():
            if self._early_file is None or self._early_file[0] != k:
                self._early_file = (k, pd.read_parquet(path))
            start = self.early_rows.get(k, 0)
            piece = self._early_file[1].iloc[start:start + SHARD_SIZE]
            if not len(piece):
                return
            self.early_rows[k] = start + len(piece)
        elif k in self.feed.submitted:
            taken = self.feed.take_any(k)
            if taken is None:
                return
            self.early_shards.setdefault(k, {})[taken[0]] = taken[1]
            piece = rows_frame(taken[1])
        else:
            return
        if len(piece):
            self.prefed += self.stream.add(self._known(piece))

    def _known(self, piece: pd.DataFrame) -> pd.DataFrame:
        """Keep what a published row's variants are keyed by (``compose.variants``) for ``piece``'s tasks."""
        ctx = piece["size_context"].fillna("") if "size_context" in piece else [""] * len(piece)
        dtypes = piece["dtype"].fillna("float32") if "dtype" in piece else ["float32"] * len(piece)
        for t, code, c, d in zip(piece["task_id"], piece["code"], ctx, dtypes, strict=True):
            self.rows_by_task.setdefault(t, {"task_id": t, "code": code, "size_context": c, "dtype": d})
        return piece

    def round_starts(self, k: int, composed: int) -> None:
        """Round ``k`` starts, ``composed`` candidates in the rounds before it: after each verdict from now on,
        ``compose_ahead`` decides whether round ``k + 1`` is composed, and an accepted task's hidden shape
        variants are computed (``compose.variants.VariantPool``, cached where publication reads them)."""
        def after(task_id: str, result: dict[str, Any]) -> None:
            self.compose_ahead(k, composed)
            row = self.rows_by_task.get(task_id)
            if result.get("accepted") and row is not None and self.variants is not None:
                eager = (result.get("metrics") or {}).get("runtime", {}).get("eager_ms")
                gpu = (self.stream.env.get("gpu") or "cpu") if self.cfg.device == "cuda" else "cpu"
                self.variants.submit({**row, "eager_ms": float(eager) if isinstance(eager, (int, float))
                                      else float("nan"), "gpu": gpu})

        self.stream.after_result = after

    def compose_ahead(self, k: int, composed: int) -> None:
        """Send the shards of the next round not composed yet, up to ``AHEAD_ROUNDS`` rounds past ``k``, one
        round composing at a time, when it fits the candidate budget (``composed``: candidates of the rounds
        before ``k``) and the last selection fell short of the target (``short``: its signature cap and quotas
        can need more than the accepted count says) or the accepted tasks projected from the yield so far fall
        short of it. Composing more never changes the result (a round is used only when the one before falls
        short)."""
        s = self.stream
        for ahead in range(1, AHEAD_ROUNDS + 1):
            nxt = k + ahead
            if nxt in self.feed.submitted or _round_path(self.run_dir, nxt).exists():
                if self.feed.composing(nxt):
                    return  # its shards first: a later round would only slow them down
                continue
            if composed + (ahead + 1) * self.cfg.round_size > self.cfg.candidate_budget:
                return
            if self.short or (s.verdicted >= 20  # else no yield to project from yet
                              and s.accepted + s.pending * s.accepted / s.verdicted < AHEAD_MARGIN * self.cfg.target):
                self.feed.submit(nxt)
            return

    def filter_round_done(self) -> None:
        """A round's verdicts are all in: the filter stage's record so far."""
        s = self.stream
        if s.first_submit is not None:
            self.timeline.begin("filter", at=s.first_submit)
            self.timeline.end("filter", at=s.last_result or s.first_submit, busy_s=s.busy_s)
        if self.warming:
            self.warm_up, self.warming = _warm_up_summary(self.warming, self.composers_warming), []

    def gpu_spans(self) -> list[tuple] | None:
        return self.stream.spans if self.stream is not None and self.cfg.device == "cuda" else None

    def close(self, finished: bool = False) -> _Closing:
        """Stop the composer shards, close the filter stream (ledger, sandbox logs) and the cluster; the
        variants of accepted tasks are waited for when the run ``finished`` (publication reads them), else
        stopped. A finished run closes the cluster on a thread of its own, beside the wait and the
        publication (``_Closing.join`` waits for it); otherwise everything is closed before this returns.
        The seconds of each part are in ``_Closing.steps`` (``cluster_close_s``, ``variants_wait_s``)."""
        closing = _Closing(self)
        self.timeline.begin("cluster_close")
        if finished:
            closing.thread = threading.Thread(target=closing.shut_down, name="opforge-cluster-close")
            closing.thread.start()
        else:
            closing.shut_down()
        t1 = time.perf_counter()
        if self.variants is not None:
            self.variants.close(wait=finished)
            closing.steps["variants_wait_s"] = round(time.perf_counter() - t1, 2)
            if self.variants.first_submit is not None:
                self.timeline.begin("publication_work", at=self.variants.first_submit)
                self.timeline.end("publication_work", at=self.variants.last_done or self.variants.first_submit,
                                  busy_s=self.variants.busy_s)
        return closing


class _Closing:
    """The closing of a run's composer shards, filter stream and cluster (``_StreamedJob.close``): ``steps``
    holds the seconds of each part; the cluster close is the timeline's ``cluster_close`` stage."""

    def __init__(self, job: _StreamedJob):
        self.job, self.thread, self.error = job, None, None
        self.steps: dict[str, Any] = {}

    def shut_down(self) -> None:
        job, t0 = self.job, time.perf_counter()
        try:
            if job.feed is not None:
                job.feed.cancel()
            if job.stream is not None:
                job.stream.close()
            t1 = time.perf_counter()
            if job.handle is not None:
                job.handle.close()
            self.steps["filter_close_s"] = round(t1 - t0, 2)
        except BaseException as exc:  # noqa: BLE001 - reported by join, on the run's own thread
            self.error = exc
            if self.thread is None:
                raise
        finally:
            self.steps["cluster_close_s"] = round(time.perf_counter() - t0, 2)
            job.timeline.end("cluster_close", busy_s=self.steps["cluster_close_s"])

    def join(self) -> None:
        """Wait for a cluster close running on its thread. What it raised becomes a warning and
        ``steps["cluster_close_error"]``: the run's results are all written by then."""
        if self.thread is not None:
            self.thread.join()
            self.thread = None
            if self.error is not None:
                self.steps["cluster_close_error"] = f"{type(self.error).__name__}: {self.error}"
                warnings.warn(f"closing the cluster after the run failed: {self.steps['cluster_close_error']}",
                              RuntimeWarning, stacklevel=2)


# run options that decide nothing about which candidates are filtered or selected: where and with how many
# workers the run goes, and the card's wording
_NOT_DECIDING = ("out", "workers", "scheduler", "compose_workers", "pretty_name", "license", "repo_id")


def decision_key(cfg: RunConfig, filter_fingerprint: str) -> str:
    """What a round's decisions (``RoundDecisions``) depend on, as a SHA-256 hex digest: the resolved config
    less the options that decide nothing (``out``, ``workers``, ``scheduler``, ``compose_workers`` and the
    card's ``pretty_name``, ``license``, ``repo_id``), the filter fingerprint (the ledger's: versions and filter
    settings) and the source of the code that decides (this module and ``pipeline.select``)."""
    import hashlib

    from opforge.pipeline import select

    conf = {k: v for k, v in cfg.model_dump(mode="json").items() if k not in _NOT_DECIDING}
    h = hashlib.sha256(json.dumps(conf, sort_keys=True, default=str).encode())
    h.update(filter_fingerprint.encode())
    for module in (__file__, select.__file__):
        h.update(Path(module).read_bytes())
    return h.hexdigest()


class RoundDecisions:
    """What each round of a run decided once its verdicts were in and the run went on, one JSON line per round
    in the run directory's ``candidates/decisions.jsonl``: the round's candidates not filtered (full
    signatures, and heavy-op candidates while only the heavy-op cap was short), whether it counted as a round
    for the heavy-op cap, and whether the selection was short. A resumed run replays a round from its line
    instead of deciding from the selection of the round before, and gathers no verdicts and makes no selection
    for a round whose next round has a line too (the lines hold all that the next round takes from them):
    reading back 14 finished rounds of 3,000 cost 151 s on a 4 x H100 host, 89 s of it verdict tables and
    selections (benchmarks/results/h100/streaming_runs.json).

    A line counts only under the same ``key`` (``decision_key``) and for the same candidates (the round file's
    task ids, by digest); a line cut by a kill, or any other, is ignored, and the round is decided again."""

    def __init__(self, run_dir: Path, key: str):
        self.run_dir, self.path, self.key = Path(run_dir), Path(run_dir) / "candidates" / "decisions.jsonl", key
        self.lines: dict[int, dict[str, Any]] = {}
        self._digests: dict[int, str] = {}  # of the round files read (a round file never changes once written)
        if self.path.exists():
            for line in self.path.read_text(encoding="utf-8").splitlines():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if (isinstance(rec, dict) and rec.get("key") == key and isinstance(rec.get("round"), int)
                        and isinstance(rec.get("tasks"), str) and isinstance(rec.get("not_filtered"), list)
                        and isinstance(rec.get("heavy_skipped"), int)
                        and isinstance(rec.get("extra_round"), bool) and isinstance(rec.get("short"), bool)):
                    self.lines[rec["round"]] = rec

    @staticmethod
    def digest(task_ids) -> str:
        import hashlib

        return hashlib.sha256("\n".join(map(str, task_ids)).encode()).hexdigest()

    def valid(self, k: int) -> dict[str, Any] | None:
        """Round ``k``'s line when it holds for the round file on disk now, else None."""
        rec = self.lines.get(k)
        path = _round_path(self.run_dir, k)
        if rec is None or not path.exists():
            return None
        if k not in self._digests:
            try:
                self._digests[k] = self.digest(pd.read_parquet(path, columns=["task_id"])["task_id"])
            except Exception:  # noqa: BLE001 - an unreadable round is read, and reported, where it is used
                return None
        return rec if rec.get("tasks") == self._digests[k] else None

    def write(self, k: int, frame: pd.DataFrame, not_filtered: set[str], heavy_skipped: int, extra_round: bool,
              short: bool) -> None:
        rec = {"round": k, "key": self.key, "tasks": self.digest(frame["task_id"]),
               "not_filtered": sorted(not_filtered), "heavy_skipped": int(heavy_skipped),
               "extra_round": bool(extra_round), "short": bool(short)}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a+b") as f:
            cut = False
            if f.seek(0, 2):
                f.seek(-1, 2)
                cut = f.read(1) != b"\n"  # a line a kill cut short: end it first
            f.write((("\n" if cut else "") + json.dumps(rec) + "\n").encode())
        self.lines[k] = rec


def _stage_s(timeline, stage: str) -> float:
    rec = timeline.stages.get(stage)
    if not rec or rec["start"] is None or rec["end"] is None:
        return 0.0
    return rec["end"] - rec["start"]


def _vocabulary_path(cfg: RunConfig, catalog: Path) -> str | None:
    """The shape vocabulary the composer sizes with: ``cfg.vocabulary``, else the one harvested beside the
    run's seed catalog, else None (the packaged one)."""
    if cfg.vocabulary:
        return cfg.vocabulary
    beside = Path(catalog).parent / "shape_vocabulary.json"
    return str(beside) if beside.exists() else None


def _filter_settings(cfg: RunConfig):
    from opforge.filters.chain import GPU_SHARING_OPTIONS, FilterSettings, merge_thresholds

    gpu = {k: getattr(cfg, k) for k in GPU_SHARING_OPTIONS if getattr(cfg, k) is not None}
    thresholds = merge_thresholds(cfg.thresholds, compile_autotune=cfg.compile_autotune)
    return FilterSettings(device=cfg.device, skip=list(cfg.skip_filters), runtime_window_ms=cfg.runtime_window_ms,
                          timeout_s=cfg.timeout_s, memory_gib=cfg.memory_gib, kernelbench=cfg.kernelbench,
                          kernelbench_levels=tuple(cfg.kernelbench_levels), thresholds=thresholds, **gpu)


def accepted_pool(candidates: pd.DataFrame, verdicts: pd.DataFrame) -> pd.DataFrame:
    """Accepted candidates joined with their measurements (one row per task_id, first occurrence)."""
    v = verdicts[verdicts["accepted"]].drop_duplicates("task_id")
    cols = ["task_id", "eager_ms", "compile_ms", "roofline_ms", "fusion_gain", "kernelbench_nearest",
            "kernelbench_similarity"]
    pool = candidates.drop_duplicates("task_id").merge(v[[c for c in cols if c in v]], on="task_id", how="inner")
    return pool.sort_values("candidate_index", kind="stable").reset_index(drop=True)


def random_cap(cfg: RunConfig) -> float | None:
    """The selection's rule-6 cap on random-composer tasks for the run ``cfg``: ``max_random_share``, but never
    below the random composer's share of the candidates (``1 - motif_share``), so a run that asks for more of
    them (``--motif-share 0``: all) gets them; None when ``max_random_share`` is None."""
    if cfg.max_random_share is None:
        return None
    return max(cfg.max_random_share, 1.0 - cfg.motif_share)


def run_selection(pool: pd.DataFrame, cfg: RunConfig):
    """``pipeline.select.select_tasks`` of ``cfg.target`` tasks from ``pool`` with the run's selection rules
    (``cfg`` resolved: ``max_per_signature`` set). Bucket shares come from ``cfg.op_mix`` and
    ``cfg.transformers_share``; with the ``models`` op mix, from the pool's own ``data_source`` mix
    (``select.bucket_shares``).

    Raises:
        ValueError: ``cfg.op_mix`` does not parse (``compose.graphs.sampler.parse_op_mix``).
    """
    from opforge.compose.graphs.sampler import parse_op_mix
    from opforge.pipeline.select import bucket_shares, select_tasks

    shares = bucket_shares(parse_op_mix(cfg.op_mix), cfg.transformers_share, pool,
                           keep_pool_mix=cfg.op_mix == "models")
    return select_tasks(pool, cfg.target, shares, seed=cfg.seed, max_per_signature=cfg.max_per_signature,
                        max_heavy_share=cfg.max_heavy_share, soft_min_fusion_gain=cfg.soft_min_fusion_gain,
                        max_random_share=random_cap(cfg), max_op_share=cfg.max_op_share,
                        max_op_set_share=cfg.max_op_set_share)


def cap_round(selection) -> bool:
    """Whether the next round is composed only to hold the heavy-op cap: the last round's ``selection``
    (``pipeline.select.Selection``, None before the first) meets the target but not ``max_heavy_share``."""
    return selection is not None and selection.shortfall == 0 and selection.light_short > 0


def target_stop(selection, cfg: RunConfig, candidates: int, extra_rounds: int) -> str:
    """The stop reason after a round whose ``selection`` came from ``candidates`` candidates, ``extra_rounds``
    rounds having been composed after the target was met; "" to compose another round. Stops when the target is
    met and the heavy-op cap held, or after ``cfg.cap_rounds`` such rounds."""
    if selection.shortfall or (selection.light_short and extra_rounds < cfg.cap_rounds):
        return ""
    reason = f"target of {cfg.target} reached after {candidates} candidates"
    if extra_rounds or selection.light_short:
        reason += (f"; {extra_rounds} more round(s) for the heavy-op cap of {cfg.max_heavy_share:.0%}, "
                   + (f"still {selection.light_short} tasks without a heavy op short" if selection.light_short
                      else "held"))
    return reason


def run_pipeline(cfg: RunConfig, progress: bool = True) -> RunResult:
    """Run (or resume) the whole pipeline described by ``cfg``; see the module docstring.

    Raises:
        ConfigError: the run directory holds another run, or a bad option.
        ValueError / InputError / ReferenceLoadError: from the stages, with the file or option named.
    """
    from opforge.compose.graphs.sampler import parse_op_mix
    from opforge.filters.chain import check_thresholds
    from opforge.pipeline.select import heavy_flags, signature_cap
    from opforge.pipeline.timeline import Timeline

    cfg = cfg.resolved()
    settings = _filter_settings(cfg)
    settings.names()  # unknown filter names and thresholds fail here, before anything is written
    check_thresholds(settings.thresholds)
    run_dir = Path(cfg.out)
    run_dir.mkdir(parents=True, exist_ok=True)
    _check_same_run(cfg, run_dir)
    _check_rounds(run_dir)
    save_config(cfg, run_dir / "config.yaml")
    parse_op_mix(cfg.op_mix)  # a bad op mix fails here, before anything is written
    timeline = Timeline()

    _check_seeds_catalog(cfg, run_dir)  # before the cluster starts
    # the cluster starts (and its sandboxes warm up) while the seed catalog is harvested
    job = _StreamedJob(cfg, run_dir, settings, timeline, progress)
    rounds: list[pd.DataFrame] = []  # each round's candidates, read once
    not_filtered: set[str] = set()  # task ids of candidates not filtered (skip_full_signatures)
    n_heavy_skipped = 0  # of them, heavy-op candidates of the rounds composed to hold max_heavy_share
    extra_rounds = 0  # rounds composed after the target was met, to hold max_heavy_share
    selection = pool = None
    stop_reason = ""
    finished = False
    try:
        timeline.begin("harvest")
        catalog = _harvest(cfg, run_dir, progress)
        timeline.end("harvest")
        job.compose_from(catalog)
        decisions = RoundDecisions(run_dir, decision_key(cfg, job.stream.fp))
        k = 0
        while True:
            # the round's candidates stream into the filter shard by shard (skips decided from the verdicts of
            # the earlier rounds only, so a resumed run skips the same ones); a round an earlier call finished
            # replays its recorded skips, and when the next round is finished too, its verdicts are not gathered
            # nor a selection made (the next round needs neither: RoundDecisions)
            t_round = time.perf_counter()
            record = decisions.valid(k)
            replay = record is not None and decisions.valid(k + 1) is not None
            job.round_starts(k, sum(len(r) for r in rounds))
            round_skips: set[str] = set()  # this round's candidates not filtered
            round_heavy = 0  # of them, heavy-op candidates skipped for the heavy-op cap
            if record is not None:
                round_skips, round_heavy = set(record["not_filtered"]), int(record["heavy_skipped"])
                not_filtered |= round_skips
                n_heavy_skipped += round_heavy
            skip_heavy = record is None and cap_round(selection)
            capped = (signature_cap(pool, cfg.max_per_signature)
                      if record is None and cfg.skip_full_signatures and pool is not None else None)
            for piece, added in job.pieces(k):
                if capped is not None:
                    new = capped(piece)
                    round_skips |= new
                    not_filtered |= new
                if cfg.skip_full_signatures and skip_heavy:
                    # the target is met: a heavy-op candidate cannot bring the selection closer to its cap
                    new = set(piece["task_id"][heavy_flags(piece)]) - not_filtered
                    n_heavy_skipped += len(new)
                    round_heavy += len(new)
                    round_skips |= new
                    not_filtered |= new
                skipped = piece["task_id"].isin(not_filtered)
                if added:  # given to the filter ahead of this decision (prefeed): take the skipped ones back
                    job.stream.discard(piece["task_id"][skipped])
                else:
                    job.stream.add(piece[~skipped])
            t_pieces = time.perf_counter()
            rounds.append(pd.read_parquet(_round_path(run_dir, k)))
            if replay:
                extra_rounds += bool(record["extra_round"])
                job.short = bool(record["short"])
                timeline.round_seconds(k, pieces_s=t_pieces - t_round, result_s=0.0, waiting_s=0.0, select_s=0.0)
                k += 1
                continue
            candidates = pd.concat(rounds, ignore_index=True)
            candidates[~candidates["task_id"].isin(not_filtered)].to_parquet(run_dir / "candidates.parquet",
                                                                             index=False)
            # every verdict of the round (the corpus filters again over the whole input: as one filter pass)
            # while the round's last verdicts come in, the next round's composed rows keep the workers busy
            res = job.stream.result(run_dir / "candidates.parquet", meanwhile=lambda k=k: job.prefeed(k + 1))
            t_result = time.perf_counter()
            job.filter_round_done()
            pool = accepted_pool(candidates, res.verdicts)
            selection = run_selection(pool, cfg)
            job.short = bool(selection.shortfall or selection.light_short)
            timeline.round_seconds(k, pieces_s=t_pieces - t_round, result_s=t_result - t_pieces,
                                   waiting_s=job.stream.waited_s, select_s=time.perf_counter() - t_result)
            k += 1
            stop_reason = target_stop(selection, cfg, len(candidates), extra_rounds)
            if stop_reason:
                break
            extra_rounds += selection.shortfall == 0
            if len(candidates) + cfg.round_size > cfg.candidate_budget:
                stop_reason = (f"candidate budget of {cfg.candidate_budget} exhausted: {len(selection.rows)} of "
                               f"{cfg.target} tasks selected"
                               + (f", {selection.light_short} tasks without a heavy op short of the heavy-op cap"
                                  if selection.shortfall == 0 else ""))
                break
            if record is None:
                decisions.write(k - 1, rounds[-1], round_skips, round_heavy, extra_round=selection.shortfall == 0,
                                short=job.short)
        finished = True
    finally:
        # seconds of each step between the last verdict and the Hub folder (run.json's ``publication_steps``):
        # closing the composers, the sandboxes and the cluster (a finished run: beside what follows), the wait
        # for the variants pool
        closing = job.close(finished)
    steps = closing.steps
    warm_up = job.warm_up
    seconds = {"harvest": _stage_s(timeline, "harvest"), "cluster_start": _stage_s(timeline, "cluster_start"),
               "compose": _stage_s(timeline, "compose"), "filter": _stage_s(timeline, "filter")}

    t0 = time.perf_counter()
    timeline.begin("select_and_publish")
    rows = _published_rows(selection.rows, res.funnel, cfg)
    # hidden shape variants (compose.variants), with the default settings `opforge variants` uses, so adding them
    # to a published folder later gives the same column; cached in the run directory (the variants of accepted
    # tasks were computed there while the filter ran: ``variants_computed`` counts those computed only now)
    from opforge.compose.variants import VariantSettings, summary
    from opforge.pipeline.variants_column import variants_column

    t_step, variant_stats = time.perf_counter(), {}
    rows["shape_variants"], variant_results = variants_column(rows, VariantSettings(), cfg.compose_workers,
                                                              run_dir / "variants.jsonl", progress,
                                                              stats=variant_stats)
    steps.update(variants_s=round(time.perf_counter() - t_step, 2),
                 **{f"variants_{k}": v for k, v in variant_stats.items()})
    t_step = time.perf_counter()
    from opforge.pipeline.funnel_counts import funnel_counts

    funnel = _funnel_summary(candidates, res, len(rounds), stop_reason, settings, len(not_filtered))
    funnel["counts"] = funnel_counts(candidates["task_id"], res.verdicts, len(rows))  # run.json, card and status
    context = _card_context(cfg, rows, funnel, selection, res.funnel["environment"])
    context["variants"] = summary(variant_results)
    provenance = {"config": public_config(cfg, run_dir), "funnel": funnel, "environment": res.funnel["environment"],
                  "selection": _selection_json(selection)}
    steps["card_s"] = round(time.perf_counter() - t_step, 2)
    from opforge.pipeline.hub_folder import build_hub_folder

    t_step = time.perf_counter()
    hf_dir = build_hub_folder(rows, run_dir / "hf", context, provenance)
    steps["hub_folder_s"] = round(time.perf_counter() - t_step, 2)
    (run_dir / "selection.json").write_text(json.dumps(_selection_json(selection), indent=2))
    seconds["select_and_publish"] = time.perf_counter() - t0
    timeline.end("select_and_publish", busy_s=seconds["select_and_publish"])
    closing.join()
    result = RunResult(run_dir, hf_dir, len(rows), funnel["accepted"], len(candidates), stop_reason,
                       {k: round(v, 2) for k, v in seconds.items()})
    (run_dir / "run.json").write_text(json.dumps({
        "selected": result.selected, "accepted": result.accepted, "candidates": result.candidates,
        "rounds": len(rounds), "stop_reason": stop_reason, "seconds": result.seconds, "sandbox_warm_up": warm_up,
        "not_filtered_full_signature": len(not_filtered) - n_heavy_skipped,
        "not_filtered_heavy_cap": n_heavy_skipped, "tasks_sent_ahead": job.prefed, "yield": round(funnel["yield"], 4),
        "publication_steps": steps, "funnel": funnel["counts"],
        "timeline": timeline.record(job.gpu_spans(), job.feed.spans if job.feed is not None else None)}, indent=2))
    return result


def public_config(cfg: RunConfig, run_dir: Path) -> dict[str, Any]:
    """The resolved config as the Hub folder publishes it (``hf/opforge_run.json``), with no path of the
    building machine: ``out`` is ``.`` (the run directory), and each file option (``seeds_catalog``,
    ``vocabulary``, a ``kernelbench`` file) becomes its path relative to the run directory when it lies inside
    it, else ``NAME (sha256 HEX16)`` (the file's name and the first 16 hex digits of its SHA-256; just its
    name when it no longer exists). ``hub:`` and ``packaged:`` references are kept as they are."""
    import hashlib

    data = cfg.model_dump(mode="json")
    data["out"] = "."
    root = Path(run_dir).resolve()
    for key in ("seeds_catalog", "vocabulary", "kernelbench"):
        value = data.get(key)
        if not value or str(value).startswith(("hub:", "packaged:")):
            continue
        path = Path(value).resolve()
        if path.is_relative_to(root):
            data[key] = str(path.relative_to(root))
        elif path.is_file():
            data[key] = f"{path.name} (sha256 {hashlib.sha256(path.read_bytes()).hexdigest()[:16]})"
        else:
            data[key] = path.name
    return data


def _shape_stats(rows: pd.DataFrame) -> dict[str, Any]:
    """Sizes and dtypes of the published rows for the card: first-input batch p50 / p90, largest non-batch
    dim p50, distinct non-batch sizes, share with a size that is not a multiple of 8, dtype shares, and the
    most common size contexts."""
    import numpy as np

    batch, largest, dims, odd = [], [], set(), 0
    for s in rows["input_shapes"]:
        shapes = [sh for sh in json.loads(s) if sh]
        if not shapes:
            continue
        batch.append(shapes[0][0])
        rest = [d for sh in shapes for d in sh[1:]]
        largest.append(max(rest) if rest else 0)
        dims.update(rest)
        odd += any(d % 8 for d in rest)
    n = max(1, len(batch))
    dtypes = rows["dtype"].value_counts(normalize=True) if "dtype" in rows else pd.Series(dtype=float)
    ctx = pd.Series([c for c in size_contexts(rows) if c], dtype=str)
    return {"n": len(batch), "batch_p50": float(np.median(batch)) if batch else 0.0,
            "batch_p90": float(np.percentile(batch, 90)) if batch else 0.0,
            "batch_min": int(min(batch)) if batch else 0, "batch_max": int(max(batch)) if batch else 0,
            "largest_p50": float(np.median(largest)) if largest else 0.0, "distinct_dims": len(dims),
            "odd_share": odd / n, "dtypes": [(str(k), float(v)) for k, v in dtypes.items()],
            "contexts": [(str(k), int(v)) for k, v in ctx.value_counts().head(12).items()],
            "no_context": len(rows) - len(ctx)}


def size_contexts(rows: pd.DataFrame) -> list[str]:
    """Per row, where its sizes come from: its ``size_context`` (the model family of the random composer's shape
    vocabulary), else the source model of its motif or block (``provenance``'s ``source``, e.g.
    ``transformers:llama``), else ``""`` (fixed sizes)."""
    out = []
    ctxs = rows["size_context"] if "size_context" in rows else [""] * len(rows)
    provs = rows["provenance"] if "provenance" in rows else [""] * len(rows)
    for ctx, text in zip(ctxs, provs, strict=True):
        if isinstance(ctx, str) and ctx:
            out.append(ctx)
            continue
        try:
            prov = json.loads(text) if isinstance(text, str) and text.strip() else {}
        except json.JSONDecodeError:
            prov = {}
        out.append(str(prov.get("source") or "") if isinstance(prov, dict) else "")
    return out


def _source_stats(rows: pd.DataFrame) -> dict[str, Any]:
    """Where the published rows come from (the ``provenance`` column): tasks per kind (``motif`` mined from a
    real model, ``block`` a transformers block, ``random`` the random composer), per motif category, the most
    common source models and the number of distinct ones."""
    from collections import Counter

    kinds, cats, models = Counter(), Counter(), Counter()
    for text in rows["provenance"] if "provenance" in rows else []:
        prov = json.loads(text) if text else {}
        if prov.get("motif_id"):
            kinds["motif"] += 1
            cats[prov.get("category", "")] += 1
            models[prov.get("source", "")] += 1
        elif prov.get("block"):
            kinds["block"] += 1
            models[prov.get("source", "")] += 1
        else:
            kinds["random"] += 1
    n = max(1, len(rows))
    libraries = sorted({m.split(":")[0] for m in models if ":" in m})
    return {"kinds": [(k, v, v / n) for k, v in kinds.most_common()], "categories": cats.most_common(),
            "models": models.most_common(12), "distinct_models": len(models), "libraries": libraries}


def _selection_json(sel) -> dict[str, Any]:
    return {"quotas": sel.quotas, "picked": sel.picked, "available": sel.available, "shortfall": sel.shortfall,
            "notes": sel.notes, "task_ids": list(sel.rows["task_id"])}


def _published_rows(sel: pd.DataFrame, funnel: dict[str, Any], cfg: RunConfig) -> pd.DataFrame:
    """The selected rows in the published columns (pipeline.hub_folder.COLUMNS)."""
    from importlib.metadata import version

    env = funnel["environment"]
    out = sel.copy()
    out["gpu"] = (env.get("gpu") or "cpu") if cfg.device == "cuda" else "cpu"
    out["torch_version"] = env.get("torch")
    out["opforge_version"] = version("opforge")
    if "dtype" not in out:  # candidates composed before the dtype column existed
        out["dtype"] = "float32"
    if "size_context" not in out:
        out["size_context"] = ""
    if "provenance" not in out:  # candidates composed before the provenance column existed
        out["provenance"] = ""
    out["provenance"] = out["provenance"].fillna("")
    out["dtype"] = out["dtype"].fillna("float32")
    out["size_context"] = out["size_context"].fillna("")
    out["generator_seed"] = out["generator_seed"].astype("int64")
    out["num_ops"] = out["num_ops"].astype("int64")
    for c in ("eager_ms", "compile_ms", "roofline_ms", "fusion_gain", "kernelbench_similarity"):
        out[c] = pd.to_numeric(out[c] if c in out else float("nan"), errors="coerce").astype("float64")
    return out


def _funnel_summary(candidates: pd.DataFrame, res, rounds: int, stop_reason: str, settings,
                    not_filtered: int = 0) -> dict[str, Any]:
    """Counts of the whole run: ``candidates`` composed, ``not_filtered`` of them skipped for a full signature,
    ``accepted``, ``yield`` = accepted / filtered candidates, rejections per reason."""
    v = res.verdicts
    by_reason = v[~v["accepted"]]["reason"].map(lambda r: r.split(":")[0]).value_counts()
    accepted = int(v["accepted"].sum())
    return {"candidates": len(candidates), "not_filtered_full_signature": not_filtered, "rounds": rounds,
            "stop_reason": stop_reason, "accepted": accepted,
            "yield": accepted / max(1, len(candidates) - not_filtered),
            "by_reason": [(str(k), int(n)) for k, n in by_reason.items()],
            "by_reason_detail": res.funnel["by_reason_detail"], "filters": settings.names(),
            "window": list(settings.runtime_window_ms) if settings.runtime_window_ms else None}


def _card_context(cfg: RunConfig, rows: pd.DataFrame, funnel: dict, sel, env: dict) -> dict[str, Any]:
    import numpy as np

    ops = pd.Series([o for s in rows["ops"] for o in json.loads(s)])
    cats = sorted({c for s in rows["categories"] for c in json.loads(s)})
    eager = pd.to_numeric(rows["eager_ms"], errors="coerce").dropna()
    kb = pd.to_numeric(rows["kernelbench_similarity"], errors="coerce").dropna()
    device_label = env.get("gpu") if cfg.device == "cuda" and env.get("gpu") else "CPU"
    from opforge.filters.headroom import resolve_peaks
    from opforge.pipeline.headroom_card import headroom_context

    peaks, source = resolve_peaks(cfg.thresholds.get("roofline", {}).get("peaks", "auto"), cfg.device,
                                  env.get("gpu"))
    return {
        "headroom": headroom_context(rows, cfg.device == "cuda", peaks.describe(), source),
        "shapes": _shape_stats(rows),
        "sources": _source_stats(rows),
        "pretty_name": cfg.pretty_name, "license_id": cfg.license, "license": f"Licence: {cfg.license}",
        "seed": cfg.seed, "device_profile": cfg.device_profile,
        "load_id": cfg.repo_id or "path/to/this/folder", "funnel": funnel,
        "mix": [{"bucket": b, "picked": sel.picked.get(b, 0), "quota": sel.quotas.get(b, 0)} for b in sorted(sel.quotas)
                if sel.quotas.get(b, 0) or sel.picked.get(b, 0)],
        "selection_notes": sel.notes,
        "coverage": {"distinct_ops": int(ops.nunique()), "distinct_signatures": int(
            rows["ops"].map(lambda s: json.dumps(sorted(json.loads(s)))).nunique()),
            "max_per_signature": cfg.max_per_signature, "categories": cats,
            "top_ops": [(str(k), int(n)) for k, n in ops.value_counts().head(15).items()]},
        "runtime": {"n": len(eager), "median": float(eager.median()) if len(eager) else 0.0,
                    "p10": float(np.percentile(eager, 10)) if len(eager) else 0.0,
                    "p90": float(np.percentile(eager, 90)) if len(eager) else 0.0},
        "kernelbench": {"levels": list(cfg.kernelbench_levels), "n": len(kb),
                        "median": float(kb.median()) if len(kb) else 0.0, "max": float(kb.max()) if len(kb) else 0.0},
        "env": {"device_label": device_label, "torch": env.get("torch"), "transformers": env.get("transformers"),
                "triton": env.get("triton") or "not installed", "python": env.get("python"),
                "opforge_version": rows["opforge_version"].iloc[0] if len(rows) else "?"},
    }
