"""Hidden shape variants (compose/variants.py, task/sizes.py, opforge variants): a pure function of the published
row, validated on meta, added to a published folder or Parquet file deterministically."""

import json

import pandas as pd
import pyarrow.parquet as pq
import pytest
from opforge.compose.variants import VariantSettings, shape_variants, variants_for_rows
from opforge.task.sizes import VariantFormatError, free_constants, parse_variants, size_constants, with_sizes

from .harness_cases import TASK as LITERAL_TASK

COMPOSED = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight_0 = nn.Parameter(torch.randn(channels, channels))

    def forward(self, x):
        return torch.relu(x @ self.weight_0)


batch_size = 64
seq_len = 128
channels = 256


def get_inputs():
    x = torch.randn(batch_size, seq_len, channels)
    return [x]


def get_init_inputs():
    return []
'''

# Ops-6K style: the batch is a constant, the channels reach the model through get_init_inputs
OPS6K_STYLE = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3)

    def forward(self, x):
        return torch.sigmoid(self.conv(x))


batch_size = 32
in_channels = 8
out_channels = 16
height = 24
width = 24


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels]
'''


def test_free_constants_and_rewrite():
    assert size_constants(COMPOSED) == {"batch_size": 64, "seq_len": 128, "channels": 256}
    assert free_constants(COMPOSED) == {"batch_size", "seq_len"}  # channels sizes the weight
    assert free_constants(OPS6K_STYLE) == {"batch_size", "height", "width"}  # via get_init_inputs
    derived = COMPOSED.replace("channels = 256\n", "channels = 256\nhidden = seq_len * 2\n").replace(
        "torch.randn(channels, channels)", "torch.randn(channels, hidden)")
    assert "seq_len" not in free_constants(derived)  # reaches the weight through a derived constant
    new = with_sizes(COMPOSED, {"batch_size": 3, "seq_len": 77})
    assert size_constants(new) == {"batch_size": 3, "seq_len": 77, "channels": 256}
    assert new.replace("batch_size = 3", "batch_size = 64").replace("seq_len = 77", "seq_len = 128") == COMPOSED
    with pytest.raises(KeyError, match="no size constant"):
        with_sizes(COMPOSED, {"hidden": 4})


def test_variants_are_a_pure_function_of_the_row():
    row = {"task_id": "composed", "code": COMPOSED, "size_context": "llama", "dtype": "float32"}
    a, b = shape_variants(row), shape_variants(dict(row))
    assert a.variants == b.variants and len(a.variants) == 2 and a.reason is None, a
    public = [64, 128, 256]
    moved = set()
    for v in a.variants:
        shape = v["input_shapes"][0]
        assert shape != public and shape[2] == 256  # the weight's size never moves
        assert 0 < v["work_ratio"] <= 2.0
        moved |= set(v["sizes"])
        # the task's Model runs at the variant's shapes: the rewritten source gives those inputs
        assert with_sizes(COMPOSED, v["sizes"]) != COMPOSED
    assert moved == {"batch_size", "seq_len"}  # one variant moves the sequence, one the batch
    other = shape_variants(row, VariantSettings(seed=1))
    assert other.variants != a.variants  # the seed matters
    # a row without a size context (Ops-6K): only the batch moves, to vocabulary batch sizes
    plain = shape_variants({"task_id": "ops6k", "code": OPS6K_STYLE})
    assert len(plain.variants) == 2 and all(set(v["sizes"]) == {"batch_size"} for v in plain.variants)
    assert all(v["input_shapes"][0][1:] == [8, 24, 24] for v in plain.variants)
    # no size constant at all (literal shapes): recorded, not guessed
    none = shape_variants({"task_id": "literal", "code": LITERAL_TASK})
    assert none.variants == [] and none.reason == "no_free_size"


def test_variants_respect_the_memory_and_time_caps():
    row = {"task_id": "capped", "code": COMPOSED, "size_context": "llama"}
    tight = shape_variants(row, VariantSettings(max_work_ratio=1.0, input_cap_bytes=64 * 128 * 256 * 4))
    for v in tight.variants:
        assert v["work_ratio"] <= 1.0
        n = 1
        for d in v["input_shapes"][0]:
            n *= d
        assert n <= 64 * 128 * 256
    # a measured 60 ms task leaves almost no room above its own time (window top 100 / 1.6 ms)
    slow = shape_variants({**row, "eager_ms": 60.0, "gpu": "NVIDIA H200"})
    assert all(v["work_ratio"] <= 62.5 / 60.0 for v in slow.variants)


def test_parse_variants_rejects_malformed_cells():
    assert parse_variants(None) == [] and parse_variants("") == [] and parse_variants(float("nan")) == []
    assert parse_variants('[{"sizes": {"batch_size": 2}}]') == [{"sizes": {"batch_size": 2}}]
    for bad in ("{", '{"sizes": 1}', '[{"sizes": {"batch_size": 0}}]', '[{"shape": [1]}]'):
        with pytest.raises(VariantFormatError):
            parse_variants(bad)


def test_opforge_variants_on_a_folder_and_a_parquet(tmp_path):
    """The CLI adds the column in place or to a copy, byte-identically on a re-run; a folder's card declares
    it, so the folder still loads with `datasets` and passes the publish validation."""
    from opforge.data_cards.render import front_matter
    from opforge.pipeline.cli import app
    from opforge.pipeline.hub_folder import validate_folder
    from typer.testing import CliRunner

    rows = pd.DataFrame([
        {"ops": '["torch.relu"]', "data_source": "torch#2", "code": COMPOSED, "task_id": "a", "size_context": "llama"},
        {"ops": '["nn.Conv2d"]', "data_source": "torch#2", "code": OPS6K_STYLE, "task_id": "b", "size_context": ""},
        {"ops": '["torch.relu"]', "data_source": "torch#2", "code": LITERAL_TASK, "task_id": "c", "size_context": ""},
    ])
    folder = tmp_path / "hf"
    (folder / "data").mkdir(parents=True)
    rows.to_parquet(folder / "data" / "train-00000-of-00001.parquet", index=False)
    fm = front_matter(pretty_name="t", license="apache-2.0", features=[
        {"name": c, "dtype": "string"} for c in rows.columns], n_rows=3, num_bytes=1, data_glob="data/train-*.parquet",
        tags=[])
    (folder / "README.md").write_text(f"---\n{fm}\n---\n\n# t\n")
    runner = CliRunner()
    res = runner.invoke(app, ["variants", str(folder), "--out", str(tmp_path / "copy"), "--workers", "0"])
    assert res.exit_code == 0, res.output
    assert "2 of 3 tasks have 2 variants" in res.output
    assert not any("shape_variants" in c for c in pq.read_table(next((folder / "data").glob("*.parquet"))).column_names)
    copy = tmp_path / "copy"
    validate_folder(copy)
    card = (copy / "README.md").read_text()
    assert "## Hidden shape variants" in card and "2 of 3 tasks" in card
    got = pd.read_parquet(copy / "data")
    assert [len(json.loads(s)) for s in got["shape_variants"]] == [2, 2, 0]
    assert list(got.columns[:5]) == list(rows.columns)  # the Ops-6K columns are untouched
    report = json.loads((copy / "opforge_variants.json").read_text())
    assert report["reasons"] == {"no_free_size": 1} and report["per_count"] == {"0": 1, "2": 2}
    # a Parquet file, twice: the same bytes
    src = tmp_path / "rows.parquet"
    rows.to_parquet(src, index=False)
    for out in ("one.parquet", "two.parquet"):
        assert runner.invoke(app, ["variants", str(src), "--out", str(tmp_path / out), "--workers", "0"]).exit_code == 0
    assert (tmp_path / "one.parquet").read_bytes() == (tmp_path / "two.parquet").read_bytes()
    assert pd.read_parquet(tmp_path / "one.parquet")["shape_variants"].tolist() == got["shape_variants"].tolist()
    bad = runner.invoke(app, ["variants", str(tmp_path / "missing.parquet")])
    assert bad.exit_code == 2 and "no such file" in bad.output


def test_variants_for_rows_in_workers_matches_in_process(tmp_path):
    rows = [{"task_id": "a", "code": COMPOSED, "size_context": "llama"}, {"task_id": "b", "code": OPS6K_STYLE}]
    here = variants_for_rows(rows, workers=0, progress=False)
    cache = tmp_path / "cache.jsonl"
    stats: dict = {}
    pooled = variants_for_rows(rows, workers=2, cache_path=cache, progress=False, stats=stats)
    assert [r.variants for r in pooled] == [r.variants for r in here]
    assert len(cache.read_text().splitlines()) == 2
    assert stats == {"cached": 0, "computed": 2, "workers": 1}  # two rows are one chunk: one process, not two
    again = variants_for_rows(rows, workers=2, cache_path=cache, progress=False, stats=stats)  # from the cache
    assert [r.variants for r in again] == [r.variants for r in here]
    assert len(cache.read_text().splitlines()) == 2
    assert stats == {"cached": 2, "computed": 0, "workers": 0}
