"""Composition as Dask tasks: the candidates of a run round by round, in shards composed on the cluster's
CPU workers while the filter works on the shards already composed.

Round ``k`` of a run holds candidate indices ``k * round_size .. (k + 1) * round_size - 1``; shard ``j`` of it
the ``SHARD_SIZE`` indices from ``k * round_size + j * SHARD_SIZE``. A candidate depends only on the seed
catalog, the composer's options and its index (``compose.composer.compose_rows``), so a shard depends only on
(seed, round, shard) and a round's rows, put together in shard order, are those of ``compose`` over the
round's indices whatever worker composed which shard, and however many workers there are.

Workers need no access to the client's files: the seed catalog, the shape vocabulary and a motif library
other than the packaged one travel inside a ``ComposerFiles`` worker plugin and are written into each
worker's local directory (``engine.pool`` does the same for the sandboxes).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from distributed import Client, Future, WorkerPlugin, get_worker

PLUGIN_NAME = "opforge-composer"
SHARD_SIZE = 50  # candidate indices per shard: a few seconds of one core


class ComposerFiles(WorkerPlugin):
    """The files a worker composes from: ``catalog`` (seed catalog Parquet), ``vocabulary`` (shape vocabulary
    JSON) and ``motif_library`` (motif library .json.gz), as bytes; None for the packaged default."""

    name = PLUGIN_NAME
    idempotent = False

    def __init__(self, catalog: bytes, vocabulary: bytes | None = None, motif_library: bytes | None = None):
        self.files = {"catalog": catalog, "vocabulary": vocabulary, "motif_library": motif_library}
        digest = hashlib.sha256()
        for k in sorted(self.files):
            digest.update(k.encode() + hashlib.sha256(self.files[k] or b"").digest())
        self.digest = digest.hexdigest()[:16]
        self.paths: dict[str, str | None] = {}
        self._catalog = None
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_catalog", "_lock")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._catalog, self._lock = None, threading.Lock()

    def setup(self, worker) -> None:
        folder = Path(worker.local_directory) / "opforge-composer" / self.digest
        folder.mkdir(parents=True, exist_ok=True)
        names = {"catalog": "catalog.parquet", "vocabulary": "shape_vocabulary.json",
                 "motif_library": "motifs.json.gz"}
        for key, data in self.files.items():
            if data is None:
                self.paths[key] = None
                continue
            path = folder / names[key]
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(data)
            tmp.replace(path)
            self.paths[key] = str(path)
        self.files = {}

    def catalog(self):
        """The seed catalog (``list[SeedOp]``), read once per worker."""
        with self._lock:
            if self._catalog is None:
                from opforge.seeds.catalog import read_catalog

                self._catalog = read_catalog(Path(self.paths["catalog"]))
            return self._catalog


def composer_files(catalog: Path, vocabulary: str | None, motif_library: str | None) -> ComposerFiles:
    """The plugin of a run composing from these client paths (``vocabulary`` / ``motif_library`` None: the
    packaged ones). Raises FileNotFoundError naming a missing file."""
    def read(path: str | Path | None) -> bytes | None:
        if path is None:
            return None
        if not Path(path).is_file():
            raise FileNotFoundError(f"{path}: no such file")
        return Path(path).read_bytes()

    return ComposerFiles(read(catalog), read(vocabulary), read(motif_library))


def compose_shard(options: dict[str, Any], start: int, n: int, fingerprints: bool = False) -> dict[str, Any]:
    """Dask task: the candidate rows of indices ``start .. start + n - 1`` (None for an index no graph fits),
    composed with ``compose.composer.ComposeConfig(**options)`` from the files of this worker's
    ``ComposerFiles``. Returns ``{"rows", "busy_s", "worker", "started_at", "ended_at"}`` (seconds; Unix time)
    and, with ``fingerprints``, ``"fingerprints"``: the duplicate filter's fingerprint of each row's source
    (``filters.duplicate.fingerprint``; None for a None row), computed here so that the client, which scans
    every row for duplicates, does not (about 2 ms a source on cpu-2core, where a shard takes about 0.9 s to
    compose on a 4 x H200 host's CPU worker).

    Raises RuntimeError when the worker has no ``ComposerFiles`` plugin."""
    from opforge.compose.composer import ComposeConfig, compose_rows

    plugin = get_worker().plugins.get(PLUGIN_NAME)
    if not isinstance(plugin, ComposerFiles):
        raise RuntimeError("no opforge composer files on this worker: register a ComposerFiles plugin")
    started, t0 = time.time(), time.perf_counter()
    cfg = ComposeConfig(**{**options, "n": n, "start_index": start, "vocabulary": plugin.paths["vocabulary"],
                           "motif_library": plugin.paths["motif_library"]})
    rows = compose_rows(plugin.catalog(), cfg, range(start, start + n))
    out: dict[str, Any] = {"rows": rows}
    if fingerprints:
        from opforge.filters.duplicate import fingerprint

        out["fingerprints"] = [fingerprint(r["code"]) if r is not None else None for r in rows]
    return {**out, "busy_s": time.perf_counter() - t0, "worker": str(get_worker().name), "started_at": started,
            "ended_at": time.time()}


def warm_composer(motif_library: bool = True) -> float:
    """Dask task: import the composer's modules and, with ``motif_library``, read the packaged motif library
    and the transformers block specs into this process's caches (``compose.motifs.library.load_motifs``,
    ``compose.blocks.tasks.block_specs``), so the worker's first shard does not (about 8 s on cpu-2core, 17-19 s
    on a 4 x H200 host while its sandboxes started). Needs no seed catalog: ``opforge run`` sends it while
    the catalog is harvested. Returns the seconds it took."""
    t0 = time.perf_counter()
    from opforge.compose import composer  # noqa: F401 - the import is the warm-up

    if motif_library:
        from opforge.compose.blocks.tasks import block_specs
        from opforge.compose.motifs.library import load_motifs

        load_motifs(None, shared=True)
        block_specs()
    return time.perf_counter() - t0


def shards_of_round(k: int, round_size: int, shard_size: int | None = None) -> list[tuple[int, int]]:
    """(start index, count) of each shard of round ``k`` (``shard_size`` default ``SHARD_SIZE``)."""
    shard_size = shard_size or SHARD_SIZE
    base = k * round_size
    return [(base + j, min(shard_size, round_size - j)) for j in range(0, round_size, shard_size)]


@dataclass
class ShardFeed:
    """Shards composed on the cluster for the client's round loop.

    ``submit(k)`` sends round ``k``'s shards (once); ``take_any(k)`` gives a shard's rows once its task is done
    (the caller keeps the loop turning meanwhile, e.g. ``FilterStream.step``). Tasks run on ``workers`` (the
    cluster's CPU workers; None: any worker).

    With ``fingerprints`` the shards also fingerprint their sources for the duplicate filter, and each arriving
    shard's fingerprints go into the client's cache (``filter_run.cache_fingerprints``).

    Attributes:
        busy_s: compose seconds of the shards received; ``first_submit`` / ``last_done``: Unix seconds.
        spans: (worker, started_at, ended_at, round, shard) of each shard received (Unix seconds).
    """

    client: Client
    options: dict[str, Any]
    round_size: int
    workers: list[str] | None
    watch: Callable[[Future, Callable[[Future], None]], None]
    key: str  # distinguishes this run's tasks (seed, options)
    fingerprints: bool = False
    done: dict[tuple[int, int], list] = field(default_factory=dict)
    futures: dict[tuple[int, int], Future] = field(default_factory=dict)
    submitted: set[int] = field(default_factory=set)
    busy_s: float = 0.0
    first_submit: float | None = None
    last_done: float | None = None
    spans: list[tuple] = field(default_factory=list)

    def submit(self, k: int) -> None:
        """Compose round ``k`` (no-op when already submitted)."""
        if k in self.submitted:
            return
        self.submitted.add(k)
        self.first_submit = self.first_submit or time.time()
        for j, (start, n) in enumerate(shards_of_round(k, self.round_size)):
            future = self.client.submit(compose_shard, self.options, start, n, self.fingerprints,
                                        key=f"compose-{self.key}-{k}-{j}", workers=self.workers, pure=False)
            self.futures[(k, j)] = future
            self.watch(future, lambda f, kj=(k, j): self._arrived(kj, f))

    def composing(self, k: int) -> bool:
        """Whether a shard of round ``k`` is still being composed."""
        return any(key[0] == k for key in self.futures)

    def shards(self, k: int) -> int:
        return len(shards_of_round(k, self.round_size))

    def _arrived(self, kj: tuple[int, int], future: Future) -> None:
        out = future.result()  # a composer error stops the run here, with its traceback
        self.futures.pop(kj, None)
        self.done[kj] = out["rows"]
        if out.get("fingerprints"):
            from opforge.pipeline.filter_run import cache_fingerprints

            cache_fingerprints([r["code"] if r is not None else None for r in out["rows"]], out["fingerprints"])
        self.busy_s += out["busy_s"]
        self.last_done = time.time()
        self.spans.append((out["worker"], out["started_at"], out["ended_at"], *kj))

    def take_any(self, k: int) -> tuple[int, list] | None:
        """(``j``, rows) of a composed shard of round ``k`` not taken yet, the lowest index first (then forgotten
        here), else None. Shards finish out of index order (each worker runs its own queue), so a caller that
        needs only the rows, not their order, never waits behind a slow shard."""
        ready = [j for (kk, j) in self.done if kk == k]
        if not ready:
            return None
        j = min(ready)
        return j, self.done.pop((k, j))

    def cancel(self) -> None:
        """Cancel the shards not composed yet (the run stopped)."""
        if self.futures:
            self.client.cancel(list(self.futures.values()))
        self.futures.clear()
