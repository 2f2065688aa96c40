"""Candidates from the motif library: draw a motif, maybe mutate it, size it for the window, render it.

Mutations (``MUTATIONS``, applied to ``composer.MOTIF_MUTATION_SHARE`` of the motif candidates) keep a motif
a piece of a real model while varying it: ``activation`` swaps its activation function for another one real
models use in that place (``ACTIVATION_SWAPS``), ``residual`` adds the residual connection of a pre-norm
block (the output plus a second input of its shape; not to a motif whose output is such a sum already), ``norm`` swaps an ``nn.LayerNorm`` for an ``nn.RMSNorm``
of the same size and eps and back (Llama-style models replaced the one with the other). The dtype is the family's own (``native_dtype``) with
probability ``composer.NATIVE_DTYPE_SHARE``, else the run's dtype mix; a motif whose code casts every input
to one dtype itself has that dtype (``fixed_dtype``). Batch and sequence length come from
the shape vocabulary (``compose.motifs.sizing.choose_sizes``: a random pair among those predicted inside the
window shrunk by its margin, so candidates of one motif differ in size; at least ``min_batch``), the sequence
never past the family's ``max_positions``; on a fixed-size profile (``cpu``, ``test``) they come from
``FIXED_SIZES``, and a candidate whose inputs exceed ``MAX_FIXED_INPUT_BYTES`` is not made. A motif whose
predicted time cannot reach the window at those sizes stays as fast as it is (the runtime filter rejects it as
too fast; sizes are never inflated past the family's vocabulary).

The ``ops`` labels are those the rendered code calls, recovered by tracing it on ``meta``
(``compose.labels``), so they are exact by construction.
"""

from __future__ import annotations

import copy
import json
import random

from opforge.compose.device_profiles import window_target
from opforge.compose.motifs.cut import Motif
from opforge.compose.motifs.render import RenderError, render_motif
from opforge.compose.motifs.sizing import _ITEM, MotifCost, _module_params, choose_sizes
from opforge.compose.motifs.sources import motif_source
from opforge.task.identity import task_id_for

# Activation functions real models use in the same place (MLP / gate / epilogue), by functional name.
ACTIVATION_SWAPS = {"silu": ("gelu", "relu", "mish"), "gelu": ("silu", "relu"), "relu": ("gelu", "silu"),
                    "mish": ("silu", "gelu"), "tanh": ("sigmoid",), "sigmoid": ("tanh",)}
MUTATIONS = ("activation", "residual", "norm")
# Categories whose output is no hidden state: a residual added to next-token probabilities is no model's.
NOT_MUTATED = frozenset({"sampling_head"})
FIXED_SIZES = {"cpu": ([2, 4], [32, 64]), "test": ([1, 2], [8, 16])}
# A fixed-size profile's candidate reads at most this many bytes of inputs: an image motif keeps its model's
# spatial size whatever the batch and sequence (a SAM layer's 2 x 72 x 72 x 4736 float32 activations are 196 MB),
# and the trivial filter runs such a task about ten times over (one call per ablation): 57 s on one core of
# cpu-2core in the CPU main job, a third of its filter time.
MAX_FIXED_INPUT_BYTES = 64 * 2**20


def small_enough(m: Motif, max_params: int) -> bool:
    """The motif's parameters and module parameters add up to at most ``max_params``."""
    n = sum(_prod(p["shape"]) for p in m.params)
    for c in m.calls:
        if c["spelling"] == "module":
            n += _module_params(c)
    return n <= max_params


def _prod(shape) -> int:
    out = 1
    for d in shape:
        out *= int(d)
    return out


def mutate(m: Motif, kind: str, rng: random.Random) -> Motif | None:
    """A copy of ``m`` with mutation ``kind`` (``MUTATIONS``), or None when it does not apply (never to a
    category of ``NOT_MUTATED``)."""
    if m.category in NOT_MUTATED:
        return None
    m = copy.deepcopy(m)
    if kind == "activation":
        acts = [c for c in m.calls if c["spelling"] == "F." + c["name"] and c["name"] in ACTIVATION_SWAPS]
        if not acts:
            return None
        call = rng.choice(acts)
        new = rng.choice(ACTIVATION_SWAPS[call["name"]])
        call["name"], call["spelling"], call["canonical"] = new, f"F.{new}", new
        call["args"] = call["args"][:1]
        call["kwargs"] = {}
        return m
    if kind == "residual":
        if len(m.outputs) != 1 or ends_in_residual(m):
            return None
        out = m.outputs[0]
        shape, dtype = _out_shape(m, out)
        if shape is None or not shape or not dtype.startswith(("float", "bfloat")):
            return None
        vid_in = max(_all_vids(m)) + 1
        vid_out = vid_in + 1
        m.inputs.append({"vid": vid_in, "shape": shape, "dtype": dtype, "kind": "normal", "bound": 0,
                         "name": "residual"})
        m.calls.append({"index": -1, "kind": "function", "name": "add", "spelling": "method",
                        "args": [{"T": out}, {"T": vid_in}], "kwargs": {}, "outputs": [vid_out], "module": "",
                        "scope": "", "scope_class": "", "counted": True, "heavy": False, "flops": 0.0,
                        "data": True, "canonical": "add", "module_path": "", "index_bound": 0,
                        "out_shapes": [[shape, dtype]]})
        m.outputs = [vid_out]
        m.n_ops += 1
        return m
    if kind == "norm":
        norms = [c for c in m.calls if c["spelling"] == "module" and c["name"] in ("LayerNorm", "RMSNorm")]
        if not norms:
            return None
        call = rng.choice(norms)
        swapped = _swap_norm(call["module"])
        if swapped is None:
            return None
        call["module"], call["name"] = swapped
        call["canonical"] = "nn." + call["name"]
        return m
    raise ValueError(f"unknown motif mutation {kind!r}; known: {', '.join(MUTATIONS)}")


RESIDUAL_ADDS = frozenset({"add", "__add__", "__radd__", "__iadd__", "add_"})


def ends_in_residual(m: Motif) -> bool:
    """Whether ``m``'s output is a sum of two tensors of its shape (a residual connection already): a
    ``residual`` mutation would add a second one."""
    from opforge.compose.motifs.trace import template_refs

    if len(m.outputs) != 1:
        return False
    last = next((c for c in m.calls if m.outputs[0] in c["outputs"]), None)
    if last is None or last["name"] not in RESIDUAL_ADDS:
        return False
    refs = template_refs(last["args"])
    inputs = {i["vid"]: i["shape"] for i in m.inputs}
    out_shape = list(_out_shape(m, m.outputs[0])[0] or [])
    return len(refs) == 2 and all(list(inputs.get(v) or _out_shape(m, v)[0] or []) == out_shape for v in refs)


def _swap_norm(source: str) -> tuple[str, str] | None:
    """``nn.LayerNorm(...)`` <-> ``nn.RMSNorm(...)`` with the same normalized shape, eps and affine weight
    (source, class name); None when the module does not rebuild."""
    import torch

    with torch.device("meta"):
        try:
            mod = eval(source, {"nn": torch.nn, "torch": torch})  # noqa: S307 - a traced torch.nn extra_repr
        except Exception:  # noqa: BLE001
            return None
    shape = tuple(mod.normalized_shape)
    eps = mod.eps if mod.eps is not None else 1e-6
    affine = bool(mod.elementwise_affine)
    if isinstance(mod, torch.nn.LayerNorm):
        return f"nn.RMSNorm({shape}, eps={eps}, elementwise_affine={affine})", "RMSNorm"
    return f"nn.LayerNorm({shape}, eps={eps}, elementwise_affine={affine})", "LayerNorm"


def _all_vids(m: Motif) -> list[int]:
    out = [d["vid"] for d in m.inputs + m.params]
    for c in m.calls:
        out += [o for o in c["outputs"] if o is not None]
    return out


def _out_shape(m: Motif, vid: int):
    for c in m.calls:
        for o, (sh, dt) in zip(c["outputs"], c.get("out_shapes", []), strict=False):
            if o == vid:
                return sh, dt
    return None, ""


def motif_candidate(state: dict, rng: random.Random, i: int, dtype: str) -> dict | None:
    """One candidate row (``composer.COLUMNS``) from the motif pool in ``state`` (the composer's worker
    state), or None when the drawn motif cannot be rendered or sized."""
    from opforge.compose import composer as C
    from opforge.compose.labels import recovered_labels

    cfg, profile, pool = state["cfg"], state["profile"], state["motifs"]
    motif = pool.draw(rng)
    mutation = ""
    if rng.random() < C.MOTIF_MUTATION_SHARE:
        kind = rng.choice(MUTATIONS)
        mutated = mutate(motif, kind, rng)
        if mutated is not None:
            motif, mutation = mutated, kind
    if rng.random() < C.NATIVE_DTYPE_SHARE and motif.native_dtype in ("float32", "bfloat16", "float16"):
        dtype = motif.native_dtype
    fixed = fixed_dtype(motif)
    if fixed:
        dtype = fixed
    cost = MotifCost(motif)
    least = min_batch(motif)
    if profile.realistic:
        vocab = state["vocab"]
        longest = min(motif.max_positions or 4096, 8192)
        seqs = [s for s in vocab.values("seq", 16, longest)] or [128]
        batches = [b for b in vocab.values("batch", least, profile.max_batch)] or [least]
        ok_lo, ok_hi, target = window_target(profile)
        # the band starts at twice the window's shrunk floor: predictions err by up to 2x either way
        picked = choose_sizes(cost, profile, dtype, batches, seqs, target, band=(2 * ok_lo, ok_hi), rng=rng)
        if picked is None:
            return None
        batch, seq, predicted = picked
    else:
        batches, seqs = FIXED_SIZES.get(profile.name, FIXED_SIZES["cpu"])
        batches = [b for b in batches if b >= least] or [least]
        batch, seq = rng.choice(batches), rng.choice(seqs)
        predicted = cost.predict_ms(batch, seq, dtype, profile)
    source = motif.sources[0]
    doc = (f"{_describe(motif)} from {source} ({', '.join(motif.scope_classes[:3]) or 'model'}), {dtype}. "
           f"Generated by {C.GENERATOR}, seed {cfg.seed}, candidate {i}.")
    try:
        code = render_motif(motif, batch, seq, dtype, doc)
        labels = [alts[0] for alts in recovered_labels(code, f"candidate {i}")]
    except (RenderError, Exception):  # noqa: BLE001 - a motif that does not render or run at these sizes
        return None
    if len(labels) < 2:
        return None
    shapes = _input_shapes(code)
    if not profile.realistic and sum(_prod(x) for x in shapes) * _ITEM.get(dtype, 4) > MAX_FIXED_INPUT_BYTES:
        return None
    family = source.split(":", 1)[-1]
    prov = {"source": source, "found_in": len(motif.sources), "scopes": motif.scopes,
            "modules": motif.scope_classes, "motif_id": motif.motif_id, "category": motif.category,
            "mutation": mutation}
    library = motif_source(motif)
    if library:  # a merged library (``motifs.sources``): which library, and every model it was found in
        prov.update(library=library, models=list(motif.sources))
    return {
        "task_id": task_id_for(code), "code": code, "ops": json.dumps(labels), "data_source": f"torch#{len(labels)}",
        "num_ops": len(labels), "graph": json.dumps({"motif": motif.motif_id, "calls": [c["name"] for c in motif.calls],
                                                    "batch_size": batch, "seq_len": seq if motif.seq else None},
                                                   sort_keys=True),
        "categories": json.dumps(sorted({motif.category})), "input_shapes": json.dumps(shapes), "dtype": dtype,
        "size_context": family if profile.realistic else "", "pattern": f"motif:{motif.category}", "predicted_ms": float(predicted),
        "device_profile": profile.name, "generator": C.GENERATOR, "generator_seed": cfg.seed, "candidate_index": i,
        "provenance": json.dumps(prov, sort_keys=True),
    }


BATCH_STAT_MODULES = ("BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SyncBatchNorm")


def min_batch(m: Motif) -> int:
    """The least batch a task of ``m`` runs with: 2 when it calls a batch-norm module (a KernelBench ``Model`` runs
    in training mode, where batch norm needs more than one value per channel: a pooled ``[1, C]`` or ``[1, C, 1,
    1]`` input raises), else 1."""
    return 2 if any(c["spelling"] == "module" and c["name"] in BATCH_STAT_MODULES for c in m.calls) else 1


def fixed_dtype(m: Motif) -> str | None:
    """The dtype of a motif whose floating inputs the traced code itself casts to one dtype (their traced
    dtype is not ``motif_trace.TRACE_DTYPE``, e.g. generate's float32 logits in ``compose.motifs.heads``), else
    None: such a motif is drawn in that dtype only, since every tensor it reads has it whatever the task's."""
    dts = {d["dtype"] for d in m.inputs + m.params if d["dtype"] in ("float16", "float32", "bfloat16", "float64")}
    return dts.pop() if len(dts) == 1 and "float16" not in dts else None


def _describe(m: Motif) -> str:
    names = {"norm_residual": "Residual add + normalisation", "norm": "Normalisation", "gated_mlp": "Gated MLP",
             "rotary": "Rotary position embedding", "attention": "Attention scores, mask and softmax",
             "softmax": "Scaled, masked softmax", "conv_norm_act": "Convolution + normalisation + activation",
             "gemm_epilogue": "GEMM with its epilogue", "activation": "Activation", "pool_head": "Pooling head",
             "embedding": "Embedding", "elementwise": "Elementwise chain",
             "sampling_head": "Sampling head (logits processors + softmax)"}
    return names.get(m.category, m.category) + " motif"


def _input_shapes(code: str) -> list[list[int]]:
    import torch
    from opforge.task.source import load_task

    with torch.device("meta"):
        xs = load_task(code, "shapes").inputs()
    return [list(x.shape) for x in xs if isinstance(x, torch.Tensor)]


__all__ = ["MUTATIONS", "min_batch", "motif_candidate", "mutate", "small_enough"]
