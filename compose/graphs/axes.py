"""Axis roles of a composed graph: what each tensor axis means, and which axes an op may work over.

Every axis of every tensor in a sampled ``OpGraph`` carries a *role*:

| role | meaning | from |
|---|---|---|
| ``batch`` | independent samples | ``N`` |
| ``sequence`` | tokens, time steps, keys | ``L`` of ``NLC`` / ``NCL``; flattened spatial axes |
| ``feature`` | hidden / embedding / head-dim features | ``C`` of ``NC`` / ``NLC``, ``K``, ``E`` |
| ``channel`` | image / signal channels | ``C`` of ``NCHW`` / ``NCL`` / ``NHWC`` / ``NCDHW`` |
| ``spatial`` | height, width, depth | ``H``, ``W``, ``D`` |
| ``head`` | attention heads, groups split off a feature axis | ``A`` |
| ``unit`` | a size-1 axis (``unsqueeze``, ``keepdim``) | |

Graph inputs take their roles from their layout (``TEMPLATE_ROLES``). Each op's output roles follow from its
input's (``output_roles``): elementwise ops, GEMMs and convolutions keep them by position (a Linear replaces
the feature axis with a new feature axis), reductions drop the reduced axes, layout ops (transpose, permute,
movedim, flatten, unflatten, reshape) move, merge or split them.

An op's dim and layout arguments must hit the roles it exists for (``DIM_RULES``, ``input_violation``):

* softmax, log-softmax, softmin, logsumexp: feature, sequence (keys) or channel;
* cumulative scans: sequence (``cumsum`` also spatial: summed-area tables);
* sort, topk, kthvalue, arg / max / min / median / mode with a dim: feature or channel;
* other reductions, ``chunk`` / ``split`` / ``glu``, ``cat``, indexing: any axis but the batch;
* ``roll`` (always with ``dims``), ``flip``, ``diff``, ``torch.gradient``: sequence or spatial;
* ``F.normalize``, cosine similarity, pairwise distance, Linear / matmul / bilinear, layer / RMS norm: the last
  (contracted or normalised) axis is a feature or channel axis, never a spatial width or a sequence;
* convolutions, batch / instance / group norm, pooling, unfold, pixel (un)shuffle, channel shuffle,
  interpolation, grid sampling: channel-first data ``[batch, channel or feature, spatial or sequence...]``;
* recurrent layers and ``nn.MultiheadAttention``: ``[batch, sequence, feature]``; scaled dot-product
  attention: ``[batch, head, sequence, feature]``; ``tril`` / ``triu``: a square ``[..., sequence, sequence]``
  (attention scores) or feature matrix.

Nothing reduces, normalises, sorts, scans or reorders over the batch: the batch stays axis 0 of every tensor,
alone (``batch_stays_first`` checks it on the shapes). The sampler draws the dim arguments of the ops above
from the axes whose roles they allow (``bind_dims``) and rejects an op whose input has no such axis.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass

from opforge.task.op_names import snake

BATCH, SEQUENCE, FEATURE, CHANNEL, SPATIAL, HEAD, UNIT = (
    "batch", "sequence", "feature", "channel", "spatial", "head", "unit")
ROLES = (BATCH, SEQUENCE, FEATURE, CHANNEL, SPATIAL, HEAD, UNIT)
NON_BATCH = frozenset({SEQUENCE, FEATURE, CHANNEL, SPATIAL, HEAD})

TEMPLATE_ROLES: dict[str, list[str]] = {
    "NCHW": [BATCH, CHANNEL, SPATIAL, SPATIAL],
    "NCL": [BATCH, CHANNEL, SEQUENCE],
    "NC": [BATCH, FEATURE],
    "NHWC": [BATCH, SPATIAL, SPATIAL, CHANNEL],
    "NLC": [BATCH, SEQUENCE, FEATURE],
    "NCDHW": [BATCH, CHANNEL, SPATIAL, SPATIAL, SPATIAL],
    "C": [FEATURE],
    "NALE": [BATCH, HEAD, SEQUENCE, FEATURE],
}
# Role of a size symbol in a shape written without a template (an op's extra input).
SYMBOL_ROLES = {"N": BATCH, "C": FEATURE, "K": FEATURE, "L": SEQUENCE, "H": SPATIAL, "W": SPATIAL,
                "D": SPATIAL, "A": HEAD, "E": FEATURE}
_CHANNEL_LAYOUTS = {"NCHW", "NCL", "NHWC", "NCDHW"}


def input_roles(shape: list, template: str | None = None) -> list[str]:
    """Roles of a graph input: those of ``template`` when given, else from the size symbols of ``shape``
    (``C`` is a channel in a channel layout, a feature otherwise); an int dim is a feature (1: unit)."""
    if template in TEMPLATE_ROLES and len(TEMPLATE_ROLES[template]) == len(shape):
        return list(TEMPLATE_ROLES[template])
    out = []
    for d in shape:
        if isinstance(d, str) and d in SYMBOL_ROLES:
            out.append(SYMBOL_ROLES[d])
        else:
            out.append(UNIT if d == 1 else FEATURE)
    return out


def op_name(label: str) -> str:
    """Bare snake-case name of a seed-op label: ``nn.LogSoftmax`` -> ``log_softmax``, ``torch.cumsum`` ->
    ``cumsum``, ``F.conv2d`` -> ``conv2d``, ``+`` -> ``add``."""
    if label in ("+", "-", "*", "/"):
        return {"+": "add", "-": "sub", "*": "mul", "/": "div"}[label]
    return snake(label.split(".")[-1])


# ---- dim arguments ----

@dataclass(frozen=True)
class DimRule:
    """How an op's dim argument is bound.

    Attributes:
        roles: roles the axis (or axes) may have.
        keys: argument names (``dim``; ``dims`` for roll / flip; ``dim0, dim1`` for transpose...).
        kind: ``one`` (an int), ``list`` (a one-element list), ``pair`` (two distinct axes), ``flatten``
            (start_dim <= end_dim), ``unflatten`` (dim and its split sizes) or ``check`` (the op's own dim is
            kept and only checked: its other arguments were built for it).
        last: prefer the last allowed axis (softmax and norms over the trailing features, as models write).
        keepdim: draw ``keepdim`` (reductions).
        tuple_out: with a dim the op returns (values, indices): the values are taken.
    """

    roles: frozenset[str]
    keys: tuple[str, ...] = ("dim",)
    kind: str = "one"
    last: bool = True
    keepdim: bool = False
    tuple_out: bool = False


_SOFT = frozenset({FEATURE, SEQUENCE, CHANNEL})
_FEAT = frozenset({FEATURE, CHANNEL})
_SEQ = frozenset({SEQUENCE})
_SEQ_SP = frozenset({SEQUENCE, SPATIAL})
_ANY = frozenset({FEATURE, CHANNEL, SEQUENCE, SPATIAL})
_LAYOUT = frozenset({FEATURE, CHANNEL, SEQUENCE, SPATIAL, HEAD})

DIM_RULES: dict[str, DimRule] = {
    **{n: DimRule(_SOFT) for n in ("softmax", "log_softmax", "softmin")},
    "logsumexp": DimRule(_SOFT, keepdim=True),
    **{n: DimRule(_SEQ) for n in ("cumprod", "cummax", "cummin", "logcumsumexp")},
    **{n: DimRule(_SEQ_SP) for n in ("cumsum", "cumulative_trapezoid")},
    **{n: DimRule(_FEAT) for n in ("sort", "argsort", "topk", "kthvalue", "argmax", "argmin", "mode")},
    **{n: DimRule(_FEAT, keepdim=True, tuple_out=True) for n in ("max", "min", "median", "nanmedian")},
    **{n: DimRule(_ANY, keepdim=True) for n in ("sum", "mean", "nansum", "nanmean", "amax", "amin", "aminmax",
                                                 "std", "var", "std_mean", "var_mean", "prod", "norm",
                                                 "count_nonzero", "all", "any", "quantile", "nanquantile")},
    **{n: DimRule(_SEQ_SP) for n in ("trapz", "trapezoid", "diff", "gradient")},
    **{n: DimRule(_ANY, last=True) for n in ("chunk", "unsafe_chunk", "split", "tensor_split", "glu")},
    "roll": DimRule(_SEQ_SP, keys=("dims",), last=False),
    "flip": DimRule(_SEQ_SP | {FEATURE}, keys=("dims",), kind="list", last=False),
    **{n: DimRule(_FEAT) for n in ("normalize", "cosine_similarity")},
    **{n: DimRule(_LAYOUT, keys=("dim0", "dim1"), kind="pair") for n in ("transpose", "swapaxes", "swapdims")},
    **{n: DimRule(_LAYOUT, keys=("source", "destination"), kind="pair") for n in ("movedim", "moveaxis")},
    "flatten": DimRule(_LAYOUT, keys=("start_dim", "end_dim"), kind="flatten"),
    "unflatten": DimRule(_LAYOUT, keys=("dim", "sizes"), kind="unflatten"),
    **{n: DimRule(_LAYOUT, kind="check") for n in ("cat", "concat", "concatenate", "stack", "index_select",
                                                     "narrow", "select", "repeat_interleave", "gather",
                                                     "scatter", "index_copy", "unsqueeze", "squeeze", "tile",
                                                     "permute", "rot90", "diagonal", "diag_embed")},
}
# Ops whose implicit axis is the batch (``msort``, ``flipud``: dim 0; ``diag`` / ``diagflat`` / ``trace`` of a
# [batch, feature] matrix; ``pdist``: distances between the samples), or that flatten everything (``ravel``).
BATCH_OPS = frozenset({"msort", "flipud", "diag", "diagflat", "trace", "pdist", "ravel", "histc", "vdot", "dot",
                       "inner", "kron", "tensordot", "t"})
# Implicit dims of ops that have one when the argument is absent (``None``: every axis / the flattened tensor).
DEFAULT_DIMS: dict[str, object] = {
    "softmax": "implicit", "log_softmax": "implicit", "softmin": "implicit", "chunk": 0, "unsafe_chunk": 0,
    "split": 0, "tensor_split": 0, "sort": -1, "argsort": -1, "topk": -1, "kthvalue": -1, "mode": -1,
    "glu": -1, "roll": None, "gradient": None, "diff": -1, "trapz": -1, "trapezoid": -1,
    "cumulative_trapezoid": -1, "normalize": 1, "cosine_similarity": 1, "rot90": [0, 1], "diagonal": [0, 1],
    "flatten": 0, "fliplr": 1,
}
_MODULE_DIM_DEFAULTS = {"softmax": "implicit", "log_softmax": "implicit", "softmin": "implicit", "glu": -1,
                        "flatten": 1, "cosine_similarity": 1}


def _module_key(seed) -> bool:
    return seed.kind == "module"


def allowed_axes(roles: list[str], allowed: frozenset[str]) -> list[int]:
    """Axes of a tensor with ``roles`` whose role is in ``allowed`` (never the batch)."""
    return [i for i, r in enumerate(roles) if r in allowed and r != BATCH]


def bind_dims(name: str, seed, roles: list[str], shape: tuple[int, ...], init: dict, call: dict,
              rng: random.Random) -> tuple[dict, dict, dict] | None:
    """Draw the dim arguments of op ``name`` (``seed``) for an input with ``roles`` / ``shape``.

    Returns (init args, call args, node attributes such as ``output_index``) with the dims set from the axes
    ``DIM_RULES`` allows, or None when the input has no such axis. Ops without a rule come back unchanged.
    """
    rule = DIM_RULES.get(name)
    if rule is None:
        return init, call, {}
    args = init if _module_key(seed) else call
    args = dict(args)
    nd = len(roles)
    axes = allowed_axes(roles, rule.roles)
    axes = [a for a in axes if shape[a] > 1]
    extra: dict = {}
    if rule.kind == "check":
        return init, call, {}
    if not axes:
        return None
    if rule.kind in ("one", "list"):
        axis = axes[-1] if rule.last and rng.random() < 0.7 else rng.choice(axes)
        if name in ("glu", "chunk", "unsafe_chunk", "split", "tensor_split") and shape[axis] % 2:
            even = [a for a in axes if shape[a] % 2 == 0]
            if not even:
                return None
            axis = even[-1]
        value = axis - nd if axis == nd - 1 else axis  # the last axis written as -1, as models do
        key = rule.keys[0]
        args[key] = [value] if rule.kind == "list" else value
        if name == "roll":
            args["shifts"] = rng.choice([1, 2, 3, -1, shape[axis] // 2 or 1])
        if name == "split":
            args.setdefault("split_size_or_sections", shape[axis] // 2)
        if rule.keepdim and "keepdim" not in args:
            args["keepdim"] = rng.random() < 0.3
        if rule.tuple_out:
            extra["output_index"] = 0
    elif rule.kind == "pair":
        if len(axes) < 2:
            return None
        a, b = rng.sample(axes, 2)
        args[rule.keys[0]], args[rule.keys[1]] = a, b
    elif rule.kind == "flatten":
        runs = [(i, j) for i in axes for j in axes if j > i and all(k in axes for k in range(i, j + 1))]
        if not runs:
            return None
        i, j = rng.choice(runs)
        args[rule.keys[0]], args[rule.keys[1]] = i, (j - nd if j == nd - 1 else j)
    elif rule.kind == "unflatten":
        options = [(a, f) for a in axes for f in (2, 4, 8, 16) if shape[a] % f == 0 and shape[a] > f]
        if not options:
            return None
        a, f = rng.choice(options)
        args[rule.keys[0]], args[rule.keys[1]] = a, [f, -1]
    if _module_key(seed):
        return args, call, extra
    return init, args, extra


# Ops whose ``dims`` argument is not a list of axes (repetitions, a permutation checked on the shapes).
_NOT_AXES = frozenset({"tile", "permute", "repeat", "expand", "reshape", "view"})


def _resolve_dims(name: str, seed, args: dict, nd: int) -> list[int] | None:
    """The axes an op works over from its (bound) arguments or its implicit default; None when it has no
    dim argument, [] when it works over every axis (which includes the batch)."""
    if name in _NOT_AXES:
        return None
    value: object = "absent"
    for key in ("dim", "dims", "axis", "dim0", "dim1", "source", "destination", "start_dim"):
        if key in args:
            value = args[key] if key not in ("dim0", "source") else [args[key], args.get(
                "dim1" if key == "dim0" else "destination", args[key])]
            break
    if value == "absent":
        defaults = _MODULE_DIM_DEFAULTS if _module_key(seed) else DEFAULT_DIMS
        if name not in defaults:
            return None
        value = defaults[name]
    if value == "implicit":
        value = 0 if nd in (0, 1, 3) else 1
    if value is None:
        return []
    if name == "flatten" and isinstance(value, int):
        end = args.get("end_dim", -1)
        value = list(range(value % nd, end % nd + 1)) if nd else []
    values = value if isinstance(value, (list, tuple)) else [value]
    try:
        return [int(v) % nd for v in values]
    except (TypeError, ValueError, ZeroDivisionError):
        return None


def op_dims(name: str, seed, init: dict, call: dict, nd: int) -> list[int] | None:
    """The axes op ``name`` works over (its bound dim arguments or implicit default; [] = every axis), or None
    for an op without a dim argument."""
    return _resolve_dims(name, seed, init if _module_key(seed) else call, nd)


# ---- layouts ops require ----

_CHANNEL_FIRST = re.compile(
    r"^(conv(_transpose)?[123]d|(adaptive_)?(avg|max|lp)_pool[123]d|fractional_max_pool[23]d|"
    r"(sync_)?batch_norm([123]d)?|instance_norm([123]d)?|group_norm|local_response_norm|cross_map_lrn2d|"
    r"unfold|fold|pixel_(un)?shuffle|channel_shuffle|native_channel_shuffle|interpolate|upsample\w*|"
    r"upsampling_\w+|grid_sample|softmax2d|(feature_)?dropout[123]d)$")
_RANK2_OK = re.compile(r"^((sync_)?batch_norm(1d)?|group_norm)$")
# Channel-first ops whose input rank is fixed although their name has no ``Nd`` suffix.
_RANKS = {"pixel_shuffle": 4, "pixel_unshuffle": 4, "unfold": 4, "fold": 3, "cross_map_lrn2d": 4}
_LAST_FEATURE = re.compile(
    r"^(linear|bilinear|lazy_linear|matmul|mm|addmm|layer_norm|native_layer_norm|rms_norm|pairwise_distance|"
    r"cdist|(lstm|gru|rnn)_cell|cosine_embedding_loss)$")
_SEQUENCE_LAYOUT = re.compile(r"^(lstm|gru|rnn|multihead_attention|bmm|baddbmm)$")
_PAD = re.compile(r"^(pad|(zero|constant|reflection|replication|circular)_pad([123])d)$")
_SPATIAL_DIGIT = re.compile(r"([123])d$")


def input_violation(name: str, seed, roles: list[str], init: dict, call: dict) -> str | None:
    """Why op ``name`` may not take an input with ``roles`` given its (bound) arguments, or None."""
    nd = len(roles)
    if not roles or roles[0] != BATCH:
        return "the input has no leading batch axis"
    if name in BATCH_OPS:
        return f"{name} works over the batch axis"
    if _CHANNEL_FIRST.match(name):
        if nd < 2 or (nd == 2 and not _RANK2_OK.match(name)):
            return f"{name} needs channel-first [batch, channel, ...] data"
        m = _SPATIAL_DIGIT.search(name)
        rank = _RANKS.get(name, int(m.group(1)) + 2 if m and name != "batch_norm1d" else None)
        if rank is not None and nd != rank:
            return f"{name} needs a rank-{rank} channel-first input"
        if roles[1] not in (CHANNEL, FEATURE) or any(r not in (SPATIAL, SEQUENCE) for r in roles[2:]):
            return f"{name} needs channel-first [batch, channel, spatial...] data, got {roles}"
    if _LAST_FEATURE.match(name) and roles[-1] not in (FEATURE, CHANNEL):
        return f"{name} works over the last axis, a {roles[-1]} axis"
    if _SEQUENCE_LAYOUT.match(name) and (nd != 3 or roles[1] != SEQUENCE or roles[2] not in (FEATURE, CHANNEL)):
        return f"{name} needs [batch, sequence, feature] data, got {roles}"
    if name in ("tril", "triu") and (nd < 3 or roles[-1] != roles[-2] or roles[-1] not in (SEQUENCE, FEATURE)):
        return f"{name} masks a square [sequence, sequence] (or feature) matrix, got {roles}"
    if name == "scaled_dot_product_attention" and roles != [BATCH, HEAD, SEQUENCE, FEATURE]:
        return f"attention needs [batch, head, sequence, feature] data, got {roles}"
    m = _PAD.match(name)
    if m:
        k = int(m.group(3)) if m.group(3) else len(call.get("pad", [0, 0])) // 2
        if k >= nd or any(r not in (SPATIAL, SEQUENCE) for r in roles[nd - k:]):
            return f"{name} pads the last {k} axes, not all spatial / sequence: {roles}"
    args = init if _module_key(seed) else call
    dims = _resolve_dims(name, seed, args, nd)
    if dims is not None:
        if dims == [] or any(roles[d] == BATCH for d in dims):
            return f"{name} works over the batch axis"
        rule = DIM_RULES.get(name)
        if rule is not None and rule.kind != "check" and any(roles[d] not in rule.roles for d in dims):
            return f"{name} over a {', '.join(roles[d] for d in dims)} axis (allowed: {sorted(rule.roles)})"
    return None


def batch_stays_first(shape: tuple[int, ...], probe_shape: tuple[int, ...], batch: int, probe: int) -> bool:
    """Whether an output whose shape is ``shape`` at batch ``batch`` and ``probe_shape`` at batch ``probe``
    keeps the batch as its axis 0, alone: nothing merged the batch with another axis, moved it or reduced it."""
    if len(shape) != len(probe_shape) or not shape:
        return False
    changed = [i for i, (a, b) in enumerate(zip(shape, probe_shape, strict=True)) if a != b]
    return changed == [0] and shape[0] == batch and probe_shape[0] == probe


# ---- output roles ----

def _merge(roles: list[str]) -> str:
    if BATCH in roles:
        return BATCH
    real = [r for r in roles if r != UNIT] or [UNIT]
    if all(r in (SPATIAL, SEQUENCE) for r in real):
        return SEQUENCE if len(real) > 1 or real[0] == SEQUENCE else SPATIAL
    if len(set(real)) == 1:
        return real[0]
    return FEATURE


def _align(in_shape: tuple[int, ...], out_shape: tuple[int, ...], roles: list[str]) -> list[str] | None:
    """Roles of a reshaped output, by grouping input axes whose sizes multiply to each output axis."""
    out, i = [], 0
    n = len(in_shape)
    for size in out_shape:
        if size == 1 and (i >= n or in_shape[i] != 1):
            out.append(UNIT)
            continue
        group, prod = [], 1
        while i < n and (prod < size or not group):
            prod *= in_shape[i]
            group.append(roles[i])
            i += 1
            if prod == size:
                break
        if prod == size:
            out.append(_merge(group))
            continue
        if prod % size == 0 and len(group) == 1:  # one input axis split over several outputs
            out.append(HEAD if group[0] in (FEATURE, CHANNEL) else group[0])
            in_shape = (*in_shape[: i - 1], prod // size, *in_shape[i:])
            roles = [*roles[: i - 1], group[0], *roles[i:]]
            i -= 1
            continue
        return None
    while i < n and in_shape[i] == 1:
        i += 1
    return out if i == n else None


def output_roles(name: str, seed, roles: list[str], in_shape: tuple[int, ...], out_shape: tuple[int, ...],
                 init: dict, call: dict, other_roles: list[str] | None = None) -> list[str] | None:
    """Roles of op ``name``'s output (module doc), or None when they cannot be told from the shapes."""
    nd, od = len(in_shape), len(out_shape)
    args = init if _module_key(seed) else call
    if name in ("transpose", "swapaxes", "swapdims", "adjoint", "t") and od == nd:
        if name in ("adjoint", "t"):
            a, b = nd - 2, nd - 1
        else:
            a, b = args.get("dim0", 0) % nd, args.get("dim1", 1) % nd
        out = list(roles)
        out[a], out[b] = out[b], out[a]
        return out
    if name in ("movedim", "moveaxis") and od == nd:
        src, dst = args.get("source", 0) % nd, args.get("destination", 0) % nd
        out = list(roles)
        out.insert(dst, out.pop(src))
        return out
    if name == "permute" and od == nd:
        dims = [d % nd for d in args.get("dims", range(nd))]
        return [roles[d] for d in dims]
    if name in ("bmm", "cdist") and od == nd == 3:
        return [roles[0], roles[1], SEQUENCE]
    if name == "unfold" and od == 3 and nd == 4:  # F.unfold: [N, C*k*k, patches]
        return [roles[0], CHANNEL, SEQUENCE]
    if od == nd and name not in ("reshape", "view", "unflatten", "flatten"):
        out = list(roles)
        for i, (a, b) in enumerate(zip(in_shape, out_shape, strict=True)):
            if b == 1 and a != 1:
                out[i] = UNIT  # keepdim reduction or a size-1 pooling
        return out
    if od < nd and name not in ("reshape", "view", "flatten"):
        dims = _resolve_dims(name, seed, args, nd)
        if dims:
            keep = [r for i, r in enumerate(roles) if i not in set(dims)]
            if len(keep) == od:
                return keep
        if name == "squeeze":
            keep = [r for r, s in zip(roles, in_shape, strict=True) if s != 1]
            if len(keep) == od:
                return keep
        # drop the axes whose sizes the output lacks (a reduction with an implicit dim)
        out, j = [], 0
        for r, s in zip(roles, in_shape, strict=True):
            if j < od and out_shape[j] == s:
                out.append(r)
                j += 1
        return out if j == od else None
    if od > nd and tuple(out_shape[:nd]) == tuple(in_shape) and name not in ("reshape", "view", "unflatten"):
        return [*roles, *[FEATURE if s > 1 else UNIT for s in out_shape[nd:]]]
    if name == "unsqueeze" and od == nd + 1:
        d = args.get("dim", 0) % od
        return [*roles[:d], UNIT, *roles[d:]]
    if name == "stack" and od == nd + 1:
        d = args.get("dim", 0) % od
        return [*roles[:d], FEATURE, *roles[d:]]
    return _align(tuple(in_shape), tuple(out_shape), list(roles))


def fan_in(name: str, param: str, shape: list[int]) -> int | None:
    """Fan-in of a weight parameter of a functional GEMM / conv op, as ``torch.nn.init`` computes it for
    ``nn.Linear`` / ``nn.Conv*`` (``_calculate_fan_in_and_fan_out``: ``shape[1] * prod(shape[2:])``); for the
    right operand of ``mm`` / ``matmul`` / ``addmm`` (``[in, out]``), ``shape[0]``. None for anything else
    (biases, statistics, index tensors)."""
    if param in ("mat2", "other") and len(shape) == 2:
        return int(shape[0])
    if param == "weight" and len(shape) >= 2 and re.match(r"^(linear|bilinear|conv(_transpose)?[123]d|conv_tbc)$",
                                                          name):
        return int(shape[1] * math.prod(shape[2:]))
    return None


# Roles a template's size symbol may stand for when an op's template is bound to an existing tensor.
_SYMBOL_FITS = {"N": {BATCH}, "C": {CHANNEL, FEATURE}, "K": {CHANNEL, FEATURE}, "L": {SEQUENCE, SPATIAL},
                "H": {SPATIAL, SEQUENCE}, "W": {SPATIAL, SEQUENCE}, "D": {SPATIAL, SEQUENCE}, "A": {HEAD},
                "E": {FEATURE}}


def template_fits(template: str, roles: list[str], name: str) -> bool:
    """Whether op ``name`` may bind ``template``'s size symbols (``seeds.seed_op.TEMPLATES``) to a tensor with
    ``roles``. Layout-sensitive ops need each symbol on an axis of its kind (``C`` a channel or feature axis,
    ``L`` a sequence...; channel-first and sequence-layout ops: every axis; GEMMs and last-axis norms: the last
    one); other ops take any template of the tensor's rank. A ``unit`` axis fits any symbol but ``N``."""
    symbols = TEMPLATE_SYMBOLS.get(template)
    if symbols is None or len(symbols) != len(roles):
        return False
    if _CHANNEL_FIRST.match(name) or _SEQUENCE_LAYOUT.match(name) or _PAD.match(name):
        pairs = zip(symbols, roles, strict=True)
    elif _LAST_FEATURE.match(name):
        if roles[-1] not in (FEATURE, CHANNEL):
            return False
        pairs = [(symbols[-1], roles[-1])]
    else:
        return True
    return all(r in _SYMBOL_FITS[s] or (r == UNIT and s != "N") for s, r in pairs)


TEMPLATE_SYMBOLS = {"NCHW": "NCHW", "NCL": "NCL", "NC": "NC", "NHWC": "NHWC", "NLC": "NLC", "NCDHW": "NCDHW",
                    "C": "C", "NALE": "NALE"}
