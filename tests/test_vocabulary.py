"""Shape vocabulary: harvested from transformers default configs (and CNNs built on meta), JSON round trip,
the packaged snapshot."""

from __future__ import annotations

import json

import pytest
import torch.nn as nn
from opforge.seeds.vocabulary import (
    AXES,
    BATCH_SIZES,
    ShapeVocabulary,
    VocabularyError,
    default_vocabulary,
    harvest_vocabulary,
    load_vocabulary,
    write_vocabulary,
)


def _conv_out(side: int, k: int, s: int, p: int) -> int:
    return (side + 2 * p - k) // s + 1


def _stand_in_cnn() -> nn.Module:
    """A torchvision-like classifier: 7x7/2 stem, 3x3/2 max pool, one 3x3/2 conv, 1000-way head."""
    return nn.Sequential(
        nn.Conv2d(3, 64, 7, stride=2, padding=3), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1),
        nn.Conv2d(64, 160, 3, stride=2, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(160, 1000))


@pytest.fixture(scope="module")
def small_vocab() -> ShapeVocabulary:
    return harvest_vocabulary(progress=False, model_types=["vit", "llama", "gpt2", "whisper", "resnet", "clip",
                                                           "no_such_family"],
                              cnn_models=[("stand_in", _stand_in_cnn)], cnn_source="test", processors=False)


def _sources(vocab: ShapeVocabulary, axis: str, value: int) -> list[str]:
    return next(v.sources for v in vocab.axes[axis] if v.value == value)


def test_configs_give_real_sizes_with_provenance(small_vocab):
    from transformers import GPT2Config, LlamaConfig, ViTConfig, WhisperConfig

    vit, llama, gpt2, whisper = ViTConfig(), LlamaConfig(), GPT2Config(), WhisperConfig()
    tokens = (vit.image_size // vit.patch_size) ** 2 + 1  # ViT prepends a [CLS] token
    assert tokens in small_vocab.values("seq")
    assert "vit.(image/patch)^2+cls" in _sources(small_vocab, "seq", tokens)
    assert gpt2.vocab_size in small_vocab.values("vocab") and "gpt2.vocab_size" in _sources(
        small_vocab, "vocab", gpt2.vocab_size)
    assert llama.hidden_size in small_vocab.values("hidden")
    assert llama.intermediate_size in small_vocab.values("intermediate")
    assert whisper.num_mel_bins in small_vocab.values("mel")
    assert whisper.max_source_positions in small_vocab.values("seq")
    assert vit.num_channels in small_vocab.values("channels")
    # GPT-2: n_inner None means 4 * n_embd
    rec = next(m for m in small_vocab.models if m["family"] == "gpt2")
    assert rec["intermediate"] == 4 * gpt2.n_embd
    assert rec["head_dim"] == gpt2.n_embd // gpt2.n_head
    # 2^k sequence lengths up to the family's maximum positions
    assert 1024 in small_vocab.values("seq") and llama.max_position_embeddings in small_vocab.values("seq")
    assert small_vocab.skipped == ["no_such_family"]


def test_models_are_coherent_records(small_vocab):
    from transformers import CLIPConfig, LlamaConfig, ResNetConfig

    llama = LlamaConfig()
    rec = next(m for m in small_vocab.models if m["family"] == "llama")
    assert rec["source"] == "transformers"
    assert (rec["hidden"], rec["intermediate"], rec["heads"], rec["vocab"]) == (
        llama.hidden_size, llama.intermediate_size, llama.num_attention_heads, llama.vocab_size)
    assert rec["head_dim"] == llama.hidden_size // llama.num_attention_heads
    # a sub-config is its own record, tagged with its path
    clip = CLIPConfig()
    vision = next(m for m in small_vocab.models if m["family"] == "clip" and m.get("part") == "vision_config")
    assert vision["hidden"] == clip.vision_config.hidden_size
    assert vision["tokens"] == (clip.vision_config.image_size // clip.vision_config.patch_size) ** 2 + 1
    # a hierarchical backbone: its channel ladder and the feature-map ladder of a 224 image
    resnet = ResNetConfig()
    rec = next(m for m in small_vocab.models if m["family"] == "resnet")
    assert rec["channels"] == list(resnet.hidden_sizes)
    assert rec["spatial"] == [224 // s for s in (4, 8, 16, 32)]
    assert 7 in small_vocab.values("spatial")


def test_cnn_stand_in_is_recorded_from_a_meta_forward(small_vocab):
    rec = next(m for m in small_vocab.models if m["source"] == "test")
    stem = _conv_out(224, 7, 2, 3)
    pooled = _conv_out(stem, 3, 2, 1)
    assert rec["channels"] == [3, 64, 160]
    assert rec["spatial"] == [224, stem, _conv_out(pooled, 3, 2, 1)]
    assert rec["kernel"] == [3, 7]
    assert rec["classes"] == 1000
    assert "stand_in.conv_channels" in _sources(small_vocab, "channels", 160)


def test_axes_values_and_weights(small_vocab):
    assert set(small_vocab.axes) == set(AXES)
    assert small_vocab.values("batch") == sorted(BATCH_SIZES)
    assert small_vocab.values("batch", lo=4, hi=64) == [b for b in sorted(BATCH_SIZES) if 4 <= b <= 64]
    for axis in AXES:
        vals = small_vocab.values(axis)
        assert vals == sorted(set(vals))
        w = small_vocab.weights(axis)
        if vals:
            assert abs(sum(w.values()) - 1.0) < 1e-9 and set(w) == set(vals)
    counts = {v.value: v.count for v in small_vocab.axes["seq"]}
    total = sum(counts.values())
    assert small_vocab.weights("seq")[1024] == pytest.approx(counts[1024] / total)
    with pytest.raises(KeyError, match="unknown axis"):
        small_vocab.values("width")


def test_json_round_trip_and_errors_name_the_field(small_vocab, tmp_path):
    back = ShapeVocabulary.from_json(small_vocab.to_json())
    assert back.axes == small_vocab.axes and back.models == small_vocab.models
    assert back.version == small_vocab.version and back.libraries == small_vocab.libraries

    data = json.loads(small_vocab.to_json())
    data["axes"]["hidden"][0]["value"] = -3
    with pytest.raises(VocabularyError, match=r"axes\.hidden\[0\]\.value"):
        ShapeVocabulary.from_json(json.dumps(data))
    data = json.loads(small_vocab.to_json())
    del data["axes"]["mel"]
    with pytest.raises(VocabularyError, match=r"axes\.mel"):
        ShapeVocabulary.from_json(json.dumps(data))
    data = json.loads(small_vocab.to_json())
    data["version"] = 999
    path = tmp_path / "v.json"
    path.write_text(json.dumps(data))
    with pytest.raises(VocabularyError, match=rf"{path}.*'version'"):
        load_vocabulary(path)
    with pytest.raises(FileNotFoundError, match="missing.json"):
        load_vocabulary(tmp_path / "missing.json")
    out = write_vocabulary(small_vocab, tmp_path / "sub" / "shape_vocabulary.json")
    assert load_vocabulary(out).axes == small_vocab.axes


def test_packaged_snapshot_holds_odd_real_sizes():
    vocab = default_vocabulary()
    assert vocab.libraries["transformers"]
    expected = {"channels": 3, "seq": 197, "classes": 1000, "vocab": 50257, "mel": 80, "spatial": 7}
    for axis, value in expected.items():
        assert value in vocab.values(axis), (axis, value)
    for axis, value in (("seq", 577), ("seq", 50), ("seq", 1500), ("seq", 3000), ("mel", 128), ("spatial", 32),
                        ("spatial", 299 if vocab.libraries.get("torchvision") else 384)):
        assert value in vocab.values(axis), (axis, value)
    for axis in AXES:
        assert vocab.axes[axis], axis
        assert all(v.sources for v in vocab.axes[axis]), axis
    # not only powers of two
    hidden = vocab.values("hidden")
    assert sum(h & (h - 1) != 0 for h in hidden) >= 10


@pytest.mark.slow
def test_packaged_snapshot_matches_a_fresh_harvest():
    import transformers

    snap = default_vocabulary()
    if snap.libraries["transformers"] != transformers.__version__:
        pytest.skip("snapshot was harvested from another transformers version")
    fresh = harvest_vocabulary(progress=False)
    for axis in AXES:
        assert fresh.values(axis) == snap.values(axis), axis


def _fake_torchvision(monkeypatch):
    """A stand-in ``torchvision`` package whose model registry holds one small CNN."""
    import sys
    import types

    from transformers.utils import import_utils

    import_utils.is_torchvision_available()  # transformers caches the real answer before the stand-in appears
    tv = types.ModuleType("torchvision")
    models = types.ModuleType("torchvision.models")
    models.list_models = lambda module=None: ["stand_in"]
    models.get_model = lambda name, weights=None: _stand_in_cnn()
    tv.models, tv.__version__ = models, "0.0+test"
    monkeypatch.setitem(sys.modules, "torchvision", tv)
    monkeypatch.setitem(sys.modules, "torchvision.models", models)


def test_torchvision_models_are_read_when_installed(monkeypatch):
    _fake_torchvision(monkeypatch)
    vocab = harvest_vocabulary(progress=False, model_types=[], processors=False)
    assert vocab.libraries["torchvision"] == "0.0"
    rec = next(m for m in vocab.models if m["source"] == "torchvision")
    assert rec["family"] == "stand_in" and rec["channels"] == [3, 64, 160] and rec["classes"] == 1000
    assert "stand_in.feature_map" in _sources(vocab, "spatial", _conv_out(224, 7, 2, 3))
