"""Motifs mined from real models: tracing, cutting, rendering, sizing and composing (compose.motif_*)."""

import json
import math
import random

import pytest
import torch
from opforge.compose.labels import labels_match, recovered_labels
from opforge.compose.motifs.cut import Motif, MotifLibraryError, cut_motifs, read_library, write_library
from opforge.compose.motifs.render import render_motif
from opforge.compose.motifs.sizing import MotifCost, choose_sizes
from opforge.compose.motifs.trace import BATCH, SEQ, trace_transformers
from opforge.task.source import load_task


@pytest.fixture(scope="module")
def llama():
    return cut_motifs(trace_transformers("llama"))


@pytest.fixture(scope="module")
def bert():
    return cut_motifs(trace_transformers("bert"))


def _calls(m: Motif) -> set[str]:
    return {c["name"] for c in m.calls}


def _run_meta(code: str):
    with torch.device("meta"):
        task = load_task(code, "motif")
        model = task.build()
        out = model(*task.inputs())
    return out if isinstance(out, tuple) else (out,)


def test_llama_motifs_are_the_fusions_of_a_decoder_layer(llama):
    cats = {m.category for m in llama}
    assert {"rotary", "gated_mlp", "norm_residual", "attention", "norm"} <= cats
    rotary = next(m for m in llama if m.category == "rotary")
    assert {"neg", "cat"} <= _calls(rotary)
    assert sorted(i["kind"] for i in rotary.inputs) == ["normal", "trig", "trig"]
    gated = [m for m in llama if m.category == "gated_mlp"]
    assert any({"silu", "mul"} <= _calls(m) for m in gated)
    for m in llama:
        assert 2 <= m.n_ops <= 8 and m.n_heavy <= 2
        assert len(m.outputs) <= 2 and 1 <= len(m.inputs) <= 4
        assert m.native_dtype == "bfloat16" and m.max_positions > 0


def test_bert_motifs_hold_layernorm_residuals_and_gelu_epilogues(bert):
    cats = {m.category for m in bert}
    assert {"norm_residual", "attention"} <= cats
    assert any(c["name"] == "LayerNorm" for m in bert for c in m.calls)
    assert any("gelu" in _calls(m) for m in bert)
    att = [m for m in bert if m.category == "attention"]
    assert all("softmax" in _calls(m) for m in att)


@pytest.mark.parametrize("fixture", ["llama", "bert"])
def test_every_motif_renders_at_other_sizes_with_scaled_shapes(fixture, request):
    motifs = request.getfixturevalue(fixture)
    for m in motifs:
        a = render_motif(m, 2, 48, "float32", "doc")
        b = render_motif(m, 3, 64, "bfloat16", "doc")
        assert "import transformers" not in a and "transformers." not in a
        outs_a, outs_b = _run_meta(a), _run_meta(b)
        for x, y in zip(outs_a, outs_b, strict=True):
            # the batch axis moves with batch_size (2 -> 3) and nothing else keeps the trace's sentinels
            assert BATCH not in x.shape and SEQ not in x.shape
            assert x.dim() == y.dim()
            assert y.dtype in (torch.bfloat16, torch.float32, torch.int64, torch.bool)
        assert (a != b)


def test_rendered_labels_are_exact_and_small_motifs_run_on_cpu(llama, bert):
    small = [m for m in llama + bert
             if sum(c.get("module_params", 0) for c in m.calls) + sum(
                 torch.Size(p["shape"]).numel() for p in m.params) < 3_000_000][:12]
    assert small
    for m in small:
        code = render_motif(m, 1, 16, "float32", "doc")
        labels = [alts[0] for alts in recovered_labels(code)]
        assert labels_match(code, labels)
        task = load_task(code, "motif")
        torch.manual_seed(0)
        out = task.build()(*task.inputs())
        outs = out if isinstance(out, tuple) else (out,)
        assert all(torch.isfinite(o.float()).all() for o in outs)


def test_inputs_are_drawn_by_kind(llama):
    rotary = next(m for m in llama if m.category == "rotary")
    task = load_task(render_motif(rotary, 2, 32, "float32", "doc"), "rotary")
    torch.manual_seed(0)
    xs = dict(zip(("x", "cos", "sin"), task.inputs(), strict=False))
    assert xs["cos"].abs().max() <= 1 and xs["cos"].min() < 0
    att = next(m for m in llama if any(i["kind"] == "mask" for i in m.inputs))
    code = render_motif(att, 1, 16, "float32", "doc")
    mask = [t for t, i in zip(load_task(code, "att").inputs(), att.inputs, strict=True) if i["kind"] == "mask"][0]
    assert mask.shape[-1] == mask.shape[-2] == 16
    assert (mask[..., 0, 1:] < -1e30).all() and (mask[..., -1, :] == 0).all()  # causal


def test_sizing_follows_batch_and_sequence_and_keeps_the_family_vocabulary(llama):
    from opforge.compose.device_profiles import get_profile

    p = get_profile("h200")
    m = next(m for m in llama if m.category == "norm_residual")
    cost = MotifCost(m)
    t1, t2 = cost.predict_ms(1, 128, "bfloat16", p), cost.predict_ms(8, 128, "bfloat16", p)
    assert t2 > t1
    assert cost.input_bytes(2, 128, "bfloat16") == 2 * cost.input_bytes(1, 128, "bfloat16")
    assert cost.input_bytes(1, 128, "float32") == 2 * cost.input_bytes(1, 128, "bfloat16")
    b, s, t = choose_sizes(cost, p, "bfloat16", [1, 2, 4, 8, 16], [128, 512, 2048], target_ms=1e6)
    assert (b, s) == (16, 2048)  # too fast at every size: the largest, never past the vocabulary
    tiny = choose_sizes(cost, p, "bfloat16", [1, 2, 4], [128, 512], target_ms=1e-9)
    assert tiny[:2] == (1, 128)


def test_library_round_trip_and_errors(llama, tmp_path):
    path = write_library(llama, tmp_path / "m.json.gz", {"traced": ["transformers:llama"]})
    back, meta = read_library(path)
    assert [m.motif_id for m in back] == [m.motif_id for m in llama] and meta["traced"] == ["transformers:llama"]
    with pytest.raises(MotifLibraryError, match="no such motif library"):
        read_library(tmp_path / "missing.json.gz")
    bad = tmp_path / "bad.json.gz"
    bad.write_text("not gzip")
    with pytest.raises(MotifLibraryError, match="bad.json.gz"):
        read_library(bad)


def test_shared_library_is_read_once_per_file_and_version(llama, tmp_path):
    """``load_motifs(path, shared=True)`` keeps the objects it read for the same unchanged file; a rewritten
    file is read again; without ``shared`` every call reads fresh objects, and only shared ones leave the
    collector's young generations (frozen); a missing file still raises."""
    import gc
    import os

    from opforge.compose.motifs.library import load_motifs

    path = write_library(llama, tmp_path / "m.json.gz", {})
    gc.unfreeze()
    first = load_motifs(path, shared=True)
    assert load_motifs(path, shared=True) is first
    tracked = {id(o) for o in gc.get_objects()}
    assert id(first) not in tracked and id(first[0].calls) not in tracked and gc.get_freeze_count() > 0
    fresh = load_motifs(path)
    assert id(fresh) in {id(o) for o in gc.get_objects()}
    assert fresh is not first and fresh[0] is not first[0] and [m.motif_id for m in fresh] == [m.motif_id for m in first]
    write_library(llama[:2], path, {})
    os.utime(path, ns=(1, 1))  # a new version of the file, whatever the clock's resolution
    again = load_motifs(path, shared=True)
    assert again is not first and [m.motif_id for m in again] == [m.motif_id for m in llama[:2]]
    with pytest.raises(MotifLibraryError, match="no such motif library"):
        load_motifs(tmp_path / "missing.json.gz", shared=True)


def test_mutations_swap_the_activation_and_add_a_residual(llama):
    from opforge.compose.motifs.candidates import mutate

    gated = next(m for m in llama if m.category == "gated_mlp" and "silu" in _calls(m))
    swapped = mutate(gated, "activation", random.Random(0))
    assert "silu" not in _calls(swapped) and _calls(swapped) & {"gelu", "relu", "mish"}
    from opforge.compose.motifs.candidates import ends_in_residual

    single = next(m for m in llama if len(m.outputs) == 1 and not ends_in_residual(m))
    res = mutate(single, "residual", random.Random(0))
    assert len(res.inputs) == len(single.inputs) + 1 and res.n_ops == single.n_ops + 1
    outs = _run_meta(render_motif(res, 2, 32, "float32", "doc"))
    assert outs[0].shape == _run_meta(render_motif(single, 2, 32, "float32", "doc"))[0].shape


def test_norm_mutation_swaps_layernorm_for_rmsnorm(bert):
    from opforge.compose.motifs.candidates import mutate

    ln = next(m for m in bert if any(c["name"] == "LayerNorm" for c in m.calls))
    swapped = mutate(ln, "norm", random.Random(0))
    code = render_motif(swapped, 2, 16, "float32", "doc")
    assert "nn.RMSNorm((768,)" in code and "nn.LayerNorm" not in code
    assert "nn.RMSNorm" in [alts[0] for alts in recovered_labels(code)]
    back = mutate(swapped, "norm", random.Random(0))
    assert "nn.LayerNorm((768,)" in render_motif(back, 2, 16, "float32", "doc")


def _compose_llama(catalog_path, llama, tmp_path, n: int):
    """(config, candidates, their motif rows) of ``n`` test-profile candidates drawn from the llama motifs only."""
    from opforge.compose.composer import ComposeConfig, compose
    from opforge.seeds.catalog import read_catalog

    lib = write_library(llama, tmp_path / "lib.json.gz", {})
    cfg = ComposeConfig(n=n, seed=3, device_profile="test", motif_share=1.0, motif_library=str(lib),
                        transformers_share=0.0)
    df = compose(read_catalog(catalog_path), cfg, progress=False)
    return cfg, df, df[df.pattern.str.startswith("motif:")]


def test_composer_draws_motifs_with_provenance_and_exact_labels(catalog_path, llama, tmp_path):
    from opforge.compose.composer import compose
    from opforge.seeds.catalog import read_catalog

    cfg, df, motif_rows = _compose_llama(catalog_path, llama, tmp_path, 8)
    assert len(motif_rows) >= 6
    for row in motif_rows.itertuples():
        prov = json.loads(row.provenance)
        assert prov["source"] == "transformers:llama" and prov["motif_id"] and prov["modules"]
        assert labels_match(row.code, json.loads(row.ops))
        assert row.data_source == f"torch#{row.num_ops}"
    again = compose(read_catalog(catalog_path), cfg, progress=False)
    assert list(again.task_id) == list(df.task_id)


def test_fixed_size_profiles_keep_motif_inputs_under_the_cap(catalog_path, llama, tmp_path, monkeypatch):
    """On a fixed-size profile a motif candidate whose inputs exceed ``MAX_FIXED_INPUT_BYTES`` is not made; the
    composer draws another one for that index."""
    from opforge.compose.motifs import candidates as motif_candidates

    cap = 256 * 1024  # llama motifs at the test sizes read 128 KB (batch 1, 8 positions) to 512 KB
    monkeypatch.setattr(motif_candidates, "MAX_FIXED_INPUT_BYTES", cap)
    _, _, motif_rows = _compose_llama(catalog_path, llama, tmp_path, 12)
    assert len(motif_rows) >= 6
    sizes = [sum(math.prod(s) for s in json.loads(row.input_shapes)) * getattr(torch, row.dtype).itemsize
             for row in motif_rows.itertuples()]
    assert max(sizes) <= cap and min(sizes) > 0


def test_sizes_vary_inside_the_window_band(llama):
    from opforge.compose.device_profiles import get_profile

    p = get_profile("h200")
    cost = MotifCost(next(m for m in llama if m.category == "norm_residual"))
    picks = {choose_sizes(cost, p, "bfloat16", [1, 2, 4, 8, 16, 32, 64], [128, 256, 512, 1024, 2048], 1.0,
                          band=(0.05, 20.0), rng=random.Random(k))[:2] for k in range(20)}
    assert len(picks) > 3
    for b, s in picks:
        assert 0.05 <= cost.predict_ms(b, s, "bfloat16", p) <= 20.0


def test_overflow_guard_clamps_are_left_out():
    from opforge.compose.motifs.trace import is_overflow_guard

    assert is_overflow_guard("clamp", [{"T": 1}], {"min": -64504.0, "max": 64504.0})
    assert is_overflow_guard("clamp", [{"T": 1}, -65000.0, {"lit": 65000}], {})
    assert not is_overflow_guard("clamp", [{"T": 1}], {"min": 0.0, "max": 6.0})
    assert not is_overflow_guard("relu", [{"T": 1}], {})


def test_motif_candidates_take_sizes_from_the_vocabulary_within_the_caps(catalog_path):
    """H200-sized motif candidates of the packaged library: the batch is a vocabulary batch (<= 512), the
    sequence a vocabulary sequence length, the inputs within the profile's cap in the task's dtype."""
    import math

    from opforge.compose.composer import ComposeConfig, compose
    from opforge.compose.device_profiles import get_profile
    from opforge.seeds.catalog import read_catalog
    from opforge.seeds.vocabulary import default_vocabulary

    vocab = default_vocabulary()
    batches, seqs = set(vocab.values("batch", 1, 512)), set(vocab.values("seq"))
    cap = get_profile("h200").input_cap_bytes
    df = compose(read_catalog(catalog_path), ComposeConfig(n=24, seed=5, device_profile="h200", motif_share=1.0,
                                                           transformers_share=0.0), progress=False)
    rows = df[df.pattern.str.startswith("motif:")]
    assert len(rows) >= 20
    item = {"float32": 4, "bfloat16": 2, "float16": 2}
    for row in rows.itertuples():
        g = json.loads(row.graph)
        assert g["batch_size"] in batches, g
        assert g["seq_len"] is None or g["seq_len"] in seqs, g
        assert sum(math.prod(s) for s in json.loads(row.input_shapes)) * item[row.dtype] <= cap * 1.01


def test_no_second_residual_on_a_motif_that_ends_in_one(llama):
    """A motif whose output is already a residual sum (pre-norm ``h + attn(norm(h))``) gets no second one; the
    mutated motif itself ends in one."""
    from opforge.compose.motifs.candidates import ends_in_residual, mutate

    summed = [m for m in llama if len(m.outputs) == 1 and ends_in_residual(m)]
    assert summed
    assert all(mutate(m, "residual", random.Random(0)) is None for m in summed)
    plain = next(m for m in llama if len(m.outputs) == 1 and not ends_in_residual(m))
    assert ends_in_residual(mutate(plain, "residual", random.Random(0)))


def test_a_copy_of_a_contiguous_value_is_not_rendered():
    """``.contiguous()`` calls the motifs traced (after views, slices and transposes) are rendered only where
    they copy at the rendered sizes: run on ``meta``, no rendered one receives a contiguous tensor, and the real
    copies (after a transpose of two non-trivial dims) stay."""
    from opforge.compose.motifs.library import load_motifs
    from torch.overrides import TorchFunctionMode

    motifs = [m for m in load_motifs(None) if any(c["name"] == "contiguous" for c in m.calls)]
    sample = random.Random(3).sample(motifs, 150)
    seen: list[bool] = []

    class Copies(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func is torch.Tensor.contiguous:
                seen.append(args[0].is_contiguous())
            return func(*args, **(kwargs or {}))

    for m in sample:
        code = render_motif(m, 2, 16 if m.seq else None, "float32", "doc")
        with torch.device("meta"):
            task = load_task(code, "motif")
            model, inputs = task.build(), task.inputs()
            with Copies():
                model(*inputs)
    traced = sum(c["name"] == "contiguous" for m in sample for c in m.calls)
    assert seen and not any(seen)
    assert len(seen) < traced


def test_no_rendered_motif_returns_an_input_unchanged():
    """Casts to the dtype a value already has are left out when rendering; a motif output that thereby became
    one of its inputs is not returned (no work, no result), so no rendered task's forward returns an input
    object, in any task dtype."""
    from opforge.compose.motifs.library import load_motifs
    from opforge.compose.motifs.render import SAME_DTYPE_CASTS, RenderError

    motifs = [m for m in load_motifs(None) if any(c["name"] in SAME_DTYPE_CASTS for c in m.calls)]
    assert motifs
    rendered = 0
    for m in motifs:
        for dtype in ("float32", "bfloat16"):
            try:
                code = render_motif(m, 2, 16 if m.seq else None, dtype, "doc")
            except RenderError:
                continue
            try:
                with torch.device("meta"):
                    task = load_task(code, "motif")
                    model, inputs = task.build(), task.inputs()
                    out = model(*inputs)
            except Exception:  # noqa: BLE001 - a motif that needs other sizes than 2 x 16 (or does not run)
                continue
            outs = out if isinstance(out, (tuple, list)) else [out]
            assert not any(o is x for o in outs for x in inputs), (code, dtype)
            rendered += 1
    assert rendered > 40


def test_categories_are_drawn_by_share_over_yield(llama):
    from collections import Counter

    from opforge.compose.motifs.library import YIELD_FLOOR, MotifPool

    cats = Counter(m.category for m in llama)
    a, b = cats.most_common(2)[0][0], cats.most_common(2)[1][0]
    pool = MotifPool([m for m in llama if m.category in (a, b)], shares={a: 0.5, b: 0.5},
                     yields={a: 0.8, b: 0.4})
    rng = random.Random(0)
    drawn = Counter(pool.draw(rng).category for _ in range(6000))
    # equal shares, yields 0.8 and 0.4: b is drawn twice as often (its few-motif scaling divided out)
    scale = {c: pool.shares[c] * max({a: 0.8, b: 0.4}[c], YIELD_FLOOR) / 0.5 for c in (a, b)}
    expected = (1 / 0.4 * scale[b]) / (1 / 0.8 * scale[a])
    assert drawn[b] / drawn[a] == pytest.approx(expected, rel=0.1)
    # a category that never passes is drawn at most 1 / YIELD_FLOOR times its share
    floored = MotifPool([m for m in llama if m.category in (a, b)], shares={a: 0.5, b: 0.5}, yields={a: 1.0, b: 0.0})
    assert floored.shares[b] / scale[b] == pytest.approx(0.5 / YIELD_FLOOR)
    with pytest.raises(ValueError, match="no motif"):
        MotifPool(llama, shares={"no_such_category": 1.0})


def test_op_sets_are_drawn_uniformly_within_a_category(llama):
    """Inside a category the pool draws an op set (``op_key``) uniformly, then a model with it: an op set found
    in many models is drawn no more often than one found in a single model, so candidates spread over distinct
    kernels."""
    import copy
    from collections import Counter

    from opforge.compose.motifs.library import MotifPool, op_key

    by_cat = Counter(m.category for m in llama)
    cat = max(by_cat, key=lambda c: len({op_key(m) for m in llama if m.category == c}))
    ms = [m for m in llama if m.category == cat]
    # the first motif's op set found in 12 more models (as the RMSNorm of every Llama-like model is)
    for k in range(12):
        twin = copy.deepcopy(ms[0])
        twin.sources = [f"transformers:twin{k}"]
        twin.motif_id = f"twin{k}"
        ms.append(twin)
    counts = Counter(op_key(m) for m in ms)
    assert len(counts) >= 3 and counts[op_key(ms[0])] > 12
    pool = MotifPool(ms, shares={cat: 1.0})
    rng = random.Random(3)
    n = 400 * len(counts)
    drawn = Counter(op_key(pool.draw(rng)) for _ in range(n))
    assert set(drawn) == set(counts)
    for key in counts:
        assert drawn[key] / n == pytest.approx(1 / len(counts), rel=0.25), key


def test_light_share_splits_draws_between_motifs_with_and_without_a_heavy_call(llama):
    """With ``light_share``, that share of draws comes from the motifs without a GEMM / conv / attention /
    recurrent call, whatever the category weights; a class with no motif leaves its draws to the other."""
    from collections import Counter

    from opforge.compose.motifs.library import MotifPool

    light = [m for m in llama if not m.n_heavy]
    heavy = [m for m in llama if m.n_heavy]
    assert light and heavy
    shares = {c: 1.0 for c in {m.category for m in llama}}
    for share in (0.2, 0.7):
        pool = MotifPool(llama, shares=shares, light_share=share, light_shares=shares)
        rng = random.Random(1)
        drawn = Counter(bool(pool.draw(rng).n_heavy) for _ in range(4000))
        assert drawn[False] / 4000 == pytest.approx(share, abs=0.03)
    only_heavy = MotifPool(heavy, shares=shares, light_share=0.9, light_shares=shares)
    assert set(only_heavy.classes) == {"heavy"}
    assert all(only_heavy.draw(random.Random(i)).n_heavy for i in range(50))
    with pytest.raises(ValueError, match="light_share"):
        MotifPool(llama, light_share=1.5)


def test_a_motif_that_discards_a_result_is_never_drawn(llama):
    """A call whose result no later call reads and the motif does not return (a value the model only tested
    in Python, ``isfinite(x).all()``) would be computed and thrown away by the task: such a window is not cut,
    and such a motif in a library is not drawn."""
    import copy

    from opforge.compose.motifs.cut import dead_calls
    from opforge.compose.motifs.library import MotifPool

    assert not any(dead_calls(m) for m in llama)
    m = copy.deepcopy(llama[0])
    out = m.outputs[0]
    fresh = max(o for c in m.calls for o in c["outputs"] if o is not None) + 1
    m.calls.append({**m.calls[-1], "name": "isfinite", "spelling": "torch.isfinite", "canonical": "isfinite",
                    "args": [{"T": out}], "kwargs": {}, "outputs": [fresh]})
    m.motif_id = "dead"
    assert dead_calls(m) == ["isfinite"]
    pool = MotifPool([m, llama[0]], shares={m.category: 1.0})
    assert all(x.motif_id != "dead" for fam in pool.groups[m.category].values() for x in fam)


def test_batch_norm_motifs_are_never_sized_at_batch_one(llama):
    """A KernelBench ``Model`` runs in training mode, where batch norm over a pooled ``[1, C]`` input raises:
    motifs that call a batch-norm module get a batch of at least 2, the others keep 1."""
    import copy

    import torch
    from opforge.compose.motifs.candidates import min_batch

    assert {min_batch(m) for m in llama} == {1}
    m = copy.deepcopy(next(x for x in llama if any(c["spelling"] == "module" for c in x.calls)))
    call = next(c for c in m.calls if c["spelling"] == "module")
    call["name"] = "BatchNorm1d"
    assert min_batch(m) == 2
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        torch.nn.BatchNorm1d(8)(torch.randn(1, 8))  # the failure the rule avoids
    torch.nn.BatchNorm1d(8)(torch.randn(2, 8))


def test_module_constructors_drop_a_keyword_an_older_torch_lacks(monkeypatch):
    """On a torch whose ``nn.BatchNorm2d`` takes no ``bias`` (before 2.13), the library's ``bias=True`` (the
    default the torch that added it gave it) is left out, so the module and the library's conv + batch-norm
    motifs build there; another value is kept, and that constructor rejects it."""
    from opforge.compose.motifs import render as motif_render
    from opforge.compose.motifs.library import load_motifs

    class OldBatchNorm2d(torch.nn.BatchNorm2d):
        def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True,
                     device=None, dtype=None):
            super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype)

    monkeypatch.setattr(torch.nn, "BatchNorm2d", OldBatchNorm2d)
    motif_render.module_source.cache_clear()
    try:
        src = motif_render.module_source(
            "nn.BatchNorm2d(64, eps=0.001, momentum=0.1, affine=True, bias=True, track_running_stats=True)")
        assert src == "nn.BatchNorm2d(64, eps=0.001)"
        assert isinstance(eval(src, {"nn": torch.nn}), OldBatchNorm2d)  # noqa: S307
        kept = motif_render.module_source("nn.BatchNorm2d(64, bias=False)")
        assert kept == "nn.BatchNorm2d(64, bias=False)"
        with pytest.raises(TypeError, match="bias"):
            eval(kept, {"nn": torch.nn})  # noqa: S307
        motifs = [m for m in load_motifs() if m.category == "conv_norm_act"
                  and any("BatchNorm2d(" in (c["module"] or "") for c in m.calls if c["spelling"] == "module")][:20]
        assert motifs
        for m in motifs:
            code = motif_render.render_motif(m, 2, 0, "float32", "doc")
            ns: dict = {}
            exec(code, ns)  # noqa: S102 - the rendered task defines Model
            with torch.device("meta"):
                ns["Model"](*ns["get_init_inputs"]())
    finally:
        motif_render.module_source.cache_clear()


def test_module_constructors_leave_out_default_keywords_and_build_the_same_module():
    """An extra_repr lists every constructor argument, also those a newer torch added (BatchNorm's ``bias``):
    rendered without the ones at their default, the constructor runs on an older torch and builds the same
    module here."""
    from opforge.compose.motifs.library import load_motifs
    from opforge.compose.motifs.render import module_source

    assert module_source("nn.BatchNorm1d(384, eps=1e-05, momentum=0.1, affine=True, track_running_stats=True)") \
        == "nn.BatchNorm1d(384)"
    kept = module_source("nn.BatchNorm2d(64, eps=0.001, momentum=0.01, affine=False)")
    assert kept == "nn.BatchNorm2d(64, eps=0.001, momentum=0.01, affine=False)"
    assert module_source("nn.Dropout(p=0.0, inplace=False)") == "nn.Dropout(p=0.0)"  # 0.0 is not p's 0.5
    assert module_source("not a call (") == "not a call ("
    sources = {c["module"] for m in load_motifs() for c in m.calls if c["spelling"] == "module" and c["module"]}
    assert any("BatchNorm" in s for s in sources) and len(sources) > 20
    for src in sorted(sources):
        short = module_source(src)
        with torch.device("meta"):
            a, b = (eval(s, {"nn": torch.nn, "torch": torch}) for s in (src, short))  # noqa: S307
        assert type(a) is type(b) and a.extra_repr() == b.extra_repr(), (src, short)
