"""Enumerate candidate seed modules from the installed transformers: activation classes and the
building blocks (MLP, attention, norm, embedding, layer, ...) of every model family, each built from a
small config of that family's own config class. No weights are downloaded and nothing touches the network.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Iterator

import torch.nn as nn
from opforge.seeds.seed_op import SeedOp, SkipRecord, TensorSpec

# Class-name endings of the building blocks harvested from each modeling file.
BLOCK_SUFFIXES = (
    "MLP", "Mlp", "FeedForward", "FFN", "Attention", "SelfAttention", "RMSNorm", "LayerNorm", "Norm",
    "Layer", "Block", "Intermediate", "Output", "Embeddings", "PatchEmbeddings", "Pooler", "Stage",
    "Head", "Transform", "Conv", "Activation", "Shortcut", "ShortCut", "Bottleneck", "BottleNeckLayer",
)
MAX_BLOCKS_PER_FAMILY = 8

# Small sizes written into every config that has the field (hidden sizes divisible by the head counts).
SMALL_CONFIG = {
    "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
    "num_hidden_layers": 1, "vocab_size": 128, "max_position_embeddings": 64, "head_dim": 8,
    "d_model": 32, "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 64,
    "decoder_ffn_dim": 64, "n_embd": 32, "n_head": 4, "n_layer": 1, "n_inner": 64, "embed_dim": 32,
    "num_heads": 4, "dim": 32, "hidden_dim": 64, "ffn_dim": 64, "num_channels": 3, "image_size": 32,
    "patch_size": 4, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, "dropout": 0.0,
    "attention_dropout": 0.0, "activation_dropout": 0.0, "hidden_dropout": 0.0, "resid_pdrop": 0.0,
    "embd_pdrop": 0.0, "attn_pdrop": 0.0, "drop_path_rate": 0.0, "layerdrop": 0.0,
}
SEQ_LEN = 8


def _small_config(cfg_cls) -> tuple[object, dict]:
    try:
        params = inspect.signature(cfg_cls.__init__).parameters
    except (TypeError, ValueError):
        params = {}
    kw = {k: v for k, v in SMALL_CONFIG.items() if k in params}
    try:
        return cfg_cls(**kw), kw
    except Exception:
        try:
            return cfg_cls(), {}
        except Exception:
            return None, {}


def _family_config_class(fam: str):
    try:
        cmod = importlib.import_module(f"transformers.models.{fam}.configuration_{fam}")
    except Exception:
        return None
    from transformers import PretrainedConfig

    classes = [c for n, c in vars(cmod).items() if isinstance(c, type) and issubclass(c, PretrainedConfig)
               and c is not PretrainedConfig and c.__module__ == cmod.__name__]
    if not classes:
        return None
    base = fam.replace("_", "").lower()
    classes.sort(key=lambda c: (c.__name__.lower() != f"{base}config", c.__name__))
    return classes[0]


def _forward_inputs(cls, cfg) -> list[list[TensorSpec]] | None:
    """Input recipes to try for ``cls.forward``: one tensor plus optional ones left at their defaults."""
    try:
        params = list(inspect.signature(cls.forward).parameters.values())[1:]
    except (TypeError, ValueError):
        return None
    required = [p for p in params if p.default is inspect.Parameter.empty
                and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if len(required) != 1:
        return None
    hidden = getattr(cfg, "hidden_size", 32) if cfg is not None else 16
    if not isinstance(hidden, int):
        hidden = 32
    name = required[0].name
    if "ids" in name:
        return [[TensorSpec(shape=["N", SEQ_LEN], dtype="int64", values="index:100")]]
    chans = getattr(cfg, "num_channels", 3) if cfg is not None else 3
    shapes = [["N", SEQ_LEN, hidden], ["N", hidden, 8, 8], ["N", chans, 32, 32], ["N", 8, 8, hidden],
              ["N", hidden], ["N", hidden, SEQ_LEN]]
    return [[TensorSpec(shape=s)] for s in shapes]


def activation_candidates(version: str) -> Iterator[SeedOp | SkipRecord]:
    from transformers.activations import ACT2CLS

    seen = set()
    for key in sorted(ACT2CLS):
        entry = ACT2CLS[key]
        cls, kwargs = (entry if isinstance(entry, tuple) else (entry, {}))
        if cls in seen or not (isinstance(cls, type) and issubclass(cls, nn.Module)):
            continue
        seen.add(cls)
        if cls.__module__.startswith("torch"):
            continue  # plain torch activations are already torch seed ops
        yield SeedOp(label=cls.__name__, qualname=f"{cls.__module__}.{cls.__name__}", library="transformers",
                     library_version=version, kind="module", init_args=dict(kwargs), family="activations",
                     category="activation", inputs=[TensorSpec(shape=[])])


def family_names() -> list[str]:
    """Model families of the installed transformers (sub-packages of ``transformers.models``), in name order;
    nothing is imported beyond ``transformers.models`` itself."""
    import transformers.models as tm

    return sorted(m.name for m in pkgutil.iter_modules(tm.__path__) if m.ispkg)


def family_candidates(version: str, families: list[str] | None = None) -> Iterator[list[SeedOp] | SkipRecord]:
    """For each model family, a list of drafts (one per input recipe to try) per building-block class."""
    for fam in families or family_names():
        yield from family_blocks(version, fam)


def family_blocks(version: str, fam: str) -> list[list[SeedOp] | SkipRecord]:
    """Drafts of one model family's building blocks (imports ``transformers.models.<fam>.modeling_<fam>``):
    per block class a list of drafts, one per input recipe to try, or a ``SkipRecord`` (``import_error``,
    ``config_error``, ``no_rule:init``, ``no_rule:forward``); at most ``MAX_BLOCKS_PER_FAMILY`` lists."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    out: list[list[SeedOp] | SkipRecord] = []
    try:
        mod = importlib.import_module(f"transformers.models.{fam}.modeling_{fam}")
    except Exception as exc:
        return [SkipRecord(label=fam, qualname=f"transformers.models.{fam}", library="transformers",
                           reason="import_error", detail=f"{type(exc).__name__}: {exc}"[:200])]
    cfg_cls = _family_config_class(fam)
    if cfg_cls is None:
        return []
    cfg, cfg_kw = _small_config(cfg_cls)
    if cfg is None:
        return [SkipRecord(label=fam, qualname=f"{cfg_cls.__module__}.{cfg_cls.__name__}",
                           library="transformers", reason="config_error")]
    blocks = sorted(n for n, c in vars(mod).items() if isinstance(c, type) and issubclass(c, nn.Module)
                    and c.__module__ == mod.__name__ and n.endswith(BLOCK_SUFFIXES)
                    and "PreTrained" not in n and not n.endswith("Model"))
    taken = 0
    for name in blocks:
        if taken >= MAX_BLOCKS_PER_FAMILY:
            break
        cls = getattr(mod, name)
        qual = f"{mod.__name__}.{name}"
        try:
            init = list(inspect.signature(cls.__init__).parameters.values())[1:]
        except (TypeError, ValueError):
            continue
        req = [p for p in init if p.default is inspect.Parameter.empty
               and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        init_args = {}
        if not req or req[0].name != "config" or any(p.name not in ("layer_idx",) for p in req[1:]):
            out.append(SkipRecord(label=name, qualname=qual, library="transformers",
                                  reason="no_rule:init", detail=str([p.name for p in req])))
            continue
        if len(req) > 1:
            init_args["layer_idx"] = 0
        recipes = _forward_inputs(cls, cfg)
        if not recipes:
            out.append(SkipRecord(label=name, qualname=qual, library="transformers",
                                  reason="no_rule:forward", detail="needs several tensor inputs"))
            continue
        taken += 1
        out.append([SeedOp(label=name, qualname=qual, library="transformers", library_version=version,
                           kind="module", init_args=init_args, inputs=r, family=fam, category="block",
                           config_class=f"{cfg_cls.__module__}.{cfg_cls.__name__}", config=cfg_kw)
                    for r in recipes])
    return out
