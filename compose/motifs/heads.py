"""Model heads as a motif source: the sampling step of transformers' ``generate``.

``generate(do_sample=True)`` casts the last position's logits ``[batch, vocab]`` to float32 and turns them into
next-token probabilities through the logits processors its ``GenerationConfig`` names, in the order
``GenerationMixin._get_logits_processor`` builds them (temperature, then top-k, then top-p), then
``softmax`` (``transformers.generation.logits_process``); ``torch.multinomial`` then draws the token. That step
is not part of ``model.forward``, so the model traces of ``compose.motifs.trace`` never see it.

Each processor chain of ``SAMPLING_CHAINS`` is traced with those transformers classes themselves, at the
vocabulary size of a decoder family's default config (``HEAD_FAMILIES``), on ``meta`` like a model
(``motif_trace.trace_module``), and cut like a model trace (``motif_cut.cut_motifs``). Every processor runs as
its own module, so a window may start after any processor; only windows that end in the probabilities are
kept, since a processor's output holds ``-inf`` where it filters tokens. The random draw is not part of a
motif. The logits are drawn as ``LOGIT_SCALE`` times a standard normal, so the distribution is peaked as a
trained model's is (see ``LOGIT_SCALE``), not near-uniform.

Kernel libraries fuse exactly this step (FlashInfer's top-k / top-p sampling kernels, vLLM's sampler): sorting
and scanning a vocabulary-wide row is work ``torch.compile`` leaves in several kernels (room over the better of
eager and Inductor p50 12 on H100 for the heads accepted in a 1,000-task run; the top-p ones fail Inductor on
torch 2.11 with CUDA and are rejected ``compile_error``). The selection publishes at most three heads per op
signature and dtype, and the chains here have four signatures.

Not here: losses (``transformers.loss.loss_utils``) reduce to one scalar that is nearly the same for every
input draw (the ``degenerate_output:input_independent`` rule rejects it).
"""

from __future__ import annotations

import warnings

import torch
from opforge.compose.motifs.cut import Motif, cut_motifs
from opforge.compose.motifs.trace import Trace, TraceError, trace_module

# Processor chains of generate(do_sample=True): (transformers class, constructor kwargs), in generate's order,
# from the generation_config.json of released checkpoints (Llama 3: temperature 0.6, top_p 0.9; Qwen2.5:
# temperature 0.7, top_k 20, top_p 0.8; Gemma 3: top_k 64, top_p 0.95 at temperature 1) and transformers'
# GenerationConfig default (top_k 50).
SAMPLING_CHAINS: dict[str, list[tuple[str, dict]]] = {
    "llama3": [("TemperatureLogitsWarper", {"temperature": 0.6}), ("TopPLogitsWarper", {"top_p": 0.9})],
    "qwen2_5": [("TemperatureLogitsWarper", {"temperature": 0.7}), ("TopKLogitsWarper", {"top_k": 20}),
                ("TopPLogitsWarper", {"top_p": 0.8})],
    "gemma3": [("TopKLogitsWarper", {"top_k": 64}), ("TopPLogitsWarper", {"top_p": 0.95})],
    "default_top_k": [("TopKLogitsWarper", {"top_k": 50})],
    "temperature_top_k": [("TemperatureLogitsWarper", {"temperature": 0.7}), ("TopKLogitsWarper", {"top_k": 50})],
}
# Not here: the repetition penalty (9 ops with the softmax) and typical decoding (15) are longer than a motif
# (motif_cut.MAX_OPS); eta sampling reads a tensor's value on the host; min-p and epsilon sampling end in a
# step that keeps the top min_tokens_to_keep tokens, a no-op on any draw where the threshold already keeps
# them (the trivial filter rejects those tasks as trivial:noop).

# Decoder families whose default config gives a head its vocabulary size (32000 to 262208).
HEAD_FAMILIES = ("llama", "qwen2", "gemma", "phi3", "gpt2", "gpt_neox", "falcon", "olmo", "mpt", "bloom", "opt",
                 "llama4_text", "deepseek_v3", "phi", "codegen", "starcoder2", "jamba", "gemma3_text", "exaone4",
                 "glm", "smollm3", "mamba")
# Standard-normal logits times 5 give softmax entropies of 2.7-3.7 nats over 32K-262K tokens, where top-p 0.9 keeps
# tens to a few hundred tokens (measured on 64 draws); at scale 1 the softmax is near-uniform (every probability
# below 1e-2, an answer of zeros would pass the evaluation tolerance).
LOGIT_SCALE = 5.0
HEAD_SEQ_CONTEXT = 64  # length of the token history generate passes every processor (these chains do not read it)


class HeadError(TraceError):
    """A head could not be built or traced; the message names the head and the cause."""


class _Step(torch.nn.Module):
    """One logits processor as a module, so its output is a boundary a motif may start from."""

    def __init__(self, processor):
        super().__init__()
        self.processor = processor

    def forward(self, input_ids, scores):
        return self.processor(input_ids, scores)


class SamplingHead(torch.nn.Module):
    """``softmax(processors(input_ids, scores))``: generate's sampling step before ``multinomial``."""

    def __init__(self, processors):
        super().__init__()
        self.steps = torch.nn.ModuleList(_Step(p) for p in processors)

    def forward(self, input_ids, scores):
        for step in self.steps:
            scores = step(input_ids, scores)
        return torch.nn.functional.softmax(scores, dim=-1)


def family_vocab(family: str) -> int:
    """The vocabulary size of ``family``'s default transformers config. Raises ``HeadError``."""
    from opforge.seeds.relevance import _quiet
    from transformers import CONFIG_MAPPING

    try:
        with _quiet():
            cfg = CONFIG_MAPPING[family]()
    except Exception as exc:  # noqa: BLE001 - a family missing from the installed transformers
        raise HeadError(f"head:{family}: no default config ({type(exc).__name__})") from None
    v = getattr(cfg, "vocab_size", None)
    if not isinstance(v, int) or v < 2:
        raise HeadError(f"head:{family}: the default config has no vocab_size")
    return v


def trace_sampling_head(chain: str, family: str) -> Trace:
    """Trace ``SAMPLING_CHAINS[chain]`` at ``family``'s vocabulary size. Raises ``HeadError``."""
    from transformers.generation import logits_process

    vocab = family_vocab(family)
    try:
        procs = [getattr(logits_process, cls)(**kw) for cls, kw in SAMPLING_CHAINS[chain]]
    except (KeyError, AttributeError, TypeError, ValueError) as exc:
        raise HeadError(f"head:{chain}: cannot build its processors ({exc})") from None

    def inputs(batch, seq):
        with torch.device("meta"):
            return {"input_ids": torch.zeros(batch, HEAD_SEQ_CONTEXT, dtype=torch.long),
                    "scores": torch.empty(batch, vocab, dtype=torch.float32)}

    source = f"transformers:{family}"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trace = trace_module(SamplingHead(procs).eval(), inputs, source, "transformers")
    except Exception as exc:  # noqa: BLE001 - any failure of third-party code is reported by name
        raise HeadError(f"head:generate.{chain}@{source}: {type(exc).__name__}: {str(exc)[:200]}") from None
    for c in trace.calls:  # each call named by its processor's transformers class, the softmax by generate
        step = c.scope.split(".")[1] if c.scope.startswith("steps.") else None
        c.scope_class = SAMPLING_CHAINS[chain][int(step)][0] if step is not None else "generate"
    trace.config = {"max_positions": 0, "hidden_size": 0, "native_dtype": "float32"}
    return trace


def head_motifs(trace: Trace) -> list[Motif]:
    """The motifs of a head's trace that end in the head's own output, logits drawn at ``LOGIT_SCALE`` (see
    the module docstring)."""
    final = set(trace.outputs)
    out = [m for m in cut_motifs(trace) if final & set(m.outputs)]
    for m in out:
        for d in m.inputs:
            if d["kind"] == "normal":
                d["scale"] = LOGIT_SCALE
    return out


def head_jobs(families: tuple[str, ...] | None = None) -> list[tuple[str, object]]:
    """(name, job) pairs for ``motifs.mine_motifs``: every sampling chain at each family's vocabulary size
    (default ``HEAD_FAMILIES``); a job returns a trace whose motifs ``head_motifs`` cuts."""
    return [(f"head:{fam}.generate.{chain}", lambda f=fam, c=chain: trace_sampling_head(c, f))
            for fam in (HEAD_FAMILIES if families is None else families) for chain in SAMPLING_CHAINS]
