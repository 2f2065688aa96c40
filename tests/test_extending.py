"""Extending opforge (docs/extending.md): own ops, own models as motif sources, merged and weighted motif
libraries, clear errors for unknown names, and a broken optional import that fails soft."""

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from opforge.seeds.specs_loader import SpecError, load_specs

ROOT = Path(__file__).resolve().parents[1]
EX = ROOT / "examples" / "extending"


@pytest.fixture(scope="module")
def own_ops():
    """The example's own ops and two packaged ops, probed (seconds: no full harvest)."""
    from opforge.seeds.probe import probe

    specs = [s for s in load_specs(None, extra=[EX / "own_specs.yaml"])]
    packaged = [s for s in load_specs() if s.label in ("+", "F.linear")]
    ops = [probe(s) for s in [*specs, *packaged]]
    return ops


def test_own_module_and_function_are_probed_as_one_seed_op_each(own_ops):
    from opforge.seeds.seed_op import SeedOp

    by = {o.label: o for o in own_ops}
    assert isinstance(by["SquaredReLU"], SeedOp), by["SquaredReLU"]
    assert isinstance(by["scaled_tanh"], SeedOp), by["scaled_tanh"]
    assert by["SquaredReLU"].library == "user" and by["SquaredReLU"].kind == "module"
    assert by["SquaredReLU"].qualname.endswith("own_ops.py:SquaredReLU") and Path(
        by["SquaredReLU"].qualname.split(":")[0]).is_absolute()


def test_user_specs_add_to_the_packaged_ones_and_replace_only_on_request():
    packaged = {s.label for s in load_specs()}
    both = {s.label for s in load_specs(extra=[EX / "own_specs.yaml"])}
    alone = {s.label for s in load_specs(None, extra=[EX / "own_specs.yaml"])}
    assert packaged < both and {"SquaredReLU", "scaled_tanh"} <= both
    assert alone == {"SquaredReLU", "scaled_tanh"}


def test_composed_task_with_an_own_op_is_self_contained(own_ops, tmp_path):
    from opforge.compose.composer import ComposeConfig, compose
    from opforge.task.source import load_task

    ops = [o for o in own_ops if hasattr(o, "kind")]
    cfg = ComposeConfig(n=12, seed=1, device_profile="test", motif_share=0.0, transformers_share=0.0,
                        op_weights={"SquaredReLU": 50.0, "scaled_tanh": 50.0}, dtype_mix="float32:1", op_mix="1:0,2:1")
    df = compose(ops, cfg, progress=False)
    own = df[df.ops.str.contains("SquaredReLU|scaled_tanh")]
    assert len(own) >= 3
    for code in own.code:
        assert "own_ops" not in code and "import own" not in code  # the source is inlined, no import
        assert "class SquaredReLU" in code or "def scaled_tanh" in code
        task = load_task(code, "own")  # runs on its own
        m = task.module
        out = m.Model(*m.get_init_inputs())(*m.get_inputs())
        assert torch.isfinite(out).all()


def test_unknown_op_weight_label_is_an_error_with_the_closest(own_ops):
    from opforge.compose.graphs.op_weights import check_op_weights

    with pytest.raises(ValueError, match=r"'SquaredRelu'.*closest: SquaredReLU"):
        check_op_weights(own_ops, {"SquaredRelu": 1.0})
    check_op_weights(own_ops, {"SquaredReLU": 1.0})


def test_spec_qualname_that_does_not_import_names_the_entry_and_closest(tmp_path):
    (tmp_path / "own_ops.py").write_text((EX / "own_ops.py").read_text())
    bad = tmp_path / "bad.yaml"
    bad.write_text("- {label: SquaredRelu, qualname: 'own_ops.py:SquaredRelu', kind: module, inputs: [{shape: []}]}\n")
    with pytest.raises(SpecError, match=r"bad.yaml: entry 0 \('SquaredRelu'\).*closest: SquaredReLU"):
        load_specs(None, extra=[bad])
    bad.write_text("- {label: F.threshhold, qualname: torch.nn.functional.threshhold, kind: function}\n")
    with pytest.raises(SpecError, match="closest: threshold"):
        load_specs(None, extra=[bad])


def test_torch_special_functions_are_harvested_and_traced_under_their_label():
    from opforge.seeds.probe import probe
    from opforge.seeds.seed_op import SeedOp
    from opforge.seeds.torch_candidates import namespace_candidates

    drafts = {d.label: d for d in namespace_candidates("x", "torch.special") if isinstance(d, SeedOp)}
    assert "torch.special.erfcx" in drafts and "torch.special.expm1" not in drafts  # alias of torch.expm1
    assert isinstance(probe(drafts["torch.special.erfcx"]), SeedOp)


@pytest.fixture(scope="module")
def own_library(tmp_path_factory):
    from opforge.compose.motifs.cut import write_library
    from opforge.compose.motifs.sources import mine_user_models

    motifs, meta = mine_user_models([f"{EX / 'own_model.py'}:GatedBlock"],
                                    inputs_fn=f"{EX / 'own_model.py'}:example_inputs")
    assert motifs and meta["traced"] and not meta["skipped"]
    return write_library(motifs, tmp_path_factory.mktemp("motifs") / "own.json.gz", meta)


def test_own_model_with_input_shapes_gives_the_same_motifs(own_library):
    from opforge.compose.motifs.cut import read_library
    from opforge.compose.motifs.sources import mine_user_models

    shaped, _ = mine_user_models([f"{EX / 'own_model.py'}:GatedBlock"], input_shapes=["batch,seq,256"])
    assert {m.motif_id for m in shaped} == {m.motif_id for m in read_library(own_library)[0]}
    assert all(m.sources == ["user:GatedBlock"] for m in shaped)


def test_merged_sources_are_drawn_by_weight_and_name_their_models(own_library, tmp_path):
    from opforge.compose.motifs.cut import read_library, write_library
    from opforge.compose.motifs.library import MotifPool
    from opforge.compose.motifs.sources import merge_sources, source_pool
    from opforge.compose.motifs.trace import trace_module

    class Other(torch.nn.Module):  # a second source: a LayerNorm + GELU epilogue model
        def __init__(self):
            super().__init__()
            self.lin, self.norm = torch.nn.Linear(64, 64), torch.nn.LayerNorm(64)

        def forward(self, x):
            return torch.nn.functional.gelu(self.norm(self.lin(x))) + x

    with torch.device("meta"):
        m = Other().to(torch.float16)
    from opforge.compose.motifs.cut import cut_motifs

    trace = trace_module(m, lambda b, s: {"x": torch.empty(b, s, 64, dtype=torch.float16, device="meta")},
                         "user:Other", "user")
    trace.config = {"max_positions": 0, "hidden_size": 0, "native_dtype": "float32"}
    base = write_library(cut_motifs(trace), tmp_path / "base.json.gz", {})
    out, meta = merge_sources([f"{own_library}:0.3"], tmp_path / "merged.json.gz", base=str(base))
    assert meta["source_weights"] == pytest.approx({"base.json.gz": 0.7, "own.json.gz": 0.3})
    motifs = read_library(out)[0]
    pool = source_pool(motifs, meta["source_weights"], lambda ms: MotifPool(ms, light_share=0.55))
    rng = random.Random(0)
    drawn = [pool.draw(rng).sources[0] for _ in range(2000)]
    share = drawn.count("user:GatedBlock") / len(drawn)
    assert 0.25 < share < 0.35


def test_compose_with_a_weighted_own_library_names_library_and_models(own_library, own_ops, tmp_path):
    from opforge.compose.composer import ComposeConfig, compose
    from opforge.compose.motifs.sources import merge_sources

    out, _ = merge_sources([f"{own_library}:1"], tmp_path / "merged.json.gz", base=str(own_library))
    ops = [o for o in own_ops if hasattr(o, "kind")]
    df = compose(ops, ComposeConfig(n=8, seed=0, device_profile="test", motif_share=1.0, transformers_share=0.0,
                                    motif_library=str(out)), progress=False)
    prov = [json.loads(p) for p in df.provenance if p]
    assert prov and all(p["library"] == "own.json.gz" and p["models"] == ["user:GatedBlock"] for p in prov)


def test_unknown_motif_source_is_an_error_naming_it(tmp_path):
    from opforge.compose.motifs.sources import MotifSourceError, parse_source, trace_user_model
    from opforge.compose.motifs.trace import TraceError

    with pytest.raises(MotifSourceError, match="nope.json.gz"):
        parse_source(str(tmp_path / "nope.json.gz") + ":0.3")
    with pytest.raises(MotifSourceError, match="weight"):
        parse_source("packaged:1.5")
    with pytest.raises(TraceError, match="closest: GatedBlock"):
        trace_user_model(f"{EX / 'own_model.py'}:GatedBlok", ["batch,seq,256"])


def test_broken_torchvision_is_reported_in_one_line_and_the_rest_runs(tmp_path):
    broken = tmp_path / "torchvision"
    broken.mkdir()
    (broken / "__init__.py").write_text('raise RuntimeError("operator torchvision::nms does not exist")\n')
    code = ("from opforge.seeds.optional_imports import guard_optional_imports as g; print(g()); "
            "from opforge.compose.motifs.trace import TraceError, trace_torchvision\n"
            "try:\n    trace_torchvision('resnet18')\nexcept TraceError as e:\n    print('skip', e)\n"
            "import importlib.util; print('found', importlib.util.find_spec('torchvision'))")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "operator torchvision::nms does not exist" in res.stdout.splitlines()[0]
    assert "skip torchvision:resnet18: torchvision unavailable" in res.stdout
    assert "found None" in res.stdout


def test_seeds_explain_gives_reason_meaning_and_fix(tmp_path):
    from opforge.seeds.catalog import write_catalog, write_skip_report
    from opforge.seeds.seed_op import SkipRecord
    from opforge.seeds.skip_reasons import SKIP_REASONS, explain

    cat = write_catalog([], tmp_path / "catalog.parquet")
    write_skip_report([SkipRecord(label="F.threshold", qualname="torch.nn.functional.threshold", library="torch",
                                  reason="no_rule:threshold", detail="")], tmp_path / "catalog_skipped.csv")
    text = explain("F.threshold", cat)
    assert "no_rule:threshold" in text and SKIP_REASONS["no_rule"][1] in text
    with pytest.raises(KeyError, match="closest: F.threshold"):
        explain("F.treshold", cat)
    doc = (ROOT / "docs" / "extending.md").read_text()
    assert all(f"`{code}`" in doc for code in SKIP_REASONS)  # every reason code documented in the table
