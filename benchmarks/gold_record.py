"""Record of the gold subset's reference solutions graded by the shipped harness (issue #57, "Must show").

Reads the result directory of ``opforge harness eval RELEASE SOLUTIONS RESULTS`` (``results.jsonl``,
``environment.json``), grades every gold row's latest result of its shipped solution
(``opforge.pipeline.gold_release.gold_rows``), runs the static policy checks on every solution
(``harness.policy.policy_violations``, ``harness.timing_tamper.timing_tampers``, ``harness.symbols.denied_tokens``)
and writes ``benchmarks/results/<machine>/gold.json``: provenance (commit, command, machine), the eval command,
per-row results and the figures (rows, strata, dtypes, % correct incl. hidden variants, % reward 3, geomean
speed-ups over torch.compile and eager, per-row % of roofline) with the issue's targets beside them.

    python benchmarks/gold_record.py RESULTS [--release releases/opforge-ops-6k]
        [--solutions releases/gold-solutions] [--copy-to $OUT/gold.json] [--command "..."]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import record

TARGETS = {"rows": 40, "strata": 6, "dtypes": 3, "correct_pct": 90.0, "reward3_pct": 50.0,
           "geomean_speedup_compile": 1.25, "geomean_speedup_eager": 2.0}


def static_checks(solutions: Path, task_ids: list[str]) -> dict[str, list[str]]:
    """task_id -> the static rules its solution breaks (empty list: passes; rows without a solution left out)."""
    from opforge.harness.build import FIXED_BINDING
    from opforge.harness.policy import policy_violations
    from opforge.harness.solution import Solution
    from opforge.harness.symbols import denied_tokens
    from opforge.harness.timing_tamper import timing_tampers

    out = {}
    for tid in task_ids:
        folder = solutions / tid
        if not folder.is_dir():
            continue
        sol = Solution.from_dir(folder)
        own = {k: v for k, v in sol.sources.items() if k not in FIXED_BINDING}
        out[tid] = ([f"policy:{v}" for v in policy_violations(sol.model_new)]
                    + [f"timing:{v}" for v in timing_tampers(sol.model_new)]
                    + [f"source:{v}" for v in denied_tokens(own)])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", type=Path)
    ap.add_argument("--release", type=Path, default=Path("releases/opforge-ops-6k"))
    ap.add_argument("--solutions", type=Path, default=Path("releases/gold-solutions"))
    ap.add_argument("--copy-to", type=Path, default=None, help="also write the record here (e.g. under $OUT)")
    ap.add_argument("--command", default=None, help="the eval command the results came from")
    args = ap.parse_args()

    from opforge.pipeline.gold import rule_text
    from opforge.pipeline.gold_release import gold_figures, gold_rows

    frame = gold_rows(args.release, args.solutions, args.results)
    figures = gold_figures(frame)
    checks = static_checks(args.solutions, list(frame["task_id"]))
    figures["static_checks_pass"] = sum(1 for v in checks.values() if not v)
    met = {"rows": figures["rows"] >= TARGETS["rows"], "strata": len(figures["strata"]) >= TARGETS["strata"],
           "dtypes": len(figures["dtypes"]) >= TARGETS["dtypes"],
           "static_checks": figures["static_checks_pass"] == figures["with_solution"] == figures["rows"]}
    for k in ("correct_pct", "reward3_pct", "geomean_speedup_compile", "geomean_speedup_eager"):
        met[k] = figures[k] is not None and figures[k] >= TARGETS[k]
    rows = json.loads(frame.drop(columns=["files"]).to_json(orient="records"))
    for r in rows:
        r["static_violations"] = checks.get(r["task_id"])
    report = json.loads((args.results / "report.json").read_text()) if (args.results / "report.json").is_file() else {}
    payload = {"rule": rule_text(), "eval_command": args.command, "eval_config": report.get("config"),
               "figures": figures, "targets": TARGETS, "targets_met": met, "rows": rows}
    path = record.write("gold", payload)
    print(f"wrote {path}")
    if args.copy_to is not None:
        record.write_file(args.copy_to, {**json.loads(path.read_text())})
        print(f"wrote {args.copy_to}")
    print(json.dumps({"figures": figures, "targets_met": met}, indent=1))


if __name__ == "__main__":
    main()
