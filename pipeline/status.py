"""``opforge status RUN_DIR``: where a run directory stands, read from its files only (nothing is started).

Reads the layout of ``pipeline.run`` (``config.yaml``, ``seeds/catalog.parquet``,
``candidates/round-NNNN.parquet``, ``filter/ledger.jsonl``, ``filter/funnel.json``, ``run.json`` with its stage
timeline, ``hf/``) or of a bare ``opforge filter`` directory (``ledger.jsonl``, ``funnel.json``, ``verdicts.parquet``). Safe to call
while the run is going: a ledger line being written is skipped.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

# Reason prefixes that say the task broke (as opposed to a rule it failed): what "last failures" lists.
FAILURE_PREFIXES = ("crash", "timeout", "oom", "eager_error", "compile_error")
# What the "ledger" line of ``format_status`` counts (it differs from the funnel's counts, see there).
LEDGER_LABEL = "sandbox verdicts, one per task id run, also of tasks no longer candidates; not the funnel"


class StatusError(ValueError):
    """RUN_DIR is not a run directory; the message names it and what is missing."""


def _ledger_records(path: Path) -> list[dict[str, Any]]:
    """Records of the ledger's latest fingerprint (the one its last complete line carries), in file order."""
    if not path.is_file():
        return []
    recs = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:  # a line being written or cut by a kill
                continue
            if isinstance(rec, dict) and "task_id" in rec:
                recs.append(rec)
    if not recs:
        return []
    fp = recs[-1].get("fingerprint")
    seen: dict[str, dict[str, Any]] = {}
    for r in recs:
        if r.get("fingerprint") == fp:
            seen.setdefault(r["task_id"], r)
    return list(seen.values())


def _parquet_rows(paths: list[Path]) -> tuple[int, int]:
    """(rows, distinct task_id) over ``paths`` from the Parquet footers and the task_id column only."""
    import pyarrow.parquet as pq

    rows, ids = 0, set()
    for p in paths:
        try:
            rows += pq.ParquetFile(p).metadata.num_rows
            ids.update(pq.read_table(p, columns=["task_id"]).column(0).to_pylist())
        except Exception:  # noqa: BLE001 - a file being written: counted on the next call
            continue
    return rows, len(ids)


def run_status(run_dir: str | Path, failures: int = 5) -> dict[str, Any]:
    """What ``run_dir`` holds: its kind (``run`` or ``filter``), stage, candidates composed, ledger progress,
    funnel so far (accepted, rejected per reason prefix) and the last ``failures`` broken tasks.

    Stages of a run, in order: ``harvest`` (no seed catalog yet), ``compose`` (catalog, no candidates and no
    verdict yet), ``filter`` (verdicts arriving: a round streams into the filter as it is composed),
    ``select`` (all verdicted, no ``run.json``), ``finished`` (``run.json`` written: stop reason, selected
    count, Hub folder, stage timeline).

    Raises:
        StatusError: ``run_dir`` is missing or holds neither a ``config.yaml`` nor a ``ledger.jsonl``.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise StatusError(f"{run_dir}: no such directory")
    is_run = (run_dir / "config.yaml").is_file()
    filter_dir = run_dir / "filter" if is_run else run_dir
    if not is_run and not (filter_dir / "ledger.jsonl").is_file():
        raise StatusError(f"{run_dir}: not a run directory (no config.yaml from `opforge run`, no ledger.jsonl "
                          f"from `opforge filter`)")
    out: dict[str, Any] = {"run_dir": str(run_dir), "kind": "run" if is_run else "filter"}
    recs = _ledger_records(filter_dir / "ledger.jsonl")
    accepted = sum(1 for r in recs if r.get("accepted"))
    reasons = Counter(str(r.get("reason")).split(":")[0] for r in recs if not r.get("accepted"))
    out["ledger"] = {"verdicted": len(recs), "accepted": accepted, "rejected": len(recs) - accepted,
                     "by_reason": dict(reasons.most_common())}
    broken = [r for r in recs if not r.get("accepted") and str(r.get("reason")).startswith(FAILURE_PREFIXES)]
    out["last_failures"] = [{"task_id": r["task_id"], "reason": r.get("reason"), "filter": r.get("filter"),
                             "error": _error_text(r)} for r in broken[-failures:]]
    funnel_path = filter_dir / "funnel.json"
    if funnel_path.is_file():
        try:
            f = json.loads(funnel_path.read_text(encoding="utf-8"))
            out["last_filter_pass"] = {k: f.get(k) for k in ("input_rows", "unique_tasks", "accepted_tasks",
                                                             "rejected_tasks", "wall_s", "tasks_per_min")}
        except (OSError, json.JSONDecodeError):
            pass
    if not is_run:
        out["stage"] = "filter"
        return out

    import yaml

    cfg = yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8")) or {}
    out["config"] = {k: cfg.get(k) for k in ("target", "device", "seed", "device_profile", "op_mix", "round_size",
                                             "candidate_budget")}
    rounds = sorted((run_dir / "candidates").glob("round-[0-9][0-9][0-9][0-9].parquet"))
    n_rows, n_unique = _parquet_rows(rounds)
    out["candidates"] = {"rounds": len(rounds), "rows": n_rows, "unique": n_unique}
    run_json = run_dir / "run.json"
    if run_json.is_file():
        out["stage"] = "finished"
        try:
            out["result"] = json.loads(run_json.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            out["result"] = None
        hf = run_dir / "hf"
        out["hub_folder"] = str(hf) if (hf / "README.md").is_file() else None
        from opforge.pipeline.funnel_counts import run_funnel

        # the counts of run.json and the card, recounted from the run's files (pipeline.funnel_counts)
        out["funnel"] = run_funnel(run_dir) or (out["result"] or {}).get("funnel")
    elif not rounds:  # the first round streams: its shards are filtered while later ones compose
        out["stage"] = ("filter" if recs else "compose") if (run_dir / "seeds" / "catalog.parquet").is_file() \
            else "harvest"
    elif len(recs) < n_unique:
        out["stage"] = "filter"
    else:
        out["stage"] = "select"
    return out


def _error_text(rec: dict[str, Any]) -> str | None:
    """The first error message a broken task's metrics carry (``error`` / ``message`` of any filter)."""
    for m in (rec.get("metrics") or {}).values():
        if isinstance(m, dict):
            for key in ("error", "message", "detail"):
                if m.get(key):
                    return " ".join(str(m[key]).split())[:200]
    return None


def format_status(s: dict[str, Any]) -> str:
    """``run_status`` as a few lines for the terminal. The ``funnel`` line is the run's (``pipeline.funnel_counts``,
    as in run.json and the card); the ``ledger`` line is the sandbox stage's progress, labelled as such."""
    lines = [f"{s['run_dir']}: {s['kind']} directory, stage: {s['stage']}"]
    if "config" in s:
        c = s["config"]
        lines.append(f"config: target {c['target']}, device {c['device']}, seed {c['seed']}, profile "
                     f"{c['device_profile']}, op mix {c['op_mix']}, round size {c['round_size']}, budget "
                     f"{c['candidate_budget']}")
    if "candidates" in s:
        c = s["candidates"]
        lines.append(f"candidates: {c['rows']} in {c['rounds']} round(s), {c['unique']} unique")
    if s.get("funnel"):
        from opforge.pipeline.funnel_counts import format_funnel

        lines.append(f"funnel: {format_funnel(s['funnel'])}")
    # the ledger is the sandbox stage's record, not the funnel: one verdict per task id sent to the sandboxes (the
    # duplicate check runs on the client and is not in it; a task composed past the run's last round is), so the
    # line says what it counts and says "passed" where the funnel says "accepted"
    led = s["ledger"]
    # "N of M" while verdicts are still due; a finished ledger may hold more verdicts than unique candidates
    # (a task re-run after a crash, a duplicate verdicted before it was seen as one): then only N
    todo = (f" of {s['candidates']['unique']}" if "candidates" in s and led["verdicted"] < s["candidates"]["unique"]
            else "")
    lines.append(f"ledger ({LEDGER_LABEL}): {led['verdicted']}{todo} verdicted, {led['accepted']} passed, "
                 f"{led['rejected']} rejected"
                 + (" (" + ", ".join(f"{k} {v}" for k, v in led["by_reason"].items()) + ")" if led["by_reason"] else ""))
    if s.get("last_filter_pass"):
        f = s["last_filter_pass"]
        lines.append(f"last filter pass: {f['unique_tasks']} tasks, {f['accepted_tasks']} accepted, "
                     f"{f['wall_s']} s, {f['tasks_per_min'] or 0} tasks/min")
    if s.get("result"):
        r = s["result"]
        lines.append(f"result: {r.get('stop_reason')}; {r.get('selected')} selected, yield {r.get('yield')}")
        from opforge.pipeline.timeline import format_timeline

        lines += format_timeline(r.get("timeline") or {})
        p = r.get("publication_steps")
        if p:
            lines.append(f"  after the last verdict: cluster closed in {p.get('cluster_close_s')} s (beside the rest), "
                         f"variants pool waited for {p.get('variants_wait_s', 0)} s; variants {p.get('variants_s')} s "
                         f"({p.get('variants_computed', 0)} computed now, {p.get('variants_cached', 0)} from the run's "
                         f"cache), card {p.get('card_s')} s, Hub folder {p.get('hub_folder_s')} s")
    if s.get("hub_folder"):
        lines.append(f"Hub folder: {s['hub_folder']}")
    if s["last_failures"]:
        lines.append("last failures:")
        lines += [f"  {f['task_id']}  {f['reason']}" + (f"  ({f['filter']})" if f["filter"] else "")
                  + (f": {f['error']}" if f["error"] else "") for f in s["last_failures"]]
    return "\n".join(lines)
