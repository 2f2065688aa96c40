"""The ordered filter chain and its settings.

``FILTERS`` is the one ordered list of filters (position = chain order, cheap first). ``FilterSettings`` is
the one configuration object of the filter stage (pydantic; it travels to the workers). ``make_chain``
turns it into filter instances in ``FILTERS`` order; ``run_chain`` runs them on one task and stops at the
first rejection.

Adding a filter: write a ``Filter`` subclass with ``name``, ``cost``, ``version``, ``score`` and ``decide``
in a module of this package and add its line to ``FILTERS`` where it should run.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from typing import Any

from opforge.engine.settings import GPU_SHARING_OPTIONS, EngineSettings  # noqa: F401 - part of this API
from opforge.filters.verdict import Cost, Filter, TaskInput
from pydantic import Field, field_validator, model_validator

# Default GPU step limit (FilterSettings.gpu_step_limit_s): this many time-sliced sandboxes x the runtime
# window's upper edge; without a window, this many seconds. Default GPU-time limit of one forward call
# (gpu_share_limit_s): this many x the window's upper edge.
STEP_LIMIT_SANDBOXES, STEP_LIMIT_NO_WINDOW_S, STEP_SHARE_WINDOWS = 16, 5.0, 2.0

# The filters, in chain order (position = order: cheap first): name and class by import path. The names are
# literal so the client can validate names without importing torch; ``load_filters`` checks each class's.
FILTERS: tuple[tuple[str, str], ...] = (
    ("duplicate", "opforge.filters.duplicate:DuplicateFilter"),  # corpus: the whole input, on the client
    ("static", "opforge.filters.static:StaticFilter"),
    ("contamination", "opforge.filters.contamination:ContaminationFilter"),
    ("roofline", "opforge.filters.headroom:RooflineFilter"),  # static: traced on meta
    ("eager", "opforge.filters.eager:EagerFilter"),
    ("runtime_screen", "opforge.filters.runtime:RuntimeScreenFilter"),
    ("headroom_screen", "opforge.filters.headroom:HeadroomScreenFilter"),  # an upper bound of headroom's room
    ("determinism", "opforge.filters.determinism:DeterminismFilter"),
    ("degenerate", "opforge.filters.degenerate:DegenerateFilter"),
    ("trivial", "opforge.filters.trivial:TrivialFilter"),
    ("compile", "opforge.filters.torch_compile:CompileFilter"),
    ("runtime", "opforge.filters.runtime:RuntimeFilter"),
    ("headroom", "opforge.filters.headroom:HeadroomFilter"),  # decides on roofline + runtime metrics
)


def load_filters(filters: tuple[tuple[str, str], ...] | None = None) -> dict[str, type[Filter]]:
    """Import the classes of ``filters`` (default ``FILTERS``) and return name -> class in chain order.
    Raises ValueError when a class's ``name`` is not the one it is listed under."""
    out: dict[str, type[Filter]] = {}
    for name, path in filters or FILTERS:
        module, _, cls_name = path.partition(":")
        cls = getattr(importlib.import_module(module), cls_name)
        if cls.name != name:
            raise ValueError(f"filters: {path} is listed as {name!r} but its name is {cls.name!r}")
        out[name] = cls
    return out


def filter_versions(names: list[str]) -> dict[str, int]:
    """name -> ``Filter.version`` of each filter of ``names`` (part of the ledger fingerprint)."""
    registry = load_filters()
    return {n: registry[n].version for n in names}


class FilterSettings(EngineSettings):
    """Settings of one filter run: the engine's (``engine.settings.EngineSettings``: device, timeout,
    memory guard, GPU sharing) and the filter stage's own. Units: ms for the window.

    Attributes:
        only / skip: filter names to run exclusively / to leave out (``static`` always runs).
        runtime_window_ms: [lo, hi] eager-median window; None = off (the CPU default).
        thresholds: per-filter threshold overrides, e.g. ``{"determinism": {"max_drift": 0.05}}``.
        kernelbench: where the contamination filter's KernelBench problems come from (a .jsonl/.parquet
            path or ``hub:REPO@REVISION``; None = ``filters.kernelbench.default_reference()``).
        kernelbench_levels: KernelBench levels to compare with (default 1–3).
        kernelbench_index: path of the built index the sandboxes load (set by the run, not by users).
        kernelbench_identity: source hash, levels and version of that index (part of the fingerprint).
    """

    only: list[str] | None = None
    skip: list[str] = Field(default_factory=list)
    runtime_window_ms: tuple[float, float] | None = None
    thresholds: dict[str, dict[str, Any]] = Field(default_factory=dict)
    kernelbench: str | None = None
    kernelbench_levels: tuple[int, ...] = (1, 2, 3)
    kernelbench_index: str | None = None
    kernelbench_identity: dict[str, Any] | None = None

    @field_validator("runtime_window_ms")
    @classmethod
    def _window(cls, v):
        if v is not None and not 0 <= v[0] < v[1]:
            raise ValueError(f"runtime window must be 0 <= lo < hi (ms), got {list(v)}")
        return v

    @model_validator(mode="after")
    def _step_limits(self) -> FilterSettings:
        window = self.runtime_window_ms
        if self.gpu_step_limit_s is None:
            self.gpu_step_limit_s = (STEP_LIMIT_NO_WINDOW_S if window is None
                                     else round(STEP_LIMIT_SANDBOXES * window[1] / 1e3, 3))
        if self.gpu_share_limit_s is None:
            autotune = bool(self.thresholds.get("compile", {}).get("autotune"))
            self.gpu_share_limit_s = (0.0 if window is None or autotune
                                      else round(STEP_SHARE_WINDOWS * window[1] / 1e3, 3))
        return self

    def names(self) -> list[str]:
        """Filter names that will run, in chain order. Raises ValueError on an unknown name."""
        for n in [*(self.only or []), *self.skip]:
            if n not in FILTER_NAMES:
                raise ValueError(f"unknown filter {n!r}; known: {', '.join(FILTER_NAMES)}")
        return [n for n in FILTER_NAMES if (self.only is None or n in self.only or n == "static")
                and (n not in self.skip or n == "static")]

    def fingerprint_fields(self) -> dict[str, Any]:
        """What changes verdicts: chain and each filter's ``version``, window, thresholds, memory guard,
        KernelBench reference (not timeout or threads). Imports the filter modules."""
        fields = {"device": self.device, "filters": filter_versions(self.names()),
                  "window": self.runtime_window_ms, "thresholds": self.thresholds, "memory_gib": self.memory_gib}
        if "contamination" in self.names():
            fields["kernelbench"] = self.kernelbench_identity
        return fields

    def corpus_names(self) -> list[str]:
        """Filters of this run that score the whole input on the client (``duplicate``)."""
        return [n for n in self.names() if n in CORPUS_FILTERS]


FILTER_NAMES = tuple(name for name, _ in FILTERS)
# Filters that score the whole input at once on the client (``corpus = True``), before dispatch.
CORPUS_FILTERS = ("duplicate",)


def parse_threshold(text: str) -> tuple[str, str, Any]:
    """``"FILTER.KEY=VALUE"`` -> (filter, key, value), VALUE read as YAML (``0.01`` a float, ``[1, 50]`` a
    list, ``true`` / ``null``...), e.g. ``runtime.budget_s=0.01``. Raises ValueError naming ``text`` when
    it is not of that form or names an unknown filter (keys are checked by ``check_thresholds``)."""
    import yaml

    name_key, sep, raw = text.partition("=")
    name, dot, key = name_key.strip().partition(".")
    if not (sep and dot and name and key.strip()):
        raise ValueError(f"threshold {text!r}: expected FILTER.KEY=VALUE, e.g. runtime.budget_s=0.01")
    if name not in FILTER_NAMES:
        raise ValueError(f"threshold {text!r}: unknown filter {name!r}")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        raise ValueError(f"threshold {text!r}: value {raw.strip()!r} is not valid YAML") from None
    return name, key.strip(), value


def merge_thresholds(base: dict[str, dict[str, Any]], texts: list[str] | None = None,
                     compile_autotune: bool = False) -> dict[str, dict[str, Any]]:
    """``base`` (filter -> {key: value}) with every ``parse_threshold`` text applied on top (later wins),
    then ``compile.autotune`` = True when ``compile_autotune`` (``--compile-autotune`` / the run key: the
    dedicated switch wins); ``base`` itself is not changed. Raises ValueError as ``parse_threshold``."""
    merged = {name: dict(values) for name, values in base.items()}
    for text in texts or []:
        name, key, value = parse_threshold(text)
        merged.setdefault(name, {})[key] = value
    if compile_autotune:
        merged.setdefault("compile", {})["autotune"] = True
    return merged


def check_thresholds(thresholds: dict[str, dict[str, Any]]) -> None:
    """Raise ValueError naming the filter and key when ``thresholds`` (filter -> {key: value}) names a
    filter or a key that does not exist (the keys are each filter's ``default_thresholds``); imports the
    filter modules, so call it before dispatching work, not per task."""
    registry = load_filters()
    for name, values in thresholds.items():
        if name not in registry:
            raise ValueError(f"thresholds: unknown filter {name!r}; known: {', '.join(FILTER_NAMES)}")
        known = registry[name].default_thresholds()
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ValueError(f"thresholds: filter {name!r} has no threshold(s) {unknown}; "
                             f"known: {', '.join(sorted(known)) or 'none'}")


def make_chain(settings: FilterSettings) -> list[Filter]:
    """Instantiate the chosen per-task filters in order (corpus filters excluded), applying
    ``settings.thresholds``, the runtime window, the KernelBench index and the ``headroom`` filter's
    ``min_room`` to ``headroom_screen`` (left out where ``headroom`` does not run)."""
    registry = load_filters()
    chain = []
    names = settings.names()
    for name in names:
        if name in CORPUS_FILTERS or (name == "headroom_screen" and "headroom" not in names):
            continue  # the screen stands in for headroom's rule only where headroom runs
        overrides = dict(settings.thresholds.get(name, {}))
        if name == "headroom_screen" and "min_room" in settings.thresholds.get("headroom", {}):
            overrides.setdefault("min_room", settings.thresholds["headroom"]["min_room"])
        if name in ("runtime", "runtime_screen") and settings.runtime_window_ms is not None:
            overrides.setdefault("window_ms", list(settings.runtime_window_ms))
        if name == "contamination":
            chain.append(registry[name](index=settings.kernelbench_index, **overrides))
            continue
        chain.append(registry[name](**overrides))
    return chain


def make_corpus_filters(settings: FilterSettings) -> list[Filter]:
    """Instantiate the chosen corpus filters (run on the client over the whole input)."""
    registry = load_filters()
    return [registry[n](**settings.thresholds.get(n, {})) for n in settings.corpus_names()]


def run_chain(task: TaskInput, chain: list[Filter],
              on_stage: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run ``chain`` on one task; stop at the first rejection.

    Returns a JSON-ready dict: ``accepted``, ``reason``, ``filter`` (the rejecting one, None when
    accepted), ``metrics`` (filter name -> metrics of every filter that ran), ``seconds`` (filter name ->
    wall seconds). A filter with ``reads`` gets the metrics of those earlier filters (``Filter.reads``).
    ``on_stage(name)`` is called before each filter. An exception escaping a filter's ``score`` becomes its
    rejection: ``oom`` for out-of-memory, otherwise ``compile_error:<Exc>`` in the ``compile`` filter and
    ``eager_error:<Exc>`` in any other.
    """
    from opforge.engine.execution import failure_metrics

    metrics: dict[str, Any] = {}
    seconds: dict[str, float] = {}
    for f in chain:
        if on_stage is not None:
            on_stage(f.name)
        start = time.perf_counter()
        try:
            with _device_work(f, task):
                metrics_f = (f.score(task, {n: metrics[n] for n in f.reads if n in metrics}) if f.reads
                             else f.score(task))
            verdict = f.decide(metrics_f)
        except Exception as exc:  # noqa: BLE001 - a filter's own crash on odd output is still a verdict
            verdict = f.reject_failure(failure_metrics(exc),
                                       "compile_error" if f.name == "compile" else "eager_error")
        seconds[f.name] = time.perf_counter() - start
        metrics[f.name] = verdict.metrics
        if not verdict.accepted:
            return {"accepted": False, "reason": verdict.reason, "filter": f.name, "metrics": metrics,
                    "seconds": seconds}
    return {"accepted": True, "reason": None, "filter": None, "metrics": metrics, "seconds": seconds}


def _device_work(f: Filter, task: TaskInput):
    """A device filter's scoring on CUDA holds the GPU's ``compute`` lock shared (``engine.gpu_locks``),
    so no neighbour's timing overlaps it, unless the filter takes the lock itself (``gpu_work_lock``
    False); anything else runs unlocked."""
    import contextlib

    device = getattr(task, "device", "cpu")
    if f.cost != Cost.DEVICE or not f.gpu_work_lock or not str(device).startswith("cuda"):
        return contextlib.nullcontext()
    from opforge.engine.gpu_locks import gpu_work

    return gpu_work(device)


# The filter chain as the engine's sandbox job (``engine.sandbox.Sandbox(CHAIN_JOB, settings)``).
CHAIN_JOB = "opforge.filters.chain:ChainJob"


class ChainJob:
    """The per-task filter chain of ``settings`` (a ``FilterSettings`` dict) as an
    ``engine.sandbox_child.SandboxJob``: ``run`` is ``run_chain`` on one task."""

    def __init__(self, settings: dict[str, Any]):
        self.settings = FilterSettings.model_validate(settings)
        self.chain = make_chain(self.settings)
        self.device_stages = frozenset(f.name for f in self.chain if f.cost == Cost.DEVICE)
        self._run = None

    def warm_up(self) -> dict[str, Any]:
        """On CUDA with the compile filter: a first small compile (a process's first costs seconds more than
        later ones). Returns ``compile_warm_up_s`` or ``compile_warm_up_error``."""
        compile_filter = next((f for f in self.chain if f.name == "compile"), None)
        if self.settings.device != "cuda" or compile_filter is None:
            return {}
        from opforge.filters.torch_compile import warm_up_compiler

        heuristic = not compile_filter.thresholds["autotune"]  # the filter's defaults merged with the run's
        try:
            return {"compile_warm_up_s": round(warm_up_compiler("cuda", heuristic=heuristic), 3)}
        except Exception as exc:  # noqa: BLE001 - only a head start: the compile filter meets and reports it
            return {"compile_warm_up_error": f"{type(exc).__name__}: {str(exc)[:200]}"}

    def run(self, task_id: str, code: str, on_stage: Callable[[str], None]) -> dict[str, Any]:
        from opforge.engine.execution import TaskRun

        self._run = TaskRun(code=code, task_id=task_id, device=self.settings.device)
        return run_chain(self._run, self.chain, on_stage=on_stage)

    def release(self) -> None:
        if self._run is not None:
            self._run.release()
            self._run = None
