"""opforge.task.realism: the figures it computes on hand-written tasks, and its worker pool."""

import math

import pytest
from opforge.task import realism

# A: fp32 GEMM + GRU, batch 16, sizes (10, 100) that are not multiples of 8.
LINEAR = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, d_in, d_out):
        super().__init__()
        self.fc = nn.Linear(d_in, d_out)
        self.rnn = nn.GRU(d_out, 24, batch_first=True)

    def forward(self, x):
        return self.rnn(torch.relu(self.fc(x)))[0]


def get_inputs():
    return [torch.randn(16, 10, 100)]


def get_init_inputs():
    return [100, 256]
'''

# B: bf16 convolution, batch 4, every size a multiple of 8, two inputs.
CONV_BF16 = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(8, 16, 3, padding=1).to(torch.bfloat16)

    def forward(self, x, y):
        return self.conv(x) * y


def get_inputs():
    return [torch.randn(4, 8, 32, 32, dtype=torch.bfloat16), torch.randn(4, 16, 32, 32, dtype=torch.bfloat16)]


def get_init_inputs():
    return []
'''

# C: a "transformers" row with a 1-D input (no batch), an internal ATen-level name and a
# transformers.models import that is never executed.
INTERNAL_1D = '''
import torch
import torch.nn as nn


def _reference_block():
    from transformers.models.bert.modeling_bert import BertLayer
    return BertLayer


class Model(nn.Module):
    def forward(self, x):
        return torch.constant_pad_nd(torch.cumsum(x, 0), [1, 1])


def get_inputs():
    return [torch.randn(1000)]


def get_init_inputs():
    return []
'''

ROWS = [
    {"task_id": "a", "code": LINEAR, "ops": '["nn.Linear", "torch.relu", "nn.GRU"]', "data_source": "torch#2"},
    {"task_id": "b", "code": CONV_BF16, "ops": '["nn.Conv2d", "*"]', "data_source": "torch#2"},
    {"task_id": "c", "code": INTERNAL_1D, "ops": "BertLayerLike", "data_source": "transformers"},
]


@pytest.fixture(scope="module")
def records():
    return [realism.measure_row(r) for r in ROWS]


def test_records_hold_shapes_dtypes_and_ops(records):
    a, b, c = records
    assert [r["status"] for r in records] == ["ok", "ok", "ok"]
    assert a["input_shapes"] == [[16, 10, 100]] and a["feature_sizes"] == [100, 256]
    assert set(a["ops"]) == {"linear", "relu", "gru"}  # nn.GRU's zeros (initial state) is a helper
    assert b["input_dtypes"] == ["bfloat16", "bfloat16"] and b["param_dtypes"] == ["bfloat16"]
    assert set(b["ops"]) == {"conv2d", "mul"} and b["feature_sizes"] == [8, 16]
    assert b["input_bytes"] == (4 * 8 * 32 * 32 + 4 * 16 * 32 * 32) * 2
    assert c["input_shapes"] == [[1000]] and "constant_pad_nd" in c["ops"]
    assert c["internal"] == ["constant_pad_nd"] and a["internal"] == [] == b["internal"]
    assert (c["tf_models"], c["tf_any"]) == (True, True)


def test_figures_of_three_tasks(records):
    f = realism.summarise(records)
    assert (f["rows"], f["n_built"], f["n_traced"]) == (3, 3, 3)
    # batch: A 16, B 4, C none (1-D first input)
    assert f["n_with_batch"] == 2
    assert f["batch_p50"] == pytest.approx((16 + 4) / 2)
    assert f["batch_p90"] == pytest.approx(4 + 0.9 * (16 - 4))
    assert f["batch_share_gt_8192"] == 0
    # largest non-batch dim: A 100, B 32
    assert f["largest_non_batch_p50"] == pytest.approx((100 + 32) / 2)
    assert f["distinct_non_batch_dims"] == len({10, 100, 8, 32, 16})
    assert f["non_multiple_of_8_share"] == pytest.approx(1 / 3)  # A only (100)
    assert f["low_precision_share"] == pytest.approx(1 / 3)  # B only
    sizes = sorted(r["input_bytes"] for r in records)
    assert f["input_bytes_p50"] == sizes[1] == 16 * 10 * 100 * 4
    assert f["heavy_op_share"] == pytest.approx(2 / 3)
    assert f["conv_share"] == pytest.approx(1 / 3) and f["gemm_share"] == pytest.approx(1 / 3)
    assert f["attention_share"] == 0 and f["rnn_share"] == pytest.approx(1 / 3)
    shares = dict(f["top20_ops"])
    assert shares["relu"] == pytest.approx(1 / 3) and shares["mul"] == pytest.approx(1 / 3)
    # linear, conv2d and mul are common ops, relu a building block; gru, cumsum and constant_pad_nd are exotic,
    # each in one task (ties go to the smaller name); three tasks, three op sets
    assert f["top_exotic_op"] in {"constant_pad_nd", "cumsum", "gru"} and f["top_exotic_op"] == "constant_pad_nd"
    assert f["top_exotic_op_share"] == pytest.approx(1 / 3)
    assert f["top_op_set_share"] == pytest.approx(1 / 3)
    assert (f["distinct_op_sets"], f["distinct_op_set_share"]) == (3, 1.0)
    assert f["internal_name_share"] == pytest.approx(1 / 3)
    assert f["n_transformers"] == 1 and f["transformers_models_import_share"] == 1.0
    checks = realism.check_targets(f)
    assert "top_other_op_share" not in checks and checks["distinct_op_set_share"]["pass"] is True
    assert checks["top_op_set_share"]["pass"] is False and checks["top_exotic_op_share"]["pass"] is False
    assert checks["batch_p50"]["pass"] is True and checks["largest_non_batch_p50"]["pass"] is False
    assert checks["transformers_models_import_share"]["pass"] is False


@pytest.mark.parametrize(("code", "labels", "found"), [
    ("y = x.index_copy(0, i, s)", [], []),
    ("y = torch.native_layer_norm(x, [8], w, b, 1e-5)", [], ["native_layer_norm"]),
    ("from torch.nn.functional import max_pool2d_with_indices as mp", [], ["max_pool2d_with_indices"]),
    ("y = x.permute_copy(1, 0)", [], ["permute_copy"]),
    ("y = torch._softmax(x, 1, False)", [], ["torch._softmax"]),
    ("y = x + 1", ["torch.slice_inverse", "nn.ReLU"], ["torch.slice_inverse"]),
])
def test_internal_names(code, labels, found):
    assert realism.internal_names(code, labels) == found


@pytest.mark.slow
def test_bad_rows_become_records_and_a_hang_a_timeout():
    hang = LINEAR.replace("def get_inputs():\n", "def get_inputs():\n    while True:\n        pass\n")
    assert hang != LINEAR
    rows = [ROWS[0], {"task_id": "bad", "code": "x = 1"}, ROWS[1], {"task_id": "hang", "code": hang}]
    recs = realism.measure_rows(rows, workers=1, timeout_s=5, progress=False)
    assert [r["status"] for r in recs] == ["ok", "load_error", "ok", "timeout"]
    assert recs[2]["input_bytes"] == (4 * 8 * 32 * 32 + 4 * 16 * 32 * 32) * 2
    f = realism.summarise(recs)
    assert f["n_built"] == 2 and math.isclose(f["low_precision_share"], 0.5)


def test_diversity_rule_of_multi_op_rows():
    """Issue #60: layout ops do not count (neither as ops nor in op sets), building blocks and the common ops
    may recur in any share, any other op is exotic; an op set is named by its sorted ops."""
    assert [realism.op_kind(o) for o in ("reshape", "transpose", "getitem", "to")] == ["layout"] * 4
    assert [realism.op_kind(o) for o in ("layer_norm", "batch_norm2d", "softmax", "gelu", "max_pool2d",
                                         "adaptive_avg_pool1d", "cat", "conv3d", "rsqrt", "si_lu")] == ["block"] * 10
    assert [realism.op_kind(o) for o in ("add", "matmul", "linear", "conv2d")] == ["common"] * 4
    assert [realism.op_kind(o) for o in ("cumsum", "scaled_dot_product_attention", "embedding")] == ["exotic"] * 3
    tasks = [["reshape", "layer_norm", "add"], ["layer_norm", "transpose", "add"], ["cumsum", "layer_norm"],
             ["view", "permute"], ["cumsum", "softmax"]]
    d = realism.diversity(tasks)
    assert d["top_exotic_op"] == "cumsum" and d["top_exotic_op_share"] == pytest.approx(2 / 5)
    assert d["top_op_set"] == "add + layer_norm" and d["top_op_set_share"] == pytest.approx(2 / 5)
    assert (d["distinct_op_sets"], d["distinct_op_set_share"]) == (4, pytest.approx(4 / 5))
    assert realism.op_set_name(realism.op_set(["view", "permute"])) == "(layout only)"
    assert realism.diversity([])["top_op_set_share"] is None
