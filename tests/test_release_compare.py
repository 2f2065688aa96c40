"""opforge.pipeline.compare on two hand-made datasets whose every figure is known."""

import json

import pandas as pd
import pytest
from opforge.pipeline import compare


def _task(forward: str, inputs: str, init: str = "", extra: str = "") -> str:
    return f'''import os
import torch
import torch.nn as nn
import torch.nn.functional as F
{extra}

class Model(nn.Module):
    def __init__(self):
        super().__init__()
{init or "        pass"}

    def forward(self, x):
{forward}


def get_inputs():
    return [{inputs}]


def get_init_inputs():
    return []
'''


TANH_SIGMOID = _task("        return torch.sigmoid(torch.tanh(x))", "torch.randn(4, 8)")
LINEAR_RELU = _task("        return torch.relu(self.fc(x))", "torch.randn(4, 8)", "        self.fc = nn.Linear(8, 16)")
CUMSUM_GELU = _task("        return F.gelu(torch.cumsum(x, dim=1))", "torch.randn(4, 8)")
EXP_MUL = _task("        return torch.exp(x * x)", "torch.randn(4, 8)")
TINY_BLOCK_6K = _task("        return F.gelu(self.dense(x))", "torch.randn(4, 8)", "        self.dense = nn.Linear(8, 8)")

# ours
CUMSUM_GELU_COMMENTED = CUMSUM_GELU.replace("def forward(self, x):", "def forward(self, x):  # scan, then GELU")
TANH_SIGMOID_RENAMED = TANH_SIGMOID.replace("(self, x)", "(self, inp)").replace("torch.tanh(x)", "torch.tanh(inp)")
LINEAR_RELU_F = _task("        h = self.proj(x)\n        return F.relu(h)", "torch.randn(2, 3, 32)",
                      "        self.proj = nn.Linear(32, 64)\n        self.scale = 2")
TANH_ONLY = _task("        return torch.tanh(x)", "torch.randn(4, 8)")
ABS_ADD_BF16 = _task("        return x.abs() + 1", "torch.randn(4, 8, dtype=torch.bfloat16)")
TINY_BLOCK_OURS = _task("        return self.block(x)", "torch.randn(4, 8)", "        self.block = TinyBlock()", '''

class TinyBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.dense = nn.Linear(8, 8)

    def forward(self, x):
        return F.gelu(self.dense(x))
''')
CRASH = _task("        return x", "torch.randn(4, 8) if os._exit(3) is None else None")

KERNELBENCH = [
    {"level": 2, "problem_id": 1, "name": "1_Linear_ReLU", "code": _task(
        "        return torch.relu(self.linear(x))", "torch.randn(2, 4)", "        self.linear = nn.Linear(4, 4)")},
    {"level": 1, "problem_id": 2, "name": "2_Softmax", "code": _task("        return torch.softmax(x, dim=1)",
                                                                     "torch.randn(2, 4)")},
]


@pytest.fixture
def datasets(tmp_path, monkeypatch):
    monkeypatch.setenv("OPFORGE_CACHE", str(tmp_path / "cache"))
    ops6k = pd.DataFrame([
        {"ops": '["torch.tanh", "torch.sigmoid"]', "data_source": "torch#2", "code": TANH_SIGMOID},
        {"ops": '["nn.Linear", "torch.relu"]', "data_source": "torch#2", "code": LINEAR_RELU},
        {"ops": '["torch.tanh", "torch.sigmoid"]', "data_source": "torch#2", "code": TANH_SIGMOID},
        {"ops": '["torch.cumsum", "F.gelu"]', "data_source": "torch#2", "code": CUMSUM_GELU},
        {"ops": '["torch.exp", "*"]', "data_source": "torch#2", "code": EXP_MUL},  # listed out of call order
        {"ops": "TinyBlock_1", "data_source": "transformers", "code": TINY_BLOCK_6K},
    ])
    ours = pd.DataFrame([
        {"ops": '["torch.cumsum", "F.gelu"]', "data_source": "torch#2", "code": CUMSUM_GELU_COMMENTED,
         "dtype": "float32"},
        {"ops": '["nn.Linear", "F.relu"]', "data_source": "torch#2", "code": LINEAR_RELU_F, "dtype": "float32"},
        {"ops": '["torch.tanh", "torch.sigmoid"]', "data_source": "torch#2", "code": TANH_SIGMOID_RENAMED,
         "dtype": "float32"},
        {"ops": '["torch.sigmoid"]', "data_source": "torch#1", "code": TANH_ONLY, "dtype": "float32"},  # wrong
        {"ops": '["Tensor.abs", "+"]', "data_source": "torch#2", "code": ABS_ADD_BF16, "dtype": "bfloat16"},
        {"ops": '["TinyBlock"]', "data_source": "transformers", "code": TINY_BLOCK_OURS, "dtype": "float32"},
        {"ops": '["Tensor.abs"]', "data_source": "torch#1", "code": CRASH, "dtype": "float32"},  # kills its worker
    ])
    (tmp_path / "hf" / "data").mkdir(parents=True)
    ours.to_parquet(tmp_path / "hf" / "data" / "train-00000-of-00001.parquet", index=False)
    ops6k.to_parquet(tmp_path / "ops6k.parquet", index=False)
    kb = tmp_path / "kernelbench.jsonl"
    kb.write_text("".join(json.dumps(p) + "\n" for p in KERNELBENCH))
    return tmp_path


def test_compare_counts(datasets):
    result = compare.compare(datasets / "hf", datasets / "ops6k.parquet",
                                     kernelbench=str(datasets / "kernelbench.jsonl"), workers=2, progress=False)
    json_path, md_path = compare.write_compare(result, datasets / "out")
    assert json.loads(json_path.read_text())["datasets"]["a"]["rows"] == 7
    prov = result["provenance"]
    assert prov["machine"]["cpu_count"] and prov["versions"]["torch"]
    assert result["names"] == [datasets.name, "ops6k"]  # an hf/ folder is named by its run folder
    ours, ops6k = result["datasets"]["a"], result["datasets"]["b"]

    # labels over all rows
    assert ours["labels"]["distinct_op_labels"] == 8  # cumsum, gelu, Linear, relu, tanh, sigmoid, abs, +
    assert ops6k["labels"]["distinct_op_labels"] == 8
    assert ops6k["labels"]["distinct_signatures"] == 4
    assert ops6k["labels"]["max_rows_per_signature"] == 2
    assert ours["labels"]["max_rows_per_signature"] == 1
    assert ours["labels"]["op_count_share"] == {"1": 2 / 6, "2": 4 / 6}
    assert ours["labels"]["data_source_share"]["transformers"] == 1 / 7
    assert ours["labels"]["declared_dtype_share"] == {"bfloat16": 1 / 7, "float32": 6 / 7}

    # label fidelity: ours' wrong label fails every rule, Ops-6K's out-of-order list only the sequence rule
    f = ours["sample"]["label_fidelity"]
    assert (f["n_sampled"], f["n_traced"], f["n_untraced"]) == (7, 6, 1)
    assert f["untraced_reasons"] == [["crash:exit3", 1]]
    assert f["torch"]["n"] == 5
    assert f["torch"]["exact_sequence"] == f["label_fidelity"] == 4 / 5
    assert f["torch"]["all_listed_computed"] == 4 / 5
    assert f["transformers"] == {"n": 1, "module_present": 1.0}
    assert [m[0] for m in f["mismatch_examples"]] == [3]
    g = ops6k["sample"]["label_fidelity"]
    assert g["torch"]["exact_sequence"] == 4 / 5
    assert g["torch"]["same_set"] == g["torch"]["all_listed_called"] == 1.0
    assert g["transformers"] == {"n": 1, "module_present": 0.0}  # Model is the renamed module

    # duplicates: Ops-6K repeats one row; ours copies one Ops-6K row exactly and one renamed
    assert (ops6k["duplicates"]["exact"], ops6k["duplicates"]["near"]) == (1, 0)
    assert (ours["duplicates"]["exact"], ours["duplicates"]["near"]) == (0, 0)
    cross = result["cross_duplicates"]
    assert (cross["exact"], cross["near"]) == (1, 1)
    assert cross["exact_pairs"] == [[0, 3]]
    assert [p[:2] for p in cross["near_pairs"]] == [[2, 0]]

    # KernelBench: one Linear+ReLU per dataset, whatever the spelling
    assert ours["sample"]["kernelbench"]["signature_hits"] == 1
    assert ours["sample"]["kernelbench"]["hit_examples"] == [[1, ["L2/1_Linear_ReLU"]]]
    assert ops6k["sample"]["kernelbench"]["signature_hits"] == 1

    # dtypes and realism, from the traced sample (the crashed row did not build)
    assert ours["sample"]["dtype_share"] == {"bfloat16": 1 / 7, "float32": 5 / 7, "unknown": 1 / 7}
    assert ours["sample"]["realism"]["low_precision_share"] == 1 / 6
    assert ops6k["sample"]["realism"]["batch_p50"] == 4

    # fusion headroom (memory-bound at these sizes, so gain = per-op bytes / fused bytes): two element-wise ops
    # on one fp32 [4, 8] tensor (cumsum+gelu, tanh+sigmoid, abs+add in bf16) read and write it twice instead
    # of once: 2.0; tanh alone: 1.0; Linear(32, 64) on [2, 3, 32] + relu: (768 + 8192 + 256 + 1536 + 2 * 1536)
    # / (768 + 8192 + 256 + 1536) = 9 / 7; Linear(8, 8) on [4, 8] + gelu: (544 + 256) / 544. The crashed row
    # has no roofline.
    h = ours["sample"]["headroom"]
    assert (h["n_measured"], h["n_untraced"]) == (6, 1)
    assert h["share_below_1.1"] == pytest.approx(1 / 6)
    assert h["fusion_gain"]["p50"] == pytest.approx((800 / 544 + 2.0) / 2, abs=1e-4)
    assert h["fusion_gain"]["p90"] == pytest.approx(2.0, abs=1e-4)
    # axis misuse: none of these forwards runs an axis-wise op over dim 0 (cumsum runs over dim 1)
    x = ours["sample"]["axis_misuse"]
    assert (x["n_sampled"], x["misused"]) == (7, 0) and x["n_traced"] == 6

    table = md_path.read_text()
    assert table.startswith(f"| measure | {datasets.name} | ops6k |")
    assert "| rows | 7 | 6 |" in table
    assert "| rows exactly duplicating a row of ops6k | 1 | - |" in table
    # the diversity of multi-op rows (task.realism, issue #60), for both datasets: Ops-6K repeats tanh + sigmoid
    d = ops6k["sample"]["realism"]
    assert (d["top_op_set"], d["top_op_set_share"], d["distinct_op_sets"]) == ("sigmoid + tanh", 2 / 6, 5)
    r = ours["sample"]["realism"]
    assert (f"| realism: top exotic op, share of rows (target <= 8 %; sample) | {r['top_exotic_op']} "
            f"({100 * r['top_exotic_op_share']:.1f} %) | {d['top_exotic_op']} ({100 * d['top_exotic_op_share']:.1f} %) |"
            in table)
    assert "| sigmoid + tanh (33.3 %) |" in table
    assert (f"| realism: distinct op sets, share of rows (target >= 20 %; sample) | {r['distinct_op_sets']} "
            f"({100 * r['distinct_op_set_share']:.1f} %) | 5 (83.3 %) |" in table)


def test_sample_is_deterministic_and_in_row_order():
    a = compare.sample_rows(6000, 300, seed=0)
    assert a == compare.sample_rows(6000, 300, seed=0) == sorted(set(a))
    assert len(a) == 300 and a != compare.sample_rows(6000, 300, seed=1)
    assert compare.sample_rows(5, 300, seed=0) == [0, 1, 2, 3, 4]
