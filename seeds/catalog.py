"""Harvest the seed catalog and read / write it as Parquet (one row per ``SeedOp``)."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from opforge.seeds.probe import probe
from opforge.seeds.seed_op import SeedOp, SkipRecord
from opforge.seeds.specs_loader import SPECS_DIR, load_specs
from tqdm import tqdm


@dataclass
class HarvestResult:
    ops: list[SeedOp]
    skips: list[SkipRecord]
    seconds: float = 0.0
    counts: dict = field(default_factory=dict)


def library_versions() -> dict[str, str]:
    import torch
    import transformers

    return {"torch": torch.__version__.split("+")[0], "transformers": transformers.__version__}


def harvest(specs_dir: Path = SPECS_DIR, with_transformers: bool = True, families: list[str] | None = None,
            progress: bool = True) -> HarvestResult:
    """Introspect torch (and transformers), probe every candidate, merge curated YAML entries.

    YAML entries override automatically harvested ops with the same label. Returns validated ops sorted by
    (library, label) and the skip report. Raises ``SpecError`` for a malformed YAML entry before any probing.
    """
    from opforge.seeds.torch_candidates import torch_candidates
    from opforge.seeds.transformers_candidates import activation_candidates, family_candidates

    t0 = time.perf_counter()
    versions = library_versions()
    specs = load_specs(specs_dir, versions)  # fail fast on a bad spec
    spec_labels = {s.label for s in specs}
    ops: dict[str, SeedOp] = {}
    skips: list[SkipRecord] = []

    def take(result):
        if isinstance(result, SeedOp):
            # A recipe must reproduce: probe the validated op once more (catches ops whose output depends
            # on state the probe does not control, e.g. routing in some MoE blocks).
            again = probe(result)
            if not isinstance(again, SeedOp) or again.output_shape != result.output_shape:
                skips.append(SkipRecord(label=result.label, qualname=result.qualname, library=result.library,
                                        reason="unstable", detail=getattr(again, "detail", "")))
                return
            ops.setdefault(result.label, result)
        else:
            skips.append(result)

    drafts = [d for d in torch_candidates() if not (isinstance(d, SeedOp) and d.label in spec_labels)]
    for d in tqdm(drafts + specs, desc="probe torch", disable=not progress, unit="op"):
        take(probe(d) if isinstance(d, SeedOp) else d)
    if with_transformers:
        for d in activation_candidates(versions["transformers"]):
            take(probe(d))
        for group in tqdm(list(family_candidates(versions["transformers"], families)), desc="probe transformers",
                          disable=not progress, unit="block"):
            if isinstance(group, SkipRecord):
                skips.append(group)
                continue
            last = None
            for draft in group:
                last = probe(draft)
                if isinstance(last, SeedOp):
                    break
            take(last)
    out = sorted(ops.values(), key=lambda o: (o.library, o.label))
    skipped_labels = {s.label for s in skips}
    skips = [s for s in skips if s.label not in ops] if skipped_labels else skips
    counts = Counter(o.library for o in out)
    return HarvestResult(ops=out, skips=skips, seconds=time.perf_counter() - t0, counts=dict(counts))


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
