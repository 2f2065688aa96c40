"""benchmarks/verdict_agreement.py: two runs' verdicts matched task by task, disagreements decided from a
measured time told apart from the others."""

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _verdicts(rows):
    return pd.DataFrame([{"row": i, "task_id": t, "accepted": acc, "reason": reason, "filter": None,
                          "metrics": json.dumps(metrics)} for i, (t, acc, reason, metrics) in enumerate(rows)])


def test_agreement_of_two_runs(tmp_path):
    near = {"runtime": {"eager_ms": 0.041}, "headroom": {"room": 1.98}}
    a = _verdicts([("t1", True, None, {}), ("t2", False, "trivial:noop", {}), ("t3", True, None, near),
                   ("t4", False, "compile_mismatch", {}), ("t5", True, None, {})])
    b = _verdicts([("t1", True, None, {}), ("t2", False, "trivial:noop", {}),
                   ("t3", False, "trivial:no_headroom", {"headroom": {"room": 1.97}}), ("t4", True, None, {}),
                   ("t6", True, None, {})])
    for name, frame in (("a", a), ("b", b)):
        (tmp_path / name / "filter").mkdir(parents=True)
        frame.to_parquet(tmp_path / name / "filter" / "verdicts.parquet")
    out = tmp_path / "agreement.json"
    subprocess.run([sys.executable, str(BENCH / "verdict_agreement.py"), str(tmp_path / "a"), str(tmp_path / "b"),
                    "--out", str(out)], check=True, capture_output=True)
    res = json.loads(out.read_text())
    assert (res["common"], res["agree"], res["differ_timed"], res["differ_untimed"]) == (4, 2, 1, 1)
    assert res["timed"][0]["task_id"] == "t3" and res["timed"][0]["a_measured"] == {"eager_ms": 0.041, "room": 1.98}
    assert res["untimed"][0] == {"task_id": "t4", "a": "compile_mismatch", "b": "accepted",
                                 "a_measured": {"eager_ms": None, "room": None},
                                 "b_measured": {"eager_ms": None, "room": None}}
    assert res["differ_pairs"] == {"accepted | trivial:no_headroom": 1, "compile_mismatch | accepted": 1}
    assert res["provenance"]["command"]
