"""Self-contained transformers block tasks (compose/blocks/tasks.py).

Fidelity: for each family, a one-layer transformers base model is built from a small config of the
family's own config class; the module the block task mirrors (found by its class name) is hooked to
capture its input and output; its weights are copied into the rendered ``Model`` and the rendered source
must reproduce the output on CPU at 1e-4. The transformers module derives its own positions and masks, so
this also checks the RoPE tables and the causal / sliding-window masks the task builds itself.
"""

import dataclasses
import json
import subprocess
import sys
import textwrap

import pytest
import torch
from opforge.compose.blocks.tasks import (
    DTYPES,
    FAMILIES,
    BlockSpec,
    block_specs,
    config_from_hf,
    render_block,
)
from opforge.task.source import load_task

BATCH, SEQ = 2, 16

# Small configs (hidden 256) of each family's own config class, one layer, no dropout.
SMALL = {
    "llama": dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=64, num_hidden_layers=1, vocab_size=128, rms_norm_eps=1e-5),
    "mistral": dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=1,
                    head_dim=64, num_hidden_layers=1, vocab_size=128, sliding_window=5),
    "qwen2": dict(hidden_size=256, intermediate_size=384, num_attention_heads=4, num_key_value_heads=2,
                  num_hidden_layers=1, vocab_size=128),
    "qwen3": dict(hidden_size=256, intermediate_size=384, num_attention_heads=8, num_key_value_heads=2,
                  head_dim=32, num_hidden_layers=1, vocab_size=128),
    "phi3": dict(hidden_size=256, intermediate_size=384, num_attention_heads=4, num_key_value_heads=2,
                 num_hidden_layers=1, vocab_size=128, pad_token_id=0),
    "gemma": dict(hidden_size=256, intermediate_size=512, num_attention_heads=2, num_key_value_heads=1,
                  head_dim=128, num_hidden_layers=1, vocab_size=128),
    "gpt_neox": dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_hidden_layers=1,
                     vocab_size=128),
    "falcon": dict(hidden_size=320, num_attention_heads=5, num_hidden_layers=1, vocab_size=128,
                   ffn_hidden_size=640),
    "gpt2": dict(n_embd=256, n_head=4, n_layer=1, vocab_size=128, n_positions=64),
    "opt": dict(hidden_size=256, ffn_dim=512, num_attention_heads=4, num_hidden_layers=1, vocab_size=128,
                word_embed_proj_dim=256, max_position_embeddings=64),
    "bert": dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_hidden_layers=1,
                 vocab_size=128, max_position_embeddings=64),
    "roberta": dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_hidden_layers=1,
                    vocab_size=128, max_position_embeddings=64),
    "vit": dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_hidden_layers=1,
                image_size=32, patch_size=8),
    "t5": dict(d_model=256, d_ff=512, num_heads=4, d_kv=64, num_layers=1, vocab_size=128),
}
BASE_MODEL = {"llama": "LlamaModel", "mistral": "MistralModel", "qwen2": "Qwen2Model", "qwen3": "Qwen3Model",
              "phi3": "Phi3Model",
              "gemma": "GemmaModel", "gpt_neox": "GPTNeoXModel", "falcon": "FalconModel",
              "gpt2": "GPT2Model", "opt": "OPTModel", "bert": "BertModel",
              "roberta": "RobertaModel", "vit": "ViTModel", "t5": "T5EncoderModel"}
CONV1D = ("c_attn.weight", "c_fc.weight", "c_proj.weight")  # GPT-2 Conv1D weights are (in, out)


def _small_cfg(family: str):
    import transformers

    fam = {f.name: f for f in FAMILIES}[family]
    cfg = getattr(transformers, fam.config_class)(**SMALL[family])
    for k in ("hidden_dropout_prob", "attention_probs_dropout_prob", "dropout", "attention_dropout",
              "resid_pdrop", "embd_pdrop", "attn_pdrop", "dropout_rate"):
        if hasattr(cfg, k):
            setattr(cfg, k, 0.0)
    return cfg


def _small_spec(label: str) -> BlockSpec:
    real = next(s for s in block_specs() if s.label == label)
    config = config_from_hf(real.family, _small_cfg(real.family))
    assert config is not None, f"{real.family}: small config not supported"
    return dataclasses.replace(real, config=config)


def _reference(spec: BlockSpec):
    """(hf submodule, its captured input hidden states, its output) from a one-layer base model."""
    import transformers

    torch.manual_seed(0)
    cfg = _small_cfg(spec.family)
    model = getattr(transformers, BASE_MODEL[spec.family])(cfg).eval()
    with torch.no_grad():  # trained-like parameters: no unit norm scale, no zero bias, O(1) activations
        for p in model.parameters():
            if p.ndim == 1:
                p.add_(0.1 * torch.randn_like(p))
            else:
                p.normal_(0.0, 256 ** -0.5)
    hidden = spec.config["hidden_size"]
    mods = [m for m in model.modules() if type(m).__name__ == spec.label
            and not (spec.kind == "norm" and m.weight.shape[0] != hidden)]
    assert mods, f"{spec.label} not found in {BASE_MODEL[spec.family]}"
    target, seen = mods[0], {}

    def hook(mod, args, kwargs, out):  # clones: the caller may update the output in place (Falcon)
        seen.setdefault("x", (args[0] if args else kwargs["hidden_states"]).clone())
        seen.setdefault("y", (out[0] if isinstance(out, tuple) else out).clone())

    h = target.register_forward_hook(hook, with_kwargs=True)
    with torch.no_grad():
        if spec.family == "vit":
            model(pixel_values=torch.randn(BATCH, 3, cfg.image_size, cfg.image_size))
        else:
            model(inputs_embeds=torch.randn(BATCH, SEQ, hidden))
    h.remove()
    return target, seen["x"], seen["y"]


def _mapped_state(hf_module) -> dict:
    out = {}
    for k, v in hf_module.state_dict().items():
        out[f"block.{k}"] = v.t() if k.endswith(CONV1D) and v.ndim == 2 else v
    return out


FIDELITY = ["LlamaMLP", "LlamaRMSNorm", "LlamaAttention", "LlamaDecoderLayer", "MistralDecoderLayer",
            "Qwen2Attention", "Qwen3Attention", "Qwen3DecoderLayer", "Phi3MLP", "Phi3Attention",
            "Phi3DecoderLayer", "GemmaRMSNorm", "GemmaDecoderLayer",
            "GPTNeoXMLP", "GPTNeoXAttention", "GPTNeoXLayer", "FalconMLP", "FalconAttention",
            "FalconDecoderLayer", "GPT2MLP", "GPT2Attention", "GPT2Block", "OPTDecoderLayer", "BertAttention", "BertLayer",
            "RobertaLayer", "ViTMLP", "ViTAttention", "ViTLayer", "T5LayerNorm", "T5LayerFF", "T5Attention", "T5Block"]


@pytest.mark.parametrize("label", FIDELITY)
def test_block_matches_transformers(label):
    if not any(s.label == label for s in block_specs()):
        pytest.skip(f"{label} not in the installed transformers")
    spec = _small_spec(label)
    hf_module, x, ref = _reference(spec)
    seq = x.shape[1]
    task = load_task(render_block(spec, BATCH, seq, "float32", f"{label} fidelity"), label)
    torch.manual_seed(1)
    ours = task.build().eval()
    state = _mapped_state(hf_module)
    assert set(state) == set(ours.state_dict()), "parameter names differ from the transformers module"
    ours.load_state_dict(state, strict=True)
    with torch.no_grad():
        out = ours(x)
    assert out.shape == ref.shape
    assert ref.abs().mean() > 0.05, "reference output too small to compare"
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)


def test_sliding_window_mask_changes_output():
    """The Mistral sliding window (5 < seq) must matter: a plain causal render differs from the reference."""
    spec = _small_spec("MistralAttention")
    hf_module, x, ref = _reference(spec)
    for window, same in ((spec.config["sliding_window"], True), (None, False)):
        s = dataclasses.replace(spec, config={**spec.config, "sliding_window": window})
        model = load_task(render_block(s, BATCH, x.shape[1], "float32", "mask"), "mask").build().eval()
        model.load_state_dict(_mapped_state(hf_module))
        with torch.no_grad():
            assert torch.allclose(model(x), ref, atol=1e-4, rtol=1e-4) is same


def test_specs_use_the_default_configs():
    import transformers

    specs = block_specs()
    assert specs == block_specs(), "block_specs is not deterministic"
    assert len({s.label for s in specs}) == len(specs)
    kinds = {s.kind for s in specs}
    assert {"norm", "mlp", "attention", "decoder_layer", "encoder_layer"} <= kinds
    fams = {f.name: f for f in FAMILIES}
    for s in specs:
        cfg = getattr(transformers, fams[s.family].config_class)()
        assert s.config == config_from_hf(s.family, cfg)
        assert s.config["hidden_size"] >= 256
        assert s.label.startswith(fams[s.family].prefix)
    llama = next(s for s in specs if s.label == "LlamaAttention").config
    ref = transformers.LlamaConfig()
    assert (llama["hidden_size"], llama["num_heads"], llama["intermediate_size"]) == (
        ref.hidden_size, ref.num_attention_heads, ref.intermediate_size)
    assert block_specs(min_hidden=10**6) == []
    specs[0].config["hidden_size"] = -1
    assert block_specs()[0].config["hidden_size"] > 0, "callers share the cached configs"


_RUNNER = textwrap.dedent('''
    import importlib.abc, json, sys
    class Refuse(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name == "transformers" or name.startswith("transformers."):
                raise ImportError("transformers is blocked in this test")
    sys.meta_path.insert(0, Refuse())
    for k in [k for k in sys.modules if k == "transformers" or k.startswith("transformers.")]:
        del sys.modules[k]
    import types, torch
    results = []
    for item in json.load(open(sys.argv[1])):
        mod = types.ModuleType("task")
        exec(compile(item["code"], item["name"], "exec"), mod.__dict__)
        with torch.device(item["device"]):
            torch.manual_seed(0)
            model = mod.Model(*mod.get_init_inputs())
            x = mod.get_inputs()
            with torch.no_grad():
                y = model(*x)
        finite = True if item["device"] == "meta" else bool(torch.isfinite(y).all())
        results.append({"name": item["name"], "in": list(x[0].shape), "out": list(y.shape),
                        "dtype": str(y.dtype), "finite": finite})
    assert "transformers" not in sys.modules
    print(json.dumps(results))
''')


def test_tasks_run_without_transformers(tmp_path):
    """Every spec, at its real size on ``meta`` and at a small size on CPU in every dtype, builds and runs
    in a process where importing transformers fails."""
    items = []
    for spec in block_specs():
        seq = 4100 if spec.config.get("sliding_window") else 8  # past Mistral's 4096 window: mask path
        items.append({"name": f"{spec.label}-real", "device": "meta", "dtype": "bfloat16",
                      "code": render_block(spec, 1, seq, "bfloat16", f"{spec.label} (real config)")})
    small = [_small_spec(s.label) for s in block_specs()]
    for i, spec in enumerate(small):
        dtype = DTYPES[i % len(DTYPES)]
        items.append({"name": f"{spec.label}-{dtype}", "device": "cpu", "dtype": dtype,
                      "code": render_block(spec, 2, 7, dtype, f"{spec.label} (small config)")})
    for item in items:
        assert "transformers" not in item["code"]
    (tmp_path / "tasks.json").write_text(json.dumps(items))
    (tmp_path / "run.py").write_text(_RUNNER)
    proc = subprocess.run([sys.executable, str(tmp_path / "run.py"), str(tmp_path / "tasks.json")],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = {r["name"]: r for r in json.loads(proc.stdout.strip().splitlines()[-1])}
    assert len(results) == len(items)
    for item in items:
        r = results[item["name"]]
        assert r["out"] == r["in"], r
        assert r["dtype"] == f"torch.{item['dtype']}", r
        assert r["finite"], r


def test_rendered_source_shape():
    spec = next(s for s in block_specs() if s.label == "LlamaDecoderLayer")
    code = render_block(spec, 3, 128, "float16", "doc")
    task = load_task(code, "shape")
    assert (task.module.batch_size, task.module.seq_len, task.module.hidden_size) == (3, 128, spec.config["hidden_size"])
    assert task.init_inputs() == []
    assert "self.to(torch.float16)" in code
    with torch.device("meta"):
        model = task.build()
        (x,) = task.inputs()
    assert x.dtype == torch.float16 and all(p.dtype == torch.float16 for p in model.parameters())
    for bad in [dict(dtype="float64"), dict(batch=0), dict(seq=-1)]:
        kw = dict(batch=1, seq=8, dtype="float32") | bad
        with pytest.raises(ValueError, match="LlamaDecoderLayer"):
            render_block(spec, kw["batch"], kw["seq"], kw["dtype"], "doc")
    with pytest.raises(ValueError, match="docstring"):
        render_block(spec, 1, 8, "float32", 'say """hi"""')
    with pytest.raises(ValueError, match="head_dim"):
        cfg = {k: v for k, v in spec.config.items() if k != "head_dim"}
        render_block(dataclasses.replace(spec, config=cfg), 1, 8, "float32", "doc")


def test_norms_are_not_identities():
    """Rendered norm parameters are seeded and non-trivial, the same on every build."""
    spec = _small_spec("GPT2Block")
    code = render_block(spec, 2, 8, "float32", "norms")
    a, b = (load_task(code, "n").build() for _ in range(2))
    for name, p in a.named_parameters():
        if name.startswith(("block.ln_1", "block.ln_2")):
            target = 1.0 if name.endswith("weight") else 0.0
            assert (p - target).abs().mean() > 0.03, name
            assert torch.equal(p, dict(b.named_parameters())[name])


def test_neox_sequential_residual_variant(monkeypatch):
    """GPT-NeoX configs without the parallel residual render the sequential layer, still exact."""
    if not any(s.label == "GPTNeoXLayer" for s in block_specs()):
        pytest.skip("GPT-NeoX not in the installed transformers")
    monkeypatch.setitem(SMALL, "gpt_neox", {**SMALL["gpt_neox"], "use_parallel_residual": False})
    assert _small_spec("GPTNeoXLayer").config["parallel_residual"] is False
    test_block_matches_transformers("GPTNeoXLayer")


def test_param_count_and_graph_json():
    """param_count follows the architecture's formula; graph_json round-trips the spec."""
    spec = next(s for s in block_specs() if s.label == "LlamaMLP")
    h, i = spec.config["hidden_size"], spec.config["intermediate_size"]
    assert spec.param_count() == 3 * h * i  # gate, up, down projections, no bias
    g = json.loads(spec.graph_json(4, 256, "bfloat16"))
    assert (g["transformers"], g["kind"], g["batch_size"], g["seq_len"], g["dtype"]) == (
        "LlamaMLP", "mlp", 4, 256, "bfloat16")
    assert g["config"] == spec.config
