"""Motif sources: a researcher's own model mined into a library, and libraries merged with a weight each.

*Own model* (``trace_user_model``, ``opforge motifs --model``): an ``nn.Module`` class (or a function that
returns a module) named by import path (``pkg.mod:Net``, ``pkg.mod.Net`` or ``file.py:Net``), built with no
arguments on ``meta`` and traced like a library model (``motifs.trace.trace_module``) on inputs given either as
shapes (``input_shapes``: one list per positional input, each size an int, ``batch`` or ``seq``) or by an
example-inputs function (``inputs_fn(batch, seq)`` returning a tensor, a tuple of tensors or a dict of keyword
tensors; called under ``torch.device("meta")``); floating inputs are cast to the trace dtype. Its motifs name it
as ``user:<name>``.

*Merged libraries* (``merge_sources``, ``opforge compose --motifs`` / ``opforge run --motifs``): the base
library (the packaged one unless replaced) plus each source ``PATH[:WEIGHT]``; every motif is tagged
``source:<name>`` (``packaged`` or the file's name) and the library's meta records ``source_weights``. The
composer then draws a source by its weight before drawing a motif within it (``SourcePool``): a weight is the
source's share of the motif draws; sources without one split what the given weights leave (their sum must be
at most 1). A motif found in two sources belongs to the first.
"""

from __future__ import annotations

import random
import warnings
from pathlib import Path

import torch
from opforge.compose.motifs.cut import Motif, cut_motifs, merge, read_library, write_library
from opforge.compose.motifs.trace import TRACE_DTYPE, Trace, TraceError, trace_module

PACKAGED = "packaged"
SOURCE_TAG = "source:"


class MotifSourceError(ValueError):
    """A motif source that does not exist, cannot be read or weighs outside [0, 1]; names the source."""


def parse_source(spec: str) -> tuple[str, float | None]:
    """``PATH[:WEIGHT]`` -> (PATH, WEIGHT or None). ``packaged`` names the packaged library. Raises
    MotifSourceError for a weight outside [0, 1] or a path that does not exist."""
    path, sep, w = spec.rpartition(":")
    weight = None
    if sep:
        try:
            weight = float(w)
        except ValueError:
            path, weight = spec, None
    else:
        path = spec
    if weight is not None and not 0 <= weight <= 1:
        raise MotifSourceError(f"motif source {spec!r}: weight {weight} must be in [0, 1]")
    if path != PACKAGED and not Path(path).is_file():
        raise MotifSourceError(f"motif source {path!r}: no such motif library (mine one with `opforge motifs "
                               f"--model ...`; `packaged` names the packaged library)")
    return path, weight


def source_name(path: str) -> str:
    """The name a source's motifs are tagged with: ``packaged`` or the library file's name."""
    return PACKAGED if path == PACKAGED else Path(path).name


def _weights(names: list[str], given: dict[str, float | None]) -> dict[str, float]:
    fixed = {n: w for n, w in given.items() if w is not None}
    total = sum(fixed.values())
    if total > 1 + 1e-9:
        raise MotifSourceError(f"motif source weights add up to {total:g} > 1: {fixed}")
    free = [n for n in names if given.get(n) is None]
    rest = (1.0 - total) / len(free) if free else 0.0
    out = {n: (given[n] if given.get(n) is not None else rest) for n in names}
    if not free and total > 0:
        out = {n: w / total for n, w in out.items()}
    return out


def merge_sources(sources: list[str], out: Path, base: str | None = None) -> tuple[Path, dict]:
    """Write the library of ``base`` (a path; None: the packaged one) plus each ``PATH[:WEIGHT]`` of
    ``sources`` to ``out``, every motif tagged with its source (``SOURCE_TAG``); returns (out, meta) with
    ``source_weights`` (name -> share of the motif draws) and ``source_motifs`` (name -> motifs). Raises
    MotifSourceError naming a missing source or bad weights, ``MotifLibraryError`` for an unreadable one."""
    from opforge.compose.motifs.library import DEFAULT_LIBRARY

    base_path, base_weight, rest = base or PACKAGED, None, []
    for path, weight in (parse_source(s) for s in sources):
        if source_name(path) == source_name(base_path):
            base_weight = weight  # naming the base again gives it a weight
        else:
            rest.append((path, weight))
    parsed = [(base_path, base_weight), *rest]
    motifs: list[Motif] = []
    given: dict[str, float | None] = {}
    counts: dict[str, int] = {}
    metas = {}
    for path, weight in parsed:
        name = source_name(path)
        if name in given:
            raise MotifSourceError(f"motif source {name!r} given twice")
        ms, meta = read_library(DEFAULT_LIBRARY if path == PACKAGED else Path(path))
        metas[name] = {k: meta.get(k) for k in ("traced", "skipped", "libraries")}
        before = {m.motif_id for m in motifs}
        for m in ms:
            if m.motif_id not in before:
                m.tags = [t for t in m.tags if not t.startswith(SOURCE_TAG)] + [SOURCE_TAG + name]
        merge(motifs, ms)
        given[name] = weight
        counts[name] = sum(1 for m in ms if m.motif_id not in before)
    weights = _weights(list(given), given)
    meta = {"source_weights": weights, "source_motifs": counts, "sources": metas}
    return write_library(motifs, out, meta), meta


def motif_source(m: Motif) -> str:
    """The source a motif of a merged library came from (``''`` in an unmerged library)."""
    for t in m.tags:
        if t.startswith(SOURCE_TAG):
            return t[len(SOURCE_TAG):]
    return ""


class SourcePool:
    """Draws a source by its weight, then a motif from that source's ``MotifPool``."""

    def __init__(self, pools: dict, weights: dict[str, float]):
        self.pools = {n: p for n, p in pools.items() if weights.get(n, 0) > 0}
        if not self.pools:
            raise MotifSourceError("motif sources: no source with a positive weight has a drawable motif")
        self.names = sorted(self.pools)
        self.weights = [weights[n] for n in self.names]

    def draw(self, rng: random.Random) -> Motif:
        name = rng.choices(self.names, self.weights)[0]
        return self.pools[name].draw(rng)

    @property
    def groups(self) -> dict:
        out: dict = {}
        for p in self.pools.values():
            for c, fams in p.groups.items():
                for fam, ms in fams.items():
                    out.setdefault(c, {}).setdefault(fam, []).extend(ms)
        return out


def source_pool(motifs: list[Motif], weights: dict[str, float], make_pool):
    """A ``SourcePool`` over the motifs of each weighted source (``make_pool(motifs)`` builds one source's
    ``MotifPool``); a source none of whose motifs can be drawn is left out with a warning naming it."""
    by_source: dict[str, list[Motif]] = {}
    for m in motifs:
        by_source.setdefault(motif_source(m), []).append(m)
    pools = {}
    for name in weights:
        try:
            pools[name] = make_pool(by_source.get(name, []))
        except ValueError as exc:
            warnings.warn(f"motif source {name!r}: {exc}; its weight goes to the others", stacklevel=2)
    return SourcePool(pools, weights)


# ---- own models ----

def _size(token: str, batch: int, seq: int) -> int:
    t = token.strip()
    if t in ("batch", "B", "N"):
        return batch
    if t in ("seq", "L", "S"):
        return seq
    try:
        v = int(t)
    except ValueError:
        raise TraceError(f"input size {t!r}: use an int, 'batch' or 'seq'") from None
    if v <= 0:
        raise TraceError(f"input size {v}: sizes are positive")
    return v


def parse_shapes(shapes: list[str]) -> list[list[str]]:
    """``["batch,seq,64", "batch,64"]`` -> one size list per positional input (checked by ``_size``)."""
    out = [[t for t in s.split(",") if t.strip()] for s in shapes]
    for shape in out:
        for t in shape:
            _size(t, 1, 1)
    return out


def trace_user_model(spec: str, input_shapes: list[str] | None = None, inputs_fn: str | None = None,
                     name: str | None = None, max_positions: int = 0) -> Trace:
    """Trace the researcher's model at ``spec`` (see the module docstring) as ``user:<name>`` (default: the
    class name). Raises ``TraceError`` naming the model: it does not import (with the closest names), takes
    constructor arguments, has no inputs given, or its forward fails."""
    from opforge.seeds.user_ops import resolve

    label = f"user:{name or spec.rpartition(':')[2].rpartition('.')[2]}"
    if not input_shapes and not inputs_fn:
        raise TraceError(f"{label}: give its input shapes (--input-shape batch,seq,64) or an example-inputs "
                         f"function (--inputs-fn pkg.mod:make_inputs)")
    try:
        obj = resolve(spec)
        fn = resolve(inputs_fn) if inputs_fn else None
    except (ImportError, AttributeError) as exc:
        raise TraceError(f"{label}: {exc}") from None
    shapes = parse_shapes(input_shapes) if input_shapes else None
    try:
        with torch.device("meta"):
            model = obj if isinstance(obj, torch.nn.Module) else obj()
        if not isinstance(model, torch.nn.Module):
            raise TraceError(f"{label}: {spec} built a {type(model).__name__}, not an nn.Module")
        model = model.to(TRACE_DTYPE).eval()
    except TraceError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's constructor
        raise TraceError(f"{label}: building {spec}() on meta raised {type(exc).__name__}: {exc}"[:300]) from None

    def cast(t):
        return t.to(TRACE_DTYPE) if isinstance(t, torch.Tensor) and t.is_floating_point() else t

    def make(batch, seq):
        if fn is not None:
            with torch.device("meta"):
                got = fn(batch, seq)
            if isinstance(got, dict):
                return {k: cast(v) for k, v in got.items()}, True
            got = got if isinstance(got, (tuple, list)) else (got,)
            return {f"x{i}": cast(v) for i, v in enumerate(got)}, False
        return {f"x{i}": torch.empty([_size(t, batch, seq) for t in s], dtype=TRACE_DTYPE, device="meta")
                for i, s in enumerate(shapes)}, False

    class Wrap(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = model

        def forward(self, **kw):
            if self.keyword:
                return self.inner(**kw)
            return self.inner(*[kw[f"x{i}"] for i in range(len(kw))])

    wrap = Wrap()
    wrap.keyword = make(2, 2)[1] if fn is not None else False

    try:
        trace = trace_module(wrap, lambda b, s: make(b, s)[0], label, "user")
    except Exception as exc:  # noqa: BLE001 - the user's forward
        raise TraceError(f"{label}: forward raised {type(exc).__name__}: {exc}"[:300]) from None
    uses_seq = any(t.strip() in ("seq", "L", "S") for s in (shapes or []) for t in s) or fn is not None
    trace.config = {"max_positions": int(max_positions) if uses_seq else 0, "hidden_size": 0,
                    "native_dtype": "float32"}
    return trace


def mine_user_models(models: list[str], input_shapes: list[str] | None = None, inputs_fn: str | None = None,
                     ) -> tuple[list[Motif], dict]:
    """Motifs of each model of ``models`` (``trace_user_model``), merged; (motifs, meta) as
    ``library.mine_motifs`` gives them (``traced``, ``skipped``: model -> why)."""
    from collections import Counter

    from opforge.compose.motifs.library import library_versions

    motifs: list[Motif] = []
    traced, skipped = [], {}
    for spec in models:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                trace = trace_user_model(spec, input_shapes, inputs_fn)
        except TraceError as exc:
            skipped[spec] = str(exc)
            continue
        traced.append(trace.name if hasattr(trace, "name") else spec)
        merge(motifs, cut_motifs(trace))
    return motifs, {"libraries": library_versions(), "traced": traced, "skipped": skipped,
                    "categories": dict(Counter(m.category for m in motifs))}
