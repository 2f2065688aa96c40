"""The composer's fast paths give exactly what the slow ones give: the meta-call memo, nn.Bilinear's meta
shape, graph inputs made without a random fill, and a motif's cost evaluated per sequence length."""

import random

import pytest
import torch
from opforge.compose.composer import ComposeConfig, compose
from opforge.compose.device_profiles import get_profile
from opforge.compose.graphs import graph as graph_module
from opforge.compose.graphs.cost_model import graph_cost
from opforge.compose.graphs.graph import _meta_input, _MetaMemo, bilinear_meta
from opforge.compose.graphs.sampler import Sampler, SamplingError
from opforge.compose.motifs.library import load_motifs
from opforge.compose.motifs.sizing import MotifCost
from opforge.seeds.seed_op import TensorSpec
from opforge.seeds.tensors import make_tensor


def _meta(t: torch.Tensor) -> tuple:
    return tuple(t.shape), t.stride(), t.storage_offset(), t.dtype, t.requires_grad, t.is_leaf


def test_motif_cost_per_sequence_is_bit_identical_to_the_per_call_methods():
    motifs = load_motifs()
    rng = random.Random(3)
    p = get_profile("h200")
    for m in rng.sample(motifs, 40):
        cost = MotifCost(m)
        for dtype in ("float32", "bfloat16"):
            for s in ([128, 2048] if m.seq else [0]):
                for b, inputs, alive, t in cost.at_seq(s, [1, 3, 64], dtype, p):
                    assert inputs == cost.input_bytes(b, s, dtype)
                    assert alive == cost.peak_bytes(b, s, dtype)
                    ops = cost.op_costs(b, s, dtype)  # the rule written out: roofline per op plus launches
                    peak, bw = p.peak_for(dtype) * p.flop_efficiency, p.bandwidth * p.bandwidth_efficiency
                    assert t == sum(1e3 * max(f / peak, by / bw) + p.launch_overhead_ms for f, by in ops)
                    assert t == cost.predict_ms(b, s, dtype, p)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bilinear_meta_shape_is_the_modules(bias, dtype):
    for lead, (i1, i2, o) in [((4,), (5, 3, 7)), ((2, 6), (8, 8, 16)), ((3, 2, 5), (4, 9, 2))]:
        m = torch.nn.Bilinear(i1, i2, o, bias=bias, device="meta").to(dtype)
        x1, x2 = (torch.empty(*lead, n, device="meta", dtype=dtype) for n in (i1, i2))
        init = {"in1_features": i1, "in2_features": i2, "out_features": o, "bias": bias}
        assert _meta(bilinear_meta([x1, x2], init, dtype)) == _meta(m(x1, x2))
    x = torch.empty(4, 5, device="meta")
    init = {"in1_features": 5, "in2_features": 5, "out_features": 3}
    assert bilinear_meta([x, x.to(torch.float16)], init, torch.float32) is None  # the module raises: run it
    assert bilinear_meta([x[:1], x[:1]], init, torch.float32) is None  # a size-1 dim: run it


def test_meta_inputs_match_make_tensor():
    for values in ("normal", "unit", "positive", "bool"):
        for dtype in ("float32", "int64", "bool"):
            for shape in [(3, 4), (1, 5, 1), (0, 3), ()]:
                ref = make_tensor(TensorSpec(shape=[1], dtype=dtype, values=values), shape, {}, "meta")
                assert _meta(_meta_input(dtype, values, shape)) == _meta(ref)
    assert _meta_input("float32", "index:7", (3,)) is None


def _graphs(harvested, n: int, seed: int = 0):
    sampler = Sampler(harvested.ops, get_profile("test"))
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        try:
            out.append(sampler.sample(rng, rng.choice([2, 3, 4]), rng.choice(["float32", "bfloat16"]))[0])
        except SamplingError:
            continue
    return out


def test_memo_answers_as_a_fresh_run(harvested, monkeypatch):
    memo = _MetaMemo()
    monkeypatch.setattr(graph_module, "_MEMO", memo)
    for g in _graphs(harvested, 12):
        for sizes in (g.sizes, {**g.sizes, "batch_size": 2 * g.sizes.get("batch_size", 1)}):
            cold = graph_cost(g, sizes)
            warm = graph_cost(g, sizes)  # every call answered by the memo
            assert cold == warm
            first = {n: _meta(t) for n, t in g.run("meta", sizes, op_flops={}).items()}
            again = {n: _meta(t) for n, t in g.run("meta", sizes, op_flops={}).items()}
            assert first == again
    assert memo.entries and all(e[0] in ("ok", "error") for e in memo.entries.values())


def test_memo_reraises_a_recorded_failure():
    memo = _MetaMemo()
    memo.put_error(("k",), ValueError("bad sizes"))
    with pytest.raises(ValueError, match="bad sizes"):
        memo.get(("k",), count=False)
    assert memo.get(("other",), count=True) is None


def test_composition_is_the_same_with_the_memo_off_cold_and_warm(harvested, monkeypatch):
    cfg = ComposeConfig(n=30, seed=9, device_profile="test", motif_share=0.0)
    monkeypatch.setattr(graph_module, "_MEMO", _MetaMemo())
    cold = compose(harvested.ops, cfg, progress=False)
    warm = compose(harvested.ops, cfg, progress=False)
    off = _MetaMemo()
    monkeypatch.setattr(off, "get", lambda key, count: None)
    monkeypatch.setattr(graph_module, "_MEMO", off)
    plain = compose(harvested.ops, cfg, progress=False)
    assert cold.equals(warm) and cold.equals(plain)
