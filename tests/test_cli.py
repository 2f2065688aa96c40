"""The ``opforge`` command line's conventions: --version, env, status, enum choices, required arguments."""

import json
import re
from importlib.metadata import version

import pandas as pd
import pytest
import yaml
from opforge.compose.device_profiles import PROFILES
from opforge.pipeline.cli import app
from opforge.pipeline.status import LEDGER_LABEL
from typer.testing import CliRunner

ENV = {"COLUMNS": "200", "TERM": "dumb", "NO_COLOR": "1"}


def invoke(*args: str):
    return CliRunner().invoke(app, list(args), env=ENV)


def flat(text: str) -> str:
    """Help / error text without rich's box drawing and line wrapping."""
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", text).split())


def test_version():
    res = invoke("--version")
    assert res.exit_code == 0 and res.output.strip() == f"opforge {version('opforge')}"


def test_env_reports_versions_gpus_and_caches(tmp_path, monkeypatch):
    monkeypatch.setenv("OPFORGE_CACHE", str(tmp_path / "c"))
    res = invoke("env", "--json")
    assert res.exit_code == 0, res.output
    info = json.loads(res.output)
    import torch

    assert info["versions"]["opforge"] == version("opforge") and info["versions"]["torch"] == version("torch")
    assert info["torch_build"]["cuda"] == torch.version.cuda
    assert isinstance(info["gpus"], list)  # empty on a machine without nvidia-smi
    assert info["caches"]["opforge"] == str(tmp_path / "c") and "huggingface_hub" in info["caches"]
    assert info["kernelbench_reference"].startswith("packaged:kernelbench@")
    text = invoke("env").output
    assert f"torch: {version('torch')}" in text and "cache opforge: " + str(tmp_path / "c") in text


@pytest.mark.parametrize("args, option, choices", [
    (["filter", "in.jsonl", "out", "--device", "gpu"], "--device", ["cpu", "cuda"]),
    (["harness", "eval", "ds", "sols", "out", "--reward", "fast"], "--reward", ["milestone", "speedup"]),
    (["compose", "--device-profile", "a100"], "--device-profile", list(PROFILES)),
    (["run", "--device", "tpu"], "--device", ["cpu", "cuda"]),
])
def test_fixed_choices_are_validated_and_listed(args, option, choices):
    res = invoke(*args)
    text = flat(res.output)
    assert res.exit_code == 2 and f"Invalid value for '{option}'" in text, text
    assert all(f"'{c}'" in text for c in choices), text


def test_op_mix_is_validated_before_anything_runs(tmp_path):
    res = invoke("compose", "--op-mix", "1:0.5,7:0.5", "--out", str(tmp_path / "c.parquet"))
    assert res.exit_code == 2 and "Invalid value for '--op-mix'" in flat(res.output)
    assert "1..5" in flat(res.output) and not (tmp_path / "c.parquet").exists()


def test_required_inputs_are_arguments_and_help_lists_choices():
    text = flat(invoke("filter", "--help").output)
    assert "INPUT" in text and "OUT" in text and "<cpu|cuda>" in text
    assert "GPU sharing" in text and "--gpu-step-limit-s" in text  # the GPU options have their own panel
    assert "--quiet" in text
    res = invoke("filter", "in.jsonl")
    assert res.exit_code == 2 and "missing argument OUT" in res.output
    assert "<milestone|speedup>" in flat(invoke("harness", "eval", "--help").output)
    assert "init" in flat(invoke("harness", "--help").output)


def _fake_run(run_dir, ledger_lines, finished=False):
    """A run directory as ``opforge run`` lays it out, with 4 candidates in one round."""
    (run_dir / "candidates").mkdir(parents=True)
    (run_dir / "seeds").mkdir()
    (run_dir / "seeds" / "catalog.parquet").write_bytes(b"")
    (run_dir / "config.yaml").write_text(yaml.safe_dump({"target": 2, "device": "cpu", "seed": 0, "op_mix": "ops6k",
                                                         "device_profile": "cpu", "round_size": 16,
                                                         "candidate_budget": 40}))
    pd.DataFrame({"task_id": ["a", "b", "c", "c"], "code": ["x"] * 4}).to_parquet(
        run_dir / "candidates" / "round-0000.parquet")
    (run_dir / "filter").mkdir()
    (run_dir / "filter" / "ledger.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ledger_lines)
                                                     + '{"task_id": "c", "acc')  # a line being written
    if finished:
        (run_dir / "run.json").write_text(json.dumps({"selected": 1, "stop_reason": "budget", "yield": 0.33}))


def test_status_reads_stage_progress_and_failures(tmp_path):
    recs = [{"task_id": "a", "accepted": True, "reason": None, "filter": None, "fingerprint": "f1", "metrics": {}},
            {"task_id": "b", "accepted": False, "reason": "crash:SIGSEGV", "filter": "eager", "fingerprint": "f1",
             "metrics": {"eager": {"error": "child died\n  signal 11"}}}]
    _fake_run(tmp_path / "r", recs)
    res = invoke("status", str(tmp_path / "r"), "--json")
    assert res.exit_code == 0, res.output
    s = json.loads(res.output)
    assert s["stage"] == "filter" and s["candidates"] == {"rounds": 1, "rows": 4, "unique": 3}
    assert s["ledger"] == {"verdicted": 2, "accepted": 1, "rejected": 1, "by_reason": {"crash": 1}}
    assert s["last_failures"] == [{"task_id": "b", "reason": "crash:SIGSEGV", "filter": "eager",
                                   "error": "child died signal 11"}]
    text = invoke("status", str(tmp_path / "r")).output
    assert "stage: filter" in text and f"ledger ({LEDGER_LABEL}): 2 of 3 verdicted, 1 passed" in text and "crash:SIGSEGV" in text

    recs.append({"task_id": "c", "accepted": False, "reason": "trivial:noop", "filter": "trivial", "fingerprint": "f1"})
    _fake_run(tmp_path / "done", recs, finished=True)
    s = json.loads(invoke("status", str(tmp_path / "done"), "--json").output)
    assert s["stage"] == "finished" and s["result"]["stop_reason"] == "budget" and s["ledger"]["verdicted"] == 3
    # a ledger with more verdicts than unique candidates (a duplicate verdicted too) never reads "4 of 3"
    recs.append({"task_id": "d", "accepted": True, "reason": None, "filter": None, "fingerprint": "f1"})
    _fake_run(tmp_path / "more", recs, finished=True)
    text = invoke("status", str(tmp_path / "more")).output
    assert f"ledger ({LEDGER_LABEL}): 4 verdicted, 2 passed" in text and "4 of 3" not in text


def test_status_of_a_filter_directory_and_of_no_run(tmp_path):
    (tmp_path / "f").mkdir()
    (tmp_path / "f" / "ledger.jsonl").write_text(json.dumps({"task_id": "a", "accepted": True, "fingerprint": "x"}) + "\n")
    s = json.loads(invoke("status", str(tmp_path / "f"), "--json").output)
    assert s["kind"] == "filter" and s["ledger"]["accepted"] == 1
    res = invoke("status", str(tmp_path))
    assert res.exit_code == 2 and "not a run directory" in res.output


def _kb_task(forward: str, inputs: str, init: str = "") -> str:
    """A KernelBench-format source: ``Model.forward(x)`` returning ``forward``, ``get_inputs()`` -> [inputs]."""
    return (f"import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n    def __init__(self):\n"
            f"        super().__init__()\n        {init or 'pass'}\n\n    def forward(self, x):\n"
            f"        return {forward}\n\n\ndef get_inputs():\n    return [{inputs}]\n\n\n"
            f"def get_init_inputs():\n    return []\n")


def test_compare_two_small_datasets(tmp_path, monkeypatch):
    """`opforge compare A B` on a JSONL file and an hf/ folder whose figures follow from the rows."""
    monkeypatch.setenv("OPFORGE_CACHE", str(tmp_path / "cache"))
    tanh_sigmoid = _kb_task("torch.sigmoid(torch.tanh(x))", "torch.randn(16, 32)")
    softmax_batch = _kb_task("torch.softmax(x, dim=0)", "torch.randn(16, 32)")  # over the batch axis
    linear_relu = _kb_task("torch.relu(self.fc(x))", "torch.randn(16, 32)", "self.fc = nn.Linear(32, 32)")
    exp_only = _kb_task("torch.exp(x)", "torch.randn(16, 32)")
    cumsum_rows = _kb_task("torch.cumsum(x, dim=1)", "torch.randn(16, 32)")
    a_rows = [
        {"code": tanh_sigmoid, "ops": '["torch.tanh", "torch.sigmoid"]', "data_source": "torch#2"},
        {"code": tanh_sigmoid, "ops": '["torch.tanh", "torch.sigmoid"]', "data_source": "torch#2"},  # copy
        {"code": softmax_batch, "ops": '["torch.softmax"]', "data_source": "torch#1"},
        {"code": linear_relu, "ops": '["nn.Linear", "torch.relu"]', "data_source": "torch#2"},
    ]
    a = tmp_path / "a.jsonl"
    a.write_text("".join(json.dumps(r) + "\n" for r in a_rows))
    b = tmp_path / "ref" / "hf"
    (b / "data").mkdir(parents=True)
    pd.DataFrame([
        {"code": tanh_sigmoid, "ops": '["torch.tanh", "torch.sigmoid"]', "data_source": "torch#2"},
        {"code": exp_only, "ops": '["torch.exp"]', "data_source": "torch#1"},
        {"code": cumsum_rows, "ops": '["torch.cumsum"]', "data_source": "torch#1"},
    ]).to_parquet(b / "data" / "train-00000-of-00001.parquet", index=False)
    kb = tmp_path / "kernelbench.jsonl"
    kb.write_text(json.dumps({"level": 2, "problem_id": 1, "name": "1_Linear_ReLU", "code": _kb_task(
        "torch.relu(self.linear(x))", "torch.randn(2, 4)", "self.linear = nn.Linear(4, 4)")}) + "\n")
    out = tmp_path / "cmp"

    res = invoke("compare", str(a), str(b), "--out", str(out), "--workers", "1", "--kernelbench", str(kb), "--quiet")
    assert res.exit_code == 0, res.output
    assert "| measure | a | ref |" in res.output and "| rows | 4 | 3 |" in res.output
    result = json.loads((out / "compare.json").read_text())
    assert (out / "compare.md").read_text().startswith("| measure | a | ref |")
    da, db = result["datasets"]["a"], result["datasets"]["b"]
    assert (da["rows"], db["rows"]) == (4, 3)
    assert da["labels"]["distinct_op_labels"] == 5  # tanh, sigmoid, softmax, Linear, relu
    assert db["labels"]["op_count_share"] == {"1": 2 / 3, "2": 1 / 3}
    assert (da["duplicates"]["exact"], db["duplicates"]["exact"]) == (1, 0)  # A's second row copies its first
    assert result["cross_duplicates"]["exact"] == 2  # both tanh-sigmoid rows of A are B's first row
    assert da["sample"]["label_fidelity"]["label_fidelity"] == 1.0
    assert da["sample"]["kernelbench"]["signature_hits"] == 1  # Linear + ReLU
    assert db["sample"]["kernelbench"]["signature_hits"] == 0
    assert (da["sample"]["axis_misuse"]["misused"], db["sample"]["axis_misuse"]["misused"]) == (1, 0)
    # one op alone (softmax; exp, cumsum) has nothing to fuse: fusion gain 1; two element-wise ops on one
    # [16, 32] tensor read and write it twice instead of once: 2
    assert da["sample"]["headroom"]["share_below_1.1"] == 1 / 4
    assert db["sample"]["headroom"]["share_below_1.1"] == 2 / 3
    gains = db["sample"]["headroom"]["fusion_gain"]  # of [2, 1, 1], linear interpolation between ranks
    assert gains["p50"] == pytest.approx(1.0, abs=1e-4) and gains["p90"] == pytest.approx(1.8, abs=1e-4)


def test_compare_names_a_missing_dataset(tmp_path):
    res = invoke("compare", str(tmp_path / "missing.parquet"), str(tmp_path))
    assert res.exit_code == 2 and "missing.parquet: no such file or folder" in res.output
