"""The ``opforge`` command line (typer).

Conventions: what a command cannot run without is a positional argument (``opforge filter INPUT OUT``);
options with fixed choices are enums, so ``--help`` lists them and a bad value stops the command with the
choices named (exit code 2); every error is one ``error: ...`` line on stderr and exit code 2; progress
bars go to stderr, only when it is a terminal and ``--quiet`` is not given. The options that only tune how
sandboxes share a GPU are grouped under their own help panel.
"""

from __future__ import annotations

import enum
import json
import sys
from collections import Counter
from pathlib import Path

import typer
from opforge.compose.device_profiles import PROFILES
from opforge.engine.settings import GPU_SHARING_OPTIONS, SANDBOX_OPTIONS, EngineSettings
from opforge.pipeline.settings_options import settings_options

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode="markdown",
                  help="opforge: build, filter and publish KernelBench-format fused-operator datasets, and score "
                       "kernels against them.")
seeds_app = typer.Typer(no_args_is_help=True, rich_markup_mode="markdown", help="Seed-operator catalog: harvest, list, vocabulary, relevance.")
app.add_typer(seeds_app, name="seeds")
harness_app = typer.Typer(no_args_is_help=True, rich_markup_mode="markdown", help="Evaluation environment: task workspaces and batch "
                                                     "evaluation of candidate kernels.")
app.add_typer(harness_app, name="harness")
gold_app = typer.Typer(no_args_is_help=True, rich_markup_mode="markdown",
                       help="Gold subset of a release: the rows that carry graded reference solutions (issue #57).")
app.add_typer(gold_app, name="gold")

DEFAULT_CATALOG = Path("runs/seeds/catalog.parquet")
GPU_PANEL = "GPU sharing (CUDA only; defaults suit one task per sandbox, see docs/gpu-sharing.md)"
KB_PANEL = "KernelBench contamination"


class Device(enum.StrEnum):
    """Where tasks run."""

    cpu = "cpu"
    cuda = "cuda"


class Reward(enum.StrEnum):
    """``milestone``: -1 / 1 / 2 / 3 (CUDA-Agent's scheme); ``speedup``: the speed-up itself."""

    milestone = "milestone"
    speedup = "speedup"


# The composer's registered device profiles (compose.device_profiles.PROFILES), as choices.
DeviceProfileName = enum.StrEnum("DeviceProfileName", {name: name for name in PROFILES})


MOTIFS_HELP = ("Your motif library PATH[:WEIGHT] (`opforge motifs --model`), repeatable: added to the packaged "
               "one (or --motif-library); WEIGHT is its share of the motif draws (default: the sources without one "
               "split what is left); `packaged:W` weighs the packaged one.")


def _value(choice):
    """An enum choice's string (None stays None)."""
    return choice.value if isinstance(choice, enum.Enum) else choice


def _check_op_mix(value: str | None) -> str | None:
    """``--op-mix`` callback: ``ops6k``, ``uniform`` or ``1:0.2,2:0.3,...`` (op counts 1-5)."""
    if value is None:
        return value
    from opforge.compose.graphs.sampler import parse_op_mix

    try:
        parse_op_mix(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc).replace("bad --op-mix ", "")) from None
    return value


def _check_dtype_mix(value: str | None) -> str | None:
    """``--dtype-mix`` callback: ``float32:0.7,bfloat16:0.18,float16:0.12`` style shares."""
    if value is None:
        return value
    from opforge.compose.composer import parse_dtype_mix

    try:
        parse_dtype_mix(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    return value


def _progress(quiet: bool) -> bool:
    """Progress bars: only on a terminal, and not with ``--quiet``."""
    return not quiet and sys.stderr.isatty()


def _fail(message: str, code: int = 2):
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _given(arg, alias, what: str):
    """A required input given as an argument, or as its older option spelling (kept as a hidden alias)."""
    if arg is not None and alias is not None and str(arg) != str(alias):
        _fail(f"{what} given twice ({arg} and {alias})")
    if arg is None and alias is None:
        _fail(f"missing argument {what}")
    return arg if arg is not None else alias


QUIET_HELP = "No progress bars (they are off anyway when stderr is not a terminal)."


def _version_callback(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"opforge {version('opforge')}")
        raise typer.Exit()


@app.callback()
def main(version: bool = typer.Option(False, "--version", callback=_version_callback, is_eager=True,
                                      help="Print opforge's version and exit.")) -> None:
    """opforge: build, filter and publish KernelBench-format fused-operator datasets, and score kernels."""
    from opforge.seeds.optional_imports import guard_optional_imports

    for name, why in guard_optional_imports().items():  # one line each, then the command runs without it
        typer.echo(f"warning: {name} does not import ({why}); running without it", err=True)


@seeds_app.command("harvest")
def seeds_harvest(
    out: Path = typer.Option(DEFAULT_CATALOG, help="Catalog Parquet to write; the skip report goes beside it."),
    specs: list[Path] = typer.Option(None, help="Your YAML spec file or folder, repeatable: added to the packaged "
                                                "seeds/specs (an entry with a packaged label replaces it)."),
    replace_specs: bool = typer.Option(False, "--replace-specs", help="Read only --specs, not the packaged ones."),
    no_transformers: bool = typer.Option(False, "--no-transformers", help="Harvest torch ops only."),
    workers: int = typer.Option(None, help="Probe processes (default: all usable cores; the catalog does not "
                                           "depend on it)."),
    probe_timeout_s: float = typer.Option(180.0, help="Per-probe limit, seconds: a longer one is a `timeout` skip."),
    probe_memory_gib: float = typer.Option(4.0, help="Per-probe memory bound, GiB: past it, an `oom` skip."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help=QUIET_HELP),
):
    """Introspect the installed torch and transformers, probe every candidate in sandboxed child processes
    (a crash, hang or memory blow-up is a skip record), write the catalog."""
    from opforge.seeds.catalog import harvest, write_catalog, write_skip_report
    from opforge.seeds.probe_pool import PoolSettings
    from opforge.seeds.specs_loader import SPECS_DIR, SpecError
    from opforge.seeds.vocabulary import start_vocabulary_harvest

    vocab_path = out.with_name("shape_vocabulary.json")
    executor, vocab = start_vocabulary_harvest(vocab_path)  # overlaps the probes
    try:
        pool = PoolSettings(workers=workers, timeout_s=probe_timeout_s, memory_gib=probe_memory_gib)
        res = harvest(None if replace_specs else SPECS_DIR, with_transformers=not no_transformers, pool=pool,
                      progress=_progress(quiet), extra_specs=specs or ())
    except (SpecError, ValueError) as exc:
        executor.shutdown(wait=False, cancel_futures=True)
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    write_catalog(res.ops, out)
    skip_path = write_skip_report(res.skips, out.with_name(out.stem + "_skipped.csv"))
    fams = len({o.family for o in res.ops if o.library == "transformers" and o.family != "activations"})
    typer.echo(f"wrote {len(res.ops)} seed ops to {out} ({', '.join(f'{k}: {v}' for k, v in sorted(res.counts.items()))}; "
               f"{fams} transformers families; {sum(o.stochastic for o in res.ops)} stochastic) in {res.seconds:.1f} s")
    typer.echo(f"skip report: {skip_path} ({len(res.skips)} candidates; "
               + ", ".join(f"{k}: {v}" for k, v in Counter(s.reason.split(':')[0] for s in res.skips).most_common()) + ")")
    try:
        vocab.result()
    finally:
        executor.shutdown(wait=False, cancel_futures=True)
    _report_vocabulary(vocab_path)


def _write_vocabulary(path: Path, progress: bool = True) -> None:
    from opforge.seeds.vocabulary import harvest_vocabulary, write_vocabulary

    write_vocabulary(harvest_vocabulary(progress=progress), path)
    _report_vocabulary(path)


def _report_vocabulary(path: Path) -> None:
    from opforge.seeds.vocabulary import AXES, load_vocabulary

    vocab = load_vocabulary(path)
    typer.echo(f"shape vocabulary: {path} ({len(vocab.models)} model records; distinct values per axis: "
               + ", ".join(f"{a} {len(vocab.axes[a])}" for a in AXES) + ")")


@seeds_app.command("vocabulary")
def seeds_vocabulary(
    out: Path = typer.Option(DEFAULT_CATALOG.with_name("shape_vocabulary.json"), help="Vocabulary JSON to write."),
):
    """Harvest the shape vocabulary (sizes per axis from real model configs, torchvision CNNs when installed)."""
    _write_vocabulary(out)


@seeds_app.command("relevance")
def seeds_relevance(
    out: Path = typer.Option(DEFAULT_CATALOG.with_name("op_relevance.json"), help="Relevance table JSON to write; "
                             "per-model results go to OUT.partial.jsonl, so a killed run resumes."),
    families: str = typer.Option(None, help="Only these transformers model types, comma-separated (default all)."),
    top: int = typer.Option(40, help="Print this many ops with the largest share."),
):
    """Trace real models (transformers default configs, torchvision when installed) on meta; count their ops."""
    from opforge.seeds.relevance import harvest_relevance, write_relevance

    cache = out.with_name(out.name + ".partial.jsonl")
    table = harvest_relevance(families=_names(families), cache=cache)
    write_relevance(table, out)
    typer.echo(f"wrote {out}: {table.n_models} models traced, {len(table.skipped)} skipped, {len(table.ops)} ops")
    for o in table.top(top):
        typer.echo(f"  {o.canonical:32} share {o.share:6.1%}  models {o.models:4}  calls {o.calls:6}  "
                   f"call share {o.call_share:6.2%}")


@app.command("motifs")
def motifs_cmd(
    out: Path = typer.Option(Path("runs/motifs.json.gz"), help="Motif library to write (gzip JSON)."),
    families: str = typer.Option(None, help="Only these transformers model types, comma-separated (default all)."),
    torchvision: str = typer.Option(None, help="torchvision models, comma-separated (default: a fixed list of "
                                               "classification models; '' for none)."),
    timm: str = typer.Option(None, help="timm models, comma-separated (default: a fixed list; '' for none)."),
    heads: str = typer.Option(None, help="Decoder families whose vocabulary sizes the sampling heads are "
                                         "traced at, comma-separated (default: a fixed list; '' for none)."),
    model: list[str] = typer.Option(None, "--model", help="Your nn.Module class (or factory) by import path "
                                    "(pkg.mod:Net, file.py:Net), repeatable: mine only these models."),
    input_shape: list[str] = typer.Option(None, "--input-shape", help="With --model: one positional input's "
                                          "shape, e.g. batch,seq,256 (ints, batch, seq); repeat per input."),
    inputs_fn: str = typer.Option(None, "--inputs-fn", help="With --model: a function (batch, seq) -> input "
                                  "tensor(s) or dict, by import path (pkg.mod:make_inputs, file.py:make_inputs)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help=QUIET_HELP),
):
    """Mine fusion motifs from real models (transformers, torchvision, timm as installed) and transformers'
    sampling heads into a library; with --model, from your own models only (compose with
    `opforge compose --motifs OUT:WEIGHT`)."""
    from opforge.compose.motifs.cut import write_library
    from opforge.compose.motifs.library import write_motif_library
    from opforge.compose.motifs.sources import mine_user_models

    def models(value):
        return None if value is None else tuple(v for v in value.split(",") if v.strip())

    if model:
        motifs, meta = mine_user_models(model, input_shape or None, inputs_fn)
        if motifs:
            path = write_library(motifs, out, meta)
    else:
        path, meta = write_motif_library(out, families=_names(families), torchvision_models=models(torchvision),
                                         timm_models=models(timm), head_families=models(heads),
                                         progress=_progress(quiet))
    for why in sorted({k.split(":")[0]: v for k, v in meta["skipped"].items() if "unavailable" in v}.values()):
        typer.echo(f"warning: {why.split(': ', 1)[-1]}: its models are skipped", err=True)
    if model:
        for why in meta["skipped"].values():
            typer.echo(f"warning: {why}", err=True)
    if not meta["categories"]:
        _fail(f"no motif mined ({len(meta['skipped'])} models skipped"
              + (f"; first: {next(iter(meta['skipped'].values()))}" if meta["skipped"] else "") + "); nothing written")
    cats = ", ".join(f"{k} {v}" for k, v in sorted(meta["categories"].items(), key=lambda kv: -kv[1]))
    typer.echo(f"wrote {path}: {sum(meta['categories'].values())} motifs from {len(meta['traced'])} models "
               f"({len(meta['skipped'])} skipped); per category: {cats}")


@app.command("blind-read")
def blind_read_cmd(
    datasets: list[str] = typer.Argument(..., help="LABEL=PATH of each dataset (Parquet, JSONL or Hub folder), "
                                                   "or 'score' FOLDER JUDGMENTS to score a filled packet."),
    n: int = typer.Option(30, help="Rows drawn from each dataset."),
    seed: int = typer.Option(0, help="Sampling and shuffling seed."),
    out: Path = typer.Option(Path("runs/blind_read"), help="Packet folder to write."),
):
    """Blind read: a shuffled, comment-free packet of rows from several datasets for a reader who does not know
    their source (`packet.md`, hidden `key.json`, `judgments.template.json`); `blind-read score FOLDER FILE`
    reports each dataset's sensible / strong shares."""
    from opforge.pipeline.blind_read import BlindReadError, make_packet, score

    try:
        if datasets[0] == "score":
            if len(datasets) != 3:
                _fail("usage: opforge blind-read score FOLDER JUDGMENTS")
            typer.echo(json.dumps(score(Path(datasets[1]), Path(datasets[2])), indent=1))
            return
        pairs = {}
        for item in datasets:
            label, sep, path = item.partition("=")
            if not sep or not label or not path:
                _fail(f"bad dataset {item!r}: use LABEL=PATH")
            pairs[label] = path
        folder = make_packet(pairs, n, out, seed)
    except (BlindReadError, ValueError, OSError) as exc:
        _fail(str(exc))
    typer.echo(f"wrote {folder}/packet.md ({n * len(pairs)} rows), key.json (keep it from the reader), "
               f"judgments.template.json")


@seeds_app.command("explain")
def seeds_explain(
    label: str = typer.Argument(..., help="Seed-op label (F.threshold, torch.special.erfcx, SquaredReLU...)."),
    catalog: Path = typer.Option(DEFAULT_CATALOG, help="Seed catalog Parquet; its skip report is read beside it."),
):
    """Why LABEL is in the catalog or was skipped, and what to change (reason codes: docs/extending.md)."""
    from opforge.seeds.skip_reasons import explain

    try:
        typer.echo(explain(label, catalog))
    except (KeyError, FileNotFoundError, ValueError) as exc:
        _fail(str(exc.args[0]) if isinstance(exc, KeyError) else str(exc))


@seeds_app.command("list")
def seeds_list(
    catalog: Path = typer.Option(DEFAULT_CATALOG, help="Catalog Parquet."),
    library: str = typer.Option(None, help="Only this library (torch / transformers)."),
    category: str = typer.Option(None, help="Only this category."),
):
    """Print the catalog as a table, then counts per library and category."""
    from opforge.seeds.catalog import read_catalog

    try:
        ops = read_catalog(catalog)
    except (FileNotFoundError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    ops = [o for o in ops if (library is None or o.library == library) and (category is None or o.category == category)]
    typer.echo(f"{'label':42} {'library':12} {'kind':8} {'category':14} {'templates':24} stochastic")
    for o in ops:
        typer.echo(f"{o.label:42} {o.library:12} {o.kind:8} {o.category:14} {','.join(o.templates)[:24]:24} "
                   f"{'yes' if o.stochastic else ''}")
    libs = Counter(o.library for o in ops)
    cats = Counter(o.category for o in ops)
    typer.echo(f"{len(ops)} seed ops; per library: " + ", ".join(f"{k}={v}" for k, v in sorted(libs.items()))
               + "; per category: " + ", ".join(f"{k}={v}" for k, v in cats.most_common()))


@app.command("compose")
def compose_cmd(
    seeds: Path = typer.Option(DEFAULT_CATALOG, help="Seed catalog Parquet (from `opforge seeds harvest`)."),
    n: int = typer.Option(1000, help="Number of candidates."),
    seed: int = typer.Option(0, help="Generator seed; the same seed gives byte-identical output."),
    out: Path = typer.Option(Path("runs/candidates.parquet"), help="Candidates Parquet to write."),
    op_mix: str = typer.Option("models", callback=_check_op_mix,
                               help="models | ops6k | uniform | '1:0.2,2:0.3,...' (share of 1..5-op tasks of "
                                    "the random composer)."),
    motif_share: float = typer.Option(0.9, min=0.0, max=1.0, help="Share of candidates drawn from the motif "
                                      "library (fusions mined from real models)."),
    motif_library: Path = typer.Option(None, help="Motif library replacing the packaged one (`opforge "
                                                  "motifs` mines one)."),
    motifs: list[str] = typer.Option(None, "--motifs", help=MOTIFS_HELP),
    device_profile: DeviceProfileName = typer.Option("h100", case_sensitive=False,
                                                     help="Cost-model profile for sizing."),
    transformers_share: float = typer.Option(0.04, help="Share of self-contained transformers block tasks."),
    categories: str = typer.Option(None, help="Category weights multiplying the op weights, e.g. "
                                              "'conv:2,gemm:2,loss:0' (default 1 each, linalg 0)."),
    op_weights: Path = typer.Option(None, help="YAML / JSON file of label: weight replacing the default "
                                               "(relevance-based) weight of each op it lists."),
    dtype_mix: str = typer.Option("float32:0.7,bfloat16:0.18,float16:0.12", callback=_check_dtype_mix,
                                  help="Share of tasks per dtype (float32, bfloat16, float16)."),
    vocabulary: Path = typer.Option(None, help="Shape vocabulary JSON (default: the packaged one; "
                                               "`opforge seeds vocabulary` writes one)."),
    include_internal: bool = typer.Option(False, help="Also draw internal ATen-level ops (torch.native_*, "
                                                      "*_copy, ...)."),
    heavy_start: float = typer.Option(None, help="Probability that a task starts with a GEMM / conv / "
                                                 "attention / RNN op (default 0.5)."),
    workers: int = typer.Option(None, min=1, help="Processes (default: the usable cores; output does not depend "
                                                  "on it)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help=QUIET_HELP),
):
    """Compose candidate fused tasks (KernelBench format) from the seed catalog."""
    import time

    from opforge.compose.composer import ComposeConfig, compose_to_parquet

    weights = None
    if categories:
        try:
            weights = {c: float(w) for c, w in (p.split(":") for p in categories.split(","))}
        except ValueError:
            typer.echo(f"error: bad --categories {categories!r}: use 'cat:weight,...'", err=True)
            raise typer.Exit(2) from None
    try:
        overrides = _op_weights(op_weights)
        if motifs:
            motif_library = _merged_motifs(motifs, motif_library, out.with_name(out.stem + ".motifs.json.gz"))
        cfg = ComposeConfig(n=n, seed=seed, op_mix=op_mix, device_profile=_value(device_profile),
                            transformers_share=transformers_share, category_weights=weights,
                            op_weights=overrides, dtype_mix=dtype_mix,
                            vocabulary=str(vocabulary) if vocabulary else None,
                            include_internal=include_internal, heavy_start=heavy_start,
                            motif_share=motif_share, motif_library=str(motif_library) if motif_library else None)
    except (ValueError, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    t0 = time.perf_counter()
    try:
        from opforge.engine.cluster import usable_cores

        df = compose_to_parquet(seeds, out, cfg, workers or usable_cores(), progress=_progress(quiet))
    except (ValueError, FileNotFoundError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    mix = df.num_ops.value_counts(normalize=True).sort_index()
    typer.echo(f"wrote {len(df)} candidates to {out} in {time.perf_counter() - t0:.1f} s; "
               f"op counts: " + ", ".join(f"{k}: {v:.1%}" for k, v in mix.items())
               + f"; DAG share: {(~df.pattern.isin(['chain', 'transformers'])).mean():.1%}")


def _merged_motifs(sources: list[str], base: Path | None, out: Path) -> Path:
    """The ``--motifs`` sources merged with ``base`` (None: the packaged library) into ``out``
    (``compose.motifs.sources.merge_sources``); prints one line per source. Raises ValueError naming a bad one."""
    from opforge.compose.motifs.sources import merge_sources

    path, meta = merge_sources(sources, out, str(base) if base else None)
    typer.echo("motif sources: " + ", ".join(f"{k} {meta['source_motifs'][k]} motifs at weight {w:.2f}"
                                              for k, w in meta["source_weights"].items()) + f" -> {path}")
    return path


def _op_weights(path: Path | None) -> dict[str, float] | None:
    """The ``--op-weights`` file as label -> weight (None without one). Raises ValueError naming the file."""
    if path is None:
        return None
    from opforge.seeds.relevance import load_op_weights

    return load_op_weights(path)


def _names(value: str | None) -> list[str] | None:
    return [v.strip() for v in value.split(",") if v.strip()] if value else None


THRESHOLD_HELP = ("FILTER.KEY=VALUE, repeatable: one filter threshold (VALUE as YAML), e.g. "
                  "runtime.budget_s=0.01 or degenerate.max_err=0.5; each filter's thresholds are in its class "
                  "docstring (filters/*.py). Part of the ledger fingerprint.")


@app.command("filter")
@settings_options(EngineSettings, SANDBOX_OPTIONS, "Sandbox")
@settings_options(EngineSettings, GPU_SHARING_OPTIONS, GPU_PANEL, into="gpu_given")
def filter_cmd(
    input: Path = typer.Argument(..., metavar="INPUT", help="Tasks: JSONL or Parquet with a `code` column (optional task_id, ops, "
                                           "data_source)."),
    out: Path = typer.Argument(None, metavar="OUT", show_default=False,
                               help="Filter directory: ledger.jsonl, verdicts.parquet, funnel.json. [required]"),
    out_option: Path = typer.Option(None, "--out", hidden=True),
    device: Device = typer.Option(Device.cpu, case_sensitive=False, help="Where tasks run."),
    workers: int = typer.Option(None, help="CPU: worker processes (default: cores). CUDA: sandboxes per GPU "
                                           "(default: cores per GPU - 2, at most 30)."),
    scheduler: str = typer.Option(None, help="Address of an existing Dask scheduler to use instead."),
    runtime_window_ms: tuple[float, float] = typer.Option(None, help="LO HI eager-median window in ms "
                                                          "(default: 0.04 100 on cuda, off on cpu)."),
    no_window: bool = typer.Option(False, "--no-window", help="Record runtimes only, on any device."),
    only: str = typer.Option(None, help="Comma-separated filters to run (static always runs), of: duplicate, "
                                        "static, contamination, roofline, eager, runtime_screen, headroom_screen, "
                                        "determinism, degenerate, trivial, compile, runtime, headroom."),
    skip: str = typer.Option(None, help="Comma-separated filters to leave out (e.g. trivial, compile)."),
    limit: int = typer.Option(None, help="Only the first N input rows."),
    kernelbench: str = typer.Option(None, rich_help_panel=KB_PANEL,
                                    help="KernelBench problems for the contamination filter: a .jsonl[.gz] / "
                                         ".parquet path or hub:REPO@REVISION (default: $OPFORGE_KERNELBENCH, "
                                         "else the copy packaged with opforge)."),
    kernelbench_levels: str = typer.Option("1,2,3", rich_help_panel=KB_PANEL,
                                           help="KernelBench levels to compare with, e.g. 1,2,3,4."),
    compile_autotune: bool = typer.Option(False, "--compile-autotune", help="CUDA: let Inductor autotune in "
                                          "the compile check (default: its heuristic configs, no autotuning)."),
    threshold: list[str] = typer.Option(None, "--threshold", help=THRESHOLD_HELP),
    quiet: bool = typer.Option(False, "--quiet", "-q", help=QUIET_HELP),
    settings_given: dict | None = None,
    gpu_given: dict | None = None,
):
    """Verdict every input task with the filter chain; a re-run resumes from OUT's ledger."""
    from opforge.filters.chain import FILTER_NAMES, FilterSettings, merge_thresholds
    from opforge.filters.kernelbench import ReferenceLoadError
    from opforge.filters.runtime import resolve_window
    from opforge.pipeline.filter_run import InputError, format_funnel, run_filter

    out = Path(_given(out, out_option, "OUT"))
    device = _value(device)
    given = tuple(runtime_window_ms) if runtime_window_ms and runtime_window_ms[0] is not None else None
    window = resolve_window(device, given, no_window)
    try:
        levels = tuple(int(v) for v in _names(kernelbench_levels) or [])
        thresholds = merge_thresholds({}, threshold, compile_autotune)
        settings = FilterSettings(device=device, only=_names(only), skip=_names(skip) or [],
                                  runtime_window_ms=window, kernelbench=kernelbench, kernelbench_levels=levels,
                                  thresholds=thresholds, **(settings_given or {}), **(gpu_given or {}))
        settings.names()
    except ValueError as exc:
        _fail(f"{exc} (filters: {', '.join(FILTER_NAMES)})")
    try:
        res = run_filter(input, out, settings, workers=workers, scheduler=scheduler, limit=limit,
                         progress=_progress(quiet))
    except ReferenceLoadError as exc:
        _fail(f"{exc} (or leave the contamination filter out: --skip contamination)")
    except (InputError, RuntimeError, ValueError) as exc:
        _fail(str(exc))
    typer.echo(format_funnel(res.funnel))
    typer.echo(f"verdicts: {out / 'verdicts.parquet'}  funnel: {out / 'funnel.json'}  ledger: {out / 'ledger.jsonl'}")
    if res.failures:
        typer.echo(f"{len(res.failures)} task(s) lost their worker; recorded as crash: {res.failures[:3]}", err=True)


@app.command("run")
@settings_options(EngineSettings, SANDBOX_OPTIONS, "Sandbox")
@settings_options(EngineSettings, GPU_SHARING_OPTIONS, GPU_PANEL, into="gpu_given")
def run_cmd(
    target: int = typer.Option(None, help="Tasks to publish (N). Default 100."),
    out: Path = typer.Option(None, "--out", help="Run directory (default runs/default)."),
    device: Device = typer.Option(None, case_sensitive=False, help="Where the filters run (default cpu)."),
    workers: int = typer.Option(None, help="CPU: worker processes (default: cores). CUDA: sandboxes per GPU "
                                           "(default: cores per GPU - 2, at most 30)."),
    scheduler: str = typer.Option(None, help="Address of an existing Dask scheduler."),
    seed: int = typer.Option(None, help="Run seed (composition and selection). Default 0."),
    op_mix: str = typer.Option(None, callback=_check_op_mix,
                               help="models | ops6k | uniform | '1:0.2,2:0.3,...' (composition and selection "
                                    "quota; default models: the accepted pool's own mix)."),
    motif_share: float = typer.Option(None, min=0.0, max=1.0, help="Share of candidates drawn from the motif "
                                      "library (default 0.9)."),
    motif_library: Path = typer.Option(None, help="Motif library replacing the packaged one."),
    motifs: list[str] = typer.Option(None, "--motifs", help=MOTIFS_HELP + " Merged into RUN_DIR/motifs.merged.json.gz."),
    specs: list[Path] = typer.Option(None, help="Your YAML spec file or folder, repeatable: added to the packaged "
                                                "seeds/specs when the run harvests."),
    replace_specs: bool = typer.Option(None, "--replace-specs", help="Read only --specs, not the packaged ones."),
    runtime_window_ms: tuple[float, float] = typer.Option(None, help="LO HI eager window in ms (default: 0.04 100 "
                                                          "on cuda, off on cpu)."),
    no_window: bool = typer.Option(None, "--no-window", help="Record runtimes only."),
    device_profile: DeviceProfileName = typer.Option(None, case_sensitive=False,
                                                     help="Composer cost-model profile (default: cpu on cpu; on "
                                                          "cuda the GPU's own, h200 on an H200, else h100)."),
    dtype_mix: str = typer.Option(None, callback=_check_dtype_mix, help="Share of tasks per dtype (default "
                                             "'float32:0.7,bfloat16:0.18,float16:0.12')."),
    op_weights: Path = typer.Option(None, help="YAML / JSON label: weight file replacing the composer's "
                                               "default weight of each op it lists."),
    round_size: int = typer.Option(None, help="Candidates per compose round (default 1.5 x target)."),
    candidate_budget: int = typer.Option(None, help="Most candidates in all (default 20 x target)."),
    skip: str = typer.Option(None, help="Comma-separated filters to leave out (e.g. compile)."),
    kernelbench: str = typer.Option(None, help="KernelBench reference (path or hub:REPO@REVISION; default: "
                                               "$OPFORGE_KERNELBENCH, else the copy packaged with opforge)."),
    seeds_catalog: Path = typer.Option(None, help="Reuse this seed catalog instead of harvesting."),
    repo_id: str = typer.Option(None, help="Hub id shown in the card's loading example."),
    threshold: list[str] = typer.Option(None, "--threshold", help=THRESHOLD_HELP + " On top of the config "
                                                                  "file's `thresholds`."),
    config: Path = typer.Option(None, "--config", help="YAML file with any of these options (the command "
                                                       "line wins)."),
    compose_rounds: int = typer.Option(None, "--compose-rounds", min=1,
                                       help="Only compose rounds 0..N-1 into the run directory (missing ones; "
                                            "no cluster, no filter) and stop: a later run with the same config, "
                                            "e.g. on a GPU machine, filters them."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help=QUIET_HELP),
    settings_given: dict | None = None,
    gpu_given: dict | None = None,
):
    """Harvest -> compose -> filter -> select -> Hub folder (RUN_DIR/hf), resumable at every stage."""
    from opforge.filters.kernelbench import ReferenceLoadError
    from opforge.pipeline.filter_run import InputError
    from opforge.pipeline.run import run_pipeline
    from opforge.pipeline.run_config import ConfigError, load_config

    window = tuple(runtime_window_ms) if runtime_window_ms and runtime_window_ms[0] is not None else None
    overrides = {"target": target, "out": out, "device": _value(device), "workers": workers,
                 "scheduler": scheduler, "seed": seed, "op_mix": op_mix, "runtime_window_ms": window,
                 "motif_share": motif_share, "motif_library": str(motif_library) if motif_library else None,
                 "no_window": no_window, "device_profile": _value(device_profile), "round_size": round_size, "candidate_budget": candidate_budget,
                 "skip_filters": _names(skip), "kernelbench": kernelbench,
                 "seeds_catalog": seeds_catalog, "repo_id": repo_id, "dtype_mix": dtype_mix,
                 **(settings_given or {}), **(gpu_given or {})}
    overrides.update(specs=[str(s.resolve()) for s in specs] if specs else None, replace_specs=replace_specs)
    try:
        overrides["op_weights"] = _op_weights(op_weights)
        if motifs:
            merged = Path(out or "runs/default") / "motifs.merged.json.gz"
            overrides["motif_library"] = str(_merged_motifs(motifs, motif_library, merged).resolve())
        cfg = load_config(config, overrides, thresholds=threshold)
        if compose_rounds:
            import pandas as pd
            from opforge.pipeline.run import compose_rounds as compose_only

            paths = compose_only(cfg, compose_rounds, progress=_progress(quiet))
            n = sum(len(pd.read_parquet(p, columns=["task_id"])) for p in paths)
            typer.echo(f"{len(paths)} rounds, {n} candidates in {paths[0].parent}")
            return
        if quiet or sys.stdout.isatty():
            res = run_pipeline(cfg, progress=_progress(quiet))
        else:  # a log: stage lines and a heartbeat every 30 s instead of progress bars
            from opforge.pipeline.heartbeat import RunHeartbeat

            with RunHeartbeat(cfg.out, cfg.target):
                res = run_pipeline(cfg, progress=False)
    except (ConfigError, InputError, ReferenceLoadError, ValueError, RuntimeError, OSError) as exc:
        _fail(str(exc))
    typer.echo(f"{res.stop_reason}; {res.accepted} of {res.candidates} candidates accepted "
               f"({res.accepted / max(1, res.candidates):.1%} yield); {res.selected} selected")
    typer.echo("seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in res.seconds.items()))
    typer.echo(f"Hub folder: {res.hf_dir}  (load: datasets.load_dataset('{res.hf_dir}', split='train'); "
               f"upload: opforge publish {res.run_dir} ORG/NAME; status: opforge status {res.run_dir})")
    if res.selected < cfg.target:
        raise typer.Exit(1)


@app.command("recheck")
def recheck_cmd(
    source: Path = typer.Argument(..., help="Published rows: an opforge Hub folder (hf/) or a .parquet / .jsonl."),
    out: Path = typer.Argument(None, metavar="OUT", show_default=False,
                               help="Report directory: recheck.json and filter/ (its ledger resumes). [required]"),
    out_option: Path = typer.Option(None, "--out", hidden=True),
    device: Device = typer.Option(Device.cuda, case_sensitive=False, help="Where the rows run."),
    workers: int = typer.Option(None, help="As for `opforge filter`."),
    runtime_window_ms: tuple[float, float] = typer.Option(None, help="LO HI eager window in ms (default: 0.04 100 "
                                                          "on cuda, off on cpu)."),
    no_window: bool = typer.Option(False, "--no-window", help="Record runtimes only."),
    skip: str = typer.Option(None, help="Comma-separated filters to leave out (e.g. compile)."),
    timeout_s: float = typer.Option(300.0, help="Per-task limit in its sandbox, seconds."),
    limit: int = typer.Option(None, help="Only the first N rows."),
    sample: int = typer.Option(None, help="N rows drawn at random (with --seed) instead of all."),
    seed: int = typer.Option(0, help="Seed of --sample's draw."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help=QUIET_HELP),
):
    """Re-run every published row's rules in fresh sandboxes; report the pass rate per rule and the measured /
    published eager time (OUT/recheck.json and a table)."""
    from opforge.filters.runtime import resolve_window
    from opforge.pipeline.filter_run import InputError
    from opforge.pipeline.recheck import format_report, recheck, recheck_settings

    out = Path(_given(out, out_option, "OUT"))
    device = _value(device)
    given = tuple(runtime_window_ms) if runtime_window_ms and runtime_window_ms[0] is not None else None
    try:
        settings = recheck_settings(device, resolve_window(device, given, no_window), _names(skip), timeout_s)
        rep = recheck(source, out, settings, workers=workers, limit=limit, sample=sample, seed=seed,
                      progress=_progress(quiet))
    except (InputError, RuntimeError, ValueError) as exc:
        _fail(str(exc))
    typer.echo(format_report(rep))
    typer.echo(f"report: {out / 'recheck.json'}")


@app.command("compare")
def compare_cmd(
    a: Path = typer.Argument(..., metavar="A", help="First dataset: an opforge hf/ folder (data/*.parquet) or a "
                                                     ".parquet / .jsonl file with a `code` column."),
    b: Path = typer.Argument(..., metavar="B", help="Second dataset, read the same way (e.g. CUDA-Agent-Ops-6K's "
                                                     "Parquet)."),
    out: Path = typer.Option(Path("runs/compare"), help="Folder for compare.json and compare.md."),
    limit: int = typer.Option(None, min=1, help="Rows per dataset for the traced measures (a seeded random "
                                                "sample; default: every row)."),
    seed: int = typer.Option(0, help="Seed of the --limit sample (the same for both datasets)."),
    workers: int = typer.Option(2, min=1, help="Worker processes for the traced measures."),
    timeout_s: float = typer.Option(120.0, help="Per-row limit in its worker, seconds."),
    peaks: str = typer.Option("h200", help="Datasheet peaks of the roofline's fusion gain: h200, h100, h100-pcie."),
    kernelbench: str = typer.Option(None, rich_help_panel=KB_PANEL,
                                    help="KernelBench problems for the signature hits: a .jsonl[.gz] / .parquet "
                                         "path or hub:REPO@REVISION (default: $OPFORGE_KERNELBENCH, else the "
                                         "copy packaged with opforge)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help=QUIET_HELP),
):
    """Two KernelBench-format datasets side by side: rows, distinct ops, label fidelity, duplicates (within
    and A's rows duplicating B's), KernelBench signature hits, fusion headroom, axis misuse, dtypes and the
    realism figures (OUT/compare.json, OUT/compare.md, and the table printed)."""
    from opforge.filters.kernelbench import ReferenceLoadError
    from opforge.pipeline.compare import CompareInputError, compare, markdown_table, write_compare

    for path in (a, b):
        if not path.exists():
            _fail(f"{path}: no such file or folder")
    try:
        result = compare(a, b, kernelbench=kernelbench, workers=workers, limit=limit, seed=seed,
                         timeout_s=timeout_s, peaks=peaks, progress=_progress(quiet))
    except ReferenceLoadError as exc:
        _fail(f"{exc} (pass --kernelbench PATH)")
    except (CompareInputError, ValueError) as exc:
        _fail(str(exc))
    import shlex

    result["command"] = shlex.join(["opforge", *sys.argv[1:]]) if Path(sys.argv[0]).name == "opforge" else None
    json_path, md_path = write_compare(result, out)
    typer.echo(markdown_table(result["table"], result["names"]))
    typer.echo(f"\n{result['seconds']['total']:.1f} s; wrote {json_path} and {md_path}")


@app.command("publish")
def publish_cmd(
    run_dir: Path = typer.Argument(..., help="Run directory holding hf/ (from `opforge run`)."),
    repo_id: str = typer.Argument(None, metavar="REPO_ID", show_default=False,
                                  help="Dataset repo on the Hub, ORG/NAME. [required]"),
    repo_id_option: str = typer.Option(None, "--repo-id", hidden=True),
    private: bool = typer.Option(False, "--private", help="Create the repo private."),
    revision: str = typer.Option(None, help="Branch to commit to (default main)."),
    tag: str = typer.Option(None, help="Tag to create on the commit, e.g. v1.0."),
):
    """Validate RUN_DIR/hf with `datasets` and upload it to the Hub in one commit (token from HF_TOKEN / login)."""
    from opforge.pipeline.publish import PublishError, publish

    repo_id = _given(repo_id, repo_id_option, "REPO_ID")
    try:
        res = publish(run_dir, repo_id, private=private, revision=revision, tag=tag)
    except PublishError as exc:
        _fail(str(exc))
    typer.echo(f"published {res.files} files to {res.repo_id} (commit {res.commit}"
               + (f", tag {res.tag}" if res.tag else "") + f"): {res.url}")


@app.command("variants")
def variants_cmd(
    source: Path = typer.Argument(..., help="A dataset folder (README.md + data/*.parquet, e.g. RUN_DIR/hf) or a "
                                            ".parquet file of published rows."),
    out: Path = typer.Option(None, help="Write a copy here (a folder for a folder, a .parquet for a file); "
                                        "default: in place."),
    seed: int = typer.Option(0, help="Seed mixed with each task_id (the default is what `opforge run` uses)."),
    count: int = typer.Option(2, min=1, help="Variants wanted per task."),
    workers: int = typer.Option(None, help="Worker processes (default: the usable cores)."),
):
    """Add the hidden `shape_variants` column (extra input shapes the grader checks) to published rows; the
    card of a folder gets the column and its section. Deterministic: the same rows and seed give the same files."""
    import json

    from opforge.compose.variants import VariantError, VariantSettings
    from opforge.pipeline.variants_column import add_variants

    try:
        rep = add_variants(source, out, VariantSettings(seed=seed, count=count), workers=workers)
    except (FileNotFoundError, ValueError, VariantError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"{rep['with_count']} of {rep['tasks']} tasks have {count} variants or more "
               f"(per count: {json.dumps(rep['per_count'])}; fewer: {json.dumps(rep['reasons'])}); {rep['output']}")


@app.command("release")
def release_cmd(
    run_dir: Path = typer.Argument(..., help="The finished run directory (`opforge run`)."),
    out: Path = typer.Option(..., "--out", help="Release folder to write; replaced only when it is an earlier "
                                                "release folder."),
    hf: Path = typer.Option(None, "--hf", help="Published folder with the shape_variants column (default "
                                               "RUN_DIR/hf; `opforge variants --out` writes a copy)."),
    compare: Path = typer.Option(None, "--compare", help="`opforge compare` result (compare.json) whose dataset A "
                                                         "is the --hf folder."),
    recheck: Path = typer.Option(None, "--recheck", help="`opforge recheck` report (recheck.json) of the "
                                                         "published rows."),
    realism: Path = typer.Option(None, "--realism", help="Realism report ({figures, targets}); default: the "
                                                         "--compare result's figures of its dataset A."),
    version: str = typer.Option(None, "--version", help="Version of the release, stated on the card and in "
                                                        "opforge_run.json."),
    changelog: Path = typer.Option(None, "--changelog", help="Markdown file of what changed; the card's Release "
                                                             "section holds it."),
    exclude: list[Path] = typer.Option(None, "--exclude", help="Reference dataset (.parquet / .jsonl / folder with "
                                                               "a code column; repeatable): no released row may "
                                                               "equal one of its rows. The packaged KernelBench "
                                                               "problems are always checked."),
    max_mb: float = typer.Option(50.0, "--max-mb", min=0.0, help="Cap on the folder's total size, MB (10^6 "
                                                                  "bytes)."),
):
    """Assemble a release folder from a finished run: the whole-run funnel, the card with the release, build,
    re-check, realism and comparison sections, provenance; written only after it loads with `datasets` and
    passes the release checks."""
    from opforge.pipeline.release import DEFAULT_REFERENCES, ReleaseError, assemble_release

    try:
        res = assemble_release(run_dir, hf, out, compare=compare, recheck=recheck, realism=realism,
                               version=version, changelog=changelog,
                               references=[*DEFAULT_REFERENCES, *(exclude or [])], max_bytes=int(max_mb * 1e6))
    except ReleaseError as exc:
        _fail(str(exc))
    f, c = res["funnel"], res["checks"]
    refs = ", ".join(f"{k} ({v['rows']:,} rows)" for k, v in c["references"].items())
    typer.echo(f"{f['candidates']:,} candidates -> {f['accepted']:,} accepted -> {c['rows']:,} released; "
               f"{c['files']} files, {c['bytes'] / 1e6:.1f} MB; no row equals a row of {refs}")
    typer.echo(f"wrote {res['out']} (load: datasets.load_dataset({str(res['out'])!r}, split='train'))")


@gold_app.command("select")
def gold_select_cmd(
    release: Path = typer.Argument(..., help="Release folder (data/*.parquet) or a .parquet file of its rows."),
    seed: int = typer.Option(None, help="Seed of the rule (default: pipeline.gold.GOLD_SEED)."),
    per_stratum: int = typer.Option(None, "--per-stratum", min=1, help="Rows per stratum (default: "
                                                                         "pipeline.gold.GOLD_PER_STRATUM)."),
    out: Path = typer.Option(None, "--out", help="Write the subset here (.csv or .json: task_id, stratum, dtype, "
                                                 "eager_ms, rank, and the rule with its seed in the .json)."),
):
    """Print (or write) the gold subset of a release: the rows drawn by the seeded, stratified rule of
    pipeline.gold (motif categories and the random composer; dtypes in turn; eager 0.04-5 ms)."""
    from opforge.pipeline.gold import GOLD_PER_STRATUM, GOLD_SEED, gold_subset, read_release_rows, rule_text

    seed = GOLD_SEED if seed is None else seed
    per_stratum = per_stratum or GOLD_PER_STRATUM
    try:
        gold = gold_subset(read_release_rows(release), per_stratum=per_stratum, seed=seed)
    except (FileNotFoundError, OSError, ValueError) as exc:
        _fail(str(exc))
    rule = rule_text(per_stratum, seed)
    if out is not None:
        if out.suffix == ".json":
            out.write_text(json.dumps({"rule": rule, "seed": seed, "per_stratum": per_stratum,
                                       "rows": gold.to_dict("records")}, indent=1))
        elif out.suffix == ".csv":
            gold.to_csv(out, index=False)
        else:
            _fail(f"--out {out}: use a .csv or .json file")
    typer.echo(f"rule: {rule}")
    for r in gold.itertuples(index=False):
        typer.echo(f"{r.task_id}  {r.stratum:<16} {r.dtype:<9} eager {r.eager_ms:.4f} ms  rank {r.rank}")
    counts = Counter(gold["stratum"])
    typer.echo(f"{len(gold)} rows: " + ", ".join(f"{k} {v}" for k, v in counts.items())
               + (f"; wrote {out}" if out is not None else ""))


@gold_app.command("release")
def gold_release_cmd(
    results: Path = typer.Argument(..., help="Result directory of `opforge harness eval RELEASE SOLUTIONS "
                                             "RESULTS` (results.jsonl; environment.json names the GPU)."),
    solutions: Path = typer.Option(Path("releases/gold-solutions"), "--solutions",
                                   help="Solution folders, one per task_id (model_new.py, kernels/)."),
    out: Path = typer.Option(Path("releases/opforge-ops-6k"), "--out",
                             help="The release folder: gets the gold/ configuration and the card section."),
    gpu: str = typer.Option(None, help="GPU the results were measured on (default: RESULTS/environment.json)."),
):
    """Write the `gold` configuration of a release folder (task_id, stratum, dtype, the solution's files,
    status, reward, speed-ups over eager and torch.compile, % of roofline, GPU) and its card section; the
    default configuration stays as it is."""
    from opforge.pipeline.gold_release import GoldError, write_gold

    try:
        res = write_gold(out, solutions, results, gpu=gpu)
    except GoldError as exc:
        _fail(str(exc))
    f = res["figures"]

    def fmt(v, spec):
        return "-" if v is None else format(v, spec)

    typer.echo(f"{f['rows']} gold rows ({f['with_solution']} with a solution): correct {fmt(f['correct_pct'], '.1f')} %, "
               f"reward 3 {fmt(f['reward3_pct'], '.1f')} %, geomean vs torch.compile "
               f"{fmt(f['geomean_speedup_compile'], '.2f')}x, vs eager {fmt(f['geomean_speedup_eager'], '.2f')}x")
    typer.echo(f"wrote {res['path']} (load: datasets.load_dataset({str(out)!r}, 'gold'))")


DATASET_HELP = "Dataset: an opforge hf/ folder, a .parquet / .jsonl file or a Hub id."


@harness_app.command("init")
def harness_init_cmd(
    dataset: str = typer.Argument(None, metavar="DATASET", show_default=False, help=DATASET_HELP + " [required]"),
    task: str = typer.Argument(None, metavar="TASK_ID", show_default=False,
                               help="task_id of the task to materialise. [required]"),
    out: Path = typer.Argument(None, metavar="OUT", show_default=False,
                               help="Workspace directory to create. [required]"),
    dataset_option: str = typer.Option(None, "--dataset", hidden=True),
    task_option: str = typer.Option(None, "--task", hidden=True),
    out_option: Path = typer.Option(None, "--out", hidden=True),
    force: bool = typer.Option(False, "--force", help="Replace a non-empty OUT."),
    registry: Path = typer.Option(None, help="Where the workspace's record (task row, protected-file hashes) is "
                                             "kept, outside OUT (default: $OPFORGE_CACHE/workspaces)."),
):
    """Write a task workspace: model.py, model_new.py, kernels/ (fixed binding), RULES.md, tools/; record the
    task and the protected files' hashes outside it (the tools evaluate against that record)."""
    from opforge.harness.dataset import DatasetError
    from opforge.harness.workspace import WorkspaceError, init_workspace

    dataset = _given(dataset, dataset_option, "DATASET")
    task = _given(task, task_option, "TASK_ID")
    out = Path(_given(out, out_option, "OUT"))
    try:
        path = init_workspace(dataset, task, out, force=force, registry=registry)
    except (DatasetError, WorkspaceError) as exc:
        _fail(str(exc))
    typer.echo(f"workspace for {task} in {path}: edit model_new.py and kernels/, then python tools/profile.py")


@harness_app.command("toolchain")
def harness_toolchain_cmd(
    device: str = typer.Option("auto", help="cpu (g++ only), cuda (g++ and nvcc) or auto (cuda when nvidia-smi "
                                            "lists a GPU)."),
):
    """Make the extension toolchain of this machine now (a precompiled torch header, the fixed binding units;
    about a minute of CPU, once per torch, compiler and GPU) so the first candidate build does not wait for it;
    print its folder and what making it took. Builds make it themselves when it is missing."""
    from opforge.engine.ledger import gpus
    from opforge.harness.toolchain import ensure_toolchain

    if device == "auto":
        device = "cuda" if gpus() else "cpu"
    if device not in ("cpu", "cuda"):
        _fail(f"--device {device!r}: expected cpu, cuda or auto")
    try:
        tc = ensure_toolchain(device, log=sys.stderr)
    except RuntimeError as exc:
        _fail(str(exc))
    lite = "yes" if tc.get("lite_binding_obj") else "no (every build parses the full torch headers)"
    typer.echo(f"toolchain {device}: {tc['dir']} (made in {tc['seconds']:.1f} s); light-header builds: {lite}")


@harness_app.command("eval")
def harness_eval_cmd(
    dataset: str = typer.Argument(None, metavar="DATASET", show_default=False, help=DATASET_HELP + " [required]"),
    solutions: Path = typer.Argument(None, metavar="SOLUTIONS", show_default=False,
                                     help="Directory with one subfolder per task_id (model_new.py, kernels/). "
                                          "[required]"),
    out: Path = typer.Argument(None, metavar="OUT", show_default=False,
                               help="Report directory: results.jsonl (resumable: keyed by task, solution content, "
                                    "settings and environment) and report.json. [required]"),
    dataset_option: str = typer.Option(None, "--dataset", hidden=True),
    solutions_option: Path = typer.Option(None, "--solutions", hidden=True),
    out_option: Path = typer.Option(None, "--out", hidden=True),
    device: Device = typer.Option(Device.cpu, case_sensitive=False, help="Where solutions run."),
    workers: int = typer.Option(None, help="Evaluations at once (CPU: processes, default cores; CUDA: per GPU, default 4)."),
    scheduler: str = typer.Option(None, help="Address of an existing Dask scheduler to evaluate on instead "
                                             "(its workers need no access to this machine's files)."),
    reward: Reward = typer.Option(Reward.milestone, case_sensitive=False,
                                  help="milestone: -1 / 1 / 2 / 3 (CUDA-Agent's scheme); speedup: the speed-up."),
    no_compile: bool = typer.Option(False, "--no-compile", help="Do not profile torch.compile."),
    burst_ms: float = typer.Option(None, "--burst-ms", min=0.0,
                                   help="Each warm-up and timed request is a burst of calls on fresh inputs lasting "
                                        "about this long (ms; 0: one call per request; default "
                                        "engine.timing.BURST_TARGET_MS)."),
    cuda_graphs: bool = typer.Option(True, "--cuda-graphs/--no-cuda-graphs",
                                     help="On CUDA, time bursts as CUDA-graph replays when every timed forward "
                                          "can be captured (else all run plain)."),
    atol: float = typer.Option(None, help="Absolute tolerance (default: by output dtype, 1e-2 for float32)."),
    rtol: float = typer.Option(None, help="Relative tolerance (default: by output dtype, 1e-2 for float32)."),
    threads: int = typer.Option(None, help="Intra-op threads of the reference and candidate servers (default: "
                                           "the cores a worker may use); timings take the device one at a time."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help=QUIET_HELP),
):
    """Evaluate every solution against its task on Dask workers; write per-solution results and the pass rate
    / faster-than rates / geomean speed-ups, overall and per data_source."""
    from opforge.harness.batch import evaluate_many
    from opforge.harness.dataset import DatasetError, get_task, load_tasks
    from opforge.harness.evaluate import EvalConfig
    from opforge.harness.report import report
    from opforge.harness.solution import Solution, SolutionError
    from pydantic import ValidationError

    dataset = _given(dataset, dataset_option, "DATASET")
    solutions = Path(_given(solutions, solutions_option, "SOLUTIONS"))
    out = Path(_given(out, out_option, "OUT"))
    try:
        config = EvalConfig(device=_value(device), reward=_value(reward), profile_compile=not no_compile,
                            atol=atol, rtol=rtol, threads=threads, cuda_graphs=cuda_graphs,
                            **({} if burst_ms is None else {"burst_target_ms": burst_ms}))
        tasks = load_tasks(dataset)
        if not solutions.is_dir():
            raise DatasetError(f"{solutions}: not a directory")
        pairs, skipped = [], []
        for sub in sorted(p for p in solutions.iterdir() if p.is_dir()):
            try:
                pairs.append((get_task(tasks, sub.name, dataset), Solution.from_dir(sub).files))
            except (DatasetError, SolutionError) as exc:
                skipped.append(f"{sub.name}: {exc}")
    except (DatasetError, ValidationError) as exc:
        _fail(str(exc))
    for line in skipped:
        typer.echo(f"skipped {line}", err=True)
    out.mkdir(parents=True, exist_ok=True)
    results = evaluate_many(pairs, config, results_path=out / "results.jsonl", workers=workers,
                            progress=_progress(quiet), scheduler=scheduler)
    rep = {**report(results), "config": config.model_dump(mode="json"), "skipped": skipped,
           "dataset": str(dataset), "solutions": str(solutions)}
    (out / "report.json").write_text(json.dumps(rep, indent=1))
    o = rep["overall"]
    typer.echo(f"{o['n']} solutions: pass {o.get('pass_rate', 0):.1%}, faster than eager "
               f"{o.get('faster_than_eager_rate', 0):.1%}, faster than compile {o.get('faster_than_compile_rate', 0):.1%}"
               f"; report: {out / 'report.json'}")


# `opforge eval`: the same command as `opforge harness eval`, kept under its first name.
app.command("eval", hidden=True)(harness_eval_cmd)


@app.command("env")
def env_cmd(as_json: bool = typer.Option(False, "--json", help="Print JSON instead of lines.")):
    """Print what a bug report needs: versions (opforge, Python, torch and its CUDA build, transformers, dask,
    triton...), GPUs (name, memory, driver) and the cache folders."""
    from opforge.pipeline.env_report import collect, format_env

    info = collect()
    typer.echo(json.dumps(info, indent=1) if as_json else format_env(info))


@app.command("status")
def status_cmd(
    run_dir: Path = typer.Argument(..., help="A run directory (`opforge run`) or filter directory (`opforge filter`)."),
    failures: int = typer.Option(5, help="How many of the last broken tasks (crash, timeout, oom, errors) to list."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of lines."),
):
    """Where a run stands, from its files (safe while it runs): stage, candidates, ledger progress, funnel so
    far, last failures."""
    from opforge.pipeline.status import StatusError, format_status, run_status

    try:
        s = run_status(run_dir, failures=failures)
    except StatusError as exc:
        _fail(str(exc))
    typer.echo(json.dumps(s, indent=1, default=str) if as_json else format_status(s))


if __name__ == "__main__":
    app()
