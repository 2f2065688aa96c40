"""The KernelBench reference index the ``contamination`` filter compares every task with.

Source of the problems: KernelBench (Ouyang et al., 2025, arXiv 2502.10517), levels 1–3 by default
(250 problems; level 4 optional). By default the copy packaged with opforge (``PACKAGED_SOURCE``:
``filters/data/kernelbench/``, levels 1–4 of github.com/ScalingIntelligence/KernelBench at commit
``PACKAGED_COMMIT``, MIT, licence and provenance beside it), so decontamination works offline; otherwise a
local ``.jsonl`` (optionally gzipped) / ``.parquet`` with the columns ``level, problem_id, name, code``, or
the Hugging Face Hub dataset ``ScalingIntelligence/KernelBench`` at a pinned revision (``hub:REPO@REV``).

The index holds, per problem, what each contamination tier compares (``ProblemFeatures``), and is built
once per run by the client (``build_index``), written to the run directory and loaded by every sandbox
child from that file (``load_index``), so workers never re-trace KernelBench.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

# Hub source and the revision we pin (the dataset's "Upload dataset" commit of 2025-01-10; override with
# ``hub:ScalingIntelligence/KernelBench@<revision>``). Needs the network.
HUB_REPO = "ScalingIntelligence/KernelBench"
HUB_REVISION = "16b08a8"
DEFAULT_LEVELS = (1, 2, 3)
# The packaged copy (built by scripts/package_kernelbench.py from the GitHub repository at this commit).
PACKAGED_DIR = Path(__file__).resolve().parent / "data" / "kernelbench"
PACKAGED_COMMIT = "423217d9fda91e0c2d67e4a43bf62f96f6d104f1"
PACKAGED_SOURCE = f"packaged:kernelbench@{PACKAGED_COMMIT[:8]}"
# Bump when the features or their normalisation change: a cached index of another version is rebuilt.
INDEX_VERSION = 1
NUM_PERM = 128  # MinHash permutations: Jaccard estimate std. error <= 1/sqrt(128) ~ 0.044
SHINGLE = 5  # tokens per MinHash shingle


class ReferenceLoadError(ValueError):
    """The KernelBench reference cannot be loaded; the message names the source and what is wrong."""


@dataclass
class KernelBenchProblem:
    level: int
    problem_id: int
    name: str
    code: str

    @property
    def key(self) -> str:
        """``L<level>/<name>``, e.g. ``L1/19_ReLU``: how verdicts name a problem."""
        return f"L{self.level}/{self.name}"


def default_reference() -> str:
    """Where the reference comes from when none is given: ``$OPFORGE_KERNELBENCH``, else the packaged copy
    (``PACKAGED_SOURCE``)."""
    return os.environ.get("OPFORGE_KERNELBENCH") or PACKAGED_SOURCE


def load_problems(source: str | Path | None = None, levels: tuple[int, ...] = DEFAULT_LEVELS
                  ) -> list[KernelBenchProblem]:
    """KernelBench problems of ``levels`` from ``source`` (path, or ``hub:REPO@REVISION``), sorted by
    level and problem id.

    Raises:
        ReferenceLoadError: missing file, unknown format, missing columns, no problem at the asked levels, or a
            failed Hub download.
    """
    source = str(source or default_reference())
    if source.startswith("hub:"):
        rows = _hub_rows(source[4:])
    elif source.startswith("packaged:"):
        rows = _packaged_rows(source)
    else:
        path = Path(source)
        if not path.exists():
            raise ReferenceLoadError(f"{path}: KernelBench reference not found (set --kernelbench or "
                                 f"OPFORGE_KERNELBENCH)")
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq
            rows = pq.read_table(path).to_pylist()
        elif path.name.endswith((".jsonl", ".json", ".jsonl.gz")):
            rows = _jsonl_rows(path)
        else:
            raise ReferenceLoadError(f"{path}: expected .jsonl, .jsonl.gz or .parquet")
    problems = []
    for n, r in enumerate(rows):
        missing = [k for k in ("level", "problem_id", "name", "code") if k not in r]
        if missing:
            raise ReferenceLoadError(f"{source}: row {n} lacks {', '.join(missing)}")
        if int(r["level"]) in levels:
            problems.append(KernelBenchProblem(int(r["level"]), int(r["problem_id"]), str(r["name"]),
                                               str(r["code"])))
    if not problems:
        raise ReferenceLoadError(f"{source}: no problem at levels {list(levels)}")
    return sorted(problems, key=lambda p: (p.level, p.problem_id))


def _jsonl_rows(path: Path) -> list[dict]:
    import gzip

    rows = []
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ReferenceLoadError(f"{path}:{n}: not JSON ({exc.msg})") from None
    return rows


def _packaged_rows(source: str) -> list[dict]:
    """Rows of the packaged copy; ``source`` must be ``PACKAGED_SOURCE`` (or ``packaged:kernelbench``)."""
    if source not in (PACKAGED_SOURCE, "packaged:kernelbench"):
        raise ReferenceLoadError(f"{source}: unknown packaged reference; this opforge ships {PACKAGED_SOURCE}")
    path = PACKAGED_DIR / "problems.jsonl.gz"
    if not path.is_file():
        raise ReferenceLoadError(f"{path}: the packaged KernelBench copy is missing from this installation")
    return _jsonl_rows(path)


def _hub_rows(spec: str) -> list[dict]:
    repo, _, revision = spec.partition("@")
    try:
        from datasets import load_dataset

        ds = load_dataset(repo, revision=revision or None)
    except Exception as exc:  # noqa: BLE001 - any download / parse failure, re-raised with the source named
        raise ReferenceLoadError(f"hub:{spec}: cannot load ({type(exc).__name__}: {exc})") from None
    return [dict(row) for split in ds.values() for row in split]


@dataclass
class TaskFeatures:
    """What the contamination tiers compare, for a task or a KernelBench problem.

    Attributes:
        exact_key: ``task.identity.source_hash`` (SHA-256 of the normalised source).
        signature: canonical ops the ``Model`` calls (traced on ``meta``, else read from the source).
        signature_source: ``trace`` or ``static``.
        static_signature: the ops read from the source (always available; used when one side has no trace).
        structure: ``task.structure.class_tokens`` encoded one code point per token.
        minhash: uint32 [NUM_PERM] MinHash of the shingles of the whole source's structure tokens.
    """

    exact_key: str
    signature: frozenset[str]
    signature_source: str
    static_signature: frozenset[str]
    structure: str
    minhash: np.ndarray


def task_features(code: str, traced: frozenset[str] | None) -> TaskFeatures:
    """Features of one task source; ``traced`` is its traced op signature (None when tracing failed).

    Raises:
        ValueError: the source does not parse.
    """
    from datasketch import MinHash
    from opforge.task.identity import source_hash
    from opforge.task.structure import (
        class_tokens,
        encode_tokens,
        module_tokens,
        parse_task,
        shingles,
        static_op_signature,
    )

    tree = parse_task(code)
    if tree is None:
        raise ValueError("the source does not parse")
    static = static_op_signature(tree)
    mh = MinHash(num_perm=NUM_PERM, seed=1)
    mh.update_batch(sorted(shingles(module_tokens(tree), SHINGLE)))
    return TaskFeatures(
        exact_key=source_hash(code),
        signature=traced if traced else static, signature_source="trace" if traced else "static",
        static_signature=static, structure=encode_tokens(class_tokens(tree)),
        minhash=np.asarray(mh.hashvalues, dtype=np.uint32))


def traced_signature(code: str, name: str = "<task>") -> tuple[frozenset[str] | None, str | None]:
    """Trace the task once on the ``meta`` device: (op signature, None) or (None, "<Exc>: message")."""
    from opforge.task.source import load_task
    from opforge.task.trace import op_signature, trace_task

    try:
        with warnings.catch_warnings():  # building reference models warns (nested tensors...): not ours
            warnings.simplefilter("ignore")
            sig = op_signature(trace_task(load_task(code, name), device="meta"))
    except Exception as exc:  # noqa: BLE001 - any failure means "use the static signature"
        return None, f"{type(exc).__name__}: {str(exc)[:200]}"
    return (sig or None), None


@dataclass
class KernelBenchIndex:
    """Features of every reference problem, plus lookup tables.

    Attributes:
        problems: names (``L1/19_ReLU``), levels, in index order.
        features: one ``TaskFeatures`` per problem.
        source / source_sha256: where the problems came from and a hash of their code (for fingerprints).
        trace_failures: problem name -> why tracing on meta failed (those use the static signature).
    """

    problems: list[str]
    levels: list[int]
    features: list[TaskFeatures]
    source: str
    source_sha256: str
    trace_failures: dict[str, str] = field(default_factory=dict)
    version: int = INDEX_VERSION

    def __post_init__(self):
        self.by_exact = {f.exact_key: i for i, f in enumerate(self.features)}
        self.minhashes = np.stack([f.minhash for f in self.features]) if self.features else np.zeros((0, NUM_PERM))
        self.structures = [f.structure for f in self.features]

    def __getstate__(self):
        return {k: getattr(self, k) for k in ("problems", "levels", "features", "source", "source_sha256",
                                               "trace_failures", "version")}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.__post_init__()

    def identity(self) -> dict:
        """What identifies this index in a run fingerprint."""
        return {"source": self.source, "sha256": self.source_sha256, "levels": sorted(set(self.levels)),
                "version": self.version}


def build_index(source: str | Path | None = None, levels: tuple[int, ...] = DEFAULT_LEVELS,
                progress: bool = False) -> KernelBenchIndex:
    """Load the reference problems and compute their features (traces each on ``meta``: ~10 s for L1–3).

    Raises:
        ReferenceLoadError: see ``load_problems``.
    """
    from tqdm.auto import tqdm

    problems = load_problems(source, levels)
    feats, failures = [], {}
    for p in tqdm(problems, desc="KernelBench index", unit="problem", disable=not progress):
        traced, err = traced_signature(p.code, p.key)
        if err:
            failures[p.key] = err
        feats.append(task_features(p.code, traced))
    digest = hashlib.sha256("\n\0".join(p.code for p in problems).encode()).hexdigest()
    return KernelBenchIndex([p.key for p in problems], [p.level for p in problems], feats,
                            str(source or default_reference()), digest, failures)


def save_index(index: KernelBenchIndex, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(pickle.dumps(index, protocol=pickle.HIGHEST_PROTOCOL))
    tmp.replace(path)
    return path


_LOADED: dict[str, KernelBenchIndex] = {}


def load_index(path: str | Path) -> KernelBenchIndex:
    """The index saved at ``path`` (cached per process). Raises ReferenceLoadError if missing or stale."""
    key = str(Path(path).resolve())
    if key not in _LOADED:
        try:
            index = pickle.loads(Path(path).read_bytes())
        except (OSError, pickle.UnpicklingError, EOFError, AttributeError) as exc:
            raise ReferenceLoadError(f"{path}: not a KernelBench index ({exc})") from None
        if getattr(index, "version", None) != INDEX_VERSION:
            raise ReferenceLoadError(f"{path}: index version {getattr(index, 'version', None)}, "
                                 f"expected {INDEX_VERSION}; rebuild it")
        _LOADED[key] = index
    return _LOADED[key]


def ensure_index(path: str | Path, source: str | Path | None = None,
                 levels: tuple[int, ...] = DEFAULT_LEVELS, progress: bool = False) -> KernelBenchIndex:
    """Load the index at ``path`` if it was built from the same source and levels, else build and save it."""
    path = Path(path)
    want = str(source or default_reference())
    if path.exists():
        try:
            index = load_index(path)
            if index.source == want and sorted(set(index.levels)) == sorted(levels):
                return index
        except ReferenceLoadError:
            pass
        _LOADED.pop(str(path.resolve()), None)
    index = build_index(want, levels, progress)
    save_index(index, path)
    _LOADED[str(path.resolve())] = index
    return index


def cache_dir() -> Path:
    """Where built indexes are kept between runs: ``$OPFORGE_CACHE`` or ``~/.cache/opforge``."""
    return Path(os.environ.get("OPFORGE_CACHE") or Path.home() / ".cache" / "opforge")


def cached_index(source: str | Path | None = None, levels: tuple[int, ...] = DEFAULT_LEVELS,
                 progress: bool = False) -> tuple[Path, KernelBenchIndex]:
    """The index of ``source`` at ``levels``, built once per machine and kept under ``cache_dir()``, keyed
    by source (path, size and mtime), levels, torch version and ``INDEX_VERSION`` (~10 s to build for
    L1–3 on one core). Returns (path of the saved index, index).

    Raises:
        ReferenceLoadError: the reference cannot be loaded (see ``load_problems``).
    """
    import torch

    want = str(source or default_reference())
    stamp = None
    if not want.startswith("hub:") and Path(want).exists():  # an edited reference file is a new index
        st = Path(want).stat()
        stamp = [st.st_size, st.st_mtime_ns]
    key = hashlib.sha256(json.dumps([want, stamp, sorted(levels), torch.__version__, INDEX_VERSION]).encode()
                         ).hexdigest()
    path = cache_dir() / "kernelbench" / f"index-{key[:16]}.pkl"
    return path, ensure_index(path, want, levels, progress)


def index_for_run(run_dir: str | Path, source: str | Path | None = None,
                  levels: tuple[int, ...] = DEFAULT_LEVELS, progress: bool = True) -> tuple[Path, KernelBenchIndex]:
    """The index a run's sandboxes load: ``cached_index`` copied to ``RUN_DIR/kernelbench_index.pkl`` (so a
    run directory is self-contained and workers of an external cluster read it beside the ledger).

    Raises:
        ReferenceLoadError: the reference cannot be loaded (see ``load_problems``).
    """
    import shutil

    target = Path(run_dir) / "kernelbench_index.pkl"
    try:
        cached, index = cached_index(source, levels, progress)
    except OSError:  # no writable cache: build into the run directory only
        index = build_index(source, levels, progress)
        return save_index(index, target), index
    if cached.resolve() != target.resolve():
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(".tmp")
        shutil.copyfile(cached, tmp)
        tmp.replace(target)  # atomic: a sandbox loading the index never reads a half-written file
    return target, index
