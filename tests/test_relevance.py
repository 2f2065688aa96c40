"""Op relevance from traced real models, label weights with merged aliases, the internal-name rule."""

from __future__ import annotations

import json

import pytest
import torch.nn as nn
from opforge.seeds.public_api import alias_groups, is_internal, label_canonical
from opforge.seeds.relevance import (
    OpRelevance,
    RelevanceError,
    RelevanceTable,
    aggregate,
    default_relevance,
    harvest_relevance,
    label_relevance,
    load_op_weights,
    load_relevance,
    write_relevance,
)


class _StandIn(nn.Module):
    """A torchvision-like classifier whose forward calls conv2d twice, relu twice, add once."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = nn.Conv2d(8, 8, 3, padding=1)
        self.act = nn.ReLU()
        self.fc = nn.Linear(8, 10)

    def forward(self, x):
        y = self.act(self.c1(x))
        y = self.act(self.c2(y)) + y
        return self.fc(y.mean((2, 3)))


@pytest.fixture(scope="module")
def traced() -> RelevanceTable:
    return harvest_relevance(progress=False, families=["gpt2", "vit", "no_such_family"],
                             cnn_models=[("stand_in", _StandIn)])


def test_harvest_traces_transformers_and_cnns_on_meta(traced):
    assert traced.models == ["cnn:stand_in", "transformers:gpt2", "transformers:vit"]
    assert traced.n_models == 3
    assert "transformers:no_such_family" in traced.skipped
    # every model contributes once: conv2d is called twice by the stand-in only
    conv = traced.ops["conv2d"]
    assert conv.models == 2  # stand-in + ViT's patch embedding
    assert conv.share == pytest.approx(2 / 3)
    assert traced.ops["linear"].models == 2  # stand-in's head and ViT (GPT-2 uses its own Conv1D: addmm)
    assert traced.ops["add"].models == 3
    assert "addmm" in traced.ops
    assert "GPT2Attention" in traced.blocks and "ViTLayer" in traced.blocks
    for op in traced.ops.values():
        assert 0.0 < op.share <= 1.0 and 0.0 < op.call_share <= 1.0 and op.calls >= op.models
    assert sum(o.call_share for o in traced.ops.values()) == pytest.approx(1.0)


def test_aggregate_counts_each_model_once():
    rows = {"a": {"ops": {"add": 100}}, "b": {"ops": {"mul": 1, "add": 1}}, "c": {"error": "ValueError: x"}}
    table = aggregate(rows, {})
    assert table.n_models == 2 and table.skipped == {"c": "ValueError: x"}
    assert table.ops["add"].share == 1.0 and table.ops["mul"].share == 0.5
    assert table.ops["add"].calls == 101
    assert table.ops["add"].call_share == pytest.approx((1.0 + 0.5) / 2)
    assert table.ops["mul"].call_share == pytest.approx(0.5 / 2)


def _table(**shares) -> RelevanceTable:
    return RelevanceTable(n_models=10, ops={k: OpRelevance(k, round(v * 10), round(v * 10), v) for k, v in shares.items()},
                          blocks={"LlamaRMSNorm": 4})


def test_label_relevance_splits_one_op_over_its_aliases():
    table = _table(relu=0.6, minimum=0.2, channel_shuffle=0.4, add=0.9, conv2d=0.3, batch_norm=0.5)
    labels = ["torch.relu", "F.relu", "nn.ReLU", "torch.fmin", "torch.minimum", "nn.ChannelShuffle",
              "F.channel_shuffle", "torch.channel_shuffle", "torch.native_channel_shuffle", "+", "torch.add",
              "nn.Conv2d", "nn.BatchNorm2d", "torch.cumsum", "LlamaRMSNorm", "OtherBlock"]
    w = label_relevance(labels, table)
    assert set(w) == set(labels)
    for lab in ("torch.relu", "F.relu", "nn.ReLU"):
        assert w[lab] == pytest.approx(0.6 / 3)
    assert w["torch.fmin"] == w["torch.minimum"] == pytest.approx(0.2 / 2)
    for lab in ("nn.ChannelShuffle", "F.channel_shuffle", "torch.channel_shuffle", "torch.native_channel_shuffle"):
        assert w[lab] == pytest.approx(0.4 / 4)
    assert w["+"] == w["torch.add"] == pytest.approx(0.9 / 2)
    assert w["nn.Conv2d"] == pytest.approx(0.3) and w["nn.BatchNorm2d"] == pytest.approx(0.5)
    assert w["torch.cumsum"] == 0.0  # no traced model calls it
    assert w["LlamaRMSNorm"] == pytest.approx(0.4) and w["OtherBlock"] == 0.0
    # the same label alone takes the whole share
    assert label_relevance(["F.relu"], table)["F.relu"] == pytest.approx(0.6)


def test_alias_groups_pick_a_public_representative():
    groups = alias_groups(["torch.native_channel_shuffle", "nn.ChannelShuffle", "torch.fmin", "torch.minimum",
                           "torch.cumsum", "torch.transpose_copy", "torch.transpose", "torch.bmm", "torch.matmul"])
    assert groups["torch.native_channel_shuffle"] == groups["nn.ChannelShuffle"] == "nn.ChannelShuffle"
    assert groups["torch.fmin"] == groups["torch.minimum"] == "torch.minimum"
    assert groups["torch.bmm"] == "torch.matmul"
    assert alias_groups(["nn.ChannelShuffle", "F.channel_shuffle"])["nn.ChannelShuffle"] == "F.channel_shuffle"
    assert groups["torch.transpose_copy"] == "torch.transpose"
    assert groups["torch.cumsum"] == "torch.cumsum"
    assert label_canonical("nn.SiLU") == "silu" and label_canonical("nn.CrossEntropyLoss") == "cross_entropy"


def test_is_internal_over_the_torch_candidates():
    """The rule over every torch label the harvester considers: what it removes, and what it keeps."""
    from opforge.seeds.torch_candidates import torch_candidates

    labels = {(d.label, d.qualname) for d in torch_candidates()}
    removed = sorted(lab for lab, q in labels if is_internal(lab, q))
    names = {lab for lab, _ in labels}
    for lab in ("torch.native_layer_norm", "torch.transpose_copy", "torch.split_with_sizes_copy",
                "F.max_pool2d_with_indices", "torch.constant_pad_nd", "torch.slice_inverse",
                "torch.native_channel_shuffle"):
        if lab in names:
            assert lab in removed, lab
    for lab in ("torch.cumsum", "F.relu", "torch.relu", "nn.Conv2d", "torch.fmin", "torch.index_copy",
                "F.channel_shuffle", "torch.matmul", "F.scaled_dot_product_attention", "nn.LSTM", "F.pad"):
        if lab in names:
            assert lab not in removed, lab
    # each removed label is explained by one of the rules of is_internal
    for lab in removed:
        name = lab.rpartition(".")[2]
        assert (name.startswith(("_", "native_")) or name.endswith(("_with_indices", "_backward", "_forward", "_copy"))
                or lab.startswith("torch.")), lab
    assert 0 < len(removed) < len(labels) / 4
    assert not is_internal("+") and not is_internal("LlamaRMSNorm") and is_internal("torch.ops.aten.add")
    assert is_internal("torch._foreach_add", "torch._foreach_add")


def test_load_op_weights(tmp_path):
    y = tmp_path / "w.yaml"
    y.write_text("nn.Conv2d: 3\ntorch.cumsum: 0\n'+': 0.5\n")
    assert load_op_weights(y) == {"nn.Conv2d": 3.0, "torch.cumsum": 0.0, "+": 0.5}
    j = tmp_path / "w.json"
    j.write_text(json.dumps({"F.gelu": 2}))
    assert load_op_weights(j) == {"F.gelu": 2.0}
    y.write_text("nn.Conv2d: -1\n")
    with pytest.raises(RelevanceError, match=r"w\.yaml.*nn\.Conv2d"):
        load_op_weights(y)
    y.write_text("- nn.Conv2d\n")
    with pytest.raises(RelevanceError, match="mapping"):
        load_op_weights(y)
    with pytest.raises(FileNotFoundError, match="nope.yaml"):
        load_op_weights(tmp_path / "nope.yaml")


def test_table_json_round_trip_and_errors(traced, tmp_path):
    back = RelevanceTable.from_json(traced.to_json())
    assert back.n_models == traced.n_models and set(back.ops) == set(traced.ops)
    assert back.ops["add"].share == pytest.approx(traced.ops["add"].share)
    data = json.loads(traced.to_json())
    data["ops"]["add"]["share"] = 1.5
    with pytest.raises(RelevanceError, match=r"ops\.add\.share"):
        RelevanceTable.from_json(json.dumps(data))
    path = write_relevance(traced, tmp_path / "r.json")
    assert load_relevance(path).models == traced.models
    path.write_text("{}")
    with pytest.raises(RelevanceError, match=r"r\.json.*version"):
        load_relevance(path)


def test_packaged_snapshot_ranks_model_ops_first():
    table = default_relevance()
    assert table.n_models >= 300
    top = [o.canonical for o in table.top(25)]
    for op in ("linear", "add", "embedding", "layer_norm", "silu", "gelu"):
        assert op in top, (op, top)
    assert table.ops["linear"].share > table.ops["conv2d"].share
    assert table.ops["scaled_dot_product_attention"].share > 0.3
    assert table.ops["conv2d"].share > table.ops.get("cumsum", OpRelevance("cumsum", 0, 0, 0.0)).share


def test_torchvision_models_are_traced_when_installed(monkeypatch):
    from .test_vocabulary import _fake_torchvision

    _fake_torchvision(monkeypatch)
    table = harvest_relevance(progress=False, families=[])
    assert table.models == ["torchvision:stand_in"] and table.libraries["torchvision"] == "0.0"
    assert {"conv2d", "relu", "max_pool2d", "batch_norm", "linear"} <= set(table.ops)
    assert all(o.share == 1.0 for o in table.ops.values())
