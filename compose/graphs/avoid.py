"""Constructs the composer does not generate: ops that change nothing in their place in the graph.

A kernel may skip such an op and still be "correct", so the task teaches less than its op list says. The
``trivial`` filter catches them after the fact (for any task source); these rules keep the composer from
spending filter time on them. ``noop_reason(graph, node)`` is asked after each op is added:

* ``copy``: a copy-like shape or padding op (tile / repeat / expand / reshape / view / flatten / squeeze /
  unsqueeze / clone / contiguous / pad / narrow / identity ...) whose output has its input's shape (a tile by
  ones, a pad by zero, a reshape to the same shape);
* ``idempotent``: the same idempotent op twice in a row with the same arguments (relu after relu, abs after abs,
  clamp after clamp...);
* ``range``: an op that is the identity on its producer's range (relu or abs after an op whose output is
  non-negative; a clamp / hardtanh / relu6 whose bounds contain the [0, 1] output of sigmoid or softmax);
* ``inverse``: two adjacent layout ops that undo each other (two permutations, or two reshapes, returning to
  the first one's input shape; an op that is its own inverse applied twice: neg, flip, t, reciprocal).

Ops whose output does not depend on their input's values (``zeros_like``, ``ones_like``, ``empty_like``,
``full_like``; ``CONSTANT_OUTPUT``) and ops of complex numbers that on real tensors are identities (``conj``,
``resolve_neg``, ``positive``, ``real``) or a sign test (``angle``: 0 or pi) (``IDENTITY_ON_REAL``) are never
drawn.
"""

from __future__ import annotations

import re

from opforge.compose.graphs.graph import OpGraph
from opforge.task.op_names import label_op

CONSTANT_OUTPUT = re.compile(r"(^|\.)(zeros|ones|empty|full|new_zeros|new_ones|new_empty|new_full)(_like)?$")
# Ops of complex numbers with no meaning on the real float tensors tasks use: identities (complex conjugation,
# sign-bit views, unary plus, real part) and the argument, 0 or pi by sign.
IDENTITY_ON_REAL = re.compile(r"(^|\.)(conj|conj_physical|resolve_conj|resolve_neg|positive|real|angle)$")

_COPY_LIKE = re.compile(r"^(tile|repeat|expand|expand_as|broadcast_to|reshape|view|view_as|flatten|unflatten|"
                        r"squeeze|unsqueeze|clone|contiguous|identity|pad|constant_pad_nd|zero_pad\d?d|"
                        r"constant_pad\d?d|reflection_pad\d?d|replication_pad\d?d|circular_pad\d?d|narrow|"
                        r"ravel|atleast_\dd|detach|alias|dropout\w*|alpha_dropout|feature_alpha_dropout)$")
_IDEMPOTENT = {"relu", "relu6", "abs", "sign", "floor", "ceil", "round", "trunc", "clamp", "clip", "hardtanh",
               "sort", "nan_to_num", "fix", "positive", "tril", "triu", "clamp_min", "clamp_max", "threshold"}
_SELF_INVERSE = {"neg", "negative", "flip", "fliplr", "flipud", "t", "reciprocal", "conj", "logical_not",
                 "bitwise_not"}
_NON_NEGATIVE = {"relu", "relu6", "abs", "sigmoid", "softmax", "exp", "exp2", "softplus", "square", "sqrt",
                 "hardsigmoid", "softmin", "norm", "std", "var", "cosh", "rsqrt", "absolute", "erfc"}
_UNIT_RANGE = {"sigmoid", "softmax", "softmin", "hardsigmoid"}
_IDENTITY_ON_NON_NEGATIVE = {"relu", "abs", "absolute", "clamp_min"}
_BOUNDED = {"clamp", "clip", "hardtanh", "relu6"}
_PERMUTATION = {"transpose", "permute", "swapaxes", "swapdims", "movedim", "moveaxis", "t", "rot90",
                "channel_shuffle", "native_channel_shuffle", "pixel_shuffle", "pixel_unshuffle"}
_RESHAPE = {"reshape", "view", "flatten", "unflatten", "squeeze", "unsqueeze", "ravel", "view_as"}


def _bounds(node_attrs: dict, base: str) -> tuple[float | None, float | None]:
    args = {**node_attrs.get("init_args", {}), **node_attrs.get("call_args", {})}
    if base == "relu6":
        return 0.0, 6.0
    if base == "hardtanh":
        return args.get("min_val", -1.0), args.get("max_val", 1.0)
    return args.get("min"), args.get("max")


def noop_reason(graph: OpGraph, node: str) -> str | None:
    """Why ``node`` (just added, primary input first) changes nothing, or None. Shapes come from ``meta``."""
    g = graph.g
    attrs = g.nodes[node]
    base = label_op(attrs["label"])
    args = graph.args_of(node)
    if not args:
        return None
    vals = graph.run("meta")
    src = args[0]
    if _COPY_LIKE.match(base) and tuple(vals[node].shape) == tuple(vals[src].shape):
        return "copy"
    if not src.startswith("op"):
        return None
    prev = g.nodes[src]
    pbase = label_op(prev["label"])
    same_args = prev.get("call_args") == attrs.get("call_args") and prev.get("init_args") == attrs.get("init_args")
    if base == pbase and base in _IDEMPOTENT and same_args:
        return "idempotent"
    if base == pbase and base in _SELF_INVERSE and same_args:
        return "inverse"
    if base in _IDENTITY_ON_NON_NEGATIVE and pbase in _NON_NEGATIVE:
        return "range"
    if base in _BOUNDED and pbase in _UNIT_RANGE:
        lo, hi = _bounds(attrs, base)
        if (lo is None or lo <= 0.0) and (hi is None or hi >= 1.0):
            return "range"
    if base in _BOUNDED and pbase in _NON_NEGATIVE:
        lo, hi = _bounds(attrs, base)
        if (lo is None or lo <= 0.0) and hi is None:
            return "range"
    first_in = graph.args_of(src)[0] if graph.args_of(src) else None
    if first_in is not None and tuple(vals[node].shape) == tuple(vals[first_in].shape):
        if (base in _PERMUTATION and pbase in _PERMUTATION) or (base in _RESHAPE and pbase in _RESHAPE):
            return "inverse"
    return None
