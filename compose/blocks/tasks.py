"""Self-contained transformers block tasks: a block's computation written into the task source.

A block task holds the block class and every helper it calls (rotary embedding, ``rotate_half`` /
``apply_rotary_pos_emb``, ``repeat_kv``, activation, RMSNorm, causal / sliding-window masks) in its own
source, sized with the family's real default config read from the installed transformers config class;
the task never imports transformers. Its label (the ``ops`` entry) is the transformers class it mirrors.

Families and block kinds (``FAMILIES``): Llama, Mistral, Qwen2, Qwen3, Phi-3, Gemma (gated MLP, RMSNorm,
causal GQA attention with RoPE through SDPA, pre-norm decoder layer; Mistral's sliding window, Qwen3's
per-head q / k norm, Phi-3's fused qkv and gate / up projections, Gemma's (1 + weight) RMSNorm), GPT-NeoX
(fused per-head qkv, partial rotary, parallel residual), Falcon (multi-query attention, one LayerNorm
shared by the parallel attention and MLP), GPT-2 (GELU-new MLP, causal MHA with explicit softmax, pre-norm
block), OPT (causal MHA, pre-norm ReLU decoder layer), BERT and RoBERTa (bidirectional MHA, post-norm
encoder layer), ViT (bidirectional MHA, GELU MLP, pre-norm encoder layer) and T5 (T5LayerNorm, ReLU
DenseActDense, pre-norm feed-forward sub-layer, bidirectional attention with a relative position bias,
pre-norm encoder block). A family whose config class the installed transformers lacks, or whose default
config uses a variant not written here (a RoPE type other than ``default`` or partial rotary outside
GPT-NeoX, an activation outside ``blocks_source.ACTIVATIONS``, GPT-2 attention scaled by layer index, OPT
post-norm, Falcon without multi-query or with ALiBi, T5 gated feed-forward), yields no spec.

Usage::

    specs = block_specs()                         # one BlockSpec per (family, kind), deterministic order
    code = render_block(specs[0], batch=4, seq=512, dtype="bfloat16", docstring="...")
    ops = [specs[0].label]                        # e.g. "LlamaMLP"
"""

from __future__ import annotations

import functools
import importlib.util
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from opforge.compose.blocks import source as src
from opforge.compose.source import literal, task_source

DTYPES = ("float32", "bfloat16", "float16")
NORM_SEED = 0  # seed of the generator that draws the norm parameters in every rendered block


@dataclass(frozen=True)
class Family:
    """A transformers model family this module can write blocks for.

    Attributes:
        name: the transformers model type (``transformers.models.<name>``).
        config_class: the family's config class in ``transformers`` (its defaults size the blocks).
        prefix: the class-name prefix of the family's modules (``Llama`` -> ``LlamaMLP``).
        style: which block sources apply: ``rope`` (Llama-like decoder), ``gemma``, ``neox``, ``falcon``,
            ``gpt2``, ``opt``, ``bert``, ``vit`` or ``t5``.
    """

    name: str
    config_class: str
    prefix: str
    style: str


FAMILIES = (
    Family("llama", "LlamaConfig", "Llama", "rope"),
    Family("mistral", "MistralConfig", "Mistral", "rope"),
    Family("qwen2", "Qwen2Config", "Qwen2", "rope"),
    Family("qwen3", "Qwen3Config", "Qwen3", "rope"),
    Family("phi3", "Phi3Config", "Phi3", "rope"),
    Family("gemma", "GemmaConfig", "Gemma", "gemma"),
    Family("gpt_neox", "GPTNeoXConfig", "GPTNeoX", "neox"),
    Family("falcon", "FalconConfig", "Falcon", "falcon"),
    Family("gpt2", "GPT2Config", "GPT2", "gpt2"),
    Family("opt", "OPTConfig", "OPT", "opt"),
    Family("bert", "BertConfig", "Bert", "bert"),
    Family("roberta", "RobertaConfig", "Roberta", "bert"),
    Family("vit", "ViTConfig", "ViT", "vit"),
    Family("t5", "T5Config", "T5", "t5"),
)

# style -> kind -> class-name suffix (label = prefix + suffix), in the order specs are listed.
KINDS = {
    "rope": {"norm": "RMSNorm", "mlp": "MLP", "attention": "Attention", "decoder_layer": "DecoderLayer"},
    "gemma": {"norm": "RMSNorm", "mlp": "MLP", "attention": "Attention", "decoder_layer": "DecoderLayer"},
    "neox": {"mlp": "MLP", "attention": "Attention", "decoder_layer": "Layer"},
    "falcon": {"mlp": "MLP", "attention": "Attention", "decoder_layer": "DecoderLayer"},
    "gpt2": {"mlp": "MLP", "attention": "Attention", "decoder_layer": "Block"},
    "opt": {"attention": "Attention", "decoder_layer": "DecoderLayer"},
    "bert": {"attention": "Attention", "encoder_layer": "Layer"},
    "vit": {"mlp": "MLP", "attention": "Attention", "encoder_layer": "Layer"},
    "t5": {"norm": "LayerNorm", "mlp": "DenseActDense", "residual_mlp": "LayerFF", "attention": "Attention",
           "encoder_layer": "Block"},
}


@dataclass
class BlockSpec:
    """One block task kind of one family.

    Attributes:
        label: the transformers class name the block mirrors (the task's ``ops`` entry), e.g. ``LlamaMLP``.
        family: the transformers model type, e.g. ``llama``.
        kind: ``norm``, ``mlp``, ``attention``, ``decoder_layer``, ``encoder_layer`` or ``residual_mlp``.
        config: sizes and settings from the family's config (see ``config_from_hf``): ``hidden_size``,
            ``intermediate_size``, ``num_heads``, ``num_kv_heads``, ``head_dim``, ``act`` (transformers
            activation name), ``eps``, ``rope_theta`` and ``rotary_dim`` (RoPE families),
            ``sliding_window`` (int or None), ``max_positions`` (the longest sequence the family takes; for
            ViT the token count of its default image, (224 / 16)^2 + 1 = 197), bias flags (``qkv_bias``,
            ``o_bias``, ``mlp_bias``, ``bias``), variant flags (``qk_norm``, ``fused_proj``,
            ``parallel_residual``) and ``source`` (the config class name).
    """

    label: str
    family: str
    kind: str
    config: dict = field(default_factory=dict)

    def param_count(self) -> int:
        """Parameters of the rendered block (built on ``meta``: no memory, no compute)."""
        import torch
        from opforge.task.source import load_task

        task = load_task(render_block(self, 1, 1, "float32", self.label), self.label)
        with torch.device("meta"):
            return sum(p.numel() for p in task.build().parameters())

    def graph_json(self, batch: int, seq: int, dtype: str) -> str:
        """JSON for a dataset row's ``graph`` column: label, family, kind, batch, seq, dtype and config."""
        return json.dumps({"transformers": self.label, "family": self.family, "kind": self.kind,
                           "batch_size": batch, "seq_len": seq, "dtype": dtype, "config": self.config},
                          sort_keys=True)


def _rope(cfg) -> tuple[float, float] | None:
    """(rope_theta, partial_rotary_factor) of a config with default RoPE, None for any other RoPE type."""
    params = getattr(cfg, "rope_parameters", None)
    if isinstance(params, dict):
        if params.get("rope_type", "default") != "default" or "rope_theta" not in params:
            return None
        return float(params["rope_theta"]), float(params.get("partial_rotary_factor", 1.0))
    scaling = getattr(cfg, "rope_scaling", None)
    if scaling and scaling.get("rope_type", scaling.get("type", "default")) != "default":
        return None
    theta = getattr(cfg, "rope_theta", None)
    if theta is None:
        return None
    return float(theta), float(getattr(cfg, "partial_rotary_factor", getattr(cfg, "rotary_pct", 1.0)))


def config_from_hf(family: str, cfg) -> dict | None:
    """The block config of ``family`` read from a transformers config object ``cfg``.

    Returns None when the config uses a variant the block sources do not write (see the module
    docstring). Raises KeyError for a family not in ``FAMILIES``.
    """
    fam = {f.name: f for f in FAMILIES}[family]
    c: dict = {"source": type(cfg).__name__}
    if fam.style in ("rope", "gemma"):
        rope = _rope(cfg)
        if rope is None or rope[1] != 1.0:
            return None
        theta = rope[0]
        heads = cfg.num_attention_heads
        layer_types = getattr(cfg, "layer_types", None)
        window = getattr(cfg, "sliding_window", None)
        if layer_types and layer_types[0] != "sliding_attention":
            window = None  # the first layer attends to the full causal context
        c.update(hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size, num_heads=heads,
                 num_kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
                 head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // heads,
                 act=cfg.hidden_act, eps=float(cfg.rms_norm_eps), rope_theta=theta,
                 sliding_window=window, max_positions=cfg.max_position_embeddings,
                 qkv_bias=bool(getattr(cfg, "attention_bias", False)),
                 o_bias=bool(getattr(cfg, "attention_bias", False)),
                 mlp_bias=bool(getattr(cfg, "mlp_bias", False)), qk_norm=family == "qwen3",
                 fused_proj=family == "phi3")
        if family == "qwen2":  # Qwen2: biased q / k / v, unbiased o_proj
            c.update(qkv_bias=True, o_bias=False)
        if family == "phi3":  # Phi-3: fused projections, none biased
            c.update(qkv_bias=False, o_bias=False, mlp_bias=False)
    elif fam.style == "neox":
        rope = _rope(cfg)
        if rope is None:
            return None
        head_dim = cfg.hidden_size // cfg.num_attention_heads
        c.update(hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
                 num_heads=cfg.num_attention_heads, head_dim=head_dim, num_kv_heads=cfg.num_attention_heads,
                 act=cfg.hidden_act, eps=float(cfg.layer_norm_eps), rope_theta=rope[0],
                 rotary_dim=int(head_dim * rope[1]), bias=bool(cfg.attention_bias),
                 parallel_residual=bool(cfg.use_parallel_residual), max_positions=cfg.max_position_embeddings)
    elif fam.style == "falcon":
        rope = _rope(cfg)
        if (rope is None or rope[1] != 1.0 or cfg.alibi or not cfg.multi_query or not cfg.parallel_attn
                or cfg.new_decoder_architecture):
            return None
        heads = cfg.num_attention_heads
        c.update(hidden_size=cfg.hidden_size, intermediate_size=cfg.ffn_hidden_size or 4 * cfg.hidden_size,
                 num_heads=heads, num_kv_heads=1, head_dim=cfg.hidden_size // heads, act=cfg.activation,
                 eps=float(cfg.layer_norm_epsilon), rope_theta=rope[0], bias=bool(cfg.bias),
                 max_positions=cfg.max_position_embeddings)
    elif fam.style == "gpt2":
        if not cfg.scale_attn_weights or cfg.scale_attn_by_inverse_layer_idx or cfg.add_cross_attention:
            return None
        c.update(hidden_size=cfg.n_embd, intermediate_size=cfg.n_inner or 4 * cfg.n_embd, num_heads=cfg.n_head,
                 act=cfg.activation_function, eps=float(cfg.layer_norm_epsilon), max_positions=cfg.n_positions)
    elif fam.style == "opt":
        if not cfg.do_layer_norm_before or not cfg.layer_norm_elementwise_affine:
            return None
        c.update(hidden_size=cfg.hidden_size, intermediate_size=cfg.ffn_dim, num_heads=cfg.num_attention_heads,
                 act=cfg.activation_function, eps=1e-5, bias=bool(cfg.enable_bias),  # nn.LayerNorm's default eps
                 max_positions=cfg.max_position_embeddings)
    elif fam.style == "bert":
        if getattr(cfg, "is_decoder", False):
            return None
        c.update(hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
                 num_heads=cfg.num_attention_heads, act=cfg.hidden_act, eps=float(cfg.layer_norm_eps),
                 max_positions=cfg.max_position_embeddings)
    elif fam.style == "vit":
        c.update(hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
                 num_heads=cfg.num_attention_heads, act=cfg.hidden_act, eps=float(cfg.layer_norm_eps),
                 qkv_bias=bool(cfg.qkv_bias), max_positions=(cfg.image_size // cfg.patch_size) ** 2 + 1)
    elif fam.style == "t5":
        if cfg.is_gated_act:
            return None
        c.update(hidden_size=cfg.d_model, intermediate_size=cfg.d_ff, act=cfg.dense_act_fn,
                 eps=float(cfg.layer_norm_epsilon), num_heads=cfg.num_heads, num_kv_heads=cfg.num_heads,
                 head_dim=cfg.d_kv, num_buckets=cfg.relative_attention_num_buckets,
                 max_distance=cfg.relative_attention_max_distance,
                 max_positions=getattr(cfg, "n_positions", 512))
    if "act" in c and c["act"] not in src.ACTIVATIONS:
        return None
    if "num_heads" in c and "head_dim" not in c:
        c["head_dim"] = c["hidden_size"] // c["num_heads"]
        c["num_kv_heads"] = c["num_heads"]
    return c


def _modeling_classes(family: str) -> set[str]:
    """Class names defined in ``transformers/models/<family>/modeling_<family>.py``, read from its text
    (importing every modeling module would cost seconds); empty when the file is absent."""
    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.submodule_search_locations:
        return set()
    path = Path(spec.submodule_search_locations[0]) / "models" / family / f"modeling_{family}.py"
    if not path.is_file():
        return set()
    return set(re.findall(r"^class (\w+)\(", path.read_text(encoding="utf-8"), flags=re.MULTILINE))


def block_specs(min_hidden: int = 256) -> list[BlockSpec]:
    """One spec per (family, kind) the installed transformers provides, sized by the family's default
    config (``<ConfigClass>()``), in ``FAMILIES`` then ``KINDS`` order.

    A family is skipped when transformers lacks its config class, when ``config_from_hf`` returns None,
    or when its hidden size is below ``min_hidden``; a kind is skipped when the family's modeling module
    lacks the class it mirrors. The configs are read once per process; every call returns fresh copies.
    """
    return [BlockSpec(label, family, kind, dict(config)) for label, family, kind, config in _specs(min_hidden)]


@functools.lru_cache(maxsize=4)
def _specs(min_hidden: int) -> tuple[tuple[str, str, str, dict], ...]:
    import transformers

    out = []
    for fam in FAMILIES:
        cfg_cls = getattr(transformers, fam.config_class, None)
        if cfg_cls is None:
            continue
        try:
            config = config_from_hf(fam.name, cfg_cls())
        except Exception:  # noqa: BLE001 - a config class that cannot build its defaults: family skipped
            continue
        if config is None or config["hidden_size"] < min_hidden:
            continue
        available = _modeling_classes(fam.name)
        for kind, suffix in KINDS[fam.style].items():
            label = fam.prefix + suffix
            if label in available:
                out.append((label, fam.name, kind, config))
    return tuple(out)


# ----------------------------------------------------------------------------------------------------------
# rendering


@dataclass
class _Parts:
    helpers: list[str] = field(default_factory=list)   # top-level function sources, in order
    classes: list[str] = field(default_factory=list)   # block class sources, dependencies first
    norms: list[str] = field(default_factory=list)     # norm class names to initialise
    init: list[str] = field(default_factory=list)      # Model.__init__ lines after super().__init__()
    forward: list[str] = field(default_factory=list)   # Model.forward lines
    constants: list[str] = field(default_factory=list)  # config constant names used
    offset_norm: bool = False


def _rope_parts(spec: BlockSpec, seq: int, p: _Parts, prefix: str, gemma: bool):
    c, kind = spec.config, spec.kind
    norm = src.gemma_rms_norm(prefix) if gemma else src.rms_norm(prefix)
    p.offset_norm = gemma
    mlp = src.gated_mlp(prefix, c["act"], c["mlp_bias"], c.get("fused_proj", False))
    qk_norm = c.get("qk_norm", False)
    eps_arg = ", eps" if qk_norm else ""
    if kind == "norm":
        p.classes, p.norms = [norm], [f"{prefix}RMSNorm"]
        p.init.append(f"self.block = {prefix}RMSNorm(hidden_size, eps)")
        p.constants = ["hidden_size", "eps"]
        p.forward.append("return self.block(hidden_states)")
        return
    if kind == "mlp":
        p.classes = [mlp]
        p.init.append(f"self.block = {prefix}MLP(hidden_size, intermediate_size)")
        p.constants = ["hidden_size", "intermediate_size"]
        p.forward.append("return self.block(hidden_states)")
        return
    attn = src.rope_attention(prefix, c["qkv_bias"], c["o_bias"], qk_norm, c.get("fused_proj", False))
    p.helpers = [src.ROTATE_HALF, src.APPLY_ROPE, src.REPEAT_KV]
    p.classes = [src.rotary_embedding(prefix)] + ([norm] if qk_norm or kind == "decoder_layer" else []) + [attn]
    p.norms = [f"{prefix}RMSNorm"] if qk_norm or kind == "decoder_layer" else []
    p.init.append(f"self.rotary_emb = {prefix}RotaryEmbedding(head_dim, rope_theta)")
    if kind == "attention":
        p.init.append(f"self.block = {prefix}Attention(hidden_size, num_heads, num_kv_heads, head_dim{eps_arg})")
        p.constants = ["hidden_size", "num_heads", "num_kv_heads", "head_dim", "rope_theta"]
        if qk_norm:
            p.constants.append("eps")
    else:
        p.classes += [mlp, src.rope_decoder_layer(prefix, qk_norm)]
        p.init.append(f"self.block = {prefix}DecoderLayer(hidden_size, intermediate_size, num_heads, num_kv_heads, "
                      "head_dim, eps)")
        p.constants = ["hidden_size", "intermediate_size", "num_heads", "num_kv_heads", "head_dim", "eps",
                       "rope_theta"]
    p.forward.append("cos, sin = self.rotary_emb(hidden_states, hidden_states.shape[1])")
    window = c.get("sliding_window")
    if window is not None and seq > window:
        # the window only changes the causal mask once the sequence is longer than it
        p.helpers.append(src.SLIDING_WINDOW_MASK)
        p.constants.append("sliding_window")
        p.forward.append("mask = sliding_window_causal_mask(hidden_states.shape[1], sliding_window, "
                         "hidden_states.device)")
        p.forward.append("return self.block(hidden_states, cos, sin, mask)")
    else:
        p.forward.append("return self.block(hidden_states, cos, sin)")


def _neox_parts(spec: BlockSpec, p: _Parts, prefix: str):
    c, kind = spec.config, spec.kind
    if c["act"] == "gelu_new":
        p.helpers.append(src.GELU_NEW)
    mlp = src.neox_mlp(prefix, c["act"])
    if kind == "mlp":
        p.classes = [mlp]
        p.init.append(f"self.block = {prefix}MLP(hidden_size, intermediate_size)")
        p.constants = ["hidden_size", "intermediate_size"]
        p.forward.append("return self.block(hidden_states)")
        return
    p.helpers += [src.ROTATE_HALF, src.APPLY_PARTIAL_ROPE]
    p.classes = [src.rotary_embedding(prefix), src.neox_attention(prefix, c["bias"])]
    p.init.append(f"self.rotary_emb = {prefix}RotaryEmbedding(rotary_dim, rope_theta)")
    if kind == "attention":
        p.init.append(f"self.block = {prefix}Attention(hidden_size, num_heads)")
        p.constants = ["hidden_size", "num_heads", "rotary_dim", "rope_theta"]
    else:
        p.classes += [mlp, src.neox_layer(prefix, c["parallel_residual"])]
        p.norms = ["nn.LayerNorm"]
        p.init.append(f"self.block = {prefix}Layer(hidden_size, intermediate_size, num_heads, eps)")
        p.constants = ["hidden_size", "intermediate_size", "num_heads", "eps", "rotary_dim", "rope_theta"]
    p.forward.append("cos, sin = self.rotary_emb(hidden_states, hidden_states.shape[1])")
    p.forward.append("return self.block(hidden_states, cos, sin)")


def _falcon_parts(spec: BlockSpec, p: _Parts, prefix: str):
    c, kind = spec.config, spec.kind
    if c["act"] == "gelu_new":
        p.helpers.append(src.GELU_NEW)
    mlp = src.neox_mlp(prefix, c["act"], c["bias"])
    if kind == "mlp":
        p.classes = [mlp]
        p.init.append(f"self.block = {prefix}MLP(hidden_size, intermediate_size)")
        p.constants = ["hidden_size", "intermediate_size"]
        p.forward.append("return self.block(hidden_states)")
        return
    p.helpers += [src.ROTATE_HALF, src.APPLY_ROPE, src.REPEAT_KV]
    p.classes = [src.rotary_embedding(prefix), src.falcon_attention(prefix, c["bias"])]
    p.init.append(f"self.rotary_emb = {prefix}RotaryEmbedding(head_dim, rope_theta)")
    if kind == "attention":
        p.init.append(f"self.block = {prefix}Attention(hidden_size, num_heads)")
        p.constants = ["hidden_size", "num_heads", "head_dim", "rope_theta"]
    else:
        p.classes += [mlp, src.falcon_decoder_layer(prefix)]
        p.norms = ["nn.LayerNorm"]
        p.init.append(f"self.block = {prefix}DecoderLayer(hidden_size, intermediate_size, num_heads, eps)")
        p.constants = ["hidden_size", "intermediate_size", "num_heads", "head_dim", "eps", "rope_theta"]
    p.forward.append("cos, sin = self.rotary_emb(hidden_states, hidden_states.shape[1])")
    p.forward.append("return self.block(hidden_states, cos, sin)")


def _gpt2_parts(spec: BlockSpec, p: _Parts, prefix: str):
    c, kind = spec.config, spec.kind
    if c["act"] == "gelu_new":
        p.helpers.append(src.GELU_NEW)
    if kind in ("attention", "decoder_layer"):
        p.helpers.append(src.CAUSAL_MASK)
    mlp, attn = src.gpt2_mlp(prefix, c["act"]), src.gpt2_attention(prefix)
    if kind == "mlp":
        p.classes = [mlp]
        p.init.append(f"self.block = {prefix}MLP(hidden_size, intermediate_size)")
        p.constants = ["hidden_size", "intermediate_size"]
    elif kind == "attention":
        p.classes = [attn]
        p.init.append(f"self.block = {prefix}Attention(hidden_size, num_heads)")
        p.constants = ["hidden_size", "num_heads"]
    else:
        p.classes, p.norms = [attn, mlp, src.gpt2_block(prefix)], ["nn.LayerNorm"]
        p.init.append(f"self.block = {prefix}Block(hidden_size, intermediate_size, num_heads, eps)")
        p.constants = ["hidden_size", "intermediate_size", "num_heads", "eps"]
    p.forward.append("return self.block(hidden_states)")


def _opt_parts(spec: BlockSpec, p: _Parts, prefix: str):
    c, kind = spec.config, spec.kind
    p.helpers.append(src.CAUSAL_MASK)
    attn = src.opt_attention(prefix, c["bias"])
    if kind == "attention":
        p.classes = [attn]
        p.init.append(f"self.block = {prefix}Attention(hidden_size, num_heads)")
        p.constants = ["hidden_size", "num_heads"]
    else:
        p.classes, p.norms = [attn, src.opt_decoder_layer(prefix, c["act"], c["bias"])], ["nn.LayerNorm"]
        p.init.append(f"self.block = {prefix}DecoderLayer(hidden_size, intermediate_size, num_heads)")
        p.constants = ["hidden_size", "intermediate_size", "num_heads"]
    p.forward.append("return self.block(hidden_states)")


def _bert_parts(spec: BlockSpec, p: _Parts, prefix: str):
    c, kind = spec.config, spec.kind
    p.classes = [src.bert_self_attention(prefix), src.bert_add_norm(f"{prefix}SelfOutput", "in_size"),
                 src.bert_attention(prefix)]
    p.norms = ["nn.LayerNorm"]
    if kind == "attention":
        p.init.append(f"self.block = {prefix}Attention(hidden_size, num_heads, eps)")
        p.constants = ["hidden_size", "num_heads", "eps"]
    else:
        if c["act"] == "gelu_new":
            p.helpers.append(src.GELU_NEW)
        p.classes += [src.bert_intermediate(prefix, c["act"]), src.bert_add_norm(f"{prefix}Output", "in_size"),
                      src.bert_layer(prefix)]
        p.init.append(f"self.block = {prefix}Layer(hidden_size, intermediate_size, num_heads, eps)")
        p.constants = ["hidden_size", "intermediate_size", "num_heads", "eps"]
    p.forward.append("return self.block(hidden_states)")


def _vit_parts(spec: BlockSpec, p: _Parts, prefix: str):
    c, kind = spec.config, spec.kind
    if c["act"] == "gelu_new" and kind != "attention":
        p.helpers.append(src.GELU_NEW)
    attn, mlp = src.vit_attention(prefix, c["qkv_bias"]), src.vit_mlp(prefix, c["act"])
    if kind == "mlp":
        p.classes = [mlp]
        p.init.append(f"self.block = {prefix}MLP(hidden_size, intermediate_size)")
        p.constants = ["hidden_size", "intermediate_size"]
    elif kind == "attention":
        p.classes = [attn]
        p.init.append(f"self.block = {prefix}Attention(hidden_size, num_heads)")
        p.constants = ["hidden_size", "num_heads"]
    else:
        p.classes, p.norms = [attn, mlp, src.vit_layer(prefix)], ["nn.LayerNorm"]
        p.init.append(f"self.block = {prefix}Layer(hidden_size, intermediate_size, num_heads, eps)")
        p.constants = ["hidden_size", "intermediate_size", "num_heads", "eps"]
    p.forward.append("return self.block(hidden_states)")


def _t5_parts(spec: BlockSpec, p: _Parts, prefix: str):
    c, kind = spec.config, spec.kind
    if c["act"] == "gelu_new" and kind != "norm":
        p.helpers.append(src.GELU_NEW)
    norm, mlp = src.t5_layer_norm(prefix), src.t5_dense_act_dense(prefix, c["act"])
    attn_args = "hidden_size, num_heads, head_dim, num_buckets, max_distance"
    attn_constants = ["hidden_size", "num_heads", "head_dim", "num_buckets", "max_distance"]
    if kind == "norm":
        p.classes, p.norms = [norm], [f"{prefix}LayerNorm"]
        p.init.append(f"self.block = {prefix}LayerNorm(hidden_size, eps)")
        p.constants = ["hidden_size", "eps"]
    elif kind == "mlp":
        p.classes = [mlp]
        p.init.append(f"self.block = {prefix}DenseActDense(hidden_size, intermediate_size)")
        p.constants = ["hidden_size", "intermediate_size"]
    elif kind == "residual_mlp":
        p.classes, p.norms = [norm, mlp, src.t5_layer_ff(prefix)], [f"{prefix}LayerNorm"]
        p.init.append(f"self.block = {prefix}LayerFF(hidden_size, intermediate_size, eps)")
        p.constants = ["hidden_size", "intermediate_size", "eps"]
    elif kind == "attention":
        p.helpers.append(src.RELATIVE_POSITION_BUCKET)
        p.classes = [src.t5_attention(prefix)]
        p.init.append(f"self.block = {prefix}Attention({attn_args})")
        p.constants = attn_constants
    else:
        p.helpers.append(src.RELATIVE_POSITION_BUCKET)
        p.classes = [norm, mlp, src.t5_layer_ff(prefix), src.t5_attention(prefix), src.t5_block(prefix)]
        p.norms = [f"{prefix}LayerNorm"]
        p.init.append(f"self.block = {prefix}Block(hidden_size, intermediate_size, num_heads, head_dim, "
                      "num_buckets, max_distance, eps)")
        p.constants = [*attn_constants[:1], "intermediate_size", *attn_constants[1:], "eps"]
    p.forward.append("return self.block(hidden_states)")


def render_block(spec: BlockSpec, batch: int, seq: int, dtype: str, docstring: str) -> str:
    """KernelBench source of the block ``spec`` on input (batch, seq, hidden) in ``dtype``.

    The source defines the helpers and block classes, ``Model`` (building the block from module-level
    constants; RoPE families also build the rotary embedding, and the causal / sliding-window mask is
    derived from the sequence inside ``forward``), the constants ``batch_size``, ``seq_len`` and the
    config sizes it uses, ``get_inputs()`` returning ``[torch.randn(batch_size, seq_len, hidden_size)]``
    in ``dtype`` and an empty ``get_init_inputs()``. Norm parameters are set to seeded trained-like values
    (scale 1 + 0.1 * N(0, 1), bias 0.1 * N(0, 1), generator seed ``NORM_SEED``); Linear weights keep
    ``nn.Linear``'s default init. For ``bfloat16`` / ``float16`` the model is cast with ``self.to(dtype)``
    as the last line of ``Model.__init__`` (the RoPE tables are computed in float32 in ``forward``).

    Raises:
        ValueError: unknown dtype or family, a kind the family has no source for, batch or seq < 1,
            a config missing a field the block needs (named in the message), or a docstring that cannot
            sit between triple quotes.
    """
    if dtype not in DTYPES:
        raise ValueError(f"render_block({spec.label}): dtype {dtype!r} is not one of {DTYPES}")
    if not (isinstance(batch, int) and isinstance(seq, int) and batch >= 1 and seq >= 1):
        raise ValueError(f"render_block({spec.label}): batch and seq must be positive ints, got {batch}, {seq}")
    if '"""' in docstring or "\\" in docstring or docstring.endswith('"'):
        raise ValueError(f"render_block({spec.label}): the docstring may not hold triple quotes, backslashes "
                         "or end with a quote")
    fams = {f.name: f for f in FAMILIES}
    if spec.family not in fams:
        raise ValueError(f"render_block({spec.label}): unknown family {spec.family!r}")
    fam = fams[spec.family]
    if spec.kind not in KINDS[fam.style]:
        raise ValueError(f"render_block({spec.label}): family {spec.family} has no {spec.kind!r} block "
                         f"(kinds: {', '.join(KINDS[fam.style])})")
    p = _Parts()
    try:
        if fam.style in ("rope", "gemma"):
            _rope_parts(spec, seq, p, fam.prefix, fam.style == "gemma")
        else:
            {"neox": _neox_parts, "falcon": _falcon_parts, "gpt2": _gpt2_parts, "opt": _opt_parts, "bert": _bert_parts, "vit": _vit_parts,
             "t5": _t5_parts}[fam.style](spec, p, fam.prefix)
        constants = {name: spec.config[name] for name in p.constants}
        hidden = spec.config["hidden_size"]
    except KeyError as exc:
        raise ValueError(f"render_block({spec.label}): config lacks {exc.args[0]!r}") from None
    constants.pop("hidden_size", None)
    init = list(p.init)
    if p.norms:
        p.helpers.append(src.init_norms(p.norms, p.offset_norm))
        init.append(f"init_norm_parameters(self, seed={NORM_SEED})")
    if dtype != "float32":
        init.append(f"self.to(torch.{dtype})  # parameters in the input dtype")
    uses_math = any("math." in h for h in p.helpers)
    dtype_arg = "" if dtype == "float32" else f", dtype=torch.{dtype}"
    return task_source(
        header=["import math", ""] if uses_math else [], imports=["import torch.nn.functional as F"],
        definitions=[*p.helpers, *p.classes], docstring=docstring, init_lines=init,
        forward_args=["hidden_states"], forward_lines=p.forward,
        constants=[f"batch_size = {batch}", f"seq_len = {seq}", f"hidden_size = {hidden}",
                   *[f"{k} = {literal(v)}" for k, v in constants.items()]],
        input_lines=[], returned=f"torch.randn(batch_size, seq_len, hidden_size{dtype_arg})")
