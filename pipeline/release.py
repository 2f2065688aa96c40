"""``opforge release``: assemble a release folder from a finished run and the steps run on its rows afterwards.

A release is reproduced by a short sequence of ``opforge`` commands::

    opforge run --config run.yaml                                    # RUN_DIR (resumes; may span several calls)
    opforge recheck RUN_DIR/hf RUN_DIR/recheck --device cuda        # RUN_DIR/recheck/recheck.json
    opforge variants RUN_DIR/hf --out RUN_DIR/hf_variants            # only if hf/ lacks shape_variants
    opforge compare RUN_DIR/hf_variants REFERENCE.parquet --out RUN_DIR/compare   # compare.json
    opforge release RUN_DIR --hf RUN_DIR/hf_variants --out releases/NAME \\
        --recheck RUN_DIR/recheck/recheck.json --compare RUN_DIR/compare/compare.json \\
        --exclude REFERENCE.parquet --version 1.0 --changelog CHANGELOG.md

Inputs, all read from files (nothing of a particular release is built into this module):

* the run directory ``RUN_DIR`` (``opforge run``): ``run.json``, ``selection.json``, ``candidates/round-*.parquet``,
  ``filter/ledger.jsonl``, ``filter/verdicts.parquet`` and ``filter/funnel.json``;
* the published folder ``hf`` (default ``RUN_DIR/hf``): ``README.md`` (the run's card), ``data/*.parquet``
  with a ``shape_variants`` column, ``plots/``, ``opforge_run.json`` and, after ``opforge variants``,
  ``opforge_variants.json``;
* optionally the ``opforge recheck`` report, the ``opforge compare`` result (dataset A must be ``hf``'s data
  files), a realism report (``{"figures", "targets"}`` as ``opforge.task.realism`` gives them; without one the
  compare result's realism figures of A are used), a version string and a changelog (Markdown).

The whole-run funnel is counted from ``filter/verdicts.parquet`` and ``filter/ledger.jsonl``, not read from
``filter/funnel.json`` or ``run.json``, whose wall time, tasks per minute and ``seconds`` cover only the last
``opforge run`` invocation of a run that was resumed (``whole_run_funnel``).

Output ``out`` (a folder, replaced only when it is an earlier release folder): ``data/*.parquet`` and ``plots/*``
copied byte for byte from ``hf``; ``README.md`` (the run's card with the funnel section recounted over the
whole run and sections on the release, the build, the re-check, realism and the comparison added);
``opforge_run.json`` (``hf``'s provenance plus a ``release`` block); ``opforge_variants.json``,
``recheck.json`` and ``realism.json`` when given. The folder is written into a temporary folder beside
``out`` and checked there (``check_release``); only when every check passes is it renamed to ``out``, so a
failure leaves ``out`` as it was.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

MAX_BYTES = 50_000_000  # default cap on the release folder's total size (bytes)
# the packaged KernelBench problems (all levels it holds): no released row may equal one of them
KERNELBENCH_REFERENCE = "packaged:kernelbench"
DEFAULT_REFERENCES: tuple[str, ...] = (KERNELBENCH_REFERENCE,)
# Absolute paths of a building machine (POSIX home / temp / work folders, a Windows drive); a release file
# naming one leaks where it was built. Checked in every file but the Parquet shards (compressed: their strings
# are checked as loaded rows).
ABSOLUTE_PATH = re.compile(r"(?<![\w.~-])(/(?:home|root|tmp|Users|work|mnt|scratch|private/var|var/folders)/"
                           r"|[A-Z]:\\{1,2}(?:Users|Windows|Temp|work|home)\\)")
RELEASE_SECTIONS = ("Release", "How this release was built", "Re-check", "Realism")
COMPARE_PREFIX = "Side by side with "
CARD_TITLE = re.compile(r"(?m)^## ")


class ReleaseError(ValueError):
    """An input of the release or the assembled folder fails a check; the message names the file and the
    problem."""


# ---------------------------------------------------------------------------------------------------------
# inputs


def _read_json(path: Path, what: str) -> Any:
    """The JSON document in ``path`` (``what`` names it in errors). Raises ReleaseError: missing or not JSON."""
    if not path.is_file():
        raise ReleaseError(f"{path}: no such file ({what})")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ReleaseError(f"{path}: not JSON ({what}: {exc})") from None


def _need_keys(doc: Any, keys: Iterable[str], path: Path, what: str) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise ReleaseError(f"{path}: not {what} (a JSON object expected, got {type(doc).__name__})")
    missing = [k for k in keys if k not in doc]
    if missing:
        raise ReleaseError(f"{path}: not {what} (no {', '.join(repr(k) for k in missing)})")
    return doc


def _read_parquet(path: Path, columns: list[str] | None = None):
    import pandas as pd

    if not path.is_file():
        raise ReleaseError(f"{path}: no such file")
    try:
        return pd.read_parquet(path, columns=columns)
    except Exception as exc:  # noqa: BLE001 - any unreadable Parquet is this file's problem
        raise ReleaseError(f"{path}: unreadable Parquet ({type(exc).__name__}: {exc})") from None


def read_ledger(path: Path) -> tuple[list[dict[str, Any]], int]:
    """The records of a filter ledger (``engine.ledger.Ledger``'s JSONL) in file order, and the number of
    lines that are not a JSON object (a write cut short by a kill; the ledger itself skips them too).

    Raises:
        ReleaseError: ``path`` is missing, or a record lacks ``task_id``, ``fingerprint``, ``accepted`` or
            ``reason`` (line number named).
    """
    if not path.is_file():
        raise ReleaseError(f"{path}: no such file (the run's filter ledger)")
    records, cut = [], 0
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                cut += 1
                continue
            if not isinstance(rec, dict):
                cut += 1
                continue
            missing = [k for k in ("task_id", "fingerprint", "accepted", "reason") if k not in rec]
            if missing:
                raise ReleaseError(f"{path}:{n}: a ledger record without {', '.join(missing)}")
            records.append(rec)
    return records, cut


# ---------------------------------------------------------------------------------------------------------
# the whole-run funnel


def whole_run_funnel(run_dir: str | Path) -> dict[str, Any]:
    """Counts over every candidate of the run in ``run_dir``.

    Every composed candidate (a row of ``candidates/round-*.parquet``) is either not filtered (its signature
    was full: ``skip_full_signatures``) or has one row in ``filter/verdicts.parquet``. A verdict row given on
    the client by a corpus filter (``worker == "client"``; ``filters.chain.CORPUS_FILTERS`` when the table has
    no ``worker`` column) has no ledger record;
    every other one has the record of its ``task_id`` in ``filter/ledger.jsonl`` under the run's filter
    fingerprint (``filter/funnel.json``), with the same ``accepted`` and ``reason``.

    Returns:
        ``candidates`` (rows of the rounds the run reached: ``run.json``'s ``rounds``, the first of the round
        files; rounds composed ahead past them are counted in ``rounds_not_reached``), ``rounds``,
        ``candidates_per_round``, ``not_filtered`` (candidate rows without a verdict row),
        ``not_filtered_tasks`` (their distinct task ids),
        ``filtered`` (verdict rows), ``corpus_verdicts`` (client-side rejections), ``ledger_verdicts`` (verdict
        rows with a ledger record), ``accepted``, ``rejected`` (filtered - accepted), ``yield`` (accepted /
        filtered, 4 decimals), ``by_reason`` (reason prefix -> rejected rows, most first), ``by_reason_detail``
        (full reason -> rows), ``by_filter`` (filter -> ``ran`` tasks, ``rejected`` tasks and ``sandbox_s``,
        seconds summed over the ledger records of the verdicts), ``fingerprint``, ``environment`` (of the last
        filter pass), ``ledger_records`` (records under the fingerprint), ``ledger_records_unused`` (of those,
        records no verdict row uses), ``ledger_other_fingerprint`` (records under another fingerprint, which
        the run did not use), ``ledger_cut_lines``, ``last_invocation`` (``ran_this_time``,
        ``resumed_from_ledger``, ``wall_s`` and ``tasks_per_min`` of the last filter pass).

    Raises:
        ReleaseError: a missing or unreadable file, or files that disagree (the message names both files):
            verdict rows that are more than the candidates, a verdict row without its ledger record or with
            another verdict there, or counts that differ from ``run.json``'s.
    """
    from opforge.pipeline.run import round_files

    run_dir = Path(run_dir)
    rounds = round_files(run_dir)
    if not rounds:
        raise ReleaseError(f"{run_dir / 'candidates'}: no round-*.parquet (not a finished `opforge run` directory)")
    rpath = run_dir / "run.json"
    run = _need_keys(_read_json(rpath, "the run's record"), ("candidates", "accepted", "selected"), rpath,
                     "an `opforge run` record")
    # rounds composed ahead (``opforge run --compose-rounds``) that the run never reached are not its candidates
    used = run.get("rounds")
    reached = used if isinstance(used, int) and 0 < used <= len(rounds) else len(rounds)
    rounds, ahead = rounds[:reached], rounds[reached:]
    round_ids = [_read_parquet(p, ["task_id"])["task_id"] for p in rounds]
    per_round = [len(ids) for ids in round_ids]
    candidates = sum(per_round)
    vpath = run_dir / "filter" / "verdicts.parquet"
    lpath = run_dir / "filter" / "ledger.jsonl"
    fpath = run_dir / "filter" / "funnel.json"
    verdicts = _read_parquet(vpath)
    missing = [c for c in ("task_id", "accepted", "reason", "filter") if c not in verdicts.columns]
    if missing:
        raise ReleaseError(f"{vpath}: no column {', '.join(missing)} (not a filter verdict table)")
    last = _need_keys(_read_json(fpath, "the last filter pass's funnel"), ("fingerprint",), fpath,
                      "a filter funnel")
    fp = last["fingerprint"]
    records, cut = read_ledger(lpath)
    done: dict[str, dict[str, Any]] = {}
    other_fp = 0
    for rec in records:
        if rec["fingerprint"] == fp:
            done.setdefault(rec["task_id"], rec)  # the first record of a task counts, as in the ledger
        else:
            other_fp += 1
    if len(verdicts) > candidates:
        raise ReleaseError(f"{vpath}: {len(verdicts)} verdict rows, but {run_dir / 'candidates'}/round-*.parquet "
                           f"hold only {candidates} candidates")
    from opforge.filters.chain import CORPUS_FILTERS

    client = (verdicts["worker"] == "client") if "worker" in verdicts.columns else \
        verdicts["filter"].isin(CORPUS_FILTERS)  # a table without workers: the corpus filters' verdicts
    used: set[str] = set()
    for task_id, accepted, reason in verdicts.loc[~client, ["task_id", "accepted", "reason"]].itertuples(index=False):
        rec = done.get(task_id)
        reason = None if not isinstance(reason, str) else reason
        if rec is None:
            raise ReleaseError(f"{vpath} and {lpath} disagree: task {task_id} has a verdict but no ledger record "
                               f"under the filter fingerprint {fp}")
        if bool(rec["accepted"]) != bool(accepted) or rec["reason"] != reason:
            raise ReleaseError(f"{vpath} and {lpath} disagree on task {task_id}: verdicts.parquet says "
                               f"accepted={bool(accepted)} reason={reason!r}, the ledger accepted={rec['accepted']} "
                               f"reason={rec['reason']!r}")
        used.add(task_id)
    accepted = int(verdicts["accepted"].sum())
    rejected = verdicts.loc[~verdicts["accepted"].astype(bool), "reason"].fillna("?")
    detail = Counter(rejected)
    by_reason = Counter()
    for reason, n in detail.items():
        by_reason[reason.split(":")[0]] += n
    by_filter: dict[str, dict[str, Any]] = {}
    for task_id in sorted(used):
        rec = done[task_id]
        for name, sec in (rec.get("seconds") or {}).items():
            d = by_filter.setdefault(name, {"ran": 0, "rejected": 0, "sandbox_s": 0.0})
            d["ran"] += 1
            d["sandbox_s"] += float(sec or 0.0)
        if not rec["accepted"] and rec.get("filter"):
            by_filter.setdefault(rec["filter"], {"ran": 0, "rejected": 0, "sandbox_s": 0.0})["rejected"] += 1
    for name, n in Counter(verdicts.loc[client, "filter"].fillna("?")).items():
        by_filter.setdefault(name, {"ran": None, "rejected": 0, "sandbox_s": None})["rejected"] += n
    funnel = {
        "candidates": candidates, "rounds": len(rounds), "candidates_per_round": per_round,
        "rounds_not_reached": len(ahead),
        "not_filtered": candidates - len(verdicts), "filtered": len(verdicts),
        "not_filtered_tasks": len({t for ids in round_ids for t in ids} - set(verdicts["task_id"])),
        "corpus_verdicts": int(client.sum()), "ledger_verdicts": int((~client).sum()),
        "accepted": accepted, "rejected": len(verdicts) - accepted,
        "yield": round(accepted / len(verdicts), 4) if len(verdicts) else None,
        "by_reason": dict(by_reason.most_common()), "by_reason_detail": dict(detail.most_common()),
        "by_filter": {k: {**v, "sandbox_s": None if v["sandbox_s"] is None else round(v["sandbox_s"], 1)}
                      for k, v in sorted(by_filter.items(), key=lambda kv: -(kv[1]["sandbox_s"] or 0.0))},
        "fingerprint": fp, "environment": last.get("environment"),
        "ledger_records": len(done), "ledger_records_unused": len(done) - len(used),
        "ledger_other_fingerprint": other_fp, "ledger_cut_lines": cut,
        "last_invocation": {k: last.get(k) for k in ("ran_this_time", "resumed_from_ledger", "wall_s",
                                                     "tasks_per_min")},
    }
    if run["candidates"] != candidates or run["accepted"] != accepted:
        raise ReleaseError(f"{rpath} and {vpath} disagree: run.json counts {run['candidates']} candidates / "
                           f"{run['accepted']} accepted, the rounds and verdicts {candidates} / {accepted}")
    nf = run.get("not_filtered_full_signature")
    if nf is not None:
        nf += run.get("not_filtered_heavy_cap") or 0
    # run.json counts distinct task ids (a task composed twice in a round is skipped once)
    if nf is not None and nf not in (funnel["not_filtered"], funnel["not_filtered_tasks"]):
        raise ReleaseError(f"{rpath} and {vpath} disagree: run.json has {nf} candidates not filtered, the rounds "
                           f"less the verdict rows {funnel['not_filtered']} ({funnel['not_filtered_tasks']} "
                           f"distinct tasks)")
    return funnel


# ---------------------------------------------------------------------------------------------------------
# summaries of the steps after the run


def recheck_summary(rep: dict[str, Any], task_ids: set[str], path: Path) -> dict[str, Any]:
    """The figures of an ``opforge recheck`` report (``pipeline.recheck``) that the card and provenance state:
    rows, rows passing every rule and their share, per checked rule pass / fail / pass rate, failures, the
    measured / published eager-time ratio and the devices.

    Raises:
        ReleaseError: the report (``path``) is not a recheck report, or re-checked rows that are not
            released rows (a failure's ``task_id`` outside ``task_ids``), or more rows than the release has.
    """
    _need_keys(rep, ("rows", "all_rules_pass", "rules", "failures"), path, "an `opforge recheck` report")
    if rep["rows"] > len(task_ids):
        raise ReleaseError(f"{path}: re-checked {rep['rows']} rows, the release has {len(task_ids)}")
    strangers = sorted({f.get("task_id") for f in rep["failures"]} - task_ids)
    if strangers:
        raise ReleaseError(f"{path}: failures name rows that are not in the release: {strangers[:5]}")
    return {"rows": rep["rows"], "of": len(task_ids), "all_rules_pass": rep["all_rules_pass"],
            "all_rules_pass_rate": rep.get("all_rules_pass_rate"), "device": rep.get("device"),
            "rules": {k: {"pass": v["pass"], "fail": v["fail"], "pass_rate": v["pass_rate"]}
                      for k, v in rep["rules"].items() if v.get("checked", True)},
            "failures": rep["failures"], "eager_ratio": rep.get("eager_ratio") or {"n": 0},
            "window_ms": rep.get("window_ms"), "how": (rep.get("sample") or {}).get("how")}


def realism_summary(doc: dict[str, Any], path: Path | str) -> dict[str, Any]:
    """``figures`` (scalar figures only) and ``targets`` (figure -> ``{value, target, pass}``) of a realism
    report (``opforge.task.realism``: ``summarise`` / ``check_targets``). Raises ReleaseError naming ``path``
    when it has neither."""
    _need_keys(doc, ("figures", "targets"), Path(path), "a realism report")
    return {"figures": {k: v for k, v in doc["figures"].items() if not isinstance(v, (dict, list))},
            "targets": doc["targets"]}


def _data_digest(hf: Path) -> str:
    """SHA-256 over the bytes of ``hf/data/*.parquet`` in name order (what ``opforge compare`` records)."""
    import hashlib

    digest = hashlib.sha256()
    for p in sorted((hf / "data").glob("*.parquet")):
        digest.update(p.read_bytes())
    return digest.hexdigest()


def compare_summary(cmp: dict[str, Any], hf: Path, path: Path) -> dict[str, Any]:
    """The comparison figures of an ``opforge compare`` result whose dataset A is ``hf``'s rows: the names,
    settings (sample, seed, KernelBench reference, peaks), the cross-dataset duplicates and the table.

    Raises:
        ReleaseError: ``path`` is not a compare result, or its dataset A is not ``hf``'s data files (their
            SHA-256 differs).
    """
    _need_keys(cmp, ("names", "datasets", "table", "cross_duplicates", "settings"), path,
               "an `opforge compare` result")
    a = cmp["datasets"].get("a") or {}
    sha = (a.get("input") or {}).get("sha256")
    if sha is not None and sha != _data_digest(hf):
        raise ReleaseError(f"{path}: its dataset A is not the rows of {hf / 'data'} (another SHA-256); run "
                           f"`opforge compare {hf} ...` again")
    s = cmp["settings"]
    return {"names": list(cmp["names"]), "measure_version": cmp.get("measure_version"),
            "settings": {k: s.get(k) for k in ("limit", "seed", "timeout_s", "trace_device")},
            "kernelbench": s.get("kernelbench"), "peaks": s.get("peaks"),
            "rows": [a.get("rows"), (cmp["datasets"].get("b") or {}).get("rows")],
            "cross_duplicates": {k: cmp["cross_duplicates"].get(k) for k in ("exact", "near", "near_min")},
            "seconds": (cmp.get("seconds") or {}).get("total"),
            "opforge": (cmp.get("provenance") or {}).get("opforge"),
            "table": cmp["table"]}


# ---------------------------------------------------------------------------------------------------------
# the card


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


def _n(x: Any) -> str:
    return f"{x:,}" if isinstance(x, int) else str(x)


def _pl(n: int, one: str, many: str) -> str:
    """``n`` with the singular or plural wording: ``_pl(1, "task was", "tasks were")``."""
    return f"{n:,} {one if n == 1 else many}"


def split_sections(body: str) -> list[list[str]]:
    """``[[title, text], ...]`` of a card body split at its ``## `` headings (title "" for the preamble)."""
    parts = CARD_TITLE.split(body)
    out = [["", parts[0]]]
    for p in parts[1:]:
        title, _, text = p.partition("\n")
        out.append([title.strip(), text])
    return out


def join_sections(sections: list[list[str]]) -> str:
    return sections[0][1].strip() + "\n\n" + "".join(f"## {t}\n\n{x.strip()}\n\n" for t, x in sections[1:])


def funnel_section(f: dict[str, Any], selected: int, stop_reason: str | None) -> str:
    """The card's funnel over the whole run (``whole_run_funnel``): a sentence per stage and the table of
    rejections by reason with their details."""
    base = f["candidates"]
    rows = ["| reason | tasks | share of candidates | detail |", "|---|---:|---:|---|",
            f"| accepted | {f['accepted']:,} | {_pct(f['accepted'] / base)} | |"]
    if f["not_filtered"]:
        rows.append(f"| not filtered (signature full, heavy-op cap) | {f['not_filtered']:,} | "
                    f"{_pct(f['not_filtered'] / base)} | |")
    for reason, n in f["by_reason"].items():
        detail = ", ".join(f"`{k.split(':', 1)[1]}` {v:,}" for k, v in f["by_reason_detail"].items()
                           if k.split(":")[0] == reason and ":" in k)
        rows.append(f"| `{reason}` | {n:,} | {_pct(n / base)} | {detail} |")
    skipped = (f" {_pl(f['not_filtered'], 'was', 'were')} not filtered: (op set, dtype) signatures that already held "
               "the selection's cap of accepted tasks from earlier rounds, and heavy-op candidates of the rounds "
               "composed after the target to hold the heavy-op cap." if f["not_filtered"] else "")
    stop = f" ({stop_reason})" if stop_reason else ""
    corpus = (f"{_pl(f['corpus_verdicts'], 'was', 'were')} rejected over the whole corpus without being run "
              f"(duplicates of an earlier candidate); the other {f['ledger_verdicts']:,}" if f["corpus_verdicts"] else
              f"none was a duplicate of an earlier candidate; all {f['ledger_verdicts']:,}")
    return f"""
Over the whole run: {base:,} candidates composed in {f['rounds']} round(s){stop}.{skipped}
Of the {f['filtered']:,} filtered, {corpus} ran the sandboxed filter chain, one ledger record each, all under the
filter fingerprint `{f['fingerprint']}`. {f['accepted']:,} passed every filter ({_pct(f['yield'])} yield of the
filtered candidates); {selected:,} were selected.

{chr(10).join(rows)}

Counted from the run's `filter/verdicts.parquet` and `filter/ledger.jsonl` (every verdict of the run), not from
`filter/funnel.json`, which describes the last filter pass only.
"""


def build_section(f: dict[str, Any], run: dict[str, Any], config: dict[str, Any], steps: list[str]) -> str:
    """How the release was built, from the run's own files: the run's config, the filter fingerprint and
    environment, the result, timings (flagged as the last invocation's when the run was resumed), sandbox
    seconds per filter over the whole ledger, and the steps run on the published rows afterwards."""
    env = f.get("environment") or {}
    keys = ("target", "seed", "device", "device_profile", "round_size", "max_per_signature", "max_heavy_share",
            "cap_rounds", "soft_min_fusion_gain", "max_random_share", "max_op_share", "max_op_set_share",
            "runtime_window_ms",
            "timeout_s", "op_mix", "motif_share", "dtype_mix")
    shown = ", ".join(f"`{k}` {json.dumps(config[k])}" for k in keys if config.get(k) is not None)
    envs = ", ".join(f"{k} {env[k]}" for k in ("gpu", "torch", "transformers", "triton", "python", "filter_logic")
                     if env.get(k) is not None)
    last = f["last_invocation"]
    resumed = last.get("resumed_from_ledger") or 0
    tl = (run.get("timeline") or {}).get("stages") or {}
    walls = ", ".join(f"{k} {v['wall_s']:,.1f} s" for k, v in tl.items() if v.get("wall_s") is not None)
    if resumed:
        timing = (f"The run was resumed: its last `opforge run` invocation verdicted "
                  f"{_pl(last.get('ran_this_time') or 0, 'task', 'tasks')} and took {resumed:,} from the ledger, so `run.json`'s seconds and timeline ({walls or '-'}) "
                  "cover that invocation only.")
    else:
        rate = last.get("tasks_per_min")
        timing = (f"The run ran in one invocation: stage wall times {walls or '-'}"
                  + (f"; the filter verdicted {rate:,.1f} tasks/min." if rate else "."))
    sandbox = ", ".join(f"{k} {v['sandbox_s']:,.0f} s" for k, v in f["by_filter"].items() if v["sandbox_s"])
    extra = []
    if f["ledger_other_fingerprint"]:
        extra.append(f"The ledger also holds {_pl(f['ledger_other_fingerprint'], 'record', 'records')} under "
                     "another filter fingerprint, which the run did not use.")
    if f["ledger_records_unused"]:
        extra.append(f"{_pl(f['ledger_records_unused'], 'ledger record belongs', 'ledger records belong')} to "
                     "no verdict of the final candidates.")
    after = "".join(f"\n- {s}" for s in steps)
    return f"""
One `opforge run` built the rows: {shown}. Every verdict was given under the filter fingerprint
`{f['fingerprint']}` ({envs or 'environment not recorded'}). Result: {f['candidates']:,} candidates,
{f['accepted']:,} accepted, {run.get('selected', 0):,} selected; stop reason "{run.get('stop_reason', '?')}".
{timing} Sandbox time summed over the whole ledger: {sandbox or '-'}. {' '.join(extra)}

Afterwards, on the published rows:{after or ' nothing.'}
"""


def recheck_section(r: dict[str, Any]) -> str:
    rows = ["| rule | pass | fail | pass rate |", "|---|---:|---:|---:|"]
    rows += [f"| {k} | {v['pass']:,} | {v['fail']:,} | {_pct(v['pass_rate'])} |" for k, v in r["rules"].items()]
    fails = "; ".join(f"`{x['task_id']}` ({x['rule']}: `{x['reason']}`)" for x in r["failures"][:10]) or "none"
    more = f" (and {len(r['failures']) - 10} more)" if len(r["failures"]) > 10 else ""
    dev = r.get("device") or {}
    where = f" on {dev['recheck']}" if dev.get("recheck") else ""
    published = ", ".join(dev.get("published") or {}) or "?"
    e = r["eager_ratio"]
    ratio = (f"Measured / published eager time: p10 {e['p10']:.2f}, p50 {e['p50']:.2f}, p90 {e['p90']:.2f} "
             f"(n = {e['n']:,})." if e.get("n") else "No eager time was compared.")
    return f"""
{r['rows']:,} of the {r['of']:,} rows{f" ({r['how']})" if r.get("how") not in (None, "all") else ""} were verdicted again by `opforge recheck` in fresh sandboxes{where}
(published on {published}): {r['all_rules_pass']:,} of {r['rows']:,} pass every rule
({_pct(r['all_rules_pass_rate'])}).

{chr(10).join(rows)}

Failing rows: {fails}{more}. {ratio} The report is `recheck.json` in this folder.
"""


def _figure(key: str, v: Any) -> str:
    if isinstance(v, (int, float)) and "share" in key:
        return _pct(v)
    if isinstance(v, (int, float)) and key.startswith("input_bytes"):
        return f"{v / 1e6:,.1f} MB"
    if isinstance(v, float):
        return f"{v:,.0f}" if v == int(v) else f"{v:,.2f}"
    return _n(v)


# realism targets whose value the card shows with the figure that names it (task.realism's diversity figures)
_NAMED_BY = {"top_exotic_op_share": "top_exotic_op", "top_op_set_share": "top_op_set",
             "distinct_op_set_share": "distinct_op_sets"}


def _target_value(real: dict[str, Any], key: str) -> str:
    """A realism target's value as the card shows it; the diversity targets name what they measure (the top
    exotic op, the top op set, the number of distinct op sets)."""
    v = real["targets"][key].get("value")
    if v is None:
        return "-"
    named = real.get("figures", {}).get(_NAMED_BY[key]) if key in _NAMED_BY else None
    return _figure(key, v) + (f" ({_n(named)})" if named is not None else "")


def _missed_targets(real: dict[str, Any] | None) -> list[str]:
    """The realism targets of ``real`` measured and not met."""
    return [k for k, t in (real or {}).get("targets", {}).items() if t.get("pass") is False]


def realism_section(real: dict[str, Any], source: str) -> str:
    rows = ["| figure | value | target | |", "|---|---:|---|---|"]
    for k, t in real["targets"].items():
        verdict = "not measured" if t.get("pass") is None else "met" if t["pass"] else "**not met**"
        value = _target_value(real, k)
        rows.append(f"| {k} | {value} | {t.get('target')} | {verdict} |")
    missed = _missed_targets(real)
    note = "Every target is met." if not missed else "Not met: " + ", ".join(f"`{k}`" for k in missed) + "."
    n = real["figures"].get("rows")
    over = f" over {n:,} rows" if isinstance(n, int) else ""
    return f"""
Realism figures{over} (`opforge.task.realism`, traced on the `meta` device; {source}). {note}

{chr(10).join(rows)}
"""


def compare_section(c: dict[str, Any]) -> str:
    """The ``opforge compare`` table (rows where both datasets show 0.0 % or nothing left out)."""
    a, b = c["names"]
    rows = [f"| measure | {a} | {b} |", "|---|---|---|"]
    for m, x, y in c["table"]:
        if {x, y} <= {"0.0 %", "-"}:
            continue
        rows.append(f"| {m} | {x} | {y} |")
    s = c["settings"]
    sample = "all rows" if s.get("limit") is None else f"a random sample of {s['limit']:,} rows per dataset " \
                                                         f"(seed {s.get('seed')})"
    cross = c["cross_duplicates"]
    return f"""
The same measures for both datasets, computed by opforge's own functions (`opforge compare`, measure version
{c.get('measure_version')}): labels and duplicates over all rows, the traced measures over {sample}.
{cross.get('exact')} rows of this release equal a row of {b} (normalised source); {cross.get('near')} are near
duplicates of one (MinHash >= {cross.get('near_min')}).

{chr(10).join(rows)}
"""


def _demote(markdown: str) -> str:
    """A changelog's headings two levels down, so they stay inside the card's release section."""
    return re.sub(r"(?m)^(#{1,4}) ", lambda m: "#" * min(6, len(m.group(1)) + 2) + " ", markdown.strip())


def release_card(text: str, path: Path, funnel: dict[str, Any], run: dict[str, Any], config: dict[str, Any],
                 num_bytes: int, steps: list[str], version: str | None = None, changelog: str | None = None,
                 recheck: dict[str, Any] | None = None, realism: dict[str, Any] | None = None,
                 realism_source: str = "", compare: dict[str, Any] | None = None) -> str:
    """The release card from the run's card ``text`` (``path`` names it in errors): the front matter's
    ``num_bytes`` set to ``num_bytes`` (Arrow bytes of the rows), the ``Filter funnel`` section recounted over
    the whole run, sections ``Release`` (version, changelog; after the opening), ``How this release was
    built``, ``Re-check``, ``Realism`` and ``Side by side with B`` added after the funnel (sections of an
    earlier release card replaced), a ``filter fingerprint`` row added to ``Environment`` and notes to
    ``Limitations``. A card without one of these sections gets the new ones at its end.

    Raises:
        ReleaseError: the card has no YAML front matter with ``dataset_info.splits``.
    """
    import yaml

    try:
        _, fm, body = text.split("---", 2)
        meta = yaml.safe_load(fm)
        meta["dataset_info"]["splits"][0]["num_bytes"] = num_bytes
    except (ValueError, yaml.YAMLError, KeyError, IndexError, TypeError) as exc:
        raise ReleaseError(f"{path}: no YAML front matter with dataset_info.splits ({type(exc).__name__}: "
                           f"{exc})") from None
    sections = [s for s in split_sections(body)
                if s[0] not in RELEASE_SECTIONS and not s[0].startswith(COMPARE_PREFIX)]
    added: list[list[str]] = [["How this release was built", build_section(funnel, run, config, steps)]]
    if recheck is not None:
        added.append(["Re-check", recheck_section(recheck)])
    if realism is not None:
        added.append(["Realism", realism_section(realism, realism_source)])
    if compare is not None:
        added.append([COMPARE_PREFIX + compare["names"][1], compare_section(compare)])
    release = []
    if version or changelog:
        release = [["Release", (f"Version **{version}**." if version else "")
                    + ("\n\n" + _demote(changelog) if changelog else "")]]
    out: list[list[str]] = [sections[0], *release]
    placed = False
    for title, sec in sections[1:]:
        if title == "Filter funnel":
            sec = funnel_section(funnel, run.get("selected", 0), run.get("stop_reason"))
        elif title == "Environment":
            sec = re.sub(r"(?m)^\| filter fingerprint \|.*\n?", "", sec).rstrip()
            sec += f"\n| filter fingerprint | `{funnel['fingerprint']}` |\n"
        elif title == "Limitations":  # the realism notes of an earlier release card are replaced, not kept
            sec = re.sub(r"(?m)^- Realism target `.*\n?", "", sec).rstrip()
            sec += "\n" + "".join(f"- {x}\n" for x in _limitations(recheck, realism) if x not in sec)
        elif title == "Licence" and not placed:  # a card without a funnel section: before the licence
            out.extend(added)
            placed = True
        out.append([title, sec])
        if title == "Filter funnel" and not placed:
            out.extend(added)
            placed = True
    if not placed:
        out.extend(added)
    return "---\n" + yaml.safe_dump(meta, sort_keys=False) + "---\n\n" + join_sections(out).rstrip() + "\n"


def _limitations(recheck: dict[str, Any] | None, realism: dict[str, Any] | None = None) -> list[str]:
    """The card's release notes for ``Limitations``: shape variants, the re-check's reach and failures, and each
    realism target not met (value against target)."""
    notes = ["Hidden shape variants were validated on the `meta` device (shapes and a cost model), not run on a "
             "GPU."]
    if recheck is None:
        notes.append("The published rows were not re-checked after the run.")
    else:
        if recheck["rows"] < recheck["of"]:
            notes.append(f"The re-check re-verdicted {recheck['rows']:,} of the {recheck['of']:,} rows, not all.")
        failed = recheck["rows"] - recheck["all_rules_pass"]
        if failed:
            notes.append(f"{_pl(failed, 're-checked row', 're-checked rows')} failed a rule on re-measurement "
                         "(see Re-check).")
    for k in _missed_targets(realism):
        notes.append(f"Realism target `{k}` is not met: {_target_value(realism, k)} against "
                     f"{realism['targets'][k].get('target')} (see Realism).")
    return notes


def refresh_realism(folder: str | Path, realism: str | Path, reference: str | Path | None = None) -> dict[str, Any]:
    """Re-render the realism figures of a release folder from realism reports of its own rows, leaving the rows,
    plots and every other section as they are: the card's ``Realism`` section, its ``Limitations`` (realism
    notes replaced: only targets the report misses), the diversity rows of its ``Side by side with B`` table
    (``pipeline.compare.diversity_rows``, B's from ``reference``) and ``opforge_run.json``'s ``release.realism``
    (and ``release.comparison.diversity``). For measures added after a release was assembled: the rows are the
    published ones, so the figures are those ``opforge compare`` / ``opforge release`` would give.

    Args:
        folder: the release folder (``README.md``, ``opforge_run.json``, ``data/*.parquet``).
        realism: a realism report (``{"figures", "targets"}``: ``benchmarks/realism_bench.py``) of the folder's rows.
        reference: the same report of the compared dataset B (None: the side-by-side table is left as it is).

    Returns:
        The new ``release.realism`` block.

    Raises:
        ReleaseError: a file is missing or malformed, or the report counts another number of rows than the folder.
    """
    import pyarrow.parquet as pq
    from opforge.pipeline.compare import diversity_rows

    folder = Path(folder)
    card_path, prov_path = folder / "README.md", folder / "opforge_run.json"
    if not card_path.is_file():
        raise ReleaseError(f"{card_path}: no such file (a release folder's card)")
    prov = _read_json(prov_path, "a release's provenance")
    if not isinstance(prov.get("release"), dict):
        raise ReleaseError(f"{prov_path}: no `release` block (not a folder of `opforge release`)")
    real = realism_summary(_read_json(Path(realism), "the realism report"), realism)
    rows = sum(pq.ParquetFile(p).metadata.num_rows for p in sorted((folder / "data").glob("*.parquet")))
    if real["figures"].get("rows") != rows:
        raise ReleaseError(f"{realism}: a report of {real['figures'].get('rows')} rows, the folder holds {rows}")
    ref = None if reference is None else realism_summary(_read_json(Path(reference), "the realism report"),
                                                         reference)
    text = card_path.read_text(encoding="utf-8")
    head, sep, body = text.partition("\n---\n")
    sections = split_sections(body)
    source = f"report of this folder's rows by `benchmarks/realism_bench.py`, `{Path(realism).name}`"
    for sec in sections:
        if sec[0] == "Realism":
            sec[1] = realism_section(real, source)
        elif sec[0] == "Limitations":
            keep = re.sub(r"(?m)^- Realism target `.*\n?", "", sec[1]).rstrip()
            missed = [f"Realism target `{k}` is not met: {_target_value(real, k)} against "
                      f"{real['targets'][k].get('target')} (see Realism)." for k in _missed_targets(real)]
            sec[1] = keep + "\n" + "".join(f"- {x}\n" for x in missed)
        elif sec[0].startswith(COMPARE_PREFIX) and ref is not None:
            lines = [ln for ln in sec[1].split("\n")
                     if not ln.startswith(("| realism: top exotic op", "| realism: top op set",
                                           "| realism: distinct op sets"))]
            last = max(i for i, ln in enumerate(lines) if ln.startswith("|"))
            added = ["| " + " | ".join(r) + " |" for r in diversity_rows([real["figures"], ref["figures"]])]
            lines[last + 1:last + 1] = [r.replace("; sample)", "; all rows)") for r in added]
            sec[1] = "\n".join(lines)
    card_path.write_text(head + sep + "\n" + join_sections(sections).rstrip() + "\n", encoding="utf-8")
    prov["release"]["realism"] = real
    if ref is not None and isinstance(prov["release"].get("comparison"), dict):
        keys = ("top_exotic_op", "top_exotic_op_share", "top_op_set", "top_op_set_share", "distinct_op_sets",
                "distinct_op_set_share")
        prov["release"]["comparison"]["diversity"] = {
            "a": {k: real["figures"].get(k) for k in keys}, "b": {k: ref["figures"].get(k) for k in keys},
            "source": "benchmarks/realism_bench.py reports of both datasets' rows (task.realism)"}
    prov_path.write_text(_dump(prov))
    return real


def refresh_card_statements(folder: str | Path) -> list[str]:
    """Re-state, from a release folder's own rows, the card statements that ``opforge run`` once wrote as fixed
    prose or from another measure: the ``data_source`` range (``hub_folder.column_doc``), the libraries motifs come
    from, the first-input batch range, the size contexts (``run.size_contexts``), the selection note on a single
    op's share (replaced by the diversity of multi-op rows, ``task.realism``, measured on the rows by
    ``select.exotic_ops`` / ``select.op_sets``) and ``plots/op_count.png`` (``plots.op_count_figure``). Rows are not
    touched. Returns what was changed (a statement not found is left as it is and not listed).

    Raises:
        ReleaseError: the folder has no card or no readable rows.
    """
    import pandas as pd
    from opforge.data_cards.plots import op_count_figure
    from opforge.pipeline.hub_folder import COLUMNS, column_doc
    from opforge.pipeline.run import _shape_stats, _source_stats
    from opforge.pipeline.select import exotic_ops, op_sets
    from opforge.task.realism import op_set_name

    folder = Path(folder)
    card_path = folder / "README.md"
    if not card_path.is_file():
        raise ReleaseError(f"{card_path}: no such file (a release folder's card)")
    shards = sorted((folder / "data").glob("*.parquet"))
    if not shards:
        raise ReleaseError(f"{folder / 'data'}: no *.parquet rows")
    rows = pd.concat([_read_parquet(p) for p in shards], ignore_index=True)
    text = card_path.read_text(encoding="utf-8")
    changed: list[str] = []

    def sub(pattern: str, repl: str, what: str) -> None:
        nonlocal text
        new, n = re.subn(pattern, lambda _m: repl, text, count=1, flags=re.M)
        if n and new != text:
            text = new
            changed.append(what)

    doc = next(d for name, _, _, d in COLUMNS if name == "data_source")
    sub(r"^\| `data_source` \| string \| .*\|$", f"| `data_source` | string | {column_doc('data_source', doc, rows)} |",
        "data_source range")
    libs = _source_stats(rows)["libraries"]
    if libs:
        sub(r"forward pass of real models \([^)]*\)(?=, at the model's own)",
            f"forward pass of real models ({', '.join(libs)})", "motif libraries")
    shapes = _shape_stats(rows)
    sub(r"; the batch \(first dim of the first input\) is at most \d+\.\nFirst-input batch: median",
        f"; motifs keep their source model's sizes.\nFirst-input batch (first dim of the first input): "
        f"{shapes['batch_min']} to {shapes['batch_max']},\nmedian", "batch range")
    ctx = ", ".join(f"`{fam}` ({count})" for fam, count in shapes["contexts"])
    none = f"; {shapes['no_context']} tasks have fixed sizes (no size context)" if shapes["no_context"] else ""
    # the statement runs to the end of its paragraph (the list of contexts is on the lines after the first)
    sub(r"^Most common size contexts (?s:.*?)(?=\n\n|\Z)",
        "Most common size contexts (the model family of a row's `size_context`, else its motif's source model), "
        f"tasks each:\n{ctx}{none}.", "size contexts")
    exotic = Counter(o for x in exotic_ops(rows) for o in x)
    sets = Counter(op_sets(rows))
    top_op = max(exotic.items(), key=lambda kv: (kv[1], kv[0]), default=("none", 0))
    top_set = max(sets.items(), key=lambda kv: (kv[1], op_set_name(kv[0])))
    n = len(rows)
    sub(r"^- most frequent op outside the common ones: .*$",
        f"- diversity of multi-op rows, measured on these rows (`ops` labels; layout ops left out): most frequent "
        f"exotic op {top_op[0]} in {top_op[1] / n:.1%} of them, most frequent op set "
        f"{op_set_name(top_set[0])} in {top_set[1] / n:.1%}, {len(sets):,} distinct op sets", "selection note")
    card_path.write_text(text, encoding="utf-8")
    if (folder / "plots").is_dir():
        import matplotlib.pyplot as plt

        fig = op_count_figure(rows)
        fig.tight_layout()
        fig.savefig(folder / "plots" / "op_count.png", dpi=110)
        plt.close(fig)
        changed.append("plots/op_count.png")
    return changed


# ---------------------------------------------------------------------------------------------------------
# checks


def reference_hashes(ref: str | Path) -> tuple[str, dict[str, int]]:
    """(name, ``source_hash`` -> first row number) of a reference dataset: a folder with ``data/*.parquet``, a
    ``.parquet`` or ``.jsonl`` file with a ``code`` column, or ``packaged:kernelbench`` (every level of the
    packaged KernelBench copy).

    Raises:
        ReleaseError: the reference cannot be read (the message names it).
    """
    from opforge.task.identity import source_hash

    if str(ref).startswith("packaged:"):
        from opforge.filters.kernelbench import PACKAGED_SOURCE, ReferenceLoadError, load_problems

        try:
            codes = [p.code for p in load_problems(PACKAGED_SOURCE, levels=(1, 2, 3, 4))]
        except ReferenceLoadError as exc:
            raise ReleaseError(f"{ref}: {exc}") from None
        name = PACKAGED_SOURCE
    else:
        from opforge.pipeline.compare import CompareInputError, read_dataset

        path = Path(ref)
        if not path.exists():
            raise ReleaseError(f"{path}: no such file or folder (--exclude reference)")
        try:
            codes = [r["code"] for r in read_dataset(path)]
        except CompareInputError as exc:
            raise ReleaseError(f"{exc} (--exclude reference)") from None
        name = path.name if path.name != "hf" else f"{path.parent.name}/hf"
    hashes: dict[str, int] = {}
    for i, code in enumerate(codes):
        if isinstance(code, str):
            hashes.setdefault(source_hash(code), i)
    return name, hashes


def _local_roots(paths: Iterable[Path]) -> list[bytes]:
    """Absolute folders of this machine (resolved inputs, the working folder, home) long enough to be a
    distinctive needle."""
    roots = {str(p.resolve()) for p in paths} | {os.getcwd(), str(Path.home())}
    return sorted({r.encode() for r in roots if len(r) >= 6 and r.count("/") >= 2}, key=len, reverse=True)


def check_release(folder: str | Path, task_ids: Sequence[str], references: Iterable[str | Path] = DEFAULT_REFERENCES,
                  max_bytes: int = MAX_BYTES, local_roots: Iterable[str | Path] = ()) -> dict[str, Any]:
    """Check an assembled release folder:

    1. ``datasets.load_dataset(folder, split="train")`` loads it with the card's features and row count
       (``pipeline.hub_folder.validate_folder``), and its ``task_id`` set is ``task_ids``;
    2. every row's ``shape_variants`` parses (``task.sizes.parse_variants``);
    3. no row's normalised source (``task.identity.source_hash``) equals a row of a reference dataset
       (``reference_hashes``);
    4. no file names a folder of the building machine: ``local_roots`` (plus the working folder and home) in
       any file, ``ABSOLUTE_PATH`` in any file but the Parquet shards and in the rows' string cells;
    5. the files total at most ``max_bytes`` bytes.

    Returns:
        ``rows``, ``files``, ``bytes``, ``rows_per_variant_count`` (variants per row -> rows),
        ``references`` (name -> rows checked, all with 0 equal) and ``load_dataset: "ok"``.

    Raises:
        ReleaseError: the first check that fails; the message names the check, the file or row and, for an
            excluded row, its ``task_id`` and the reference row it equals.
    """
    import pyarrow.parquet as pq
    from opforge.pipeline.hub_folder import FolderError, validate_folder
    from opforge.task.identity import source_hash
    from opforge.task.sizes import VariantFormatError, parse_variants

    folder = Path(folder)
    try:
        v = validate_folder(folder)
    except FolderError as exc:
        raise ReleaseError(f"release folder does not load: {exc}") from None
    shards = sorted((folder / "data").glob("*.parquet"))
    rows = []
    for shard in shards:
        for r in pq.read_table(shard).to_pylist():
            rows.append((shard.name, r))
    got = [r.get("task_id") for _, r in rows]
    if set(got) != set(task_ids) or len(got) != len(task_ids):
        raise ReleaseError(f"{folder / 'data'}: {len(got)} rows whose task_ids are not the {len(task_ids)} "
                           f"selected ones (e.g. {sorted(set(got) ^ set(task_ids))[:3]})")
    per = Counter()
    for shard, r in rows:
        if "shape_variants" not in r:
            raise ReleaseError(f"{folder / 'data' / shard}: no shape_variants column (add it with `opforge variants`)")
        try:
            per[len(parse_variants(r["shape_variants"], f"{shard}: task {r.get('task_id')}: shape_variants"))] += 1
        except VariantFormatError as exc:
            raise ReleaseError(f"{folder / 'data'}/{exc}") from None
    ours: dict[str, str] = {}
    for _, r in rows:
        if isinstance(r.get("code"), str):
            ours.setdefault(source_hash(r["code"]), r.get("task_id"))
    refs = {}
    for ref in references:
        name, hashes = reference_hashes(ref)
        equal = [(ours[h], hashes[h]) for h in ours.keys() & hashes.keys()]
        if equal:
            shown = ", ".join(f"task {t} = {name} row {i}" for t, i in sorted(equal)[:5])
            raise ReleaseError(f"{folder / 'data'}: {len(equal)} row(s) equal a row of the excluded reference "
                               f"{ref} (normalised source): {shown}")
        refs[name] = len(hashes)
    needles = _local_roots(Path(p) for p in local_roots)
    size = 0
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        blob = path.read_bytes()
        size += len(blob)
        hit = next((n for n in needles if n in blob), None)
        if hit is None and path.suffix != ".parquet":
            m = ABSOLUTE_PATH.search(blob.decode("utf-8", errors="replace"))
            hit = m.group(0).encode() if m else None
        if hit is not None:
            raise ReleaseError(f"{path}: names a folder of the building machine "
                               f"({hit.decode(errors='replace')!r})")
    for shard, r in rows:
        for col, val in r.items():
            if isinstance(val, str) and (ABSOLUTE_PATH.search(val) or any(n.decode() in val for n in needles)):
                raise ReleaseError(f"{folder / 'data' / shard}: task {r.get('task_id')}: column {col} names a folder of the "
                                   "building machine")
    if size > max_bytes:
        raise ReleaseError(f"{folder}: {size:,} bytes, over the cap of {max_bytes:,}")
    return {"rows": v["rows"], "files": len(v["manifest"]), "bytes": size,
            "rows_per_variant_count": {str(k): per[k] for k in sorted(per)},
            "references": {k: {"rows": n, "equal": 0} for k, n in refs.items()}, "load_dataset": "ok"}


# ---------------------------------------------------------------------------------------------------------
# assembling


def _portable(obj: Any, roots: list[tuple[str, str]]) -> Any:
    """``obj`` with each local root in its strings replaced by its placeholder (longest root first)."""
    if isinstance(obj, dict):
        return {k: _portable(v, roots) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_portable(v, roots) for v in obj]
    if isinstance(obj, str):
        for root, name in roots:
            obj = obj.replace(root, name)
        return obj
    return obj


def _dump(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=True) + "\n"


def _replaceable(out: Path) -> None:
    """Refuse to replace ``out`` unless it is missing, empty, or an earlier release folder."""
    if not out.exists():
        return
    if not out.is_dir():
        raise ReleaseError(f"{out}: exists and is not a folder")
    if not any(out.iterdir()):
        return
    prov = out / "opforge_run.json"
    try:
        earlier = json.loads(prov.read_text(encoding="utf-8")) if prov.is_file() else None
    except (json.JSONDecodeError, UnicodeDecodeError):
        earlier = None
    if not (isinstance(earlier, dict) and "release" in earlier):
        raise ReleaseError(f"{out}: a non-empty folder that is not an earlier release (no opforge_run.json with a "
                           "release block); give a new or empty --out")


def assemble_release(run_dir: str | Path, hf_dir: str | Path | None, out: str | Path, *,
                     compare: str | Path | None = None, recheck: str | Path | None = None,
                     realism: str | Path | None = None, version: str | None = None,
                     changelog: str | Path | None = None,
                     references: Iterable[str | Path] = DEFAULT_REFERENCES,
                     max_bytes: int = MAX_BYTES) -> dict[str, Any]:
    """Assemble the release folder ``out`` from the run directory ``run_dir`` and its published folder
    ``hf_dir`` (None: ``run_dir/hf``); see the module docstring for the inputs and the files written.

    Args:
        compare: an ``opforge compare`` result (``compare.json``) whose dataset A is ``hf_dir``'s rows.
        recheck: an ``opforge recheck`` report (``recheck.json``) of (some of) the released rows.
        realism: a realism report (``{"figures", "targets"}``); without one, the compare result's realism
            figures of dataset A are stated when a compare result is given.
        version: the release's version string (card and provenance); changelog: a Markdown file whose text
            the card's ``Release`` section holds.
        references: datasets no released row may equal (normalised source): paths of folders, Parquet or
            JSONL files with a ``code`` column, or ``packaged:kernelbench``.
        max_bytes: the cap on the folder's total size, bytes.

    Returns:
        ``{"out": path, "rows", "funnel": whole_run_funnel(...), "checks": check_release(...),
        "release": the release block written to opforge_run.json}``.

    Raises:
        ReleaseError: a missing or malformed input (the message names the file), inputs that disagree, ``out``
            an existing folder that is not an earlier release, or a failed check. Nothing under ``out``
            changes then.
    """
    import pyarrow.parquet as pq
    from opforge.pipeline.hub_folder import FolderError

    run_dir, out = Path(run_dir), Path(out)
    hf = Path(hf_dir) if hf_dir is not None else run_dir / "hf"
    if not run_dir.is_dir():
        raise ReleaseError(f"{run_dir}: no such folder (the run directory)")
    if not (run_dir / "run.json").is_file():
        raise ReleaseError(f"{run_dir}: not a finished `opforge run` directory (no run.json)")
    if not (hf / "README.md").is_file() or not list((hf / "data").glob("*.parquet")):
        raise ReleaseError(f"{hf}: not a dataset folder (needs README.md and data/*.parquet)")
    out_r, hf_r, run_r = out.resolve(), hf.resolve(), run_dir.resolve()
    if out_r == hf_r or out_r.is_relative_to(hf_r) or hf_r.is_relative_to(out_r) or run_r.is_relative_to(out_r):
        raise ReleaseError(f"{out}: the release folder must be apart from the run directory and {hf}")
    _replaceable(out)

    funnel = whole_run_funnel(run_dir)
    run = _read_json(run_dir / "run.json", "the run's record")
    prov = _need_keys(_read_json(hf / "opforge_run.json", "the published folder's provenance"), ("config",),
                      hf / "opforge_run.json", "an `opforge run` provenance")
    spath = run_dir / "selection.json"
    selection = _read_json(spath, "the run's selection") if spath.is_file() else prov.get("selection") or {}
    task_ids = selection.get("task_ids") if isinstance(selection, dict) else None
    if not isinstance(task_ids, list):
        raise ReleaseError(f"{spath}: no task_ids list (the selected tasks)")
    if run.get("selected") is not None and run["selected"] != len(task_ids):
        raise ReleaseError(f"{run_dir / 'run.json'} and {spath} disagree: {run['selected']} selected, "
                           f"{len(task_ids)} task_ids")
    variants_path = hf / "opforge_variants.json"
    variants = _read_json(variants_path, "the `opforge variants` report") if variants_path.is_file() else None
    rc = re_sum = None
    if recheck is not None:
        rc = _read_json(Path(recheck), "the `opforge recheck` report")
        re_sum = recheck_summary(rc, set(task_ids), Path(recheck))
    cmp_doc = cmp_sum = None
    if compare is not None:
        cmp_doc = _read_json(Path(compare), "the `opforge compare` result")
        cmp_sum = compare_summary(cmp_doc, hf, Path(compare))
    real_doc = real_sum = None
    real_source = ""
    if realism is not None:
        real_doc = _read_json(Path(realism), "the realism report")
        real_sum = realism_summary(real_doc, realism)
        real_source = f"report `{Path(realism).name}`, shipped as `realism.json`"
    elif cmp_doc is not None:
        sample = (cmp_doc["datasets"].get("a") or {}).get("sample") or {}
        if sample.get("realism") and sample.get("realism_targets"):
            real_sum = {"figures": {k: v for k, v in sample["realism"].items() if not isinstance(v, (dict, list))},
                        "targets": sample["realism_targets"]}
            real_source = "the figures of the `opforge compare` result above"
    notes = None
    if changelog is not None:
        cpath = Path(changelog)
        if not cpath.is_file():
            raise ReleaseError(f"{cpath}: no such file (--changelog)")
        try:
            notes = cpath.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise ReleaseError(f"{cpath}: not UTF-8 text ({exc})") from None

    steps = []
    if re_sum is not None:
        steps.append(f"`opforge recheck` re-verdicted {re_sum['rows']:,} rows (Re-check below).")
    if variants is not None:
        steps.append(f"`opforge variants` computed the hidden shape variants ({variants.get('with_count')} of "
                     f"{variants.get('tasks')} tasks with {variants.get('count')}).")
    if cmp_sum is not None:
        steps.append(f"`opforge compare` measured the rows side by side with {cmp_sum['names'][1]}.")
    steps.append("`opforge release` counted the funnel over the whole run, wrote this card and checked the folder "
                 "(it loads with `datasets`, every `shape_variants` parses, no row equals a row of "
                 + ", ".join(f"`{Path(str(r)).name if not str(r).startswith('packaged:') else r}`"
                             for r in references) + ", no file names a local folder).")

    shards = sorted((hf / "data").glob("*.parquet"))
    try:
        num_bytes = sum(pq.read_table(p).nbytes for p in shards)
    except Exception as exc:  # noqa: BLE001 - an unreadable shard is that file's problem
        raise ReleaseError(f"{hf / 'data'}: unreadable Parquet ({type(exc).__name__}: {exc})") from None
    card = release_card((hf / "README.md").read_text(encoding="utf-8"), hf / "README.md", funnel, run,
                        prov["config"], num_bytes, steps, version=version, changelog=notes, recheck=re_sum,
                        realism=real_sum, realism_source=real_source, compare=cmp_sum)
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        opforge_version = dist_version("opforge")
    except PackageNotFoundError:
        opforge_version = None
    roots = sorted({(str(run_r), "RUN_DIR"), (str(hf_r), "HF_DIR"), (os.getcwd(), "."), (str(Path.home()), "~")},
                   key=lambda kv: -len(kv[0]))
    roots = [(r, n) for r, n in roots if len(r) > 1]
    release = {
        "version": version, "changelog": notes, "assembled_by": {"command": "opforge release",
                                                                 "opforge": opforge_version},
        "run": {k: run.get(k) for k in ("candidates", "accepted", "selected", "rounds", "stop_reason", "yield",
                                        "not_filtered_full_signature", "seconds")},
        "timeline": (run.get("timeline") or {}).get("stages"),
        "last_invocation_only": "run.seconds, timeline and funnel.wall_s / tasks_per_min / ran_this_time describe "
                                "the last `opforge run` invocation; funnel_whole_run counts every verdict",
        "funnel_whole_run": funnel, "recheck": re_sum, "realism": real_sum, "comparison":
            None if cmp_sum is None else {k: v for k, v in cmp_sum.items() if k != "table"},
        "shape_variants": None if variants is None else {k: v for k, v in variants.items() if k != "output"},
        "excluded_references": [str(r) if str(r).startswith("packaged:") else Path(r).name for r in references],
    }
    prov = {**prov, "release": release}

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        (tmp / "data").mkdir()
        for p in shards:
            shutil.copyfile(p, tmp / "data" / p.name)
        if (hf / "plots").is_dir():
            shutil.copytree(hf / "plots", tmp / "plots", copy_function=shutil.copyfile)
        (tmp / "README.md").write_text(card, encoding="utf-8")
        (tmp / "opforge_run.json").write_text(_dump(_portable(prov, roots)))
        if variants is not None:
            (tmp / "opforge_variants.json").write_text(_dump({**variants, "output": "."}))
        if rc is not None:
            rc_out = {**rc, "source": Path(str(rc.get("source", ""))).name} if "source" in rc else rc
            (tmp / "recheck.json").write_text(_dump(_portable(rc_out, roots)))
        if real_doc is not None:
            (tmp / "realism.json").write_text(_dump(_portable(real_doc, roots)))
        try:
            checks = check_release(tmp, task_ids, references, max_bytes, [run_dir, hf, out.parent])
        except (ReleaseError, FolderError) as exc:  # name the folder the user asked for, not the temporary one
            raise ReleaseError(f"{str(exc).replace(str(tmp), str(out))}; nothing was written to {out}") from None
        old = None
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            out.rename(old)
        tmp.rename(out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return {"out": out, "rows": checks["rows"], "funnel": funnel, "checks": checks, "release": release}
