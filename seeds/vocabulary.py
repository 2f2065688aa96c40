"""A shape vocabulary harvested from real models: the sizes the composer may give each axis of a task.

Sources, all offline (no weights, no network):

* the default config of every installed transformers model family (``CONFIG_MAPPING``), nested text /
  vision / audio / backbone sub-configs included: hidden and intermediate sizes, attention heads, key/value
  heads, head_dim (``hidden // heads`` where the config has none), vocabulary size, maximum positions,
  image and patch sizes (patch tokens ``(image / patch)^2``, ``+ 1`` where the family's modeling file has a
  class token), channel ladders of vision backbones, conv kernel sizes of audio feature encoders, mel bins,
  video frames, label counts;
* the default audio feature extractors (mel bins, frames per 30 s window: Whisper's 3000) and image
  processors (resize / crop sizes) of transformers;
* when ``torchvision`` is installed, its classification models built on the ``meta`` device and run on a
  224 x 224 image (299 for Inception v3), recording every ``nn.Conv2d``'s in / out channels, kernel size and
  output feature-map size, and the classifier's output features.

Axes (``AXES``): ``batch``, ``hidden``, ``intermediate``, ``heads``, ``head_dim``, ``kv_heads``, ``vocab``,
``seq`` (tokens / frames of a sequence), ``channels`` (conv / feature channels), ``spatial`` (image side and
feature-map side), ``kernel`` (conv kernel side), ``depth`` (the D of a 5-D ``N, C, D, H, W`` input: video
frames), ``classes`` (classifier outputs), ``mel`` (mel bins). Every value keeps its provenance
(``"llama.hidden_size"``). The snapshot shipped with the package is ``seeds/data/shape_vocabulary.json``.
"""

from __future__ import annotations

import importlib.util
import json
import math
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

VOCABULARY_VERSION = 1
AXES = ("batch", "hidden", "intermediate", "heads", "head_dim", "kv_heads", "vocab", "seq", "channels",
        "spatial", "kernel", "depth", "classes", "mel")
DATA_DIR = Path(__file__).parent / "data"
DEFAULT_PATH = DATA_DIR / "shape_vocabulary.json"
MAX_SOURCES = 25  # provenance strings kept per value (``count`` is the full number)

# Batch sizes are not harvested (a config holds none). Powers of two 1-512: the batch sizes of serving
# (1 = single request, 8-64 = dynamic batching) and of per-device training micro-batches; the odd ones are
# common per-device batch sizes of published training recipes (3, 6, 12, 24, 48, 96, 384 are multiples of 3 from
# 3-GPU / 3-way gradient-accumulation setups and of the 96 / 384 image batches of ViT / ResNet recipes).
BATCH_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256, 384, 512)
# Label counts of standard benchmarks, added to the classes axis since default configs mostly keep
# ``num_labels = 2``: ImageNet-1k 1000 (torchvision's default ``num_classes``), ImageNet-21k 21843, COCO 80
# detection classes (91 ids), ADE20K 150, Cityscapes 19, Pascal VOC 21, CIFAR-10 / -100, binary 2, GLUE MNLI 3.
BENCHMARK_CLASSES = {2: "binary", 3: "glue-mnli", 10: "cifar10", 19: "cityscapes", 21: "pascal-voc", 80: "coco",
                     91: "coco-ids", 100: "cifar100", 150: "ade20k", 1000: "imagenet-1k", 21843: "imagenet-21k"}
# Input sides of datasets, CIFAR 32 and MNIST 28, which no transformers default config holds.
BENCHMARK_SPATIAL = {32: "cifar", 28: "mnist"}

# Config attribute -> axis. Scalars and int lists are both read; lists give one value per element.
FIELD_AXES: dict[str, str] = {
    **dict.fromkeys(("hidden_size", "d_model", "n_embd", "embed_dim", "dim", "projection_dim",
                     "encoder_hidden_size", "decoder_hidden_size", "word_embed_proj_dim", "embedding_size",
                     "text_hidden_size", "vision_hidden_size", "out_hidden_size", "kv_lora_rank",
                     "q_lora_rank"), "hidden"),
    **dict.fromkeys(("intermediate_size", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim", "n_inner", "d_ff",
                     "moe_intermediate_size", "shared_expert_intermediate_size", "mlp_dim",
                     "decoder_intermediate_size", "encoder_intermediate_size"), "intermediate"),
    **dict.fromkeys(("num_attention_heads", "encoder_attention_heads", "decoder_attention_heads", "n_head",
                     "n_heads", "num_heads", "decoder_num_attention_heads"), "heads"),
    **dict.fromkeys(("num_key_value_heads", "num_kv_heads", "n_kv_heads", "multi_query_group_num"), "kv_heads"),
    **dict.fromkeys(("head_dim", "d_kv", "attention_head_size", "qk_head_dim", "v_head_dim",
                     "qk_rope_head_dim", "qk_nope_head_dim", "kv_channels"), "head_dim"),
    **dict.fromkeys(("vocab_size",), "vocab"),
    **dict.fromkeys(("max_position_embeddings", "n_positions", "max_source_positions", "max_target_positions",
                     "context_length", "n_ctx", "max_sequence_length", "image_seq_length",
                     "num_position_embeddings", "max_seq_len"), "seq"),
    **dict.fromkeys(("num_channels", "in_channels", "out_channels", "hidden_sizes", "embed_dims",
                     "neck_hidden_sizes", "conv_dim", "audio_channels", "tdnn_dim", "upsample_initial_channel",
                     "encoder_in_channels", "decoder_in_channels", "num_filters", "fusion_hidden_size",
                     "reassemble_hidden_size", "backbone_hidden_size"), "channels"),
    **dict.fromkeys(("image_size", "crop_size", "window_size", "patch_grid"), "spatial"),
    **dict.fromkeys(("conv_kernel", "kernel_size", "kernel_sizes", "conv_kernel_size", "tdnn_kernel",
                     "upsample_kernel_sizes", "resblock_kernel_sizes", "mamba_d_conv", "linear_conv_kernel_dim",
                     "num_conv_pos_embeddings", "adapter_kernel_size", "residual_kernel_size",
                     "last_kernel_size", "depthwise_conv_kernel_size", "conv_kernel_sizes", "patch_size",
                     "patch_sizes", "tubelet_size", "temporal_patch_size", "conv_depthwise_kernel_size",
                     "d_conv"), "kernel"),
    **dict.fromkeys(("num_frames",), "depth"),
    **dict.fromkeys(("num_labels", "num_classes"), "classes"),
    **dict.fromkeys(("num_mel_bins", "n_mel_bins", "n_mels"), "mel"),
}
# Record keys read from the first attribute present, in this order (the family's own size of that axis).
RECORD_FIELDS: dict[str, tuple[str, ...]] = {
    "hidden": ("hidden_size", "d_model", "n_embd", "embed_dim", "dim"),
    "intermediate": ("intermediate_size", "ffn_dim", "encoder_ffn_dim", "n_inner", "d_ff", "mlp_dim"),
    "heads": ("num_attention_heads", "encoder_attention_heads", "n_head", "n_heads", "num_heads"),
    "kv_heads": ("num_key_value_heads", "num_kv_heads", "n_kv_heads", "multi_query_group_num"),
    "head_dim": ("head_dim", "d_kv", "attention_head_size", "kv_channels"),
    "vocab": ("vocab_size",),
    "seq": ("max_position_embeddings", "n_positions", "max_source_positions", "context_length", "n_ctx",
            "max_sequence_length"),
    "mel": ("num_mel_bins", "n_mel_bins", "n_mels"),
    "depth": ("num_frames",),
    "layers": ("num_hidden_layers", "num_layers", "n_layer", "n_layers", "encoder_layers"),
}
LIST_RECORD_KEYS = ("channels", "spatial", "kernel")
# Sequence lengths 2^k from this one up to a family's maximum positions are added to ``seq``.
MIN_POW2_SEQ = 16
# A stride-4 stem then one stride-2 stage per level (ResNet, ConvNeXt, Swin, PVT, RegNet, ...): feature-map
# sides of a hierarchical backbone are image / 4, / 8, / 16, / 32 (He et al. 2016, Table 1; Liu et al. 2021).
LADDER_STRIDES = (4, 8, 16, 32)
DEFAULT_IMAGE = 224  # ImageNet training resolution, the default of backbones whose config has none
SUB_CONFIG_DEPTH = 3


@dataclass
class SizeValue:
    """One size of one axis: ``value``, how many model fields hold it (``count``), and up to
    ``MAX_SOURCES`` of them (``"llama.hidden_size"``, ``"resnet50.conv"``, ``"fixed:batch"``)."""

    value: int
    count: int
    sources: list[str] = field(default_factory=list)


class VocabularyError(ValueError):
    """A shape vocabulary file or JSON text is malformed; the message names the field."""


@dataclass
class ShapeVocabulary:
    """Sizes per axis with provenance, and one coherent record per model.

    Attributes:
        version: ``VOCABULARY_VERSION`` of the format.
        libraries: versions the vocabulary was harvested from (``{"transformers": "5.23.0", "torchvision":
            None, "torch": "2.13.0"}``; None = not installed).
        axes: axis -> values sorted by value; every axis of ``AXES`` is present.
        models: one dict per model config: ``family``, ``source`` (``transformers`` / ``torchvision``), ``part``
            (the sub-config path, e.g. ``vision_config``, absent at the top level) and the sizes that model has:
            ints for ``hidden``, ``intermediate``, ``heads``, ``kv_heads``, ``head_dim``, ``vocab``, ``seq``,
            ``mel``, ``depth``, ``classes``, ``layers``, ``tokens`` (patch tokens), ``image``, ``patch``; int lists
            in stage order for ``channels``, ``spatial``, ``kernel``. ``seq`` is the maximum positions, or the
            patch tokens of a vision encoder that has none.
        skipped: model types / models whose defaults could not be read (listed, not fatal).
    """

    version: int = VOCABULARY_VERSION
    libraries: dict[str, str | None] = field(default_factory=dict)
    axes: dict[str, list[SizeValue]] = field(default_factory=dict)
    models: list[dict] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def _axis(self, axis: str) -> list[SizeValue]:
        if axis not in AXES:
            raise KeyError(f"unknown axis {axis!r}; axes: {', '.join(AXES)}")
        return self.axes.get(axis, [])

    def values(self, axis: str, lo: int = 1, hi: int | None = None) -> list[int]:
        """Distinct sizes of ``axis`` in ``[lo, hi]`` (``hi`` None = no bound), ascending. KeyError: unknown axis."""
        return [v.value for v in self._axis(axis) if v.value >= lo and (hi is None or v.value <= hi)]

    def weights(self, axis: str) -> dict[int, float]:
        """size -> share of the axis's field count (sums to 1; empty for an empty axis)."""
        vals = self._axis(axis)
        total = sum(v.count for v in vals)
        return {v.value: v.count / total for v in vals} if total else {}

    def to_json(self) -> str:
        return json.dumps({
            "version": self.version,
            "libraries": self.libraries,
            "axes": {a: [{"value": v.value, "count": v.count, "sources": v.sources} for v in self.axes.get(a, [])]
                     for a in AXES},
            "models": self.models,
            "skipped": self.skipped,
        }, indent=1, sort_keys=False)

    @classmethod
    def from_json(cls, s: str) -> ShapeVocabulary:
        """Parse ``to_json`` output. Raises ``VocabularyError`` naming the field that is missing or wrong."""
        try:
            data = json.loads(s)
        except json.JSONDecodeError as exc:
            raise VocabularyError(f"not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise VocabularyError("top level: expected an object")
        version = data.get("version")
        if version != VOCABULARY_VERSION:
            raise VocabularyError(f"field 'version': expected {VOCABULARY_VERSION}, got {version!r} "
                                  f"(regenerate with `opforge seeds vocabulary`)")
        libraries = data.get("libraries")
        if not isinstance(libraries, dict):
            raise VocabularyError("field 'libraries': expected an object")
        raw_axes = data.get("axes")
        if not isinstance(raw_axes, dict):
            raise VocabularyError("field 'axes': expected an object")
        axes: dict[str, list[SizeValue]] = {}
        for a in AXES:
            if a not in raw_axes:
                raise VocabularyError(f"field 'axes.{a}': missing")
            if not isinstance(raw_axes[a], list):
                raise VocabularyError(f"field 'axes.{a}': expected a list")
            out = []
            for i, item in enumerate(raw_axes[a]):
                where = f"axes.{a}[{i}]"
                if not isinstance(item, dict):
                    raise VocabularyError(f"field '{where}': expected an object")
                for key in ("value", "count"):
                    v = item.get(key)
                    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                        raise VocabularyError(f"field '{where}.{key}': expected a positive int, got {v!r}")
                srcs = item.get("sources", [])
                if not isinstance(srcs, list) or not all(isinstance(x, str) for x in srcs):
                    raise VocabularyError(f"field '{where}.sources': expected a list of strings")
                out.append(SizeValue(item["value"], item["count"], list(srcs)))
            axes[a] = sorted(out, key=lambda v: v.value)
        unknown = sorted(set(raw_axes) - set(AXES))
        if unknown:
            raise VocabularyError(f"field 'axes': unknown axes {unknown}; axes: {', '.join(AXES)}")
        models = data.get("models", [])
        if not isinstance(models, list):
            raise VocabularyError("field 'models': expected a list")
        for i, m in enumerate(models):
            if not isinstance(m, dict) or not isinstance(m.get("family"), str) or not isinstance(m.get("source"), str):
                raise VocabularyError(f"field 'models[{i}]': expected an object with string 'family' and 'source'")
        skipped = data.get("skipped", [])
        if not isinstance(skipped, list) or not all(isinstance(x, str) for x in skipped):
            raise VocabularyError("field 'skipped': expected a list of strings")
        return cls(version=version, libraries=dict(libraries), axes=axes, models=models, skipped=skipped)


def load_vocabulary(path) -> ShapeVocabulary:
    """Read a vocabulary JSON file. Raises FileNotFoundError, or ValueError naming the file and the field."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"shape vocabulary not found: {path} (write one with "
                                f"`opforge seeds vocabulary --out {path}`)")
    try:
        return ShapeVocabulary.from_json(path.read_text())
    except VocabularyError as exc:
        raise VocabularyError(f"{path}: {exc}") from None


def default_vocabulary() -> ShapeVocabulary:
    """The packaged snapshot ``seeds/data/shape_vocabulary.json`` (harvested from the transformers named in its
    ``libraries``)."""
    return load_vocabulary(DEFAULT_PATH)


# --------------------------------------------------------------------------------------------- harvesting


def _int(v) -> int | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    if isinstance(v, float) and not v.is_integer():
        return None
    v = int(v)
    return v if v > 0 else None


def _ints(v) -> list[int]:
    """Positive ints of a scalar, a (nested) list, or a ``{"height": .., "width": ..}`` size dict."""
    if isinstance(v, dict):
        return [x for k in ("height", "width", "shortest_edge") if (x := _int(v.get(k))) is not None]
    if isinstance(v, (list, tuple)):
        return [x for item in v for x in _ints(item)]
    x = _int(v)
    return [x] if x is not None else []


class _Collector:
    """Accumulates (axis, value, source) triples and model records."""

    def __init__(self):
        self.values: dict[str, dict[int, list[str]]] = {a: {} for a in AXES}
        self.models: list[dict] = []
        self._seen: set[str] = set()

    def add(self, axis: str, value: int | None, source: str) -> None:
        if value is not None and value > 0:
            self.values[axis].setdefault(int(value), []).append(source)

    def add_record(self, record: dict, contributions: list[tuple[str, int, str]]) -> bool:
        """Keep a model record and its values unless an identical one (same sizes) was kept already."""
        sizes = {k: v for k, v in record.items() if k not in ("family", "source", "part")}
        if not sizes:
            return False
        key = json.dumps([record.get("model_type", record["family"]), sizes], sort_keys=True)
        if key in self._seen:
            return False
        self._seen.add(key)
        self.models.append({k: v for k, v in record.items() if k != "model_type"})
        for axis, value, source in contributions:
            self.add(axis, value, source)
        return True

    def vocabulary(self, libraries: dict) -> ShapeVocabulary:
        axes = {}
        for a in AXES:
            axes[a] = [SizeValue(v, len(srcs), sorted(set(srcs))[:MAX_SOURCES])
                       for v, srcs in sorted(self.values[a].items())]
        return ShapeVocabulary(version=VOCABULARY_VERSION, libraries=libraries, axes=axes, models=self.models)


def _modeling_text(config_cls: type) -> str:
    """Source text of the modeling file beside a config class's module, read without importing it."""
    mod = config_cls.__module__
    if ".configuration_" not in mod:
        return ""
    name = mod.replace(".configuration_", ".modeling_")
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return ""
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return ""
    return _read(spec.origin)


_TEXT_CACHE: dict[str, str] = {}


def _read(path: str) -> str:
    if path not in _TEXT_CACHE:
        try:
            _TEXT_CACHE[path] = Path(path).read_text(errors="ignore")
        except OSError:
            _TEXT_CACHE[path] = ""
    return _TEXT_CACHE[path]


_CLS_TOKEN = re.compile(r"\b(cls_token|class_embedding|class_token)\b")
_DISTILLATION_TOKEN = re.compile(r"\bdistillation_token\b")


def _config_record(cfg, family: str, part: str | None) -> tuple[dict, list[tuple[str, int, str]]]:
    """The record of one config object (its own attributes, not its sub-configs) and its axis values."""
    attrs = _attributes(cfg)
    where = f"{family}.{part}." if part else f"{family}."
    contrib: list[tuple[str, int, str]] = []
    for name, axis in FIELD_AXES.items():
        if name not in attrs:
            continue
        v = attrs[name]
        if axis == "classes" and name == "num_labels" and v == 2:
            continue  # PretrainedConfig's default, not the family's own
        if name == "multi_query_group_num" and not attrs.get("multi_query_attention", True):
            continue
        for x in _ints(v):
            contrib.append((axis, x, where + name))
    if attrs.get("multi_query") is True:
        contrib.append(("kv_heads", 1, where + "multi_query"))
    rec: dict[str, Any] = {"family": family, "source": "transformers", "model_type": getattr(cfg, "model_type", "")}
    if part:
        rec["part"] = part
    for key, names in RECORD_FIELDS.items():
        for name in names:
            x = _int(attrs.get(name))
            if x is not None:
                rec[key] = x
                break
    if attrs.get("multi_query") is True:
        rec["kv_heads"] = 1
    hidden, heads = rec.get("hidden"), rec.get("heads")
    if "head_dim" not in rec and hidden and heads and hidden % heads == 0:
        rec["head_dim"] = hidden // heads
        contrib.append(("head_dim", hidden // heads, where + "hidden_size/num_attention_heads"))
    if "intermediate" not in rec and hidden and isinstance(attrs.get("mlp_ratio"), (int, float)) \
            and not isinstance(attrs.get("mlp_ratio"), bool):
        inter = int(hidden * attrs["mlp_ratio"])
        rec["intermediate"] = inter
        contrib.append(("intermediate", inter, where + "hidden_size*mlp_ratio"))
    if "intermediate" not in rec and attrs.get("n_inner", 0) is None and hidden:
        rec["intermediate"] = 4 * hidden  # GPT-2 family: n_inner None means 4 * n_embd (GPT2Config docs)
        contrib.append(("intermediate", 4 * hidden, where + "4*n_embd"))
    if "seq" in rec:
        for k in range(int(math.log2(MIN_POW2_SEQ)), int(math.log2(rec["seq"])) + 1):
            if 2 ** k != rec["seq"]:
                contrib.append(("seq", 2 ** k, where + "pow2<=max_positions"))
    # images: side, patch grid, patch tokens, feature-map ladder
    images = _ints(attrs.get("image_size"))
    patches = [p for p in _ints(attrs.get("patch_size"))]
    ladder = _ladder_channels(attrs)
    if images:
        rec["image"] = images[0]
    if patches:
        rec["patch"] = patches[0]
    spatial: list[int] = list(dict.fromkeys(images))
    if images and patches and images[0] % patches[0] == 0 and not ladder:
        grid = images[0] // patches[0]
        spatial.append(grid)
        contrib.append(("spatial", grid, where + "image_size/patch_size"))
        text = _modeling_text(type(cfg))
        cls_tok, distill = bool(_CLS_TOKEN.search(text)), bool(_DISTILLATION_TOKEN.search(text))
        extra = cls_tok + distill
        regs = _int(attrs.get("num_register_tokens")) or 0
        tokens = grid * grid + extra + regs
        rec["tokens"] = tokens
        rec.setdefault("seq", tokens)  # a vision encoder's sequence is its patch tokens
        contrib.append(("seq", tokens, where + ("(image/patch)^2" + "+cls" * cls_tok + "+distillation" * distill)
                        + ("+registers" if regs else "")))
        frames, tubelet = _int(attrs.get("num_frames")), _int(attrs.get("tubelet_size"))
        if frames and tubelet and frames % tubelet == 0:
            contrib.append(("depth", frames // tubelet, where + "num_frames/tubelet_size"))
    if ladder:
        image = images[0] if images else DEFAULT_IMAGE
        stages = len(ladder)
        sides = [image // s for s in LADDER_STRIDES[:stages] if image % s == 0]
        spatial.extend(sides)
        for s in sides:
            contrib.append(("spatial", s, where + ("image_size" if images else f"{DEFAULT_IMAGE}") + "/stage_stride"))
        if not _ints(attrs.get("hidden_sizes")) and not _ints(attrs.get("embed_dims")):
            for c in ladder:
                contrib.append(("channels", c, where + "embed_dim*2^stage"))
    channels = ladder or [c for n in ("num_channels", "in_channels", "conv_dim", "out_channels") for c in _ints(attrs.get(n))]
    if channels:
        rec["channels"] = list(dict.fromkeys(channels))
    if spatial:
        rec["spatial"] = list(dict.fromkeys(spatial))
    kernels = [k for n, axis in FIELD_AXES.items() if axis == "kernel" for k in _ints(attrs.get(n))]
    if kernels:
        rec["kernel"] = list(dict.fromkeys(kernels))
    labels = _int(attrs.get("num_labels"))
    if labels and labels != 2:
        rec["classes"] = labels
    return rec, contrib


def _ladder_channels(attrs: dict) -> list[int]:
    """Channel ladder of a hierarchical backbone: ``hidden_sizes`` / ``embed_dims`` lists, or ``embed_dim``
    doubled per stage when the config has ``depths`` (Swin, Liu et al. 2021: C, 2C, 4C, 8C)."""
    depths = attrs.get("depths")
    for name in ("hidden_sizes", "embed_dims"):
        v = _ints(attrs.get(name))
        if len(v) >= 2 and isinstance(attrs.get(name), (list, tuple)):
            return v
    if isinstance(depths, (list, tuple)) and len(depths) >= 2:
        e = _int(attrs.get("embed_dim"))
        if e:
            return [e * 2 ** i for i in range(len(depths))]
    return []


def _attributes(cfg) -> dict[str, Any]:
    """A config's attributes: ``to_dict()`` without sub-configs, plus properties that derive sizes."""
    try:
        d = cfg.to_dict()
    except Exception:  # noqa: BLE001 - a broken to_dict only loses this config
        d = dict(vars(cfg))
    for k in ("head_dim", "num_key_value_heads", "hidden_size", "num_attention_heads"):
        if k not in d:
            try:
                d[k] = getattr(cfg, k)
            except Exception:  # noqa: BLE001 - attribute_map / properties may raise on missing fields
                pass
    return d


def _sub_configs(cfg) -> list[tuple[str, Any]]:
    from transformers import PretrainedConfig

    out = []
    for k, v in sorted(vars(cfg).items()):
        if k.startswith("_"):
            continue
        if isinstance(v, PretrainedConfig):
            out.append((k, v))
    return out


def _harvest_configs(col: _Collector, progress: bool, model_types: list[str] | None = None) -> list[str]:
    """Add every transformers default config (and its sub-configs) to ``col``; returns the failed model types."""
    from tqdm import tqdm
    from transformers import CONFIG_MAPPING

    failed = []
    for model_type in tqdm(list(CONFIG_MAPPING.keys()) if model_types is None else model_types,
                           desc="vocabulary: configs", disable=not progress,
                           unit="config"):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                cfg = CONFIG_MAPPING[model_type]()  # KeyError for an unknown model type: skipped, listed
        except Exception:  # noqa: BLE001 - a family whose defaults do not validate is skipped, and listed
            failed.append(model_type)
            continue
        stack = [(None, cfg, 0)]
        while stack:
            part, c, level = stack.pop(0)
            rec, contrib = _config_record(c, model_type, part)
            col.add_record(rec, contrib)
            if level < SUB_CONFIG_DEPTH:
                stack.extend(((f"{part}.{k}" if part else k), sub, level + 1) for k, sub in _sub_configs(c))
    return failed


def _harvest_processors(col: _Collector) -> None:
    """Mel bins and frame counts of audio feature extractors; resize / crop sides of image processors."""
    from transformers.models.auto import feature_extraction_auto as fa
    from transformers.models.auto import image_processing_auto as ia

    seen = set()
    for model_type, name in fa.FEATURE_EXTRACTOR_MAPPING_NAMES.items():
        if name in seen:
            continue
        seen.add(name)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                d = fa.feature_extractor_class_from_name(name)().to_dict()
        except Exception:  # noqa: BLE001 - extractors needing absent libraries (torchaudio) are skipped
            continue
        spectrogram = any(d.get(k) for k in ("hop_length", "n_fft", "num_mel_bins"))
        mel = _int(d.get("num_mel_bins")) or (_int(d.get("feature_size")) if spectrogram else None)
        if mel and mel > 1:
            col.add("mel", mel, f"{model_type}.{name}.feature_size")
        for key in ("nb_max_frames", "max_length"):
            if spectrogram and (x := _int(d.get(key))):
                col.add("seq", x, f"{model_type}.{name}.{key}")
    seen = set()
    for model_type, names in ia.IMAGE_PROCESSOR_MAPPING_NAMES.items():
        name = names.get("pil") or names.get("torchvision") if isinstance(names, dict) else names
        if not name or name in seen:
            continue
        seen.add(name)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                d = ia.get_image_processor_class_from_name(name)().to_dict()
        except Exception:  # noqa: BLE001 - processors needing absent libraries are skipped
            continue
        if d.get("merge_size") or d.get("min_pixels"):
            continue  # sizes are pixel counts (dynamic-resolution processors), not sides
        for key in ("size", "crop_size"):
            v = d.get(key)
            sides = _ints(v) + ([x] if isinstance(v, dict) and (x := _int(v.get("longest_edge"))) else [])
            for s in sides:
                if s <= 4096:
                    col.add("spatial", s, f"{model_type}.{name}.{key}")


# Classification models of torchvision.models and the input side each is built for (torchvision docs,
# "Classification": 224 x 224 except Inception v3, 299).
TORCHVISION_INPUT = {"inception_v3": 299}


def torchvision_models() -> list[tuple[str, Any]]:
    """(name, builder) of torchvision's classification models, or [] when torchvision is not installed."""
    try:
        import torchvision.models as tvm
    except ImportError:
        return []
    import torchvision

    names = tvm.list_models(module=torchvision.models)
    return [(n, (lambda n=n: tvm.get_model(n, weights=None))) for n in sorted(names)]


def cnn_record(name: str, build, side: int = DEFAULT_IMAGE, source: str = "torchvision") -> tuple[dict, list]:
    """Build ``build()`` on ``meta``, run a ``1 x 3 x side x side`` image and record its convolutions.

    Returns the model record (``channels``: conv in / out channels in call order, ``spatial``: input side then
    each distinct conv output side, ``kernel``: distinct conv kernel sides, ``classes``: out features of the
    last ``nn.Linear``) and the (axis, value, source) contributions. Raises what building or running raises.
    """
    import torch

    channels: list[int] = []
    spatial: list[int] = [side]
    kernels: list[int] = []
    last_linear: list[int] = []

    def hook(mod, inp, out):
        if isinstance(mod, torch.nn.Conv2d):
            channels.extend((mod.in_channels, mod.out_channels))
            kernels.extend(mod.kernel_size)
            if isinstance(out, torch.Tensor) and out.dim() == 4:
                spatial.extend(out.shape[-2:])
        elif isinstance(mod, torch.nn.Linear):
            last_linear.append(mod.out_features)

    with torch.device("meta"):
        model = build()
    model.eval()
    handle = torch.nn.modules.module.register_module_forward_hook(hook)
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model(torch.empty(1, 3, side, side, device="meta"))
    finally:
        handle.remove()
    rec: dict[str, Any] = {"family": name, "source": source, "model_type": name,
                           "channels": list(dict.fromkeys(channels)), "spatial": list(dict.fromkeys(spatial)),
                           "kernel": sorted(set(kernels))}
    if last_linear:
        rec["classes"] = last_linear[-1]
    contrib = [("channels", c, f"{name}.conv_channels") for c in rec["channels"]]
    contrib += [("spatial", s, f"{name}.feature_map") for s in rec["spatial"]]
    contrib += [("kernel", k, f"{name}.conv_kernel") for k in rec["kernel"]]
    if last_linear:
        contrib.append(("classes", last_linear[-1], f"{name}.fc"))
    return rec, contrib


def _harvest_cnns(col: _Collector, models: list[tuple[str, Any]], progress: bool, source: str) -> list[str]:
    from tqdm import tqdm

    failed = []
    for name, build in tqdm(models, desc=f"vocabulary: {source}", disable=not progress or not models, unit="model"):
        try:
            rec, contrib = cnn_record(name, build, TORCHVISION_INPUT.get(name, DEFAULT_IMAGE), source)
        except Exception:  # noqa: BLE001 - a model that does not run on meta is skipped, and listed
            failed.append(name)
            continue
        col.add_record(rec, contrib)
    return failed


def harvest_vocabulary(progress: bool = True, cnn_models: list[tuple[str, Any]] | None = None,
                       cnn_source: str = "torchvision", model_types: list[str] | None = None,
                       processors: bool = True) -> ShapeVocabulary:
    """Harvest the vocabulary from the installed transformers (and torchvision when installed).

    ``cnn_models``: (name, builder) pairs to record instead of torchvision's classification models (a builder
    returns an ``nn.Module`` taking ``N x 3 x H x W`` images). ``model_types``: only these transformers
    model types (default: all of ``CONFIG_MAPPING``); ``processors``: also read feature extractors and image
    processors. Takes about 15 s on 2 CPU cores without
    torchvision. Families whose default config does not validate are skipped (listed in ``skipped``).
    """
    import torch
    import transformers

    col = _Collector()
    for b in BATCH_SIZES:
        col.add("batch", b, "fixed:serving/training batch sizes")
    for c, name in BENCHMARK_CLASSES.items():
        col.add("classes", c, f"fixed:{name}")
    for s, name in BENCHMARK_SPATIAL.items():
        col.add("spatial", s, f"fixed:{name}")
    level = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # default configs warn about their own token ids
    try:
        failed = _harvest_configs(col, progress, model_types)
        if processors:
            _harvest_processors(col)
    finally:
        transformers.logging.set_verbosity(level)
    tv_version = None
    if cnn_models is None:
        cnn_models = torchvision_models()
        if cnn_models:
            import torchvision

            tv_version = torchvision.__version__.split("+")[0]
    failed += _harvest_cnns(col, cnn_models, progress, cnn_source)
    libraries = {"transformers": transformers.__version__, "torchvision": tv_version,
                 "torch": torch.__version__.split("+")[0]}
    vocab = col.vocabulary(libraries)
    vocab.skipped = sorted(failed)
    return vocab


def write_vocabulary(vocab: ShapeVocabulary, path) -> Path:
    """Write ``vocab`` as JSON at ``path`` (parent folders created), atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(vocab.to_json())
    tmp.replace(path)
    return path


def _harvest_into(path: str) -> str:
    """Child process: harvest the vocabulary and write it at ``path`` (returns ``path``)."""
    import os

    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")  # CPU and ``meta`` only: no CUDA context in the child
    write_vocabulary(harvest_vocabulary(progress=False), path)
    return path


def start_vocabulary_harvest(path):
    """Start ``harvest_vocabulary`` in a spawned child process that writes the vocabulary at ``path``, so it
    overlaps the seed-op probes instead of following them. Returns ``(executor, future)``: the future's
    result is ``path``; an exception raised in the child (or the child dying) is the future's exception.
    Shut the executor down after the result is read. Callers guard their entry point
    (``if __name__ == "__main__":``), as for any spawned child."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    ex = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
    return ex, ex.submit(_harvest_into, str(path))
