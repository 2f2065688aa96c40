"""benchmarks/streaming_report.py --ledger: sandbox occupancy and the release trend of a ledger alone."""

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def test_occupancy_of_a_ledger(tmp_path):
    # two sandboxes busy for 0-20 s, then one for 20-70 s, none for 70-80 s, one for 80-90 s; releases slow
    # down with age
    recs = [{"task_id": "a", "started_at": 1000.0, "ended_at": 1020.0, "release_s": 0.05, "seconds": {}},
            {"task_id": "b", "started_at": 1000.0, "ended_at": 1020.0, "release_s": 0.07, "seconds": {}},
            {"task_id": "c", "started_at": 1020.0, "ended_at": 1070.0, "release_s": 0.2, "seconds": {}},
            {"task_id": "d", "started_at": 1080.0, "ended_at": 1090.0, "release_s": 0.3, "seconds": {},
             "reason": "timeout:gpu_step"}]
    ledger = tmp_path / "ledger.jsonl"
    ledger.write_text("".join(json.dumps(r) + "\n" for r in recs))
    out = tmp_path / "report.json"
    subprocess.run([sys.executable, str(BENCH / "streaming_report.py"), "--ledger", f"x={ledger}", "--out", str(out)],
                   check=True, capture_output=True)
    run = json.loads(out.read_text())["runs"]["x"]
    occ = run["occupancy"]
    assert occ["sandboxes"] == 2 and occ["span_s"] == 90.0
    assert occ["busy_share"] == round(100 / 180, 4)
    assert occ["running_per_bin"] == [2.0, 2.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 1.0]
    assert occ["under_half_busy"] == [{"from_s": 70, "to_s": 80}]
    assert occ["release_s_p50_per_minute"] == [0.07, 0.3]
    assert run["ledger"]["verdicts"] == 4 and run["ledger"]["timeouts"] == 1
