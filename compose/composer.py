"""Compose N candidate tasks from a seed catalog: sample graphs, size them, render KernelBench source."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import random
import threading
import warnings
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from opforge.compose.device_profiles import DeviceProfile, get_profile, window_target
from opforge.compose.graphs.cost_model import choose_batch, graph_cost
from opforge.compose.graphs.op_weights import check_op_weights
from opforge.compose.graphs.render import render_graph
from opforge.compose.graphs.sampler import FLOAT_DTYPES, Sampler, SamplingError, parse_op_mix
from opforge.compose.graphs.sizing import SizingError, fit_sizes
from opforge.seeds.catalog import read_catalog
from opforge.seeds.seed_op import SeedOp
from opforge.task.identity import task_id_for
from tqdm import tqdm

GENERATOR = "opforge-compose/1.3"  # 0.6: sampling-head motifs, fixed-dtype; 0.7: heads never mutated; 0.8: light class; 0.9: module constructors without default kwargs; 1.0: motif op set drawn before the model; 1.1: batch >= 2 for batch-norm motifs; 1.2: conv_norm_act drawn at share 0.55, motif inputs on a fixed-size profile at most 64 MB; 1.3: a norm constructor's bias=True left out on a torch before 2.13 (which rejected it: most conv + batch-norm motifs failed to render there), no random-composer input left unread (concat's removed branches)
COLUMNS = ["task_id", "code", "ops", "data_source", "num_ops", "graph", "categories", "input_shapes", "dtype",
           "size_context", "pattern", "predicted_ms", "device_profile", "generator", "generator_seed",
           "candidate_index", "provenance"]
DEFAULT_DTYPE_MIX = "float32:0.7,bfloat16:0.18,float16:0.12"
# Op counts of the random composer's graphs (``compose.graphs.sampler.OP_MIXES``): ``models`` follows what real models
# fuse (3-8 ops are common); ``ops6k`` keeps CUDA-Agent-Ops-6K's mix (84 % two-op chains).
DEFAULT_OP_MIX = "models"
# Share of candidates drawn from the motif library. In a blind read of 30 published rows of a 1,000-task run on
# 2 x H200 (motif share 0.8, 35 % of the published rows from the random composer), the reader found 20 of 20 motif
# rows sensible and 4 of 9 random-composer rows; the random composer's heavy-op chains also pass the filters about
# twice as often as motifs, so its share of published rows is about twice its share of candidates.
DEFAULT_MOTIF_SHARE = 0.9
# Share of motif candidates rendered with a mutation (activation swapped, residual added); the others keep the
# model's computation as traced. A motif is drawn in the family's own dtype with probability NATIVE_DTYPE_SHARE,
# else from the run's dtype mix.
MOTIF_MUTATION_SHARE = 0.3
NATIVE_DTYPE_SHARE = 0.7
CHUNK = 50  # candidate indices per unit of work of a process pool (the output does not depend on it)


def parse_dtype_mix(spec: str) -> dict[str, float]:
    """``float32:0.7,bfloat16:0.2,float16:0.1`` -> normalised {dtype: share}. Raises ValueError naming the
    choices for an unknown dtype or a bad number."""
    out: dict[str, float] = {}
    try:
        for part in spec.split(","):
            name, w = part.split(":")
            out[name.strip()] = float(w)
    except ValueError:
        raise ValueError(f"bad dtype mix {spec!r}: use 'float32:0.7,bfloat16:0.2,float16:0.1'") from None
    bad = [d for d in out if d not in FLOAT_DTYPES]
    if bad or any(w < 0 for w in out.values()) or sum(out.values()) <= 0:
        raise ValueError(f"bad dtype mix {spec!r}: dtypes are {', '.join(FLOAT_DTYPES)} with non-negative shares")
    total = sum(out.values())
    return {d: w / total for d, w in out.items() if w > 0}


@dataclass
class ComposeConfig:
    """Options of one composition run (see ``opforge compose --help``).

    ``dtype_mix``: share of tasks per floating dtype (bfloat16 / float16 tasks have inputs, parameters and
    modules in that dtype and are judged at its tolerance, ``opforge.task.precision``). ``op_weights``: label ->
    weight overriding the relevance-based defaults (``compose.graphs.op_weights``). ``vocabulary``: path of a shape
    vocabulary JSON (default: the packaged one, ``opforge.seeds.vocabulary.default_vocabulary``).
    ``transformers_share``: share of self-contained transformers block tasks (``compose.blocks.tasks``).
    ``window_ms``: the runtime window (ms) the tasks are sized into, the filter run's (``opforge run`` passes
    its own); None = the device profile's ``window_ms``. ``motif_share``: share of candidates drawn from the
    motif library (``compose.motifs.library``; ``motif_library`` a path, default the packaged library), the rest from
    the random composer and transformers blocks. ``op_mix``: op counts of the random composer's graphs
    (``DEFAULT_OP_MIX``, or ``ops6k`` for CUDA-Agent-Ops-6K's mix)."""

    n: int
    seed: int = 0
    op_mix: str = DEFAULT_OP_MIX
    device_profile: str = "h100"
    transformers_share: float = 0.04
    allow_stochastic: bool = False
    category_weights: dict[str, float] | None = None
    start_index: int = 0
    dtype_mix: str = DEFAULT_DTYPE_MIX
    op_weights: dict[str, float] | None = None
    include_internal: bool = False
    heavy_start: float | None = None
    vocabulary: str | None = None
    window_ms: tuple[float, float] | None = None
    motif_share: float = DEFAULT_MOTIF_SHARE
    motif_library: str | None = None


def profile_for(cfg: ComposeConfig) -> DeviceProfile:
    """The device profile of ``cfg`` with its runtime window when one is given. Raises ValueError for an
    unknown profile or a window that is not 0 <= lo < hi."""
    profile = get_profile(cfg.device_profile)
    if cfg.window_ms is None:
        return profile
    lo, hi = (float(v) for v in cfg.window_ms)
    if not 0 <= lo < hi:
        raise ValueError(f"compose: runtime window must be 0 <= lo < hi (ms), got {[lo, hi]}")
    return dataclasses.replace(profile, window_ms=(lo, hi))


_STATE: dict = {}


def _init(catalog: list[SeedOp], cfg: ComposeConfig):
    import warnings

    from opforge.compose.graphs.op_weights import default_op_weights, merge_op_weights
    from opforge.compose.graphs.sampler import DEFAULT_HEAVY_START
    from opforge.seeds.optional_imports import guard_optional_imports

    guard_optional_imports()  # a broken torchvision / timm is left out, not a dead composer
    from transformers.utils import logging as hf_logging

    warnings.filterwarnings("ignore")  # deprecation chatter from ops run on meta
    hf_logging.set_verbosity_error()
    profile = profile_for(cfg)
    vocab = _vocabulary(cfg) if profile.realistic else None
    weights = merge_op_weights(default_op_weights(catalog), cfg.op_weights)
    heavy = DEFAULT_HEAVY_START if cfg.heavy_start is None else cfg.heavy_start
    _STATE["sampler"] = Sampler(catalog, profile, cfg.allow_stochastic, cfg.category_weights, vocab=vocab,
                                op_weights=weights, include_internal=cfg.include_internal, heavy_start=heavy)
    _STATE["vocab"] = vocab
    _STATE["blocks"] = _block_specs(profile) if cfg.transformers_share > 0 else []
    _STATE["motifs"] = _motif_pool(cfg, profile) if cfg.motif_share > 0 else None
    _STATE["cfg"], _STATE["profile"] = cfg, profile
    _STATE["mix"] = parse_op_mix(cfg.op_mix)
    mix = parse_dtype_mix(cfg.dtype_mix)
    runnable = {d for o in catalog for d in (o.dtypes or ["float32"])}
    missing = sorted(set(mix) - runnable)
    if missing:  # a catalog harvested before dtype probing records float32 only
        warnings.warn(f"the seed catalog records no op that runs in {', '.join(missing)} (harvest it again to "
                      f"probe dtypes): composing without them", stacklevel=2)
        mix = {d: w for d, w in mix.items() if d in runnable} or {"float32": 1.0}
    _STATE["dtypes"] = mix


def _vocabulary(cfg: ComposeConfig):
    from opforge.seeds.vocabulary import default_vocabulary, load_vocabulary

    return load_vocabulary(cfg.vocabulary) if cfg.vocabulary else default_vocabulary()


# Largest block (parameters) a fixed-size profile (``cpu``, ``test``) draws: the blocks of GPT-2, BERT, ViT and
# T5-base are 2-7 M; a Llama decoder layer (202 M) takes a minute through the filters on a CI core.
SMALL_PROFILE_BLOCK_PARAMS = 10_000_000


def _block_specs(profile):
    """Block specs the composer draws from: all on a realistic profile, the small ones otherwise."""
    from opforge.compose.blocks.tasks import block_specs

    specs = block_specs()
    if profile.realistic:
        return specs
    return [s for s in specs if s.param_count() <= SMALL_PROFILE_BLOCK_PARAMS]


def _motif_pool(cfg: ComposeConfig, profile):
    """The motif pool of ``cfg`` (``compose.motifs.library``); a fixed-size profile draws only motifs whose modules
    hold at most ``SMALL_PROFILE_BLOCK_PARAMS`` parameters."""
    from opforge.compose.motifs.candidates import small_enough
    from opforge.compose.motifs.library import LIGHT_SHARE, MotifPool, library_meta, load_motifs

    motifs = load_motifs(cfg.motif_library, shared=True)  # read-only here: MotifPool draws, mutants are copies
    if not profile.realistic:
        motifs = [m for m in motifs if small_enough(m, SMALL_PROFILE_BLOCK_PARAMS)]
    weights = library_meta(cfg.motif_library).get("source_weights")
    if weights:  # a merged library (``compose.motifs.sources``): a source by its weight, then a motif in it
        from opforge.compose.motifs.sources import source_pool

        return source_pool(motifs, weights, lambda ms: MotifPool(ms, light_share=LIGHT_SHARE))
    return MotifPool(motifs, light_share=LIGHT_SHARE)


def _batches(profile) -> list[int]:
    vocab = _STATE["vocab"]
    return [b for b in vocab.values("batch", 1, profile.max_batch)] or [1]


def _candidate(i: int) -> dict | None:
    cfg, profile, sampler = _STATE["cfg"], _STATE["profile"], _STATE["sampler"]
    mix = _STATE["mix"]
    dtypes = _STATE["dtypes"]
    # the dtype, the kind (block or graph) and the op count are drawn once per candidate, so that the mixes
    # hold whatever fails to sample
    first = random.Random(f"{cfg.seed}:{i}:dtype")
    dtype = first.choices(list(dtypes), list(dtypes.values()))[0]
    block = bool(_STATE["blocks"]) and first.random() < cfg.transformers_share
    k = first.choices(list(mix), list(mix.values()))[0]
    motif = _STATE["motifs"] is not None and not block and first.random() < cfg.motif_share
    for attempt in range(40):
        rng = random.Random(f"{cfg.seed}:{i}:{attempt}")
        if motif:
            from opforge.compose.motifs.candidates import motif_candidate

            row = motif_candidate(_STATE, rng, i, dtype)
            if row is not None:
                return row
            continue
        if block:
            row = _block_candidate(rng, i, dtype)
            if row is not None:
                return row
            continue
        try:
            graph, pattern = sampler.sample(rng, k, dtype)
        except SamplingError:
            continue
        try:
            if profile.realistic:
                _, predicted = fit_sizes(graph, profile, _batches(profile), sampler.context.knobs)
            else:
                _, predicted = choose_batch(graph, profile)
        except (MemoryError, SizingError):
            continue
        labels = graph.labels()
        doc = (f"Fused task ({pattern}, {dtype}): {' -> '.join(labels)}. Generated by {GENERATOR}, "
               f"seed {cfg.seed}, candidate {i}.")
        code = render_graph(graph, doc)
        return {
            "task_id": task_id_for(code), "code": code, "ops": json.dumps(labels),
            "data_source": f"torch#{len(labels)}", "num_ops": len(labels), "graph": graph.to_json(),
            "categories": json.dumps(sorted({graph.seeds[n].category for n in graph.ops()})),
            "input_shapes": json.dumps([list(graph.input_shape(n)) for n in graph.inputs()]), "dtype": dtype,
            "size_context": sampler.context.family if profile.realistic and sampler.context else "",
            "pattern": pattern, "predicted_ms": float(predicted), "device_profile": profile.name,
            "generator": GENERATOR, "generator_seed": cfg.seed, "candidate_index": i, "provenance": "",
        }
    return None  # no graph fits: the candidate index is left out (compose() counts them)


def _block_candidate(rng: random.Random, i: int, dtype: str) -> dict | None:
    """A self-contained transformers block task (``compose.blocks.tasks``) sized to the window: the batch and the
    sequence come from the vocabulary (a realistic profile) or stay small (others); None when no size fits."""
    from opforge.compose.blocks.tasks import render_block

    cfg, profile = _STATE["cfg"], _STATE["profile"]
    spec = rng.choice(_STATE["blocks"])
    doc = (f"Transformers block {spec.label} ({spec.family}, {dtype}), computed in this source. Generated by "
           f"{GENERATOR}, seed {cfg.seed}, candidate {i}.")
    if profile.realistic:
        longest = min(int(spec.config.get("max_positions") or 4096), 8192)
        seqs = [s for s in _STATE["vocab"].values("seq", 16, longest)] or [128]
        batches = _batches(profile)
    else:
        seqs, batches = [8], [1, 2]
    seq = rng.choice(seqs)
    ok_lo, ok_hi, target = window_target(profile)
    for _ in range(6):
        per = _block_ms(render_block(spec, 1, seq, dtype, doc), profile, dtype)
        if per is None:
            return None
        batch = min(batches, key=lambda b: abs(math.log(max(per * b, 1e-9) / target)))
        t = per * batch
        if ok_lo <= t <= ok_hi or not profile.realistic:
            code = render_block(spec, batch, seq, dtype, doc)
            return {
                "task_id": task_id_for(code), "code": code, "ops": json.dumps([spec.label]),
                "data_source": "transformers", "num_ops": 1,
                "graph": json.dumps({"transformers": spec.label, "family": spec.family, "kind": spec.kind,
                                     "batch_size": batch, "seq_len": seq, "dtype": dtype}, sort_keys=True),
                "categories": json.dumps(["block"]),
                "input_shapes": json.dumps([[batch, seq, int(spec.config.get("hidden_size", 0))]]),
                "dtype": dtype, "size_context": spec.family, "pattern": "transformers", "predicted_ms": float(t),
                "device_profile": profile.name, "generator": GENERATOR, "generator_seed": cfg.seed,
                "candidate_index": i, "provenance": json.dumps({"source": f"transformers:{spec.family}",
                                                                "block": spec.label}),
            }
        bigger = [s for s in seqs if s > seq]
        smaller = [s for s in seqs if s < seq]
        if t < ok_lo and bigger:
            seq = min(bigger)
        elif t > ok_hi and smaller:
            seq = max(smaller)
        else:
            return None
    return None


def _block_ms(code: str, profile, dtype: str) -> float | None:
    """Predicted eager ms of one batch item of a block task (roofline on ``meta``); None if it fails."""
    import torch
    from opforge.task.source import load_task
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    try:
        with torch.device("meta"):
            task = load_task(code, "block")
            model = task.build()
            x = task.inputs()
            with counter:
                out = model(*x)
    except Exception:  # noqa: BLE001 - a block that does not build at these sizes
        return None
    out_t = out[0] if isinstance(out, (tuple, list)) else out
    nbytes = sum(t.numel() * t.element_size() for t in x) + sum(p.numel() * p.element_size()
                                                                 for p in model.parameters())
    nbytes += out_t.numel() * out_t.element_size() * 6  # intermediates: a few activations per block
    return 1e3 * max(counter.get_total_flops() / (profile.peak_for(dtype) * profile.flop_efficiency),
                     nbytes / (profile.bandwidth * profile.bandwidth_efficiency))


_LOCK = threading.Lock()  # one composition at a time per process (the state is shared)


def _state_key(catalog: list[SeedOp], cfg: ComposeConfig) -> tuple:
    return id(catalog), dataclasses.replace(cfg, n=0, start_index=0)


def compose_rows(catalog: list[SeedOp], cfg: ComposeConfig, indices) -> list[dict | None]:
    """The candidate rows (``COLUMNS``) of ``indices``, None for an index no graph fits. Each row depends only on
    the catalog, ``cfg`` (less ``n`` and ``start_index``) and its index; the composer's state (sampler, motif
    pool, block specs) is built once per process for a catalog object and config and kept for later calls.
    Raises ValueError for a bad op mix, dtype mix or device profile."""
    key = _state_key(catalog, cfg)
    with _LOCK:
        if _STATE.get("key") != key or _STATE.get("catalog") is not catalog:
            _STATE.clear()
            _init(catalog, cfg)
            _STATE["key"], _STATE["catalog"] = key, catalog
        return [_candidate(i) for i in indices]


_POOL_ARGS: list = []  # (catalog, cfg) of a process-pool worker, set once by its initializer


def _worker_init(catalog: list[SeedOp], cfg: ComposeConfig) -> None:
    _POOL_ARGS[:] = [catalog, cfg]


def _chunk(indices: list[int]) -> list[dict | None]:
    catalog, cfg = _POOL_ARGS
    return compose_rows(catalog, cfg, indices)


def rows_frame(rows: list[dict | None]) -> pd.DataFrame:
    """Candidate rows (``compose_rows``) as the composer's DataFrame (``COLUMNS``), indices with no row left out."""
    return pd.DataFrame([r for r in rows if r is not None], columns=COLUMNS)


@contextlib.contextmanager
def composer_pool(catalog: list[SeedOp], cfg: ComposeConfig, workers: int):
    """A process pool of ``workers`` spawned processes composing for ``catalog`` and ``cfg`` (whatever its ``n``
    and ``start_index``), to pass to several ``compose`` calls (``pool=``) so its processes start (import torch,
    build the composer's state) once, not once per call; None when ``workers`` <= 1 (``compose`` then runs in
    this process)."""
    if workers <= 1:
        yield None
        return
    import multiprocessing as mp

    with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"), initializer=_worker_init,
                             initargs=(catalog, cfg)) as ex:
        ex.opforge_state_key = _state_key(catalog, cfg)
        yield ex


def compose(catalog: list[SeedOp], cfg: ComposeConfig, workers: int = 1, progress: bool = True,
            pool: ProcessPoolExecutor | None = None) -> pd.DataFrame:
    """``cfg.n`` candidates (candidate indices ``start_index .. start_index + n - 1``), in index order.

    The output depends only on the catalog and ``cfg`` (each candidate draws from its own seeded RNG),
    not on ``workers`` (processes; 1 = this process) or ``pool`` (a ``composer_pool`` for this catalog and
    config, used instead of starting ``workers`` processes). Raises ValueError for a bad op mix or device
    profile, or a ``pool`` made for another catalog or config.
    """
    parse_op_mix(cfg.op_mix)
    parse_dtype_mix(cfg.dtype_mix)
    profile_for(cfg)
    check_op_weights(catalog, cfg.op_weights)
    if pool is not None and getattr(pool, "opforge_state_key", None) != _state_key(catalog, cfg):
        raise ValueError("compose: the process pool was made for another catalog or composer config "
                         "(composer_pool(catalog, cfg, workers) with this call's catalog and cfg)")
    indices = list(range(cfg.start_index, cfg.start_index + cfg.n))
    rows: list[dict | None] = []
    bar = tqdm(total=len(indices), desc="compose", unit="task", disable=not progress)
    chunks = [indices[j:j + CHUNK] for j in range(0, len(indices), CHUNK)]
    with contextlib.ExitStack() as stack:
        if pool is None and workers > 1:
            pool = stack.enter_context(composer_pool(catalog, cfg, workers))
        if pool is None:
            parts = map(functools.partial(compose_rows, catalog, cfg), chunks)
        else:
            parts = pool.map(_chunk, chunks)
        for part in parts:
            rows.extend(part)
            bar.update(len(part))
    bar.close()
    missing = sum(r is None for r in rows)
    if missing:
        warnings.warn(f"{missing} of {len(rows)} candidate indices found no graph that fits (left out)",
                      stacklevel=2)
    return rows_frame(rows)


def compose_to_parquet(catalog_path: Path, out: Path, cfg: ComposeConfig, workers: int = 1,
                       progress: bool = True) -> pd.DataFrame:
    """``compose`` the catalog at ``catalog_path`` and write the candidates to the Parquet file ``out``."""
    df = compose(read_catalog(catalog_path), cfg, workers, progress=progress)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    df.to_parquet(out, index=False)
    return df


__all__ = ["ComposeConfig", "compose", "compose_rows", "compose_to_parquet", "graph_cost", "parse_dtype_mix",
           "rows_frame"]
