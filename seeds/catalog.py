"""Harvest the seed catalog and read / write it as Parquet (one row per ``SeedOp``)."""

from __future__ import annotations

import itertools
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from opforge.seeds.probe_pool import PoolSettings, ProbePool
from opforge.seeds.seed_op import SeedOp, SkipRecord
from opforge.seeds.specs_loader import SPECS_DIR, load_specs
from tqdm import tqdm


@dataclass
class HarvestResult:
    """Validated ops, skip records in candidate order, wall seconds and ops per library."""

    ops: list[SeedOp]
    skips: list[SkipRecord]
    seconds: float = 0.0
    counts: dict = field(default_factory=dict)


def library_versions() -> dict[str, str]:
    import torch
    import transformers

    return {"torch": torch.__version__.split("+")[0], "transformers": transformers.__version__}


def harvest(specs_dir: Path | None = SPECS_DIR, with_transformers: bool = True, families: list[str] | None = None,
            progress: bool = True, pool: PoolSettings | None = None, with_torch: bool = True,
            extra_specs: list[Path] | tuple = ()) -> HarvestResult:
    """Introspect torch (and transformers), probe every candidate, merge curated YAML entries.

    Probes run in parallel in sandboxed child processes (``seeds.probe_pool``; ``pool`` sets the workers,
    the per-unit timeout and the memory bound): a probe that crashes, hangs or exhausts its memory bound
    becomes a skip record (``crash:<SIGNAL>``, ``timeout``, ``oom``). The result does not depend on the
    number of workers: units are taken in candidate order, as a one-process harvest would take them. The
    workers are spawned, so a script that calls this must guard its entry point
    (``if __name__ == "__main__":``), as for any spawned ``multiprocessing`` child.

    YAML entries override automatically harvested ops with the same label. ``extra_specs``: the user's spec
    files or folders, added to those of ``specs_dir`` (None: the user's alone; ``specs_loader.load_specs``). ``with_torch=False`` probes the
    YAML entries only (no introspected torch ops). Returns validated ops sorted by (library, label) and the
    skip report. Raises ``SpecError`` for a malformed YAML entry before any probing.
    """
    from opforge.seeds.torch_candidates import torch_candidates
    from opforge.seeds.transformers_candidates import activation_candidates, family_names

    t0 = time.perf_counter()
    versions = library_versions()
    specs = load_specs(specs_dir, versions, extra_specs)  # fail fast on a bad spec
    spec_labels = {s.label for s in specs}
    drafts = [d for d in torch_candidates() if not (isinstance(d, SeedOp) and d.label in spec_labels)] \
        if with_torch else []
    items: list[SkipRecord | list[SeedOp]] = [*drafts, *specs]
    fams: list[str] = []
    if with_transformers:
        items += list(activation_candidates(versions["transformers"]))
        fams = families or family_names()
    items = [[d] if isinstance(d, SeedOp) else d for d in items]
    results = _run_units(items, fams, versions["transformers"], pool, progress)

    ops: dict[str, SeedOp] = {}
    skips: list[SkipRecord] = []
    for r in results:
        if isinstance(r, SeedOp):
            ops.setdefault(r.label, r)
        else:
            skips.append(r)
    out = sorted(ops.values(), key=lambda o: (o.library, o.label))
    skips = [s for s in skips if s.label not in ops]
    counts = Counter(o.library for o in out)
    return HarvestResult(ops=out, skips=skips, seconds=time.perf_counter() - t0, counts=dict(counts))


def _run_units(items: list[SkipRecord | list[SeedOp]], families: list[str], tf_version: str,
               settings: PoolSettings | None, progress: bool) -> list[SeedOp | SkipRecord]:
    """Probe every drafts list of ``items`` and of each family's blocks in the pool; return one result per
    unit (skip records of ``items`` as they are) in order: ``items``, then the families in order."""
    from concurrent.futures import FIRST_COMPLETED, wait

    with ProbePool(settings) as pool:
        done: dict[int, SeedOp | SkipRecord] = {}
        unit_of: dict = {}  # future -> ("probe", unit number, drafts) | ("family", name)
        family_items: dict[str, list[SkipRecord | int]] = {}
        ordered: list[SkipRecord | int] = []
        numbers = itertools.count()
        bar = tqdm(total=sum(isinstance(d, list) for d in items) + len(families), unit="unit",
                   desc=f"harvest ({pool.workers} workers)", disable=not progress, dynamic_ncols=True)

        def submit(drafts: list[SeedOp]) -> int:
            k = next(numbers)
            unit_of[pool.submit_probe(drafts)] = ("probe", k, drafts)
            return k

        for fam in families:  # first: the families' imports overlap the torch probes, not the tail
            unit_of[pool.submit_family(tf_version, fam)] = ("family", fam)
        for d in items:
            ordered.append(submit(d) if isinstance(d, list) else d)
        pending = set(unit_of)
        while pending:
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in finished:
                kind, key, *rest = unit_of.pop(fut)
                if kind == "probe":
                    d = rest[0][-1]
                    done[key] = pool.unit_result(fut, d.label, d.qualname, d.library)
                else:
                    res = pool.unit_result(fut, key, f"transformers.models.{key}", "transformers")
                    entries = [res] if isinstance(res, SkipRecord) else res
                    family_items[key] = [submit(e) if isinstance(e, list) else e for e in entries]
                    bar.total += sum(isinstance(e, list) for e in entries)
                    pending |= set(unit_of) - finished
                bar.update(1)
        bar.close()
    for fam in families:
        ordered += family_items[fam]
    return [done[x] if isinstance(x, int) else x for x in ordered]


def write_catalog(ops: list[SeedOp], path: Path) -> Path:
    """Write ops to Parquet at ``path`` (parent folders created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame([o.to_row() for o in ops]).to_parquet(path, index=False)
    return path


def write_skip_report(skips: list[SkipRecord], path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    cols = ["label", "qualname", "library", "reason", "detail"]
    pd.DataFrame([s.model_dump() for s in skips], columns=cols).to_csv(path, index=False)
    return path


def read_catalog(path: Path) -> list[SeedOp]:
    """Read a catalog written by ``write_catalog``.

    Raises FileNotFoundError naming the path, or ValueError naming the row that fails validation.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"seed catalog not found: {path} (run `opforge seeds harvest --out {path}`)")
    df = pd.read_parquet(path)
    out = []
    for i, row in enumerate(df.to_dict("records")):
        row = {k: (None if isinstance(v, float) and pd.isna(v) else v) for k, v in row.items()}
        try:
            out.append(SeedOp.from_row(row))
        except Exception as exc:
            raise ValueError(f"{path}: row {i} ({row.get('label')!r}) is not a valid SeedOp: {exc}") from None
    return out
