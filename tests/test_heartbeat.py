"""``opforge run``'s log progress (pipeline.heartbeat): stage start / end lines and heartbeat lines with done /
total, rate and ETA, read from the run directory."""

import io
import json
import time

import pandas as pd
from opforge.pipeline.heartbeat import RunHeartbeat


def test_heartbeat_lines_follow_the_run_directory(tmp_path):
    run = tmp_path / "run"
    out = io.StringIO()
    with RunHeartbeat(run, target=5, interval_s=3600, stream=out) as hb:  # ticks driven by hand below
        hb.tick()
        (run / "seeds").mkdir(parents=True)
        (run / "seeds" / "catalog.parquet").write_bytes(b"")
        (run / "candidates").mkdir()
        pd.DataFrame({"task_id": [f"t{i}" for i in range(8)]}).to_parquet(run / "candidates" / "round-0000.parquet")
        hb.tick()
        (run / "filter").mkdir()
        with open(run / "filter" / "ledger.jsonl", "w") as fh:
            for i in range(3):
                fh.write(json.dumps({"task_id": f"t{i}", "accepted": i != 1}) + "\n")
            fh.write('{"task_id": "t3", "acc')  # a line being written: not counted yet
        hb.tick()
        time.sleep(0.05)
        with open(run / "filter" / "ledger.jsonl", "a") as fh:
            fh.write('epted": true}\n' + json.dumps({"task_id": "t4", "accepted": False}) + "\n")
        hb.tick()
        (run / "run.json").write_text("{}")
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("opforge run: started (target 5, ") and "every 3600 s" in lines[0]
    assert "opforge run: stage harvest started" in lines
    assert any(x.startswith("opforge run: [") and "harvest: 0 candidates composed" in x for x in lines)
    assert any(x.startswith("opforge run: stage harvest ended after ") for x in lines)
    assert any("compose: 8 candidates composed (target 5 tasks)" in x for x in lines)
    beats = [x for x in lines if "] filter: " in x]
    assert "filter: 3 of 8 candidates composed so far (37.5 %) verdicted" in beats[0] and "2 accepted" in beats[0]
    assert "filter: 5 of 8 candidates composed so far (62.5 %) verdicted" in beats[1] and "3 accepted" in beats[1]
    assert "/s, ETA " in beats[1]
    assert any(x.startswith("opforge run: stage filter ended after ") for x in lines)
    assert lines[-1].startswith("opforge run: finished after ")
