"""Axis roles of the random composer (``compose.graphs.axes``): misuses are rejected, dims are drawn from the roles an
op exists for, roles follow layout ops; composed candidates pass ``task.axis_misuse``; trained-like values keep
saturating ops in their working range on a real draw; op weights follow positions."""

import json
import random
from types import SimpleNamespace

import pytest
import torch
from opforge.compose.graphs.axes import (
    BATCH,
    CHANNEL,
    FEATURE,
    HEAD,
    SEQUENCE,
    SPATIAL,
    TEMPLATE_ROLES,
    UNIT,
    batch_stays_first,
    bind_dims,
    input_violation,
    output_roles,
    template_fits,
)
from opforge.compose.graphs.magnitude import out_rms, saturates

FN = SimpleNamespace(kind="function")
MOD = SimpleNamespace(kind="module")
NLC, NCHW, NHWC, NCL, NC = (TEMPLATE_ROLES[t] for t in ("NLC", "NCHW", "NHWC", "NCL", "NC"))

# (op name, seed kind, input roles, init args, call args): each is a misuse the issue names
MISUSES = [
    ("softmax", FN, NLC, {}, {"dim": 0}),
    ("softmax", MOD, NLC, {}, {}),  # nn.Softmax() on a 3-D input: implicit dim 0
    ("log_softmax", FN, NC, {}, {"dim": 0}),
    ("logsumexp", FN, NLC, {}, {"dim": 0}),
    ("cumsum", FN, NLC, {}, {"dim": 0}),
    ("cumsum", FN, NLC, {}, {"dim": -1}),  # a scan over features
    ("sort", FN, NLC, {}, {"dim": 0}),
    ("sort", FN, NLC, {}, {"dim": 1}),  # sorting sequence positions
    ("topk", FN, NC, {}, {"k": 2, "dim": 0}),
    ("max", FN, NLC, {}, {"dim": 0}),
    ("chunk", FN, NLC, {}, {"chunks": 2}),  # default dim 0
    ("gradient", FN, NCHW, {}, {}),  # every axis
    ("roll", FN, NLC, {}, {"shifts": 1}),  # flattened roll
    ("roll", FN, NLC, {}, {"shifts": 1, "dims": 0}),
    ("group_norm", MOD, NLC, {"num_groups": 4, "num_channels": 16}, {}),  # GroupNorm over sequence positions
    ("conv2d", MOD, NHWC, {}, {}),  # channel-last data into a channel-first op
    ("conv1d", FN, NLC, {}, {}),
    ("batch_norm2d", MOD, NHWC, {}, {}),
    ("avg_pool1d", FN, NLC, {}, {"kernel_size": 2}),
    ("max_pool2d", FN, NCL, {}, {"kernel_size": 2}),  # a rank-3 input read as an unbatched image
    ("unfold", MOD, NLC, {"kernel_size": 2}, {}),
    ("pixel_unshuffle", FN, NCL, {}, {"downscale_factor": 2}),
    ("linear", MOD, NCHW, {}, {}),  # Linear over a spatial width
    ("linear", FN, NCL, {}, {}),  # ... or over time steps
    ("layer_norm", FN, NCHW, {}, {"normalized_shape": [8]}),
    ("msort", FN, NC, {}, {}),
    ("flipud", FN, NC, {}, {}),
    ("mean", FN, NLC, {}, {"dim": 0}),
    ("lstm", MOD, NCL, {}, {}),
    ("scaled_dot_product_attention", FN, NCHW, {}, {}),
    ("triu", FN, NLC, {}, {}),  # a causal mask over [sequence, feature]
]
CORRECT = [
    ("softmax", FN, NLC, {}, {"dim": -1}),
    ("softmax", MOD, NLC, {"dim": 1}, {}),
    ("cumsum", FN, NLC, {}, {"dim": 1}),
    ("sort", FN, NLC, {}, {}),
    ("chunk", FN, NLC, {}, {"chunks": 2, "dim": -1}),
    ("roll", FN, NCHW, {}, {"shifts": 1, "dims": 2}),
    ("gradient", FN, NCHW, {}, {"dim": 3}),
    ("group_norm", MOD, NCHW, {"num_groups": 4, "num_channels": 16}, {}),
    ("conv2d", MOD, NCHW, {}, {}),
    ("conv1d", FN, [BATCH, FEATURE, SEQUENCE], {}, {}),  # a transposed NLC tensor: conv over the sequence
    ("linear", MOD, NHWC, {}, {}),  # a channel-last MLP
    ("linear", FN, NLC, {}, {}),
    ("layer_norm", FN, NLC, {}, {"normalized_shape": [8]}),
    ("batch_norm1d", MOD, NC, {}, {}),
    ("mean", FN, NCHW, {}, {"dim": [2]}),
    ("lstm", MOD, NLC, {}, {}),
    ("scaled_dot_product_attention", FN, TEMPLATE_ROLES["NALE"], {}, {}),
    ("triu", FN, [BATCH, SEQUENCE, SEQUENCE], {}, {}),
]


@pytest.mark.parametrize("case", MISUSES, ids=[f"{c[0]}-{i}" for i, c in enumerate(MISUSES)])
def test_misuse_is_rejected(case):
    name, seed, roles, init, call = case
    assert input_violation(name, seed, roles, init, call), case


@pytest.mark.parametrize("case", CORRECT, ids=[f"{c[0]}-{i}" for i, c in enumerate(CORRECT)])
def test_correct_use_passes(case):
    name, seed, roles, init, call = case
    assert input_violation(name, seed, roles, init, call) is None, case


ALLOWED = {"softmax": {FEATURE, SEQUENCE, CHANNEL}, "cumsum": {SEQUENCE, SPATIAL}, "cummax": {SEQUENCE},
           "sort": {FEATURE, CHANNEL}, "topk": {FEATURE, CHANNEL}, "roll": {SEQUENCE, SPATIAL},
           "sum": {FEATURE, CHANNEL, SEQUENCE, SPATIAL}, "glu": {FEATURE, CHANNEL, SEQUENCE, SPATIAL}}


@pytest.mark.parametrize("name", sorted(ALLOWED))
def test_dims_are_drawn_from_the_allowed_roles(name):
    rng = random.Random(0)
    for roles, shape in ((NLC, (4, 32, 64)), (NCHW, (4, 16, 8, 8)), (NC, (4, 64)), (NCL, (4, 8, 30))):
        drawn = set()
        for _ in range(40):
            bound = bind_dims(name, FN, roles, shape, {}, {}, rng)
            if bound is None:  # no allowed axis: the op is not drawn on this input
                assert not any(r in ALLOWED[name] for r in roles), (name, roles)
                break
            _, call, _ = bound
            dim = call["dims" if name == "roll" else "dim"]
            dim = dim[0] if isinstance(dim, list) else dim
            drawn.add(roles[dim])
            assert input_violation(name, FN, roles, {}, call) is None
        assert drawn <= ALLOWED[name] and BATCH not in drawn, (name, roles, drawn)


def test_module_dims_go_to_the_constructor_and_values_are_taken_from_tuples():
    init, call, attrs = bind_dims("softmax", MOD, NLC, (4, 32, 64), {}, {}, random.Random(1))
    assert "dim" in init and not call and NLC[init["dim"]] != BATCH
    _, call, attrs = bind_dims("max", FN, NLC, (4, 32, 64), {}, {}, random.Random(1))
    assert attrs == {"output_index": 0} and NLC[call["dim"]] in (FEATURE, CHANNEL)
    assert bind_dims("cummax", FN, NCHW, (4, 16, 8, 8), {}, {}, random.Random(0)) is None  # no sequence axis


def test_layout_ops_relabel_roles():
    shape = (4, 16, 8, 8)
    assert output_roles("transpose", FN, NLC, (4, 32, 64), (4, 64, 32), {}, {"dim0": 1, "dim1": 2}) == \
        [BATCH, FEATURE, SEQUENCE]
    assert output_roles("permute", FN, NCHW, shape, (4, 8, 8, 16), {}, {"dims": [0, 2, 3, 1]}) == \
        [BATCH, SPATIAL, SPATIAL, CHANNEL]
    assert output_roles("flatten", FN, NCHW, shape, (4, 16, 64), {}, {"start_dim": 2, "end_dim": -1}) == \
        [BATCH, CHANNEL, SEQUENCE]
    assert output_roles("flatten", MOD, NCHW, shape, (4, 1024), {}, {}) == [BATCH, FEATURE]
    assert output_roles("unflatten", FN, NLC, (4, 32, 64), (4, 32, 8, 8), {}, {"dim": 2, "sizes": [8, -1]}) == \
        [BATCH, SEQUENCE, HEAD, FEATURE]
    assert output_roles("sum", FN, NLC, (4, 32, 64), (4, 32), {}, {"dim": -1}) == [BATCH, SEQUENCE]
    assert output_roles("sum", FN, NLC, (4, 32, 64), (4, 32, 1), {}, {"dim": -1, "keepdim": True}) == \
        [BATCH, SEQUENCE, UNIT]
    assert output_roles("linear", MOD, NLC, (4, 32, 64), (4, 32, 128), {}, {}) == NLC
    assert output_roles("conv2d", MOD, NCHW, shape, (4, 32, 7, 7), {}, {}) == NCHW
    assert output_roles("bmm", FN, NLC, (4, 32, 64), (4, 32, 32), {}, {}) == [BATCH, SEQUENCE, SEQUENCE]
    assert output_roles("reshape", FN, NCHW, shape, (4, 16, 64), {}, {"shape": [-1, 16, 64]}) == \
        [BATCH, CHANNEL, SEQUENCE]


def test_batch_stays_first_alone():
    assert batch_stays_first((4, 32, 64), (3, 32, 64), 4, 3)
    assert not batch_stays_first((32, 4, 64), (32, 3, 64), 4, 3)  # moved
    assert not batch_stays_first((128, 64), (96, 64), 4, 3)  # merged with the sequence
    assert not batch_stays_first((32, 64), (32, 64), 4, 3)  # reduced away


def test_templates_fit_roles_for_layout_sensitive_ops_only():
    assert template_fits("NCL", [BATCH, FEATURE, SEQUENCE], "conv1d")
    assert not template_fits("NCL", NLC, "batch_norm1d")
    assert template_fits("NLC", NLC, "linear") and not template_fits("NCHW", NCHW, "linear")
    assert template_fits("NCL", NLC, "relu")  # elementwise ops take any template of the rank


def test_magnitudes_keep_saturating_ops_in_range():
    assert not saturates("sigmoid", out_rms("linear", [1.0], 768, 768))
    summed = out_rms("sum", [1.0], 4 * 768, 4)  # a sum over 768 unit-variance features
    assert summed > 20 and saturates("sigmoid", summed) and saturates("softmax", summed)
    assert saturates("tanh", out_rms("cumsum", [1.0], 1000, 1000, reduced=1000))
    assert not saturates("tanh", out_rms("layer_norm", [summed], 10, 10))  # a norm resets the scale
    assert not saturates("relu", summed)  # relu has no narrow working range


# ---- on the harvested catalog ----

@pytest.fixture(scope="module")
def candidates(harvested):
    from opforge.compose.composer import ComposeConfig, compose

    return compose(harvested.ops, ComposeConfig(n=150, seed=21, device_profile="test", op_mix="uniform",
                                                transformers_share=0.0, motif_share=0.0), progress=False)


def test_sampled_graphs_carry_roles_and_respect_them(harvested):
    from opforge.compose.device_profiles import get_profile
    from opforge.compose.graphs.axes import op_dims, op_name
    from opforge.compose.graphs.sampler import Sampler

    s = Sampler(harvested.ops, get_profile("test"))
    rng = random.Random(7)
    for _ in range(40):
        g, _ = s.sample(rng, rng.choice([2, 3, 4]))
        vals = g.run("meta")
        for n in [*g.inputs(), *g.ops()]:
            roles = g.g.nodes[n]["roles"]
            assert len(roles) == vals[n].dim() and (roles[0] == BATCH or n.startswith("in"))
        for n in g.ops():
            a, seed, src = g.g.nodes[n], g.seeds[n], g.args_of(n)[0]
            name = op_name(a["label"])
            assert input_violation(name, seed, g.g.nodes[src]["roles"], a["init_args"], a["call_args"]) is None
            dims = op_dims(name, seed, a["init_args"], a["call_args"], vals[src].dim())
            assert dims != [] and not any(g.g.nodes[src]["roles"][d] == BATCH for d in dims or [])


def test_composed_candidates_misuse_no_axis(candidates):
    from opforge.task.axis_misuse import axis_misuse

    checks = [axis_misuse(r.code, r.task_id) for r in candidates.itertuples()]
    misused = [(r.task_id, c.reasons) for r, c in zip(candidates.itertuples(), checks, strict=True) if c]
    assert len(misused) <= 0.01 * len(candidates), misused[:5]
    assert sum(c.misused is None for c in checks) <= 0.05 * len(candidates)


def test_composed_candidates_read_every_parameter(candidates):
    from opforge.task.source import load_task

    for r in candidates.head(60).itertuples():
        if any(op in r.ops for op in ("LSTM", "GRU", "RNN")):
            continue  # recurrent meta kernels run one step per time step: slow here, read by construction
        task = load_task(r.code, r.task_id)
        with torch.device("meta"):
            model, inputs = task.build().eval(), task.inputs()
        params = [(k, p) for k, p in model.named_parameters() if p.is_floating_point()]
        if not params:
            continue
        out = model(*inputs)
        outs = [o for o in (out if isinstance(out, (tuple, list)) else [out]) if isinstance(o, torch.Tensor)]
        total = sum(o.float().sum() for o in outs if o.is_floating_point())
        grads = torch.autograd.grad(total, [p for _, p in params], allow_unused=True)
        unread = [k for (k, _), g in zip(params, grads, strict=True) if g is None]
        assert not unread, (r.task_id, unread)


def _linear_sigmoid_task(harvested, scaled: bool) -> str:
    """F.linear (768 -> 768 features) -> sigmoid, rendered by the composer."""
    from opforge.compose.graphs.graph import OpGraph
    from opforge.compose.graphs.render import render_graph

    ops = {o.label: o for o in harvested.ops}
    g = OpGraph(sizes={"batch_size": 4, "seq_len": 64, "channels": 768})
    x = g.add_input(["batch_size", "seq_len", "channels"])
    lin = g.add_op(ops["F.linear"], [x], {}, {}, {"weight": ([768, 768], "float32", "normal"),
                                                 "bias": ([768], "float32", "normal")})
    g.add_op(ops["torch.sigmoid"], [lin], {}, {}, {})
    code = render_graph(g, "linear -> sigmoid")
    return code if scaled else code.replace(" / 768 ** 0.5", "")


@pytest.mark.parametrize("scaled", [True, False])
def test_sigmoid_after_a_gemm_does_not_saturate_on_a_real_draw(harvested, scaled):
    """Fan-in scaled weights keep the sigmoid's input near unit scale: under 1 % of its outputs lie within 1e-3
    of 0 or 1 (the unscaled randn weights of earlier releases put most of them there)."""
    from opforge.task.source import load_task

    code = _linear_sigmoid_task(harvested, scaled)
    assert ("768 ** 0.5" in code) == scaled
    task = load_task(code, "linear-sigmoid")
    torch.manual_seed(0)
    with torch.no_grad():
        out = task.build().eval()(*task.inputs())
    saturated = ((out < 1e-3) | (out > 1 - 1e-3)).float().mean().item()
    if scaled:
        assert saturated < 0.01, saturated
    else:
        assert saturated > 0.3, saturated


def test_saturating_ops_of_composed_candidates_stay_in_range(candidates):
    """On a real draw of the composed candidates, the outputs of sigmoid and tanh are rarely at their bounds."""
    from opforge.task.source import load_task
    from torch.overrides import TorchFunctionMode

    outs = []

    class Capture(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if getattr(func, "__name__", "") in ("sigmoid", "tanh") and isinstance(out, torch.Tensor):
                outs.append(out.detach().float().abs())
            return out

    for r in candidates.itertuples():
        if not any(op in json.loads(r.ops) for op in ("torch.sigmoid", "F.sigmoid", "nn.Sigmoid", "torch.tanh",
                                                      "F.tanh", "nn.Tanh")):
            continue
        task = load_task(r.code, r.task_id)
        torch.manual_seed(0)
        with torch.no_grad(), Capture():
            task.build().eval()(*task.inputs())
    assert outs, "no candidate ran a sigmoid or tanh"
    near_bound = [((o - 1).abs() < 1e-3).float().mean().item() for o in outs]  # |tanh| or sigmoid near 1
    assert sum(near_bound) / len(near_bound) < 0.02, near_bound


def test_special_functions_are_weighted_by_position(harvested):
    from opforge.compose.device_profiles import get_profile
    from opforge.compose.graphs.positions import PositionTable
    from opforge.compose.graphs.sampler import Sampler

    s = Sampler(harvested.ops, get_profile("test"))
    assert s.position_weights["producer"]["torch.i0"] == 0.0
    assert s.position_weights["epilogue"]["torch.i0"] < 0.05 * s.weights["torch.i0"]
    assert s.position_weights["head"]["torch.i0"] > s.position_weights["epilogue"]["torch.i0"]
    assert s.position_weights["epilogue"]["torch.relu"] == s.weights["torch.relu"]
    rng = random.Random(0)
    firsts = {s._pick(rng, s.starters, position="producer").label for _ in range(2000)}
    assert "torch.i0" not in firsts and "torch.rad2deg" not in firsts
    flat = Sampler(harvested.ops, get_profile("test"), positions=PositionTable())
    assert flat.position_weights["producer"]["torch.i0"] == flat.weights["torch.i0"]
