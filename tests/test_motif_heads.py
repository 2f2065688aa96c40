"""Sampling-head motifs (compose.motifs.heads): generate's logits processors traced at a family's vocabulary,
cut to windows that end in the probabilities, rendered as float32 tasks whose outputs an all-zeros answer
cannot match, and equal to transformers' own processors on real values."""

import random

import pytest
import torch
from opforge.compose.labels import recovered_labels
from opforge.compose.motifs.candidates import fixed_dtype
from opforge.compose.motifs.cut import cut_motifs
from opforge.compose.motifs.heads import (
    LOGIT_SCALE,
    SAMPLING_CHAINS,
    family_vocab,
    head_jobs,
    head_motifs,
    trace_sampling_head,
)
from opforge.compose.motifs.render import render_motif
from opforge.task.source import load_task


@pytest.fixture(scope="module")
def top_p():
    return trace_sampling_head("llama3", "gpt2")


def _run(code: str, seed: int = 0):
    torch.manual_seed(seed)
    task = load_task(code, "head")
    model, inputs = task.build(), task.inputs()
    return model(*inputs), inputs


def test_windows_end_in_the_probabilities_and_start_after_any_processor(top_p):
    motifs = head_motifs(top_p)
    starts = sorted(m.calls[0]["name"] for m in motifs)
    assert starts == ["div", "sort"]  # after the temperature, or with it
    for m in motifs:
        assert set(m.outputs) == set(top_p.outputs)  # the softmax, never a processor's -inf scores
        assert m.category == "sampling_head"
        assert [d["shape"] for d in m.inputs] == [[m.batch, 50257]]  # gpt2's vocabulary
        assert m.inputs[0]["scale"] == LOGIT_SCALE and fixed_dtype(m) == "float32"
    # windows that end in a processor's output exist, and are the ones left out
    assert len(cut_motifs(top_p)) > len(motifs)


def test_rendered_heads_equal_transformers_processors():
    """A rendered head on real values equals softmax(processors(scores)) of transformers itself, for the
    processors its window holds."""
    from transformers.generation import logits_process

    for chain in SAMPLING_CHAINS:
        m = max(head_motifs(trace_sampling_head(chain, "llama")), key=lambda m: m.n_ops)  # the whole chain
        code = render_motif(m, 3, None, "float32", "doc")
        out, (x,) = _run(code)
        steps = SAMPLING_CHAINS[chain]
        first = {"div": "TemperatureLogitsWarper", "topk": "TopKLogitsWarper", "sort": "TopPLogitsWarper"}
        steps = steps[[cls for cls, _ in steps].index(first[m.calls[0]["name"]]):]  # the window's processors
        procs = [getattr(logits_process, cls)(**kw) for cls, kw in steps]
        scores = x.clone()
        for p in procs:
            scores = p(None, scores)
        torch.testing.assert_close(out, torch.softmax(scores, dim=-1))
        labels = [a[0] for a in recovered_labels(code, chain)]
        assert "F.softmax" in labels and len(labels) == m.n_ops


def test_outputs_are_peaked_not_near_uniform():
    """At LOGIT_SCALE the probabilities are far from what an all-zeros answer matches at 1e-2 (the
    degenerate_output filter's test), and top-p keeps a small share of the vocabulary."""
    m = max(head_motifs(trace_sampling_head("llama3", "qwen2")), key=lambda m: m.n_ops)
    out, _ = _run(render_motif(m, 4, None, "float32", "doc"))
    assert out.max(dim=-1).values.min() > 0.05
    kept = (out > 0).sum(dim=-1)
    assert (kept < 0.05 * out.shape[-1]).all() and (kept >= 1).all()
    torch.testing.assert_close(out.sum(dim=-1), torch.ones(4))


def test_every_family_and_chain_is_traced():
    jobs = head_jobs(("llama", "gemma"))
    assert len(jobs) == 2 * len(SAMPLING_CHAINS)
    vocabs = {family_vocab("llama"), family_vocab("gemma")}
    seen = set()
    for _name, job in jobs:
        for m in head_motifs(job()):
            seen.add(m.inputs[0]["shape"][-1])
    assert seen == vocabs


def test_unknown_family_is_a_head_error():
    from opforge.compose.motifs.heads import HeadError

    with pytest.raises(HeadError, match="no_such_family"):
        family_vocab("no_such_family")


def test_the_default_library_holds_heads_the_composer_draws(harvested, tmp_path):
    """The shipped library has sampling heads at many vocabulary sizes; candidates composed from them are
    float32 whatever the run's dtype mix, and run to finite probabilities."""
    from opforge.compose.composer import ComposeConfig, compose
    from opforge.compose.motifs.cut import write_library
    from opforge.compose.motifs.library import load_motifs

    lib = [m for m in load_motifs(None) if m.category == "sampling_head"]
    assert len({m.inputs[0]["shape"][-1] for m in lib}) >= 15
    path = write_library(lib, tmp_path / "heads.json.gz", {})
    ops = harvested.ops
    rows = compose(ops, ComposeConfig(n=24, seed=11, device_profile="cpu", motif_share=1.0, transformers_share=0.0,
                                      dtype_mix="bfloat16:1", motif_library=str(path)),
                   workers=1, progress=False)
    heads = rows[rows["pattern"] == "motif:sampling_head"]
    assert len(heads) > 10
    assert set(heads["dtype"]) == {"float32"}
    for code in random.Random(0).sample(list(heads["code"]), 3):
        out, _ = _run(code)
        assert torch.isfinite(out).all()


def test_heads_are_never_mutated():
    """A residual added to probabilities (or any other mutation) is no model's computation."""
    from opforge.compose.motifs.candidates import MUTATIONS, mutate

    m = head_motifs(trace_sampling_head("default_top_k", "llama"))[0]
    assert all(mutate(m, kind, random.Random(0)) is None for kind in MUTATIONS)

