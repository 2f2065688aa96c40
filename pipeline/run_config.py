"""Configuration of ``opforge run``: every option, loadable from YAML, saved resolved in the run directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from opforge.engine.settings import GPU_SHARING_OPTIONS, EngineSettings, optional_fields, same_fields
from pydantic import ConfigDict, Field, ValidationError, create_model


class ConfigError(ValueError):
    """A run configuration is malformed; the message names the file and the field."""


# The engine settings a run takes, declared in ``engine.settings.EngineSettings``: the timeout and memory guard
# with their defaults, the GPU sharing options as given or None (None: the engine's default).
_EngineOptions = create_model("_EngineOptions", **same_fields(EngineSettings, ("timeout_s", "memory_gib")),
                              **optional_fields(EngineSettings, GPU_SHARING_OPTIONS))


class RunConfig(_EngineOptions):
    """Options of one end-to-end run. Units: ms for the window, seconds for the timeout, GiB for memory.

    Attributes:
        target: tasks to publish (N).
        out: run directory.
        device / workers / scheduler: where the filters run (see ``opforge filter``).
        seed: generator seed: composition and selection depend only on it and the seed catalog.
        op_mix: composer op-count mix (``models``, ``ops6k``, ``uniform`` or ``1:0.2,2:0.3,...``), also the
            selection quota (``models``: the accepted pool's own mix).
        transformers_share: share of self-contained transformers block tasks (composition and quota).
        motif_share / motif_library: share of candidates drawn from the motif library (``compose.motifs.library``,
            fusions mined from real models) and its path (default: the packaged library).
        dtype_mix: share of tasks per floating dtype (``float32:0.7,bfloat16:0.18,float16:0.12``).
        op_weights: label -> weight replacing the composer's relevance-based default of each op listed.
        vocabulary: shape vocabulary JSON for realistic profiles (default: the packaged one).
        include_internal / heavy_start: composer options (see ``opforge compose --help``).
        compose_workers: CPU workers composing candidates beside the filter on the run's cluster (default
            ``pipeline.run.default_compose_workers``: one per GPU, at least 2, on CUDA; 1 on CPU); output does
            not depend on it. Also the processes that compute the hidden shape variants.
        device_profile: composer cost-model profile (default ``default_device_profile``: ``cpu`` on CPU; on CUDA
            the profile of the visible GPU's model, ``h200`` on an H200, else ``h100``).
        runtime_window_ms: eager window; None = the device default (0.04-100 ms on CUDA: filters.runtime.CUDA_WINDOW_MS; off on CPU).
        no_window: record runtimes only, on any device.
        round_size: candidates composed per round (default: 1.5 x target, at least 16).
        candidate_budget: most candidates composed in all (default: 20 x target).
        max_per_signature: selection cap on tasks sharing one (op set, dtype) signature (default
            ``default_max_per_signature`` of the target: 3 up to 4,500 tasks, 4 at 6,000).
        max_heavy_share: the selection's soft cap on tasks that call a GEMM, convolution, attention or recurrent
            op (``pipeline.select``, rule 4; None = off). Default 0.75, the top of the 40-75 % band of the
            worthwhile-tasks issue: such tasks beyond it are published only where other tasks cannot fill a quota.
        soft_min_fusion_gain: the selection's soft floor on ``fusion_gain`` (``pipeline.select``, rule 5; None =
            off): tasks below it are published only where the others cannot fill a quota. Default 1.1: below it a
            fused kernel saves under 10 % of the per-op roofline time (nothing to fuse, as the worthwhile-tasks
            issue counts it).
        max_random_share: the selection's hard cap on random-composer tasks (``pipeline.select``, rule 6; None =
            off): at most this share of the published tasks, or ``1 - motif_share`` when that is larger (a run
            that asks for more random-composer candidates gets them; ``pipeline.run.random_cap``). Default 0.15:
            five blind reads judged 12 of 32 random-composer rows sensible and 116 of 117 others
            (``pipeline.select``, rule 6), so 15 % keeps the expected sensible share near 90 %.
        max_op_share: the selection's soft cap on tasks sharing one exotic op (``pipeline.select``, rule 7;
            layout ops, the common ops and building blocks are free; None = off). Default 0.08, the bound on
            ``task.realism``'s ``top_exotic_op_share``: tasks with an exotic op already in 8 % of the chosen ones
            are published only where other tasks cannot fill a quota.
        max_op_set_share: the selection's soft cap on tasks sharing one op set (the task's ops without the
            layout ones; ``pipeline.select``, rule 7; None = off). Default 0.02, the bound on ``task.realism``'s
            ``top_op_set_share``.
        cap_rounds: most rounds composed after the target is met while the selection does not hold
            ``max_heavy_share`` (each filters only the round's candidates without a heavy op when
            ``skip_full_signatures``); 0 stops at the target. Default 2: on 2 x H100 a round of 1,500 candidates
            added about 50-70 tasks without a heavy op under the signature cap
            (benchmarks/results/h100/worthwhile_tasks.json).
        skip_full_signatures: candidates of a round whose (op set, dtype) signature already holds
            ``max_per_signature`` accepted tasks from earlier rounds are not filtered (selection would not
            take them; the opforge-Ops-6K run left 2,932 of 8,997 accepted tasks out by that cap,
            benchmarks/results/h200/release6k.json), nor the heavy-op candidates of a ``cap_rounds`` round.
        skip_filters: filters to leave out.
        timeout_s / memory_gib / gpu_step_limit_s / gpu_share_limit_s / gpu_admit_gib / gpu_admit_predicted /
            gpu_growth / gpu_memory_fraction / gpu_concurrency / compile_threads: the engine's settings
            (``engine.settings.EngineSettings``, declared there; the GPU ones None = its default).
        compile_autotune: let Inductor autotune in the compile check on CUDA (default False: its heuristic
            configs, see ``filters.torch_compile``).
        thresholds: per-filter threshold overrides (filter -> {key: value}, see ``opforge filter
            --threshold``); ``compile_autotune`` adds ``compile.autotune``.
        kernelbench / kernelbench_levels: the contamination filter's reference.
        seeds_catalog: reuse this seed catalog instead of harvesting (copied into the run directory).
        specs / replace_specs: the user's YAML spec files or folders, added to the packaged ``seeds/specs``
            (``replace_specs``: read alone) when the run harvests.
        harvest_transformers: also probe the modules of every transformers family when harvesting. Off by
            default: the composer draws seed ops from torch only and builds transformers tasks from the
            self-contained block specs of ``compose.blocks.tasks``, so a run does not need them (``opforge seeds
            harvest`` still harvests them for the full catalog).
        pretty_name / license / repo_id: the card's title, licence (Hub licence id) and the id in its
            loading example.
    """

    model_config = ConfigDict(extra="forbid")

    target: int = Field(100, ge=1)
    out: Path = Path("runs/default")
    device: Literal["cpu", "cuda"] = "cpu"
    workers: int | None = None
    scheduler: str | None = None
    seed: int = 0
    op_mix: str = "models"
    motif_share: float = Field(0.9, ge=0, le=1)  # compose.composer.DEFAULT_MOTIF_SHARE
    motif_library: str | None = None
    transformers_share: float = Field(0.04, ge=0, le=1)
    dtype_mix: str = "float32:0.7,bfloat16:0.18,float16:0.12"
    op_weights: dict[str, float] | None = None
    vocabulary: str | None = None
    include_internal: bool = False
    heavy_start: float | None = Field(None, ge=0, le=1)
    compose_workers: int | None = Field(None, ge=1)
    device_profile: str | None = None
    runtime_window_ms: tuple[float, float] | None = None
    no_window: bool = False
    round_size: int | None = Field(None, ge=1)
    candidate_budget: int | None = Field(None, ge=1)
    max_per_signature: int | None = Field(None, ge=1)
    max_heavy_share: float | None = Field(0.75, ge=0, le=1)
    cap_rounds: int = Field(2, ge=0)
    soft_min_fusion_gain: float | None = Field(1.1, ge=1)
    max_random_share: float | None = Field(0.15, ge=0, le=1)
    max_op_share: float | None = Field(0.08, ge=0, le=1)
    max_op_set_share: float | None = Field(0.02, ge=0, le=1)
    skip_full_signatures: bool = True
    skip_filters: list[str] = Field(default_factory=list)
    compile_autotune: bool = False
    thresholds: dict[str, dict[str, Any]] = Field(default_factory=dict)
    kernelbench: str | None = None
    kernelbench_levels: tuple[int, ...] = (1, 2, 3)
    seeds_catalog: Path | None = None
    specs: list[str] | None = None  # user spec files / folders added to seeds/specs (docs/extending.md)
    replace_specs: bool = False  # read only ``specs``, not the packaged ones
    harvest_transformers: bool = False
    pretty_name: str = "opforge fused operator tasks"
    license: str = "apache-2.0"
    repo_id: str | None = None

    def resolved(self) -> RunConfig:
        """A copy with every default that depends on other options filled in."""
        from opforge.filters.runtime import resolve_window

        window = resolve_window(self.device, self.runtime_window_ms, self.no_window)
        round_size = self.round_size or max(16, int(1.5 * self.target))
        return self.model_copy(update={
            "device_profile": self.device_profile or default_device_profile(self.device),
            "runtime_window_ms": window,
            "round_size": round_size,
            "candidate_budget": self.candidate_budget or max(20 * self.target, round_size),
            "max_per_signature": self.max_per_signature or default_max_per_signature(self.target),
        })


def default_max_per_signature(target: int) -> int:
    """The selection's cap on tasks of one (op set, dtype) signature when none is given: 3, plus one for each
    1,500 tasks (or part of them) of ``target`` above 4,500: 4 at 6,000. At 3 a large selection runs out of
    signatures: on the accepted pool of the opforge-Ops-6K v2.0 release run (6,374 tasks, 3,808 signatures) a
    6,000-row selection takes 5,642 rows at 3 and all 6,000 at 4 or 5, and 2,000 or 4,000 rows at 3
    (benchmarks/README.md, measurements behind the defaults)."""
    return max(3, -(-int(target) // 1500))


def default_device_profile(device: str, gpu_name: str | None = None) -> str:
    """The composer profile a run on ``device`` (``cpu`` / ``cuda``) sizes for when none is given: ``cpu`` on
    CPU; on CUDA the profile named like the datasheet peaks of the GPU ``gpu_name`` (default: the first visible
    one, from ``nvidia-smi``, CUDA not initialised), ``h100`` for a GPU without a profile of its own."""
    if device != "cuda":
        return "cpu"
    from opforge.compose.device_profiles import PROFILES
    from opforge.engine.ledger import visible_gpu_name
    from opforge.task.peaks import peaks_for_gpu

    peaks = peaks_for_gpu(gpu_name or visible_gpu_name())
    return peaks.name if peaks is not None and peaks.name in PROFILES else "h100"


# Fields whose change makes an existing run directory's results another dataset (a re-run with any other
# field changed - target, budget, workers, timeouts - resumes the same run).
IDENTITY_FIELDS = ("seed", "op_mix", "motif_share", "motif_library", "transformers_share", "device_profile", "device", "runtime_window_ms",
                   "round_size", "skip_filters", "kernelbench", "kernelbench_levels", "seeds_catalog", "dtype_mix",
                   "op_weights", "vocabulary", "include_internal", "heavy_start",
                   "harvest_transformers", "specs", "replace_specs")


def load_config(path: str | Path | None, overrides: dict[str, Any], thresholds: list[str] | None = None
                ) -> RunConfig:
    """``RunConfig`` from the YAML file ``path`` (optional) with ``overrides`` (options given on the
    command line, None values ignored) applied on top, then the ``FILTER.KEY=VALUE`` texts of
    ``thresholds`` (``--threshold``) merged into its ``thresholds``.

    Raises:
        ConfigError: unreadable YAML, not a mapping, an unknown key or an invalid value (file and field
            named), a malformed threshold text.
    """
    data: dict[str, Any] = {}
    where = "command line"
    if path is not None:
        where = str(path)
        try:
            data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read ({exc.strerror})") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML ({exc})") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: expected a mapping of option: value, got {type(data).__name__}")
    data.update({k: v for k, v in overrides.items() if v is not None})
    try:
        cfg = RunConfig.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"{where}: {problems}") from None
    if thresholds:
        from opforge.filters.chain import merge_thresholds

        try:
            cfg = cfg.model_copy(update={"thresholds": merge_thresholds(cfg.thresholds, thresholds)})
        except ValueError as exc:
            raise ConfigError(f"command line: {exc}") from None
    return cfg


def save_config(cfg: RunConfig, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False), encoding="utf-8")
