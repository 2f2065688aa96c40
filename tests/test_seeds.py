import json
from collections import Counter

import pandas as pd
import pytest
import yaml
from opforge.seeds.catalog import read_catalog
from opforge.seeds.probe import probe
from opforge.seeds.seed_op import SeedOp, SkipRecord, TensorSpec
from opforge.seeds.specs_loader import SpecError, load_spec_file
from opforge.seeds.torch_candidates import torch_candidates

from .paths import OPS6K, needs_shared


def _draft(label):
    for d in torch_candidates():
        if d.label == label:
            return d
    raise KeyError(label)


def test_probe_rejects_impossible_recipe():
    # Conv2d needs a 4-D input whose channel dim equals in_channels; a 2-D template cannot work.
    draft = SeedOp(label="nn.Conv2d", qualname="torch.nn.Conv2d", kind="module", templates=["NC"],
                   init_args={"in_channels": "$C", "out_channels": "$K", "kernel_size": 3},
                   inputs=[TensorSpec(shape=[])])
    res = probe(draft)
    assert isinstance(res, SkipRecord)
    assert res.reason == "no_recipe"
    assert "NC" in res.detail


def test_probe_rejects_unknown_qualname():
    res = probe(SeedOp(label="torch.nope", qualname="torch.no_such_function", kind="function",
                       inputs=[TensorSpec(shape=[])]))
    assert isinstance(res, SkipRecord) and res.reason in ("build_error", "no_recipe")


@pytest.mark.parametrize(("name", "ok"), [("HalfInitialised", False), ("FullyInitialised", True),
                                          ("UnseededInit", False)])
def test_probe_rejects_parameters_left_as_empty_memory(name, ok):
    res = probe(SeedOp(label=name, qualname=f"tests.probe_modules.{name}", kind="module", templates=["NC"],
                       init_args={"in_features": "$C"}, inputs=[TensorSpec(shape=[])]))
    # a custom module has no Ops-6K label, so the control stops later, at the label check
    assert isinstance(res, SkipRecord)
    if ok:
        assert res.reason == "untraceable_label", res
    else:
        assert res.reason == "no_recipe" and "uninitialized_state" in res.detail and "shift" in res.detail
        assert ("differs between two seeded builds" in res.detail) == (name == "UnseededInit")


@pytest.mark.parametrize("label", ["F.dropout", "torch.bernoulli", "nn.RReLU", "nn.Dropout"])
def test_stochastic_ops_are_flagged(label):
    res = probe(_draft(label))
    assert isinstance(res, SeedOp), res
    assert res.stochastic


@pytest.mark.parametrize("label", ["nn.ReLU", "torch.cumsum", "nn.Conv2d", "F.gelu"])
def test_deterministic_ops_are_not_flagged(label):
    res = probe(_draft(label))
    assert isinstance(res, SeedOp), res
    assert not res.stochastic


def test_yaml_entry_adds_op(tmp_path):
    spec = tmp_path / "extra.yaml"
    spec.write_text(yaml.safe_dump([{
        "label": "torch.lerp", "qualname": "torch.lerp", "kind": "function", "templates": ["NCHW", "NC"],
        "inputs": [{"shape": []}, {"shape": "like:0"}], "call_args": {"weight": 0.3},
    }]))
    drafts = load_spec_file(spec)
    assert [d.label for d in drafts] == ["torch.lerp"]
    op = probe(drafts[0])
    assert isinstance(op, SeedOp)
    assert op.templates == ["NCHW", "NC"]
    assert op.source == "spec:extra.yaml"
    assert op.output_shape == [2, 16, 12, 10]


@pytest.mark.parametrize("entry, field", [
    ({"label": "torch.x", "qualname": "torch.exp", "kind": "bogus"}, "kind"),
    ({"label": "torch.x", "qualname": "torch.exp", "kind": "function", "inputs": [{"shape": ["Q"]}]}, "inputs.0.shape"),
    ({"label": "torch.x", "qualname": "torch.exp", "kind": "function", "colour": 3}, "colour"),
    ({"qualname": "torch.exp", "kind": "function"}, "label"),
])
def test_malformed_yaml_entry_names_file_entry_and_field(tmp_path, entry, field):
    spec = tmp_path / "bad.yaml"
    good = {"label": "torch.exp", "qualname": "torch.exp", "kind": "function"}
    spec.write_text(yaml.safe_dump([good, entry]))
    with pytest.raises(SpecError) as err:
        load_spec_file(spec)
    msg = str(err.value)
    assert str(spec) in msg and "entry 1" in msg and f"'{field}'" in msg


def test_malformed_yaml_document(tmp_path):
    spec = tmp_path / "bad.yaml"
    spec.write_text("label: not-a-list\n")
    with pytest.raises(SpecError, match="expected a list"):
        load_spec_file(spec)


def test_catalog_size_and_coverage(harvested):
    counts = Counter(o.library for o in harvested.ops)
    families = {o.family for o in harvested.ops if o.library == "transformers" and o.family != "activations"}
    assert counts["torch"] >= 400
    assert counts["transformers"] >= 100
    assert len(families) >= 40
    assert all(o.label not in {s.label for s in harvested.skips} for o in harvested.ops)


@needs_shared
def test_catalog_covers_the_ops_of_ops6k(harvested):
    labels = {o.label for o in harvested.ops}
    df = pd.read_parquet(OPS6K)
    ref = {x for o, s in zip(df.ops, df.data_source, strict=True) if s != "transformers" for x in json.loads(o)}
    assert len(ref & labels) / len(ref) >= 0.85


@pytest.mark.parametrize(("name", "category"), [
    ("gelu", "activation"), ("GELU", "activation"), ("leaky_relu", "activation"),
    ("LeakyReLU", "activation"), ("ReLU", "activation"), ("ReLU6", "activation"), ("SiLU", "activation"),
    ("PReLU", "activation"), ("ge", "comparison"), ("greater_equal", "comparison"),
    ("logical_xor", "comparison"), ("fmax", "comparison"), ("svd", "linalg"), ("qr", "linalg"),
    ("pinverse", "linalg"), ("nuclear_norm", "linalg"), ("geqrf", "linalg"), ("norm", "reduction"),
    ("Softmax2d", "reduction"), ("layer_norm", "normalization"), ("RMSNorm", "normalization"),
    ("TransformerEncoderLayer", "block"), ("MultiheadAttention", "attention"), ("ConvTranspose2d", "conv"),
    ("cdist", "gemm"), ("cumsum", "scan"), ("LSTMCell", "recurrent"),
])
def test_op_names_get_their_category(name, category):
    from opforge.seeds.categories import CATEGORIES, categorize

    assert category in CATEGORIES and categorize(name) == category


@pytest.mark.parametrize("name", ["lerp", "neg", "negative", "nextafter"])
def test_elementwise_names_that_start_like_a_comparison_are_not_comparisons(name):
    from opforge.seeds.categories import categorize

    assert categorize(name, same_shape=True) == "elementwise"


def test_catalog_round_trip_and_every_row_reprobes(catalog_path, harvested):
    ops = read_catalog(catalog_path)
    assert [o.label for o in ops] == [o.label for o in harvested.ops]
    failures = []
    for op in ops:
        again = probe(op)
        if not isinstance(again, SeedOp) or again.output_shape != op.output_shape:
            failures.append((op.label, getattr(again, "reason", again.output_shape if isinstance(again, SeedOp) else None)))
    assert not failures, failures[:10]


def test_read_catalog_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="opforge seeds harvest"):
        read_catalog(tmp_path / "nope.parquet")


def test_a_harvested_op_and_its_catalog_row_hold_their_arguments_in_one_order(harvested, catalog_path):
    """Keyword-argument dicts keep one key order, whatever order the harvest built them in, so a harvested op
    and the same op read back from Parquet compose the same task (the composer iterates them)."""
    op = SeedOp(label="nn.X", qualname="torch.nn.X", kind="module", init_args={"b": 1, "a": {"d": 2, "c": 3}},
                call_args={"z": 0, "y": 1})
    assert list(op.init_args) == ["a", "b"] and list(op.init_args["a"]) == ["c", "d"] and list(op.call_args) == ["y", "z"]
    back = read_catalog(catalog_path)
    fields = ("init_args", "call_args", "params", "config")
    assert [[repr(getattr(o, f)) for f in fields] for o in harvested.ops] == \
        [[repr(getattr(o, f)) for f in fields] for o in back]
