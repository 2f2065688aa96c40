"""Roofline of a task (task/roofline.py): FLOPs and bytes per op on meta, per-op and fused times, fusion gain."""

from __future__ import annotations

import pytest
from opforge.task.peaks import DEFAULT_PEAKS, H100_SXM, H200_SXM, get_peaks, peaks_for_gpu
from opforge.task.roofline import RooflineError, footprint, roofline
from opforge.task.source import load_task

from .paths import OPS6K, needs_shared


def task(forward: str, init: str = "", inputs: str = "[torch.randn(B, N)]", args: str = "x",
         consts: str = "B, N = 64, 256") -> str:
    return f'''import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, *args):
        super().__init__()
{init or "        pass"}

    def forward(self, {args}):
{forward}


{consts}


def get_inputs():
    return {inputs}


def get_init_inputs():
    return []
'''


B, N, K = 64, 256, 512
S = B * N * 4  # bytes of one (B, N) float32 tensor


def test_linear_flops_and_bytes_are_the_gemm_and_its_operands():
    code = task("        return self.lin(x)", init=f"        self.lin = nn.Linear({N}, {K})")
    r = roofline(code)
    (op,) = r.ops
    assert op.label == "nn.Linear" and op.dtype == "float32"
    assert op.flops == r.flops == 2 * B * N * K
    want_bytes = 4 * (B * N + K * N + K + B * K)  # input, weight, bias, output
    assert op.bytes == r.bytes == want_bytes
    assert op.ms == pytest.approx(1e3 * max(2 * B * N * K / 67e12, want_bytes / 4.8e12))
    assert r.fusion_gain == pytest.approx(1.0)


def test_an_elementwise_chain_reads_and_writes_every_intermediate_once_per_op():
    code = task("        return torch.tanh(torch.relu(x) * 2.0 + y)", inputs="[torch.randn(B, N), torch.randn(B, N)]",
                args="x, y")
    r = roofline(code)
    assert [o.label for o in r.ops] == ["torch.relu", "Tensor.mul", "Tensor.add", "torch.tanh"]
    assert [o.bytes for o in r.ops] == [2 * S, 2 * S, 3 * S, 2 * S]
    assert r.flops == 0 and r.bound == "memory"
    assert r.bytes == 3 * S  # x and y read, the output written
    assert r.per_op_ms == pytest.approx(1e3 * 9 * S / 4.8e12)
    assert r.roofline_ms == pytest.approx(1e3 * 3 * S / 4.8e12)
    assert r.fusion_gain == pytest.approx(3.0)


def test_a_single_elementwise_op_has_nothing_to_fuse():
    r = roofline(task("        return torch.sigmoid(x)"))
    assert r.bytes == 2 * S and r.fusion_gain == pytest.approx(1.0)


def test_views_and_same_dtype_casts_move_no_data_and_a_layout_copy_does():
    r = roofline(task("        y = x.view(B, 2, N // 2).float().contiguous().transpose(0, 1)\n"
                      "        return y.contiguous() * 3.0"))
    by_label = {o.label: o.bytes for o in r.ops}
    assert by_label["Tensor.view"] == by_label["Tensor.float"] == by_label["Tensor.transpose"] == 0
    assert [o.bytes for o in r.ops if o.label == "Tensor.contiguous"] == [0, 2 * S]  # the second one copies
    assert r.bytes == 2 * S and r.fusion_gain == pytest.approx(2.0)


def test_a_broadcast_bias_is_read_at_its_own_size():
    r = roofline(task("        return x + self.b", init=f"        self.b = nn.Parameter(torch.randn({N}))"))
    assert r.ops[0].bytes == 2 * S + 4 * N and r.bytes == 2 * S + 4 * N


def test_integer_inputs_and_a_tuple_output():
    code = task("        e = self.emb(x)\n        return e.sum(-1), e.amax(-1)",
                init=f"        self.emb = nn.Embedding(50000, {N})", inputs="[torch.randint(0, 50000, (B, 16))]")
    r = roofline(code)
    emb, s, m = r.ops
    out = B * 16 * N * 4
    assert emb.bytes == B * 16 * 8 + out + out  # indices, the rows gathered (not the whole table), output
    assert s.bytes == m.bytes == out + B * 16 * 4
    assert r.bytes == B * 16 * 8 + out + 2 * B * 16 * 4
    assert r.fusion_gain > 1.5


def test_in_place_ops_count_the_tensor_they_write():
    r = roofline(task("        y = torch.exp(x)\n        y.mul_(2.0)\n        return torch.relu_(y)"))
    assert [o.bytes for o in r.ops] == [2 * S, 2 * S, 2 * S]
    assert r.bytes == 2 * S and r.fusion_gain == pytest.approx(3.0)
    r = roofline(task("        x.add_(1.0)\n        return x"))  # the input written in place is the output
    assert r.ops[0].bytes == 2 * S and r.bytes == 2 * S


def test_an_input_handed_back_unchanged_is_not_written():
    r = roofline(task("        return x, torch.relu(x)"))
    assert r.bytes == 2 * S


def test_module_buffers_are_read_and_bf16_uses_the_tensor_core_peak():
    code = task("        return self.bn(self.conv(x))",
                init="        self.conv = nn.Conv2d(16, 32, 3, padding=1, dtype=torch.bfloat16)\n"
                     "        self.bn = nn.BatchNorm2d(32, dtype=torch.bfloat16)",
                inputs="[torch.randn(8, 16, 32, 32, dtype=torch.bfloat16)]")
    r = roofline(code)
    conv, bn = r.ops
    assert conv.dtype == "bfloat16" and conv.flops == 2 * 8 * 32 * 32 * 32 * 16 * 9
    act = 8 * 32 * 32 * 32 * 2
    assert bn.bytes == 2 * act + 4 * 32 * 2  # input, output, weight, bias, running mean and variance
    assert conv.ms == pytest.approx(max(1e3 * conv.flops / 989e12, 1e3 * conv.bytes / 4.8e12))


def test_lstm_flops_come_from_its_weight_matrices():
    code = task("        return self.rnn(x)[0]", init="        self.rnn = nn.LSTM(32, 64, batch_first=True)",
                inputs="[torch.randn(4, 10, 32)]")
    r = roofline(code)
    assert r.ops[0].label == "nn.LSTM"
    assert r.flops == 2 * 4 * 10 * (4 * 64 * 32 + 4 * 64 * 64)


def test_peaks_change_the_times_not_the_counts():
    code = task("        return torch.relu(x) + 1.0")
    a, b = roofline(code, peaks=H200_SXM), roofline(code, peaks=H100_SXM)
    assert a.bytes == b.bytes and a.peaks == "h200" and b.peaks == "h100"
    assert b.roofline_ms == pytest.approx(a.roofline_ms * 4.8 / 3.35)
    assert a.fusion_gain == pytest.approx(b.fusion_gain)


def test_peaks_by_name_and_gpu_model():
    assert DEFAULT_PEAKS is H200_SXM and H200_SXM.bandwidth == 4.8e12 and H100_SXM.bandwidth == 3.35e12
    assert H200_SXM.peak_for("bfloat16") == 989e12 and H200_SXM.peak_for("float32") == 67e12
    assert H200_SXM.peak_for("int64") == 67e12  # unlisted: the float32 peak
    assert peaks_for_gpu("NVIDIA H200") is H200_SXM and peaks_for_gpu("NVIDIA H100 80GB HBM3") is H100_SXM
    assert peaks_for_gpu("NVIDIA A100-SXM4-80GB") is None and get_peaks("H100") is H100_SXM
    with pytest.raises(ValueError, match="unknown device peaks"):
        get_peaks("tpu")


def test_a_loaded_task_works_and_the_footprint_skips_broadcast_dims():
    import torch

    loaded = load_task(task("        return x * 2.0"), "t")
    assert roofline(loaded).bytes == 2 * S
    assert footprint(torch.empty(4, 1, device="meta").expand(4, 100)) == 16
    assert footprint(torch.empty(0, 3, device="meta")) == 0


def test_failures_raise_roofline_error_naming_the_task_and_stage():
    with pytest.raises(RooflineError, match="bad: forward on meta failed: NotImplementedError"):
        roofline(task("        return torch.nonzero(x)"), name="bad")
    with pytest.raises(RooflineError, match="missing top-level"):
        roofline("import torch\n", name="empty")
    with pytest.raises(RooflineError, match="build on meta failed: RuntimeError: no"):
        roofline(task("        return x", init="        raise RuntimeError('no')"))


@needs_shared
def test_ops6k_rows_are_measured():
    import pandas as pd

    rows = pd.read_parquet(OPS6K).iloc[:40]
    measured = 0
    for i, code in enumerate(rows["code"]):
        try:
            r = roofline(code, name=f"ops6k/{i}")
        except RooflineError as exc:  # only ops without a meta kernel (data-dependent shapes)
            assert "NotImplementedError" in str(exc), str(exc)
            continue
        measured += 1
        assert r.roofline_ms > 0 and r.per_op_ms >= r.roofline_ms * (1 - 1e-9), (i, r.as_metrics())
        assert r.ops and all(o.bytes >= 0 and o.flops >= 0 for o in r.ops)
    assert measured >= 36
