"""``opforge recheck``: re-run every published row's rules in fresh sandbox processes; report the pass rate per rule.

Input: an opforge Hub folder (its ``data/*.parquet`` shards) or one Parquet / JSONL file with the published
columns (``code``, ``task_id``; ``eager_ms`` and ``gpu`` for the runtime comparison). The rows go through
``pipeline.filter_run.run_filter`` with the filters behind the published rules (``RECHECK_FILTERS``; the
corpus-level ``duplicate`` and the KernelBench ``contamination`` filter are not rules of a single row) into
``OUT/filter`` (its ledger makes a re-run resume: rows already verdicted are not run again). Then
``OUT/recheck.json`` holds, per rule of ``RULES``, how many rows passed, failed or were not reached (the chain
stops at a row's first failure), the pass rate ``pass / (pass + fail)``, and the ratio of the measured to
the published eager time (p10, p50, p90).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from opforge.engine.ledger import environment
from opforge.filters.chain import FilterSettings
from opforge.pipeline.filter_run import run_filter
from opforge.task.task_file import read_published

# Filters that decide a published row's rules, in chain order (``static`` always runs).
RECHECK_FILTERS = ("static", "eager", "runtime_screen", "determinism", "degenerate", "compile", "runtime")


@dataclass(frozen=True)
class Rule:
    """One published rule: the filters that check it and the reason prefixes by which they fail it (any
    reason when ``reasons`` is empty)."""

    name: str
    filters: tuple[str, ...]
    reasons: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()

    def outcome(self, accepted: bool, filter_name: str | None, reason: str | None, reached: set[str],
                ran: list[str]) -> str:
        """``pass``, ``fail`` or ``not_reached`` for one row: its verdict (``accepted``, the rejecting
        ``filter_name`` and ``reason``), the filters whose metrics it has (``reached``), those of the run."""
        if self.fails(filter_name, reason):
            return "fail"
        if accepted:
            return "pass"
        if filter_name in self.filters:  # rejected here for another rule (eager's non_finite: finite)
            return "pass" if any(reason.startswith(e) for e in self.exclude) else "not_reached"
        return "pass" if all(f in reached for f in self.filters if f in ran) else "not_reached"

    def fails(self, filter_name: str | None, reason: str | None) -> bool:
        if filter_name not in self.filters or reason is None:
            return False
        if any(reason.startswith(r) for r in self.exclude):
            return False
        return not self.reasons or any(reason.startswith(r) for r in self.reasons)


# The rules of docs/DESIGN.md §2 a published row satisfies; ``eager`` fails on anything the eager filter rejects
# except non-finite outputs, which is the ``finite`` rule.
RULES = (
    Rule("eager", ("eager",), exclude=("non_finite",)),
    Rule("finite", ("eager",), reasons=("non_finite",)),
    Rule("deterministic", ("determinism",)),
    Rule("non_degenerate", ("degenerate",)),
    Rule("compile_agreement", ("compile",)),
    Rule("runtime_window", ("runtime_screen", "runtime")),
)


def recheck_settings(device: str, window_ms: tuple[float, float] | None, skip: list[str] | None = None,
                     timeout_s: float = 300.0, memory_gib: float = 8.0) -> FilterSettings:
    """Filter settings of a recheck: ``RECHECK_FILTERS`` minus ``skip``, the given runtime window (None:
    off), per-task timeout (s) and memory guard (GiB). Raises ValueError naming an unknown filter."""
    skip = list(skip or [])
    for name in skip:
        if name not in RECHECK_FILTERS:
            raise ValueError(f"--skip {name!r}: not a recheck filter; known: {', '.join(RECHECK_FILTERS)}")
    return FilterSettings(device=device, only=[n for n in RECHECK_FILTERS if n not in skip],
                          runtime_window_ms=window_ms, timeout_s=timeout_s, memory_gib=memory_gib)


def recheck(source: str | Path, out: str | Path, settings: FilterSettings, *, workers: int | None = None,
            progress: bool = True, limit: int | None = None, sample: int | None = None,
            seed: int = 0) -> dict[str, Any]:
    """Re-run the rules of every row of ``source`` (see the module docstring) into ``out``; returns the
    report also written to ``out/recheck.json``. ``limit``: only the first N rows; ``sample``: N rows drawn at
    random with ``seed`` (all rows when N is at least their number; the same N and seed draw the same rows,
    so a re-run resumes them), in file order; the report's ``sample`` says which.

    Raises:
        InputError: unreadable source (see ``task.task_file.read_published``). ValueError: bad settings, or
        both ``limit`` and ``sample`` given, or either below 1.
    """
    out = Path(out)
    rows, drawn = rows_to_recheck(read_published(source), limit, sample, seed)
    out.mkdir(parents=True, exist_ok=True)
    keep = [c for c in ("task_id", "code", "ops", "data_source") if c in rows.columns]
    rows_path = out / "_rows.parquet"
    rows[keep].to_parquet(rows_path, index=False)
    res = run_filter(rows_path, out / "filter", settings, workers=workers, progress=progress)
    report = build_report(rows, res.verdicts, settings)
    report["source"] = str(source)
    report["sample"] = drawn
    report["filter_wall_s"] = res.funnel["wall_s"]
    report["resumed_from_ledger"] = res.funnel["resumed_from_ledger"]
    (out / "recheck.json").write_text(json.dumps(report, indent=2, sort_keys=True))
    return report


def rows_to_recheck(rows: pd.DataFrame, limit: int | None = None, sample: int | None = None,
                    seed: int = 0) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The rows ``recheck`` re-runs: the first ``limit``, or ``sample`` drawn at random with ``seed`` (kept in
    file order; the same arguments draw the same rows), or all; and ``{"rows", "of", "how"}`` saying which.

    Raises:
        ValueError: both ``limit`` and ``sample`` given, or either below 1.
    """
    if limit is not None and sample is not None:
        raise ValueError("recheck: give --limit (the first N rows) or --sample (N random rows), not both")
    for name, n in (("--limit", limit), ("--sample", sample)):
        if n is not None and n < 1:
            raise ValueError(f"recheck: {name} must be >= 1 (got {n})")
    total = len(rows)
    if limit is not None and limit < total:
        return rows.head(limit), {"rows": limit, "of": total, "how": f"the first {limit}"}
    if sample is not None and sample < total:
        return (rows.sample(n=sample, random_state=seed).sort_index(),
                {"rows": sample, "of": total, "how": f"{sample} at random, seed {seed}"})
    return rows, {"rows": total, "of": total, "how": "all"}


def build_report(rows: pd.DataFrame, verdicts: pd.DataFrame, settings: FilterSettings) -> dict[str, Any]:
    """Pass counts per rule, the measured / published eager-time ratio and the devices, from the published
    ``rows`` and the filter stage's ``verdicts`` (one per row, same order; ``filter_run._verdict_table``)."""
    ran = settings.names()
    per_rule: dict[str, dict[str, Any]] = {}
    failures: list[dict[str, Any]] = []
    outcomes = list(zip(verdicts["task_id"], verdicts["accepted"], verdicts["filter"], verdicts["reason"],
                        verdicts["metrics"], strict=True))
    for rule in RULES:
        if not any(f in ran for f in rule.filters):
            per_rule[rule.name] = {"checked": False}
            continue
        counts = Counter()
        for task_id, accepted, filt, reason, metrics in outcomes:
            counts[rule.outcome(accepted, filt, reason, set(json.loads(metrics)), ran)] += 1
            if rule.fails(filt, reason):
                failures.append({"task_id": task_id, "rule": rule.name, "reason": reason})
        judged = counts["pass"] + counts["fail"]
        per_rule[rule.name] = {"checked": True, "pass": counts["pass"], "fail": counts["fail"],
                               "not_reached": counts["not_reached"],
                               "pass_rate": round(counts["pass"] / judged, 4) if judged else None}
    other = Counter(r for a, f, r in zip(verdicts["accepted"], verdicts["filter"], verdicts["reason"], strict=True)
                    if not a and not any(rule.fails(f, r) for rule in RULES))
    return {
        "rows": len(rows), "verdicted": len(verdicts), "all_rules_pass": int(verdicts["accepted"].sum()),
        "all_rules_pass_rate": round(float(verdicts["accepted"].mean()), 4) if len(verdicts) else None,
        "rules": per_rule, "other_rejections": dict(other.most_common()), "failures": failures[:50],
        "eager_ratio": eager_ratio(rows, verdicts), "device": _devices(rows, settings),
        "filters": ran, "window_ms": list(settings.runtime_window_ms) if settings.runtime_window_ms else None,
    }


def eager_ratio(rows: pd.DataFrame, verdicts: pd.DataFrame) -> dict[str, Any]:
    """Measured / published eager median per row where both are known: n, p10, p50, p90 (unitless)."""
    if "eager_ms" not in rows.columns:
        return {"n": 0}
    published = pd.to_numeric(rows["eager_ms"], errors="coerce").reset_index(drop=True)
    measured = pd.to_numeric(verdicts.set_index("row")["eager_ms"], errors="coerce").reindex(range(len(rows)))
    ratio = (measured.reset_index(drop=True) / published).replace([np.inf, -np.inf], np.nan).dropna()
    ratio = ratio[ratio > 0]
    if not len(ratio):
        return {"n": 0}
    p10, p50, p90 = np.percentile(ratio, [10, 50, 90])
    return {"n": int(len(ratio)), "p10": round(float(p10), 4), "p50": round(float(p50), 4),
            "p90": round(float(p90), 4)}


def _devices(rows: pd.DataFrame, settings: FilterSettings) -> dict[str, Any]:
    env = environment(settings.device)
    here = (env.get("gpu") or "cuda") if settings.device == "cuda" else "cpu"
    published = dict(Counter(rows["gpu"].astype(str))) if "gpu" in rows.columns else {}
    return {"recheck": here, "published": published, "same": set(published) <= {here} if published else None}


def format_report(rep: dict[str, Any]) -> str:
    """The report as a short terminal table."""
    lines = [f"{rep['rows']} rows; all rules pass: {rep['all_rules_pass']} "
             f"({(rep['all_rules_pass_rate'] or 0):.1%}); device {rep['device']['recheck']} "
             f"(published on {', '.join(rep['device']['published']) or '?'})"]
    lines.append(f"{'rule':<20}{'pass':>7}{'fail':>7}{'not run':>9}{'pass rate':>11}")
    for name, d in rep["rules"].items():
        if not d["checked"]:
            lines.append(f"{name:<20}{'(not checked)':>34}")
            continue
        rate = f"{d['pass_rate']:.1%}" if d["pass_rate"] is not None else "-"
        lines.append(f"{name:<20}{d['pass']:>7}{d['fail']:>7}{d['not_reached']:>9}{rate:>11}")
    r = rep["eager_ratio"]
    if r.get("n"):
        lines.append(f"measured / published eager time: p10 {r['p10']:.2f}  p50 {r['p50']:.2f}  p90 {r['p90']:.2f}"
                     f"  (n={r['n']})")
    if rep["other_rejections"]:
        lines.append("other rejections: " + ", ".join(f"{k}: {v}" for k, v in rep["other_rejections"].items()))
    return "\n".join(lines)
