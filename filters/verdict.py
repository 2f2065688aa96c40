"""The filter contract (docs/DESIGN.md §3): a filter scores a task (metrics) and a separate decision turns the
metrics into a ``Verdict`` with a reason code, so thresholds can be re-tuned from stored metrics."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar

# Rejection reason codes, prefix-stable (a ``:detail`` suffix is allowed). Source: docs/DESIGN.md §3.
REASONS = (
    "invalid_task", "stochastic", "eager_error", "compile_error", "compile_mismatch", "nondeterministic",
    "degenerate_output", "non_finite", "runtime_out_of_window", "timeout", "crash", "oom", "duplicate",
    "contaminated", "trivial",
)


class Cost(StrEnum):
    """Where a filter runs: ``static`` (source only), ``cpu`` (cheap execution), ``device`` (GPU / timing)."""

    STATIC = "static"
    CPU = "cpu"
    DEVICE = "device"


@dataclass
class Verdict:
    """Outcome of one filter on one task.

    Attributes:
        accepted: True when the task passes.
        reason: None when accepted, else a code from ``REASONS`` optionally followed by ``:detail``.
        filter: name of the filter that decided.
        metrics: the scores the decision was made from (JSON-serialisable).
    """

    accepted: bool
    filter: str
    reason: str | None = None
    metrics: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if self.accepted and self.reason is not None:
            raise ValueError("an accepted verdict has no reason")
        if not self.accepted:
            if not self.reason or self.reason.split(":", 1)[0] not in REASONS:
                raise ValueError(f"unknown reason code {self.reason!r}; known: {', '.join(REASONS)}")


@dataclass
class TaskInput:
    """What every filter sees: the task source and its id. Execution filters get a
    ``engine.execution.TaskRun``, which has the same two fields plus the built model, inputs and outputs."""

    code: str
    task_id: str = "<task>"


class Filter:
    """Base class. A subclass sets ``name``, ``cost`` and ``version`` and implements ``score`` (task ->
    metrics) and ``decide`` (metrics -> Verdict); it runs where its line in ``filters.chain.FILTERS`` puts
    it. ``thresholds`` holds every number the decision uses; subclasses list their defaults in
    ``default_thresholds``.

    Attributes:
        name: the filter's name (reason codes, ``--only`` / ``--skip``, thresholds, metrics).
        cost: where it runs; ``Cost.DEVICE`` declares that it needs the GPU: the task reserves GPU memory
            before the first such filter (``engine.sandbox_child._run_on_gpu``).
        gpu_work_lock: on CUDA, hold the GPU's ``compute`` lock shared for the whole ``score``
            (``engine.gpu_locks``); a filter that mixes long CPU work with GPU work sets False and takes the
            lock around its GPU parts itself.
        version: the version of its logic, part of the ledger fingerprint: raise it when a change can change
            a verdict, so no verdict of the old logic is reused.
        reads: names of earlier filters whose metrics ``score`` reads: a filter that lists any is called as
            ``score(task, earlier)``, ``earlier`` mapping each of them that ran on the task to its metrics.
    """

    name: ClassVar[str] = "filter"
    cost: ClassVar[Cost] = Cost.STATIC
    gpu_work_lock: ClassVar[bool] = True
    version: ClassVar[int] = 1
    reads: ClassVar[tuple[str, ...]] = ()

    def __init__(self, **thresholds):
        defaults = self.default_thresholds()
        unknown = set(thresholds) - set(defaults)
        if unknown:
            raise ValueError(f"filter {self.name!r} has no threshold(s) {sorted(unknown)}; "
                             f"known: {sorted(defaults)}")
        self.thresholds = {**defaults, **thresholds}

    @classmethod
    def default_thresholds(cls) -> dict[str, Any]:
        return {}

    def score(self, task: TaskInput) -> dict[str, Any]:
        raise NotImplementedError

    def decide(self, metrics: dict[str, Any]) -> Verdict:
        raise NotImplementedError

    def __call__(self, task: TaskInput | str, task_id: str = "<task>") -> Verdict:
        if isinstance(task, str):
            task = TaskInput(task, task_id)
        return self.decide(self.score(task, {}) if self.reads else self.score(task))

    def reject_failure(self, metrics: dict[str, Any], prefix: str) -> Verdict | None:
        """For metrics that record a caught exception (keys ``oom``, ``error``, ``error_type``): ``oom`` or
        ``<prefix>:<error_type>``; None when nothing failed."""
        if metrics.get("oom"):
            return self.reject("oom", metrics)
        if metrics.get("error") is not None:
            return self.reject(f"{prefix}:{metrics['error_type']}", metrics)
        return None

    def accept(self, metrics: dict[str, Any]) -> Verdict:
        return Verdict(True, self.name, None, metrics)

    def reject(self, reason: str, metrics: dict[str, Any]) -> Verdict:
        return Verdict(False, self.name, reason, metrics)
