"""``opforge run``: harvest -> compose -> filter -> select -> Hub folder, in one resumable run directory.

Run directory::

    config.yaml                  the resolved configuration (a re-run must match its identity fields)
    seeds/catalog.parquet        seed catalog (harvested once, or copied from ``seeds_catalog``)
    candidates/round-NNNN.parquet  composed candidates, ``round_size`` per round, candidate indices
                                 ``NNNN * round_size ...`` (so a round is the same whenever it is composed)
    candidates.parquet           all rounds so far (the filter stage's input), less the candidates of a round
                                 whose (op set, dtype) signature already held ``max_per_signature`` accepted
                                 tasks from earlier rounds (``skip_full_signatures``)
    filter/                      ledger.jsonl, verdicts.parquet, funnel.json (see ``opforge filter``)
    selection.json               what selection chose and why
    hf/                          the Hub folder (see ``pipeline.hub_folder``)
    run.json                     stages, timings, stop reason

Every stage skips what is already on disk: finished rounds are not recomposed, verdicts in the ledger are not
recomputed, so re-running the same command after an interruption finishes the work and redoes nothing
finished. Selection and the Hub folder are rebuilt at the end of every run (seconds).
"""

from __future__ import annotations

import json
import os
import shutil
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


def _harvest(cfg: RunConfig, run_dir: Path, progress: bool = True) -> Path:
    catalog = run_dir / "seeds" / "catalog.parquet"
    if catalog.exists():
        return catalog
    catalog.parent.mkdir(parents=True, exist_ok=True)
    if cfg.seeds_catalog is not None:
        if not Path(cfg.seeds_catalog).is_file():
            raise ConfigError(f"seeds_catalog: {cfg.seeds_catalog}: no such file")
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
        res = harvest(SPECS_DIR, progress=progress, pool=pool, with_transformers=cfg.harvest_transformers)
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


def _warm_up_summary(futures: list) -> dict[str, Any] | None:
    """What the sandboxes started before composing (``warm_sandbox`` futures) reported: how many started,
    the slowest start (s) and the first errors."""
    done = [f.result() for f in futures if f.done() and f.status == "finished"]
    return {"started": sum(1 for r in done if r["error"] is None), "of": len(futures),
            "slowest_start_s": round(max((r["start_s"] for r in done), default=0.0), 2),
            "errors": [r["error"] for r in done if r["error"]][:3]}


def _round_path(run_dir: Path, k: int) -> Path:
    return run_dir / "candidates" / f"round-{k:04d}.parquet"


def _compose_round(cfg: RunConfig, catalog: Path, k: int, run_dir: Path, progress: bool = True) -> Path:
    from opforge.compose.composer import ComposeConfig, compose
    from opforge.seeds.catalog import read_catalog

    path = _round_path(run_dir, k)
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    ccfg = ComposeConfig(n=cfg.round_size, seed=cfg.seed, op_mix=cfg.op_mix, device_profile=cfg.device_profile,
                         transformers_share=cfg.transformers_share, start_index=k * cfg.round_size,
                         dtype_mix=cfg.dtype_mix, op_weights=cfg.op_weights,
                         vocabulary=_vocabulary_path(cfg, catalog),
                         include_internal=cfg.include_internal, heavy_start=cfg.heavy_start,
                         window_ms=cfg.runtime_window_ms, motif_share=cfg.motif_share,
                         motif_library=cfg.motif_library)
    # the sandboxes wait for candidates meanwhile: compose on every core (output does not depend on it)
    workers = cfg.compose_workers or max(1, min(len(os.sched_getaffinity(0)), cfg.round_size // 50))
    df = compose(read_catalog(catalog), ccfg, workers=workers, progress=progress)
    tmp = path.with_suffix(".tmp.parquet")
    df.to_parquet(tmp, index=False)
    tmp.replace(path)
    return path


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


def run_pipeline(cfg: RunConfig, progress: bool = True) -> RunResult:
    """Run (or resume) the whole pipeline described by ``cfg``; see the module docstring.

    Raises:
        ConfigError: the run directory holds another run, or a bad option.
        ValueError / InputError / ReferenceLoadError: from the stages, with the file or option named.
    """
    from opforge.compose.sampler import parse_op_mix
    from opforge.engine.cluster import open_cluster
    from opforge.filters.chain import check_thresholds
    from opforge.pipeline.filter_run import prepare_settings, run_filter, warm_sandboxes
    from opforge.pipeline.select import bucket_shares, capped_out, select_tasks

    cfg = cfg.resolved()
    settings = _filter_settings(cfg)
    settings.names()  # unknown filter names and thresholds fail here, before anything is written
    check_thresholds(settings.thresholds)
    run_dir = Path(cfg.out)
    run_dir.mkdir(parents=True, exist_ok=True)
    _check_same_run(cfg, run_dir)
    save_config(cfg, run_dir / "config.yaml")
    shares = bucket_shares(parse_op_mix(cfg.op_mix), cfg.transformers_share)
    seconds: dict[str, float] = {}

    t0 = time.perf_counter()
    catalog = _harvest(cfg, run_dir, progress)
    seconds["harvest"] = time.perf_counter() - t0

    handle = None
    warming: list = []
    warm_up = None
    rounds: list[pd.DataFrame] = []  # each round's candidates, read once
    not_filtered: set[str] = set()  # task ids of candidates skipped for a full signature (skip_full_signatures)
    selection = pool = None
    stop_reason = ""
    seconds["compose"] = seconds["filter"] = 0.0
    try:
        k = 0
        while True:
            if handle is None:
                t0 = time.perf_counter()
                handle = open_cluster(cfg.device, cfg.workers, cfg.scheduler)
                if not _round_path(run_dir, k).exists():
                    # new candidates: the sandbox children start while the composer works (one core)
                    settings = prepare_settings(settings, run_dir / "filter", handle, progress)
                    warming = warm_sandboxes(handle, settings, run_dir / "filter")
                seconds["cluster_start"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            rounds.append(pd.read_parquet(_compose_round(cfg, catalog, k, run_dir, progress)))
            candidates = pd.concat(rounds, ignore_index=True)
            if cfg.skip_full_signatures and pool is not None:
                # decided from the verdicts of the earlier rounds only, so a resumed run skips the same ones
                not_filtered |= capped_out(rounds[-1], pool, cfg.max_per_signature)
            candidates[~candidates["task_id"].isin(not_filtered)].to_parquet(run_dir / "candidates.parquet",
                                                                             index=False)
            seconds["compose"] += time.perf_counter() - t0
            t0 = time.perf_counter()
            res = run_filter(run_dir / "candidates.parquet", run_dir / "filter", settings, handle=handle,
                             progress=progress)
            if warming:  # the filter stage has started: the warm-up futures are no longer needed
                warm_up, warming = _warm_up_summary(warming), []
            seconds["filter"] += time.perf_counter() - t0
            pool = accepted_pool(candidates, res.verdicts)
            if cfg.op_mix == "models":
                shares = bucket_shares({}, 0.0, pool, keep_pool_mix=True)
            selection = select_tasks(pool, cfg.target, shares, seed=cfg.seed, max_per_signature=cfg.max_per_signature)
            k += 1
            if selection.shortfall == 0:
                stop_reason = f"target of {cfg.target} reached after {len(candidates)} candidates"
                break
            if len(candidates) + cfg.round_size > cfg.candidate_budget:
                stop_reason = (f"candidate budget of {cfg.candidate_budget} exhausted: {len(selection.rows)} of "
                               f"{cfg.target} tasks selected")
                break
    finally:
        if handle is not None:
            handle.close()

    t0 = time.perf_counter()
    rows = _published_rows(selection.rows, res.funnel, cfg)
    # hidden shape variants (compose.variants), with the default settings `opforge variants` uses, so adding them
    # to a published folder later gives the same column; cached in the run directory
    from opforge.compose.variants import VariantSettings, summary
    from opforge.pipeline.variants_column import variants_column

    rows["shape_variants"], variant_results = variants_column(rows, VariantSettings(), cfg.compose_workers,
                                                              run_dir / "variants.jsonl", progress)
    funnel = _funnel_summary(candidates, res, len(rounds), stop_reason, settings, len(not_filtered))
    context = _card_context(cfg, rows, funnel, selection, res.funnel["environment"])
    context["variants"] = summary(variant_results)
    provenance = {"config": public_config(cfg, run_dir), "funnel": funnel, "environment": res.funnel["environment"],
                  "selection": _selection_json(selection)}
    from opforge.pipeline.hub_folder import build_hub_folder

    hf_dir = build_hub_folder(rows, run_dir / "hf", context, provenance)
    (run_dir / "selection.json").write_text(json.dumps(_selection_json(selection), indent=2))
    seconds["select_and_publish"] = time.perf_counter() - t0
    result = RunResult(run_dir, hf_dir, len(rows), funnel["accepted"], len(candidates), stop_reason,
                       {k: round(v, 2) for k, v in seconds.items()})
    (run_dir / "run.json").write_text(json.dumps({
        "selected": result.selected, "accepted": result.accepted, "candidates": result.candidates,
        "rounds": len(rounds), "stop_reason": stop_reason, "seconds": result.seconds, "sandbox_warm_up": warm_up,
        "not_filtered_full_signature": len(not_filtered), "yield": round(funnel["yield"], 4)}, indent=2))
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
    ctx = rows["size_context"].replace("", np.nan).dropna() if "size_context" in rows else pd.Series(dtype=str)
    return {"n": len(batch), "batch_p50": float(np.median(batch)) if batch else 0.0,
            "batch_p90": float(np.percentile(batch, 90)) if batch else 0.0,
            "largest_p50": float(np.median(largest)) if largest else 0.0, "distinct_dims": len(dims),
            "odd_share": odd / n, "dtypes": [(str(k), float(v)) for k, v in dtypes.items()],
            "contexts": [(str(k), int(v)) for k, v in ctx.value_counts().head(12).items()]}


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
    return {"kinds": [(k, v, v / n) for k, v in kinds.most_common()], "categories": cats.most_common(),
            "models": models.most_common(12), "distinct_models": len(models)}


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
