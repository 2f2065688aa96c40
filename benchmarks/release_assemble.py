"""Assemble the opforge-Ops-6K release: the folder ``releases/opforge-ops-6k`` and the benchmark record
``results/h200/release6k.json``, from the finished run directory and the steps run on it afterwards.

Usage (from the repository root, after the release run finished; ``benchmarks/device/RELEASE.md``)::

    opforge variants runs/release6k/hf --out runs/release6k/hf_variants --workers 2
    opforge compare runs/release6k/hf_variants CUDA_AGENT_OPS_6K.parquet --out runs/release6k  # compare.json
    python benchmarks/release_assemble.py --run runs/release6k --hf runs/release6k/hf_variants \\
        --compare runs/release6k/compare.json --out releases/opforge-ops-6k

Inputs: ``--run`` is the run directory (``run.json``, ``selection.json``, ``candidates/round-*.parquet``,
``filter/ledger.jsonl``, ``filter/verdicts.parquet``, ``recheck/recheck.json``, ``realism_published.json`` /
``.txt``); ``--hf`` the published folder with the ``shape_variants`` column (``opforge variants``); ``--compare``
the ``opforge compare`` result on those rows. ``RUN_FACTS`` holds what only the device calls' logs know
(machines, wall times, throughput).

The whole-run funnel is counted here, not read from ``filter/funnel.json`` or ``run.json``, whose wall time,
tasks per minute and ``seconds`` cover only the last device call: every candidate has one verdict in
``filter/verdicts.parquet`` (corpus-level ``duplicate`` verdicts included), every other one a record in
``filter/ledger.jsonl``; both must agree (``ReleaseError`` otherwise).

Writes ``--out`` (replaced): ``data/*.parquet`` and ``plots/*.png`` copied byte for byte from ``--hf``,
``README.md`` (the run's card with the load and funnel sections rewritten and sections on the build, the
re-check, realism and Ops-6K added), ``opforge_run.json`` (the run's provenance plus a ``release`` block),
``opforge_variants.json``, ``recheck.json``, ``realism.json`` and ``realism.txt``; then the record through
``record.write``. Before the record is written the folder is checked: ``datasets.load_dataset`` of it gives the
selected rows (``pipeline.hub_folder.validate_folder``), every ``shape_variants`` parses, no row's normalised
source (``task.identity.source_hash``) equals a row of the reference datasets (``--ops6k``, ``--kernelbench``),
no file names a folder of this machine, and the folder holds at most ``MAX_BYTES``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # sibling benchmark modules

import record  # noqa: E402 - benchmarks/record.py, beside this script

MAX_BYTES = 50_000_000
NAME = "release6k"
BUILD_TAG = "release6k-build"
BUILD_COMMIT = "ac278e91091f5ce94808aad89a317dc8866417b7"
FILTER_FINGERPRINT = "86e217a1560232b4"
# What the device calls' logs (release.log, recheck.log of each call) and the run's records say about the
# machines; numbers no file of the run directory holds.
RUN_FACTS: dict[str, Any] = {
    "command": "opforge run --config benchmarks/device/release6k.yaml",
    "config": {"target": 6000, "seed": 2026, "device_profile": "h200", "round_size": 2000,
               "max_per_signature": 5, "runtime_window_ms": [1.0, 100.0], "timeout_s": 60},
    "carried_by": "benchmarks/device/release_run.sh (device calls of at most 10 minutes; the run resumes "
                  "from its ledger)",
    "filter_code": {"tag": BUILD_TAG, "commit": BUILD_COMMIT, "fingerprint": FILTER_FINGERPRINT,
                    "rule": "every verdict of the run; the ledger resumes only under this filter fingerprint"},
    "date": "2026-11-23",
    "machines": [
        {"device_kind": "nvidia-h200", "gpus": "1 x NVIDIA H200 (143771 MiB, driver 580.159.04)", "cores": 16,
         "ledger_verdicts": 3232, "throughput_tasks_per_min": "about 350"},
        {"device_kind": "nvidia-h200-x2", "gpus": "2 x NVIDIA H200 (143771 MiB, driver 580.159.04)",
         "cores": 32, "layout": "one Dask worker per GPU, 16 sandboxes each", "ledger_verdicts": 8019,
         "throughput_tasks_per_min": "about 850-900 (1,885 tasks in 134 s and 1,857 in 122 s, call 1)"},
    ],
    "device_calls_on_two_gpus": [
        {"call": 1, "wall_s": 541, "did": "rounds 1-4 finished"},
        {"call": 2, "wall_s": 273, "did": "round 5 (filter 252.9 s), then select and publish (1.8 s); "
                                          "re-check of 1,000 published rows and realism figures after it"},
    ],
    "torch": "2.11.0+cu130", "transformers": "5.17.0", "triton": "3.6.0", "python": "3.12.3",
}
# How the shape variants of the release were computed (the command's own report has no timing).
VARIANTS_RUN = {"command": "opforge variants runs/release6k/hf --out runs/release6k/hf_variants --workers 2",
                "commit": "c1fcb44a86aecbaa081670aaf04e1234e454579c", "machine": "cpu-2core (meta device)",
                "wall_s": "about 540 (511 s generating variants)"}
ABSOLUTE_PATH = re.compile(rb"(/work/|/home/|/root/|/tmp/|/Users/|[A-Z]:\\\\)")


class ReleaseError(ValueError):
    """The run directory or the assembled folder fails a check; the message names the file and the check."""


# ---------------------------------------------------------------------------------------------------------
# facts of the run directory


def whole_run_funnel(run: Path) -> dict[str, Any]:
    """Counts over every candidate of the run: ``candidates`` (rows of ``candidates/round-*.parquet``),
    ``ledger_records`` (lines of ``filter/ledger.jsonl``), ``duplicate_verdicts`` (corpus-level ``duplicate``
    rows of ``filter/verdicts.parquet``, which have no ledger record), ``accepted``, ``by_reason`` (reason
    prefix -> tasks) and ``by_reason_detail`` (full reason -> tasks), ``yield`` (accepted / candidates), and
    per filter the sandbox runs, rejections and sandbox seconds summed over the ledger.

    Raises:
        ReleaseError: a ledger record under another fingerprint, a cut line, or ledger, verdicts and
            candidates that disagree (counts or per-task verdicts).
    """
    import pandas as pd

    rounds = sorted((run / "candidates").glob("round-*.parquet"))
    candidates = sum(len(pd.read_parquet(p, columns=["task_id"])) for p in rounds)
    ledger: dict[str, dict[str, Any]] = {}
    with open(run / "filter" / "ledger.jsonl", encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                raise ReleaseError(f"{run}/filter/ledger.jsonl:{n}: not a JSON line") from None
            if rec.get("fingerprint") != FILTER_FINGERPRINT:
                raise ReleaseError(f"{run}/filter/ledger.jsonl:{n}: fingerprint {rec.get('fingerprint')!r}, "
                                   f"the release's is {FILTER_FINGERPRINT}")
            ledger[rec["task_id"]] = rec
    verdicts = pd.read_parquet(run / "filter" / "verdicts.parquet", columns=["task_id", "accepted", "reason"])
    dup = verdicts[verdicts["reason"].fillna("").str.startswith("duplicate")]
    live = verdicts[~verdicts.index.isin(dup.index)]
    if len(verdicts) != candidates or len(dup) + len(ledger) != candidates:
        raise ReleaseError(f"{run}: {candidates} candidates, {len(verdicts)} verdict rows, {len(ledger)} ledger "
                           f"records + {len(dup)} duplicate verdicts")
    for task_id, accepted, reason in live.itertuples(index=False):
        rec = ledger.get(task_id)
        reason = None if pd.isna(reason) else reason
        if rec is None or rec["accepted"] != bool(accepted) or rec["reason"] != reason:
            raise ReleaseError(f"{run}: verdict of {task_id} in verdicts.parquet differs from the ledger's")
    reasons = Counter(r["reason"] for r in ledger.values() if not r["accepted"]) + Counter(dup["reason"])
    by_filter: dict[str, dict[str, float]] = {}
    for rec in ledger.values():
        for name, sec in (rec.get("seconds") or {}).items():
            d = by_filter.setdefault(name, {"ran": 0, "rejected": 0, "sandbox_s": 0.0})
            d["ran"] += 1
            d["sandbox_s"] += sec
        if not rec["accepted"] and rec.get("filter") in by_filter:
            by_filter[rec["filter"]]["rejected"] += 1
    accepted = sum(1 for r in ledger.values() if r["accepted"])
    return {
        "candidates": candidates, "rounds": len(rounds), "ledger_records": len(ledger),
        "duplicate_verdicts": len(dup), "accepted": accepted, "rejected": candidates - accepted,
        "yield": round(accepted / candidates, 4),
        "by_reason": dict(Counter(r.split(":")[0] for r in reasons.elements()).most_common()),
        "by_reason_detail": dict(reasons.most_common()),
        "by_filter": {k: {**v, "sandbox_s": round(v["sandbox_s"], 1)}
                      for k, v in sorted(by_filter.items(), key=lambda kv: -kv[1]["sandbox_s"])},
        "fingerprint": FILTER_FINGERPRINT,
    }


def recheck_summary(recheck: dict[str, Any]) -> dict[str, Any]:
    """The figures of ``opforge recheck``'s report the card and the record state."""
    return {"rows": recheck["rows"], "all_rules_pass": recheck["all_rules_pass"],
            "all_rules_pass_rate": recheck["all_rules_pass_rate"], "device": recheck["device"],
            "rules": {k: {"pass": v["pass"], "fail": v["fail"], "pass_rate": v["pass_rate"]}
                      for k, v in recheck["rules"].items()},
            "failures": recheck["failures"], "eager_ratio": recheck["eager_ratio"],
            "sample": "1,000 of the 6,000 published rows, pandas DataFrame.sample(random_state=2026)",
            "code": "main at c1fcb44 (opforge recheck RECHECK_SAMPLE OUT --device cuda)",
            "machine": "nvidia-h200-x2 (NVIDIA H200)"}


# ---------------------------------------------------------------------------------------------------------
# the card


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def _sections(body: str) -> list[list[str]]:
    """``[[title, text], ...]`` of a card body split at its ``## `` headings (title "" for the preamble)."""
    parts = re.split(r"(?m)^## ", body)
    out = [["", parts[0]]]
    for p in parts[1:]:
        title, _, text = p.partition("\n")
        out.append([title.strip(), text])
    return out


def _join(sections: list[list[str]]) -> str:
    return sections[0][1].rstrip() + "\n\n" + "".join(f"## {t}\n\n{x.strip()}\n\n" for t, x in sections[1:])


def load_section(folder_name: str) -> str:
    return f"""
From a clone of the opforge repository, where this folder is `releases/{folder_name}`:

```python
import json
from datasets import load_dataset

ds = load_dataset("releases/{folder_name}", split="train")   # path relative to the clone's root
row = ds[0]
ops = json.loads(row["ops"])          # e.g. ["nn.Conv2d", "F.gelu"]
namespace = {{}}
exec(row["code"], namespace)           # defines Model, get_inputs, get_init_inputs
model = namespace["Model"](*namespace["get_init_inputs"]())
out = model(*namespace["get_inputs"]())
variants = json.loads(row["shape_variants"])   # hidden extra shapes the grader also checks
```

The folder is a complete Hugging Face dataset folder (card, `data/*.parquet`): uploaded as is to a dataset
repository it loads by the repository's id. The opforge harness reads it directly:
`opforge.harness.load_tasks("releases/{folder_name}")`.
"""


def funnel_section(f: dict[str, Any], selected: int) -> str:
    rows = ["| reason | tasks | share of candidates | detail |", "|---|---:|---:|---|",
            f"| accepted | {f['accepted']:,} | {_pct(f['accepted'] / f['candidates'])} | |"]
    for reason, n in f["by_reason"].items():
        detail = ", ".join(f"`{k.split(':', 1)[1]}` {v:,}" for k, v in f["by_reason_detail"].items()
                           if k.split(":")[0] == reason and ":" in k)
        rows.append(f"| `{reason}` | {n:,} | {_pct(n / f['candidates'])} | {detail} |")
    return f"""
Over the whole run: {f['candidates']:,} candidates composed in {f['rounds']} rounds of 2,000; every one has a
verdict. {f['duplicate_verdicts']:,} were rejected as duplicates of an earlier candidate over the whole corpus
(no execution); the other {f['ledger_records']:,} ran the sandboxed chain, one ledger record each, all under
the filter fingerprint `{f['fingerprint']}` (opforge tag `{BUILD_TAG}`). {f['accepted']:,} passed every filter
({_pct(f['yield'])} yield); {selected:,} were selected (op-count mix below, at most 5 tasks per (op set,
dtype) signature); the target of {selected:,} was reached after {f['candidates']:,} candidates.

{chr(10).join(rows)}

Filters, in order: duplicate, static, contamination, eager, runtime_screen, determinism, degenerate, trivial,
compile, runtime. Reason codes are those of opforge's DESIGN.md §3; tolerance for every comparison:
atol = rtol = 1e-2 (float32, float16), 2e-2 (bfloat16). Runtime window (eager median): 1.0–100.0 ms.
"""


def build_section(f: dict[str, Any]) -> str:
    m1, m2 = RUN_FACTS["machines"]
    c1, c2 = RUN_FACTS["device_calls_on_two_gpus"]
    return f"""
One run, `{RUN_FACTS['command']}` (target 6,000, seed 2026, composer device profile `h200`, rounds of 2,000
candidates, at most 5 tasks per (op set, dtype) signature), carried across device calls of at most 10 minutes;
it resumes from its ledger, which it continues only under the same filter fingerprint, so every verdict was
given by the same filter code: opforge tag `{BUILD_TAG}` (commit `{BUILD_COMMIT[:7]}`), torch
{RUN_FACTS['torch']}, transformers {RUN_FACTS['transformers']}, Python {RUN_FACTS['python']}.

| machine | verdicts (ledger) | throughput |
|---|---:|---|
| 1 x NVIDIA H200, 16 cores | {m1['ledger_verdicts']:,} | about 350 tasks/min |
| 2 x NVIDIA H200, 32 cores; one Dask worker per GPU, 16 sandboxes each | {m2['ledger_verdicts']:,} | about 850–900 tasks/min (1,885 tasks in 134 s) |

On the two-GPU machine the run finished in two calls: {c1['wall_s']} s (rounds 1–4) and {c2['wall_s']} s
(round 5: filter 252.9 s, then selection and publication 1.8 s). Sandbox time summed over the whole run:
{', '.join(f"{k} {v['sandbox_s']:,.0f} s" for k, v in f['by_filter'].items())}.

Afterwards, on the published rows: a re-check of 1,000 of them on the GPU (below), the realism figures, the
hidden shape variants (`opforge variants`, on the `meta` device, CPU only) and the comparison with
CUDA-Agent-Ops-6K. How to reproduce: `benchmarks/device/RELEASE.md` in the opforge repository.
"""


def recheck_section(r: dict[str, Any]) -> str:
    rows = ["| rule | pass | fail | pass rate |", "|---|---:|---:|---:|"]
    rows += [f"| {k} | {v['pass']:,} | {v['fail']} | {_pct(v['pass_rate'])} |" for k, v in r["rules"].items()]
    fails = "; ".join(f"`{x['task_id']}` ({x['rule']}: `{x['reason']}`)" for x in r["failures"]) or "none"
    e = r["eager_ratio"]
    return f"""
{r['rows']:,} rows drawn at random (seed 2026) from the {6000:,} were verdicted again by `opforge recheck` in a
fresh process on an NVIDIA H200 (the device they were published on), with the filter code of a later opforge
(`c1fcb44`): {r['all_rules_pass']:,} of {r['rows']:,} pass every rule ({_pct(r['all_rules_pass_rate'])}).

{chr(10).join(rows)}

Failing rows: {fails}. Measured / published eager time: p10 {e['p10']:.2f}, p50 {e['p50']:.2f},
p90 {e['p90']:.2f} (n = {e['n']:,}). The report is `recheck.json` in this folder.
"""


def realism_section(realism: dict[str, Any]) -> str:
    rows = ["| figure | value | target | |", "|---|---:|---|---|"]
    for k, t in realism["targets"].items():
        v = t["value"]
        shown = _pct(v) if "share" in k else (f"{v / 1e6:,.1f} MB" if k.startswith("input_bytes") else f"{v:,.0f}")
        rows.append(f"| {k} | {shown} | {t['target']} | {'met' if t['pass'] else '**not met**'} |")
    fig = realism["figures"]
    missed = [k for k, t in realism["targets"].items() if not t["pass"]]
    note = ("Every target is met." if not missed else
            "Every target is met except " + ", ".join(f"`{k}`" for k in missed)
            + f" (`{fig['top_other_op']}` is in {_pct(fig['top_other_op_share'])} of the tasks).")
    return f"""
Measured on the `meta` device over all {fig['rows']:,} rows (`opforge.task.realism`; targets of opforge issue #20
for realistic tasks). {note} `realism.json` / `realism.txt` in this folder hold every figure.

{chr(10).join(rows)}
"""


def compare_section(cmp: dict[str, Any]) -> str:
    """The card's side-by-side table: the headline rows of ``opforge compare``'s table (rows where both
    datasets show 0.0 % left out; "(sample)" dropped when the sample is every row)."""
    keep = ("rows", "distinct op labels", "distinct op-label signatures", "largest number of rows sharing",
            "distinct transformers modules", "label fidelity", "exact duplicates within", "near duplicates within",
            "rows exactly duplicating", "rows nearly duplicating", "KernelBench signature hits", "dtype ",
            "realism: batch_p50", "realism: low_precision_share", "realism: input_bytes_p95")
    s = cmp["settings"]
    every = s["limit"] is None
    rows = ["| measure | opforge-Ops-6K | CUDA-Agent-Ops-6K |", "|---|---|---|"]
    for m, a, b in cmp["table"]:
        if not m.startswith(keep) or (a == b == "0.0 %") or (every and m.startswith("rows measured")):
            continue
        rows.append(f"| {m.replace(' (sample)', '') if every else m} | {a} | {b} |")
    sample = ("all rows" if every else f"a random sample of {s['limit']:,} rows per dataset (seed {s['seed']})")
    ours = cmp["datasets"].get("a") or cmp["datasets"]["ours"]  # "ours": results of the former script
    sig = " + ".join(f"`{x}`" for x in ours["labels"]["most_common_signature"] or [])
    return f"""
The same measures for both datasets, computed by opforge's own functions (`opforge compare`):
labels, duplicates and dtype over all rows, the traced measures (label fidelity, KernelBench signature hits,
realism) over {sample}, traced on the `meta` device.

{chr(10).join(rows)}

A signature here is a row's sorted set of op labels; selection's cap of 5 applies per (list of seed ops,
dtype) within each op count, so one label set may hold more rows: the largest, {sig}, spans several op counts
and dtypes.
"""


def rewrite_card(text: str, folder_name: str, funnel: dict[str, Any], selected: int, recheck: dict[str, Any],
                 realism: dict[str, Any], cmp: dict[str, Any] | None, num_bytes: int, few_variants: str) -> str:
    """The release card from the run's card (with ``opforge variants``'s section): front matter's byte count
    updated, load and funnel sections rewritten, build / re-check / realism / Ops-6K sections added after the
    funnel, the column table completed from ``pipeline.hub_folder.COLUMNS``, the shape-variant section (with
    ``few_variants`` appended) moved before the environment, environment and limitations extended.

    Raises:
        ReleaseError: the card lacks a section this rewrites.
    """
    import yaml
    from opforge.pipeline.hub_folder import COLUMNS

    _, fm, body = text.split("---", 2)
    meta = yaml.safe_load(fm)
    meta["dataset_info"]["splits"][0]["num_bytes"] = num_bytes
    run_only = "Every number on this card was measured by the run that\nbuilt the dataset (run seed 2026)."
    if run_only not in body:
        raise ReleaseError(f"card: its opening no longer says {run_only!r}")
    body = body.replace(run_only, run_only[:-1] + " or, where a section says so, on its published rows afterwards.")
    sections = _sections(body)
    titles = [t for t, _ in sections]
    for need in ("How to load", "Columns", "Filter funnel", "Hidden shape variants", "Environment", "Limitations"):
        if need not in titles:
            raise ReleaseError(f"card: no '## {need}' section (sections: {titles})")
    added = ("How this release was built", "Re-check", "Realism", "Side by side with CUDA-Agent-Ops-6K")
    variants = next(x for t, x in sections if t == "Hidden shape variants")
    sections = [[t, x] for t, x in sections if t not in (*added, "Hidden shape variants")]
    out = []
    for title, sec in sections:
        if title == "How to load":
            sec = load_section(folder_name)
        elif title == "Columns":
            sec = sec.rstrip() + "\n" + "".join(f"| `{n}` | {d} | {doc} |\n" for n, _, d, doc in COLUMNS
                                                 if f"| `{n}` |" not in sec)
        elif title == "Filter funnel":
            sec = funnel_section(funnel, selected)
        elif title == "Environment":
            out.append(["Hidden shape variants", "\n\n".join(x for x in (variants.strip(), few_variants, GRADER_NOTE)
                                                               if x)])
            sec = sec.rstrip() + "\n" + (
                f"| filter code | opforge tag `{BUILD_TAG}` (commit `{BUILD_COMMIT[:7]}`), filter fingerprint "
                f"`{FILTER_FINGERPRINT}` |\n"
                "| machines | 1 x NVIDIA H200 (16 cores), then 2 x NVIDIA H200 (32 cores) |\n")
        elif title == "Limitations":
            sec = sec.rstrip() + "\n" + (
                "- The re-check re-verdicted a random 1,000 of the 6,000 rows, not all of them; one of those "
                "(`runtime_window`) fell below the window's 1 ms floor on re-measurement.\n"
                "- Hidden shape variants were validated on the `meta` device (shapes and a cost model), not run "
                "on a GPU.\n")
        out.append([title, sec])
        if title == "Filter funnel":
            out.append(["How this release was built", build_section(funnel)])
            out.append(["Re-check", recheck_section(recheck)])
            out.append(["Realism", realism_section(realism)])
            if cmp is not None:
                out.append(["Side by side with CUDA-Agent-Ops-6K", compare_section(cmp)])
    return "---\n" + yaml.safe_dump(meta, sort_keys=False) + "---" + "\n" + _join(out).lstrip("\n").rstrip() + "\n"


def few_variants_note(shard_paths: list[Path], count: int) -> str:
    """A sentence on the rows with fewer than ``count`` variants: how many, their public batches, and why they
    got fewer (what ``compose.variants.shape_variants`` rejected for the release's 50 such rows); "" when none."""
    import pandas as pd

    rows = pd.concat([pd.read_parquet(p, columns=["shape_variants", "input_shapes"]) for p in shard_paths])
    few = rows[rows["shape_variants"].map(lambda s: len(json.loads(s)) < count)]
    if few.empty:
        return ""
    batches = Counter(json.loads(s)[0][0] if json.loads(s) and json.loads(s)[0] else None
                      for s in few["input_shapes"])
    per = Counter(len(json.loads(s)) for s in few["shape_variants"])
    parts = ", ".join(f"{per[k]:,} with {k}" for k in sorted(per))
    shown = ", ".join(f"{b} ({n})" for b, n in sorted(batches.items(), key=lambda kv: str(kv[0])))
    return (f"The {len(few):,} tasks with fewer ({parts}) all have a public batch of at most "
            f"{max(b for b in batches if b is not None)} (first input's first dim: {shown}), so at most one smaller "
            "batch exists; the larger batches tried exceed the 0.9 GB input cap or twice the public time, and the "
            "other sizes tried do not run with the task's model (e.g. a sequence length that a layer's channel "
            "count fixes).")


GRADER_NOTE = (
    "How the grader uses them (`opforge.harness.evaluate`, `EvalConfig(shape_variants=True)`, the default): the "
    "reference server draws each variant's inputs from the task source with the variant's sizes and runs the "
    "task's `Model` on them; the candidate's `ModelNew` gets the same call on those inputs in `variant_trials` (2) "
    "verify rounds per variant, shuffled in secret order among the final re-verify rounds and never timed. A "
    "wrong answer on any variant makes the evaluation `incorrect` (reward -1); a variant the reference cannot run "
    "is dropped with a flag. Agent workspaces (`opforge harness init`) and the environment's tools see only the "
    "public shape; a row without variants is graded on its public shape only.")


# ---------------------------------------------------------------------------------------------------------
# the folder


def _portable(obj: Any, run: Path) -> Any:
    """``obj`` with the run directory written ``RUN_DIR`` in its strings (nothing else changes)."""
    if isinstance(obj, dict):
        return {k: _portable(v, run) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_portable(v, run) for v in obj]
    if isinstance(obj, str):
        return obj.replace(str(run.resolve()), "RUN_DIR")
    return obj


def assemble(run: Path, hf: Path, out: Path, cmp: dict[str, Any] | None) -> dict[str, Any]:
    """Write the release folder ``out`` (module docstring) and return what the record states about it."""
    import pyarrow.parquet as pq

    funnel = whole_run_funnel(run)
    run_json = json.loads((run / "run.json").read_text())
    selection = json.loads((run / "selection.json").read_text())
    if run_json["candidates"] != funnel["candidates"] or run_json["accepted"] != funnel["accepted"]:
        raise ReleaseError(f"{run}/run.json: {run_json['candidates']} candidates / {run_json['accepted']} accepted, "
                           f"the ledger {funnel['candidates']} / {funnel['accepted']}")
    recheck = json.loads((run / "recheck" / "recheck.json").read_text())
    realism = json.loads((run / "realism_published.json").read_text())
    variants = json.loads((hf / "opforge_variants.json").read_text())
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "data").mkdir(parents=True)
    shards = sorted((hf / "data").glob("*.parquet"))
    for p in shards:
        shutil.copyfile(p, tmp / "data" / p.name)
    shutil.copytree(hf / "plots", tmp / "plots")
    num_bytes = sum(pq.read_table(p).nbytes for p in shards)
    card = rewrite_card((hf / "README.md").read_text(encoding="utf-8"), out.name, funnel,
                        run_json["selected"], recheck_summary(recheck), realism, cmp, num_bytes,
                        few_variants_note(shards, variants["count"]))
    (tmp / "README.md").write_text(card, encoding="utf-8")
    prov = json.loads((hf / "opforge_run.json").read_text())
    prov["release"] = {
        **RUN_FACTS, "funnel_whole_run": funnel,
        "last_call_only": "funnel.wall_s, funnel.tasks_per_min, funnel.ran_this_time, funnel.resumed_from_ledger "
                          "and the duplicate filter's seconds describe only the last device call (round 5)",
        "shape_variants": {k: v for k, v in variants.items() if k != "output"},
    }
    (tmp / "opforge_run.json").write_text(json.dumps(_portable(prov, run), indent=2, sort_keys=True) + "\n")
    (tmp / "opforge_variants.json").write_text(
        json.dumps({**variants, "output": "."}, indent=2, sort_keys=True) + "\n")
    (tmp / "recheck.json").write_text(json.dumps(_portable(recheck, run), indent=2, sort_keys=True) + "\n")
    (tmp / "realism.json").write_text(json.dumps(_portable(realism, run), indent=1) + "\n")
    text = (run / "realism_published.txt").read_text()
    table = text[text.index("figure "):] if "figure " in text else text  # without the progress bar
    (tmp / "realism.txt").write_text(table)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    checks = check_folder(out, selection["task_ids"] if "task_ids" in selection else prov["selection"]["task_ids"])
    return {"funnel": funnel, "run": run_json, "recheck": recheck_summary(recheck), "realism": realism,
            "variants": variants, "checks": checks}


def reference_sources(ops6k: Path, kernelbench: Path) -> dict[str, set[str]]:
    """``source_hash`` of every row of the reference datasets (test / comparison data, never shipped)."""
    import pandas as pd
    from opforge.task.identity import source_hash

    kb = [json.loads(line)["code"] for line in kernelbench.read_text().splitlines() if line.strip()]
    return {"cuda_agent_ops_6k": {source_hash(c) for c in pd.read_parquet(ops6k, columns=["code"])["code"]},
            "kernelbench": {source_hash(c) for c in kb}}


def check_folder(out: Path, task_ids: list[str], ops6k: Path | None = None, kernelbench: Path | None = None
                 ) -> dict[str, Any]:
    """The checks of the module docstring; returns their figures.

    Raises:
        ReleaseError: a check fails (the message names it).
    """
    from opforge.pipeline.hub_folder import validate_folder
    from opforge.task.identity import source_hash

    v = validate_folder(out)
    from datasets import load_dataset

    ds = load_dataset(str(out), split="train")
    if len(ds) != len(task_ids) or set(ds["task_id"]) != set(task_ids):
        raise ReleaseError(f"{out}: {len(ds)} rows whose task_ids are not the {len(task_ids)} selected")
    with_count = Counter(len(json.loads(s)) for s in ds["shape_variants"])
    ref = reference_sources(ops6k or ROOT / "runs" / "reference" / "cuda_agent_ops_6k.parquet",
                            kernelbench or ROOT / "runs" / "reference" / "kernelbench.jsonl")
    ours = {source_hash(c) for c in ds["code"]}
    overlap = {name: len(ours & hashes) for name, hashes in ref.items()}
    if any(overlap.values()):
        raise ReleaseError(f"{out}: rows equal to reference rows (normalised source): {overlap}")
    needles = [str(ROOT).encode(), str(Path.home()).encode()]
    size = 0
    for path in sorted(p for p in out.rglob("*") if p.is_file()):
        blob = path.read_bytes()
        size += len(blob)
        if any(n in blob for n in needles) or (path.suffix != ".parquet" and ABSOLUTE_PATH.search(blob)):
            raise ReleaseError(f"{path}: names a folder of the building machine")
    for col in ("code", "graph", "ops"):
        for s in ds[col]:
            if s and ABSOLUTE_PATH.search(s.encode()):
                raise ReleaseError(f"{out}: a row's {col} names a folder of the building machine")
    if size > MAX_BYTES:
        raise ReleaseError(f"{out}: {size:,} bytes, over {MAX_BYTES:,}")
    return {"rows": v["rows"], "files": len(v["manifest"]), "bytes": size,
            "rows_per_variant_count": {str(k): with_count[k] for k in sorted(with_count)},
            "reference_exact_overlap": overlap, "load_dataset": "ok"}


# ---------------------------------------------------------------------------------------------------------
# the record


def record_payload(a: dict[str, Any], cmp: dict[str, Any] | None, out: Path) -> dict[str, Any]:
    assembled = record.describe()
    real = a["realism"]
    payload = {
        "what": "opforge-Ops-6K, the release (issue #25): `opforge run --config benchmarks/device/release6k.yaml` "
                "to 6,000 tasks, re-checked, with hidden shape variants, compared with CUDA-Agent-Ops-6K; "
                f"published as `{out.relative_to(ROOT) if out.is_relative_to(ROOT) else out.name}`",
        "provenance": {
            "commit": BUILD_COMMIT, "dirty": False, "date": RUN_FACTS["date"], "command": RUN_FACTS["command"],
            "machine": "h200", "host": None, "cpu_count": 32, "platform": None,
            "gpus": [{"name": "NVIDIA H200", "memory_mib": "143771", "driver": "580.159.04"}] * 2,
            "versions": {"python": RUN_FACTS["python"], "torch": RUN_FACTS["torch"],
                         "transformers": RUN_FACTS["transformers"], "triton": RUN_FACTS["triton"]},
            "tag": BUILD_TAG,
            # the tag's code had one filter-logic version (pipeline/ledger.py FILTER_LOGIC_VERSION), no per-filter ones
            "filter_logic": {"FILTER_LOGIC_VERSION": 10}, "composer": "opforge-compose/0.3",
            "assembled": {k: assembled[k] for k in ("commit", "dirty", "date", "command", "machine", "cpu_count")},
        },
        "run": RUN_FACTS,
        "earlier_record": "the one-H200 calls' progress record (a fresh run from an empty directory with its harvest, "
                          "3,232 verdicts, sandbox seconds per filter): benchmarks/results/h200/release6k_progress.json "
                          "at commit c1fcb44",
        "result": {"candidates": a["run"]["candidates"], "accepted": a["run"]["accepted"],
                   "selected": a["run"]["selected"], "yield": a["funnel"]["yield"],
                   "stop_reason": a["run"]["stop_reason"], "rounds": a["run"]["rounds"]},
        "funnel_whole_run": a["funnel"],
        "recheck": a["recheck"],
        "realism": {"figures": {k: v for k, v in real["figures"].items() if not isinstance(v, (dict, list))},
                    "targets": real["targets"], "measured_by": real["provenance"]["command"]},
        "shape_variants": {**{k: v for k, v in a["variants"].items() if k != "output"}, **VARIANTS_RUN},
        "release_folder": a["checks"],
    }
    if cmp is not None:
        payload["comparison"] = {
            "command": cmp.get("command"), "commit": cmp.get("commit"), "machine": cmp.get("machine"),
            "versions": cmp.get("versions"), "settings": cmp["settings"],
            "seconds": cmp["seconds"], "cross_duplicates": {k: cmp["cross_duplicates"][k]
                                                            for k in ("exact", "near", "near_min")},
            "table": cmp["table"],
        }
    return payload


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", required=True, type=Path, help="the finished run directory (runs/release6k)")
    ap.add_argument("--hf", required=True, type=Path, help="its published folder with shape_variants")
    ap.add_argument("--compare", type=Path, default=None, help="`opforge compare` result (compare.json) on those rows")
    ap.add_argument("--out", type=Path, default=ROOT / "releases" / "opforge-ops-6k", help="release folder")
    ap.add_argument("--no-record", action="store_true", help="write the folder only")
    args = ap.parse_args(argv)
    for p in (args.run, args.hf):
        if not p.is_dir():
            ap.error(f"{p}: no such folder")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    cmp = json.loads(args.compare.read_text()) if args.compare else None
    a = assemble(args.run, args.hf, args.out.resolve(), cmp)
    print(json.dumps(a["checks"], indent=1))
    if not args.no_record:
        print("wrote", record.write(NAME, record_payload(a, cmp, args.out.resolve()), machine="h200"))


if __name__ == "__main__":
    main()
