"""The ``trivial`` filter (filters/trivial.py, filters/ablation.py): identity outputs, ops that change
nothing, one op that is the whole task's kernel time."""

from __future__ import annotations

import pytest
import torch
from opforge.engine.execution import INPUT_SEED, TaskRun, same_inputs
from opforge.filters.ablation import trace_task
from opforge.filters.chain import FILTER_NAMES, FilterSettings, make_chain, run_chain
from opforge.filters.trivial import TrivialFilter

from .filter_tasks import (
    BF16_NOOP,
    BF16_TASK,
    GOOD,
    INPLACE,
    NONTRIVIAL,
    RELU_NOOP_ON_ONE_DRAW,
    TRIVIAL,
    UNTRACEABLE,
    task,
)


@pytest.fixture(scope="module")
def chain():
    """The chain up to and including ``trivial`` (compile and runtime left out: not what is tested)."""
    return make_chain(FilterSettings(skip=["contamination", "compile", "runtime"]))


def test_trivial_sits_between_degenerate_and_compile():
    names = list(FILTER_NAMES)
    assert names.index("degenerate") < names.index("trivial") < names.index("compile")
    assert "trivial" in FilterSettings(only=["trivial"]).names()
    assert "trivial" not in FilterSettings(skip=["trivial"]).names()


@pytest.mark.parametrize("name", sorted(TRIVIAL))
def test_trivial_tasks_are_rejected_with_the_op_named(name, chain):
    reason, code, ops = TRIVIAL[name]
    res = run_chain(TaskRun(code, name), chain)
    assert res["reason"] == reason, (res["reason"], res["metrics"].get("trivial"))
    assert res["filter"] == "trivial"
    m = res["metrics"]["trivial"]
    if reason == "trivial:noop":
        named = [[o["op"] for o in a["ops"]] for a in m["removable"]]
        assert ops in named, named
        for a in m["removable"]:  # both draws within the tolerance, the op's source line found
            assert a["err"] <= 1.0 and a["err_alt"] <= 1.0
            assert all(o["line"] and o["node"] for o in a["ops"])
    else:
        assert any(p["err"] <= 1.0 and p["err_alt"] <= 1.0 for p in m["identity"])


def test_batchnorm_with_default_statistics_is_within_tolerance_but_not_exact(chain):
    _, code, _ = TRIVIAL["batchnorm_default_stats"]
    m = run_chain(TaskRun(code, "bn"), chain)["metrics"]["trivial"]
    (bn,) = [a for a in m["removable"] if a["ops"][0]["op"] == "BatchNorm1d"]
    assert 0.0 < bn["err"] < 0.01  # x / sqrt(1 + eps): ~5e-6 relative, far inside 1e-2


@pytest.mark.parametrize("name", sorted(NONTRIVIAL))
def test_tasks_where_every_op_matters_are_accepted(name, chain):
    res = run_chain(TaskRun(NONTRIVIAL[name], name), chain)
    assert res["accepted"], (res["reason"], res["metrics"].get("trivial"))
    m = res["metrics"]["trivial"]
    assert m["trace_error"] is None and m["op_count"] >= 2
    assert m["ablation_calls"] >= m["op_count"] - 1  # every op but exempt plumbing was tried
    assert m["removable"] == [] and all(a["err"] > 1.0 for a in m["ablations"])
    assert "top_share" not in m  # CPU: the dominated rule does not apply


def test_a_bf16_task_with_a_noop_is_rejected_at_the_bf16_tolerance(chain):
    res = run_chain(TaskRun(BF16_NOOP, "bf16"), chain)
    assert res["reason"] == "trivial:noop"
    assert res["metrics"]["eager"]["outputs"][0]["dtype"] == "bfloat16"


def test_a_noop_on_one_input_draw_only_is_not_rejected(chain):
    res = run_chain(TaskRun(RELU_NOOP_ON_ONE_DRAW, "one_draw"), chain)
    assert res["accepted"], res["reason"]
    (relu,) = [a for a in res["metrics"]["trivial"]["ablations"] if a["ops"][0]["op"] == "torch.relu"]
    assert relu["err"] == 0.0 and relu["err_alt"] > 1.0  # removable on the first draw, not the second


def test_an_untraceable_forward_is_not_judged_by_ablation(chain):
    res = run_chain(TaskRun(UNTRACEABLE, "untraceable"), chain)
    assert res["accepted"], res["reason"]
    m = res["metrics"]["trivial"]
    assert "TraceError" in m["trace_error"] and m["ablations"] == []


def test_ablation_leaves_the_inputs_as_drawn_when_the_task_writes_in_place(chain):
    run = TaskRun(INPLACE, "inplace")
    names = [f.name for f in chain]
    chain_until = chain[:names.index(TrivialFilter.name) + 1]
    res = run_chain(run, chain_until)
    assert res["metrics"]["trivial"]["ablation_calls"] > 0
    assert same_inputs(run.inputs, run.draw_inputs(INPUT_SEED))


def test_tracing_puts_back_what_forward_stores_on_the_module():
    class Caching(torch.nn.Module):
        def forward(self, x):
            self.last = x
            return x * 2

    model = Caching()
    model.last = None
    traced = trace_task(model)
    assert model.last is None and len(list(traced.gm.graph.nodes)) == 3


def _metrics(share, op_count):
    return {"identity": [], "ablations": [], "op_count": op_count, "top_share": share, "trace_error": None}


def test_dominated_decision_needs_two_ops_and_the_share_threshold():
    f = TrivialFilter()
    assert f.decide(_metrics(0.995, 3)).reason == "trivial:dominated"
    assert f.decide(_metrics(0.98, 3)).accepted
    assert f.decide(_metrics(1.0, 1)).accepted  # a single-op task is never "dominated"
    assert f.decide({k: v for k, v in _metrics(None, 3).items() if k != "top_share"}).accepted  # CPU
    assert TrivialFilter(max_share=0.9).decide(_metrics(0.95, 2)).reason == "trivial:dominated"


def _timed(share, op, op_count=3):
    return {**_metrics(share, op_count), "top_op": {"op": op, "node": "n", "line": "v = ..."}}


def test_a_heavy_op_holding_most_of_the_kernel_time_is_dominated():
    f = TrivialFilter()
    for label, heavy in (("Linear", "gemm"), ("@", "gemm"), ("torch.bmm", "gemm"), ("ConvTranspose2d", "conv"),
                         ("F.conv1d", "conv"), ("F.scaled_dot_product_attention", "attention"),
                         ("MultiheadAttention", "attention"), ("LSTM", "rnn")):
        verdict = f.decide(_timed(0.65, label))
        assert verdict.reason == "trivial:dominated" and verdict.metrics["top_heavy"] == heavy, label
        assert f.decide(_timed(0.55, label)).accepted, label  # below the heavy-op bound
        assert f.decide(_timed(0.9, label, op_count=1)).accepted, label  # one op: nothing to fuse around it
    for label in ("LayerNorm", "F.softmax", "torch.cumsum", "+"):  # a kernel can beat these: only the 99 % rule
        verdict = f.decide(_timed(0.9, label))
        assert verdict.accepted and verdict.metrics["top_heavy"] is None, label
        assert f.decide(_timed(0.995, label)).reason == "trivial:dominated", label
    assert TrivialFilter(max_heavy_share=None).decide(_timed(0.9, "Linear")).accepted
    assert TrivialFilter(max_heavy_share=0.8).decide(_timed(0.7, "Linear")).accepted


def test_only_trivial_builds_the_task_itself():
    res = run_chain(TaskRun(TRIVIAL["relu_after_relu"][1], "only"), make_chain(FilterSettings(only=["trivial"])))
    assert res["reason"] == "trivial:noop" and list(res["metrics"]) == ["static", "trivial"]


def test_the_positive_control_passes(chain):
    res = run_chain(TaskRun(GOOD, "good"), chain)
    assert res["accepted"] and res["metrics"]["trivial"]["op_count"] == 3


# one 8192^3 matmul (~1.1 TFLOP, milliseconds on an H100) next to a transpose view and ops on a 64 x 64 slice
DOMINATED = GOOD.replace("return torch.relu(self.lin(x)) * 2.0",
                         "return torch.relu((x @ x.transpose(-1, -2))[:64, :64]) + 1.0").replace(
    "torch.randn(16, 32)", "torch.randn(8192, 8192)")
BALANCED = GOOD.replace("torch.randn(16, 32)", "torch.randn(4096, 32)").replace(
    "return torch.relu(self.lin(x)) * 2.0", "return torch.tanh(torch.exp(x) * 2.0)")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_one_op_taking_the_kernel_time_is_dominated_on_cuda():
    cuda = make_chain(FilterSettings(device="cuda", skip=["contamination", "compile", "runtime"],
                                     runtime_window_ms=None))
    res = run_chain(TaskRun(DOMINATED, "dominated", "cuda"), cuda)
    assert res["reason"] == "trivial:dominated", res["metrics"].get("trivial")
    assert res["metrics"]["trivial"]["top_op"]["op"] == "@"
    res = run_chain(TaskRun(BALANCED, "balanced", "cuda"), cuda)
    assert res["accepted"], res["metrics"].get("trivial")
    assert 0 < res["metrics"]["trivial"]["top_share"] < 0.99


def test_filter_help_names_every_filter():
    from opforge.pipeline.cli import app
    from typer.testing import CliRunner

    res = CliRunner().invoke(app, ["filter", "--help"], env={"COLUMNS": "400", "TERM": "dumb"})
    assert res.exit_code == 0
    text = " ".join(res.output.split())
    for name in FILTER_NAMES:
        assert name in text, name


# A written-out RMSNorm (trained-like weight): taking out its ``+ 1e-6`` changes the output by ~1e-5 of the
# tolerance, but the constant keeps rsqrt finite: it is part of the computation.
_TRAINED_W = "        self.w = nn.Parameter(torch.randn(n) * 0.1 + 1.0)"
SAFETY = {
    "rmsnorm": task("        y = self.lin(x)\n"
                    "        return y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w", init=_TRAINED_W),
    "rmsnorm_eps_argument": task("        y = self.lin(x)\n"
                                 "        v = y.pow(2).mean(-1, keepdim=True)\n"
                                 "        return y * (v + self.eps).rsqrt() * self.w",
                                 init=_TRAINED_W + "\n        self.eps = eps",
                                 init_inputs="[32, 1e-5]").replace("def __init__(self, n):",
                                                                    "def __init__(self, n, eps):"),
    "l2_normalise": task("        y = self.lin(x)\n        return torch.tanh(y / (y.norm(dim=-1, keepdim=True) + 1e-8))"),
    "log_softmax_eps": task("        return torch.log(torch.softmax(self.lin(x), dim=-1) + 1e-9) * 0.5"),
    "clamped_log": task("        return torch.log(torch.clamp(torch.sigmoid(self.lin(x)), 1e-7, 1 - 1e-7)) * x"),
}


@pytest.mark.parametrize("name", sorted(SAFETY))
def test_a_numerical_safety_constant_is_kept(name, chain):
    res = run_chain(TaskRun(SAFETY[name], name), chain)
    assert res["accepted"], (res["reason"], res["metrics"].get("trivial"))
    tried = [o for a in res["metrics"]["trivial"]["ablations"] for o in a["ops"]]
    assert len(tried) >= 3  # the other ops were tried
    kept = [o for o in tried if o["op"] in ("+", "torch.clamp") and ("1e-" in o["line"] or "self.eps" in o["line"])]
    assert not kept, kept  # the safety constant was never taken out


def test_without_the_safety_rule_the_rmsnorm_eps_would_be_a_noop():
    run = TaskRun(SAFETY["rmsnorm"], "rmsnorm")
    chain = make_chain(FilterSettings(only=["trivial"], thresholds={"trivial": {"max_eps": 0.0}}))
    res = run_chain(run, chain)
    assert res["reason"] == "trivial:noop"
    assert [o["op"] for a in res["metrics"]["trivial"]["removable"] for o in a["ops"]] == ["+"]


# Pure copies: name -> (forward, the op the metrics must name as the no-op)
COPIES = {
    "clone": ("        return torch.relu(self.lin(x)).clone() * 2.0", "Tensor.clone"),
    "torch_clone": ("        return torch.clone(torch.tanh(self.lin(x)))", "torch.clone"),
    "detach": ("        return torch.tanh(self.lin(x).detach()) - x", "Tensor.detach"),
    "contiguous_of_contiguous": ("        return torch.tanh(self.lin(x)).contiguous() + x", "Tensor.contiguous"),
    "to_same_dtype": ("        return torch.sigmoid(self.lin(x).to(torch.float32)) * x", "Tensor.to"),
    "float_on_float32": ("        return torch.sigmoid(self.lin(x)).float() * x", "Tensor.float"),
    "copy_into_fresh": ("        y = torch.tanh(self.lin(x))\n        return torch.zeros_like(y).copy_(y) * x",
                        "Tensor.copy_"),
}


@pytest.mark.parametrize("name", sorted(COPIES))
def test_a_pure_copy_is_a_noop(name, chain):
    forward, op = COPIES[name]
    res = run_chain(TaskRun(task(forward), name), chain)
    assert res["reason"] == "trivial:noop", (res["reason"], res["metrics"].get("trivial"))
    named = [[o["op"] for o in a["ops"]] for a in res["metrics"]["trivial"]["removable"]]
    assert [op] in named, named


def test_a_copy_that_lays_the_data_out_anew_or_casts_is_kept(chain):
    layout = task("        return torch.tanh(self.lin(x).transpose(0, 1).contiguous()) @ x")
    res = run_chain(TaskRun(layout, "layout"), chain)
    assert res["accepted"], (res["reason"], res["metrics"].get("trivial"))
    cast = BF16_TASK.replace("RELU(y * 1.5 + x)", "torch.tanh((y * 1.5 + x).float())")
    res = run_chain(TaskRun(cast, "cast"), chain)
    assert res["accepted"], (res["reason"], res["metrics"].get("trivial"))
