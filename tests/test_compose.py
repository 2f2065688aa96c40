import json
import random

import pytest
import torch
from opforge.compose.composer import ComposeConfig, compose
from opforge.compose.device_profiles import get_profile
from opforge.compose.graphs.graph import OpGraph
from opforge.compose.graphs.sampler import Sampler, SamplingError, parse_op_mix
from opforge.compose.labels import labels_match, recovered_labels
from opforge.filters.runtime import measure_eager_ms
from opforge.task.identity import task_id_for
from opforge.task.source import load_task


@pytest.fixture(scope="module")
def test_candidates(harvested):
    return compose(harvested.ops, ComposeConfig(n=250, seed=11, device_profile="test", op_mix="uniform",
                                                transformers_share=0.05), progress=False)


def test_same_seed_is_byte_identical_and_seeds_differ(harvested):
    a = compose(harvested.ops, ComposeConfig(n=40, seed=5, device_profile="test"), progress=False)
    b = compose(harvested.ops, ComposeConfig(n=40, seed=5, device_profile="test"), progress=False)
    c = compose(harvested.ops, ComposeConfig(n=40, seed=6, device_profile="test"), progress=False)
    assert a.equals(b)
    assert len(set(a.task_id) & set(c.task_id)) < 5


def test_every_task_runs_on_meta_and_cpu_at_test_size(test_candidates):
    failures = []
    for row in test_candidates.itertuples():
        try:
            task = load_task(row.code, row.task_id)
            with torch.device("meta"):
                task.build()(*task.inputs())
            torch.manual_seed(0)
            with torch.no_grad():
                out = task.build().eval()(*task.inputs())
            assert isinstance(out, torch.Tensor) or isinstance(out[0], torch.Tensor)
        except Exception as exc:  # collect all, report a few
            failures.append((row.task_id, json.loads(row.ops), f"{type(exc).__name__}: {exc}"[:200]))
    assert not failures, failures[:5]


def test_labels_are_exactly_the_traced_ops(test_candidates):
    torch_rows = test_candidates[test_candidates.data_source != "transformers"]
    bad = [(r.task_id, r.ops, [x[0] for x in recovered_labels(r.code)]) for r in torch_rows.itertuples()
           if not labels_match(r.code, json.loads(r.ops))]
    assert not bad, bad[:5]
    for r in torch_rows.itertuples():
        assert r.data_source == f"torch#{len(json.loads(r.ops))}" and r.num_ops == len(json.loads(r.ops))
        assert r.task_id == task_id_for(r.code)


def test_transformers_rows_name_their_module(test_candidates):
    rows = test_candidates[test_candidates.data_source == "transformers"]
    assert len(rows) > 0
    for r in rows.itertuples():
        (label,) = json.loads(r.ops)
        assert f"self.block = {label}(" in r.code


def test_label_check_catches_a_wrong_label(test_candidates):
    row = test_candidates[test_candidates.num_ops == 2].iloc[0]
    ops = json.loads(row.ops)
    assert labels_match(row.code, ops)
    assert not labels_match(row.code, ops[::-1] if ops[0] != ops[1] else ["torch.exp", ops[1]])
    assert not labels_match(row.code, ops[:1])


def test_dag_patterns_and_op_mix(harvested):
    df = compose(harvested.ops, ComposeConfig(n=120, seed=2, device_profile="test", op_mix="1:0,2:0,3:1",
                                              motif_share=0.0), progress=False)
    torch_rows = df[df.data_source != "transformers"]
    assert set(torch_rows.num_ops) == {3}
    assert (torch_rows.pattern != "chain").sum() > 0
    dag = torch_rows[torch_rows.pattern == "residual"]
    for r in dag.itertuples():
        g = json.loads(r.graph)
        assert any(e["source"].startswith("in") and e["target"] != "op0" for e in g["edges"])


def test_parse_op_mix():
    assert parse_op_mix("ops6k")[2] == pytest.approx(0.838)
    assert parse_op_mix("1:1,2:3") == {1: 0.25, 2: 0.75}
    for bad in ("7:1", "1:-1", "x", "1:0"):
        with pytest.raises(ValueError):
            parse_op_mix(bad)


def test_sampler_excludes_stochastic_ops(harvested):
    s = Sampler(harvested.ops, get_profile("test"))
    assert "F.dropout" not in s.by_label and "nn.Dropout" not in s.by_label
    rng = random.Random(0)
    for _ in range(30):
        g, _ = s.sample(rng, 2)
        assert isinstance(g, OpGraph)
        assert not any(g.seeds[n].stochastic for n in g.ops())


def test_sampled_graphs_read_every_input(harvested, monkeypatch):
    """The concat pattern tries branch ops and removes those whose output does not match; an input such a
    branch brought (a binary op's second operand) leaves with it, so no task takes an input forward never
    reads."""
    s = Sampler(harvested.ops, get_profile("test"))
    monkeypatch.setattr(Sampler, "_pattern", lambda self, rng, k: "concat")
    made = 0
    for seed in range(80):
        try:
            g, pattern = s.sample(random.Random(seed), 4)
        except SamplingError:
            continue
        made += 1
        assert pattern == "concat" and all(g.g.out_degree(n) > 0 for n in g.inputs()), (seed, g.labels())
    assert made > 40


def test_linalg_ops_are_off_by_default_and_can_be_turned_on(harvested):
    """The harvested catalog holds matrix decompositions (category ``linalg``); the default sampler never
    draws one, ``category_weights={"linalg": 1}`` does."""
    linalg = {o.label for o in harvested.ops if o.category == "linalg"}
    assert {"torch.svd", "torch.qr", "torch.pinverse"} <= linalg, linalg
    for weights, drawn_at_most, drawn_at_least in ((None, 0, 0), ({"linalg": 1.0}, 10**6, 1)):
        s = Sampler(harvested.ops, get_profile("test"), category_weights=weights)
        rng = random.Random(3)
        drawn = sum(s._pick(rng, s.starters).label in linalg for _ in range(600))
        assert drawn_at_least <= drawn <= drawn_at_most, (weights, drawn)


def test_cpu_profile_sizes_land_in_window_often(harvested):
    """The random composer's sizing on CPU: share of candidates whose measured eager time is inside 1-100 ms
    (required to beat a coin flip). Motif candidates keep their model's sizes on a fixed-size profile, so they
    are left out (motif share 0)."""
    df = compose(harvested.ops, ComposeConfig(n=30, seed=4, device_profile="cpu", transformers_share=0,
                                              motif_share=0.0),
                 progress=False)
    inside = sum(1.0 <= measure_eager_ms(r.code, r.task_id, budget_s=0.05) <= 100.0 for r in df.itertuples())
    assert inside / len(df) >= 0.5


def test_the_runs_runtime_window_reaches_the_composers_sizing():
    from opforge.compose.composer import ComposeConfig, profile_for
    from opforge.compose.device_profiles import window_target
    from opforge.filters.runtime import resolve_window

    default = profile_for(ComposeConfig(n=1, device_profile="h100"))
    narrow = profile_for(ComposeConfig(n=1, device_profile="h100", window_ms=(5.0, 20.0)))
    # a GPU profile sizes into the filter's default window on CUDA (floor: the grader's timing precision)
    assert default.window_ms == resolve_window("cuda", None) and narrow.window_ms == (5.0, 20.0)
    assert default.window_ms[0] < 1.0
    lo, hi, target = window_target(narrow)
    assert 5.0 < lo < target < hi < 20.0
    with pytest.raises(ValueError, match="0 <= lo < hi"):
        profile_for(ComposeConfig(n=1, window_ms=(3.0, 1.0)))
