"""Benchmark results describe themselves: ``benchmarks/record.py`` and every file under ``benchmarks/results``."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))
import record  # noqa: E402

RESULTS = sorted(p for p in (BENCH / "results").rglob("*") if p.is_file())


def test_there_are_results_and_all_sit_in_a_machine_folder():
    assert len(RESULTS) >= 10
    assert all(p.parent.parent == BENCH / "results" for p in RESULTS), [str(p) for p in RESULTS]


@pytest.mark.parametrize("path", RESULTS, ids=lambda p: str(p.relative_to(BENCH / "results")))
def test_every_result_names_its_commit_command_and_machine(path):
    assert path.suffix == ".json"
    prov = json.loads(path.read_text())["provenance"]
    assert isinstance(prov["commit"], str) and len(prov["commit"]) in (40, 7) or prov["commit"] == "unknown"
    assert isinstance(prov["command"], str) and prov["command"].strip()
    assert prov["machine"] == path.parent.name


def test_record_writes_a_self_describing_result(tmp_path, monkeypatch):
    monkeypatch.setattr(record, "RESULTS", tmp_path)
    path = record.write("demo", {"n": 3, "provenance": {"note": "set by the script"}}, machine="cpu-test")
    assert path == tmp_path / "cpu-test" / "demo.json"
    body = json.loads(path.read_text())
    prov = body["provenance"]
    head = subprocess.run(["git", "-C", str(BENCH), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert prov["commit"] == head and isinstance(prov["dirty"], bool)
    assert prov["machine"] == "cpu-test" and prov["note"] == "set by the script" and body["n"] == 3
    import torch

    assert prov["versions"]["torch"].split("+")[0] == torch.__version__.split("+")[0]
    assert prov["versions"]["torch_cuda"] == torch.version.cuda
    assert isinstance(prov["filter_logic"], dict) and prov["composer"].startswith("opforge-compose/")
    assert prov["filter_logic"] and all(isinstance(v, int) for v in prov["filter_logic"].values())
    assert str(BENCH.parent) not in json.dumps(body)  # no folder of this machine
    with pytest.raises(ValueError, match="bad name"):
        record.write("a/b", {})


def test_machine_names():
    assert record.machine_name([{"name": "NVIDIA H200", "memory_mib": "1", "driver": "1"}]) == "h200"
    assert record.machine_name([{"name": "NVIDIA H100 80GB HBM3", "memory_mib": "1", "driver": "1"}]) == "h100"
    assert record.machine_name([]).startswith("cpu-") and record.machine_name([]).endswith("core")
