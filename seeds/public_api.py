"""Which seed-op labels are torch's public API, and which labels compute the same thing.

``is_internal`` flags the ATen-level names that torch exposes but no model author writes
(``torch.native_layer_norm``, ``torch.transpose_copy``, ``torch.constant_pad_nd``, ...): the default
catalog leaves them out, they stay available on request. ``alias_groups`` merges labels that compute the
same operation (``torch.relu`` / ``F.relu`` / ``nn.ReLU``; ``torch.fmin`` / ``torch.minimum``; the spellings of
``channel_shuffle``) so that they share one op's sampling weight instead of each taking a full one.
"""

from __future__ import annotations

import functools
import re

import torch
import torch.nn.functional as F
from opforge.task.op_names import _OPERATORS, canonical_name, snake

# Name patterns of ATen-level variants (torch/_C/_VariableFunctions.pyi lists them beside the public ops):
# ``native_*`` are the kernels behind a public op (native_layer_norm behind layer_norm), ``*_copy`` the
# non-aliasing copies of view ops generated for functionalization (transpose_copy), ``*_with_indices``
# the pooling kernels that also return argmax indices, ``*_backward`` the gradient kernels.
_INTERNAL_PREFIXES = ("native_",)
_INTERNAL_SUFFIXES = ("_with_indices", "_backward", "_forward")
_PRIVATE_QUALNAMES = ("torch.ops.", "torch._")

# Canonical names that compute the same thing as another canonical name on the inputs the composer draws
# (finite floats): fmin/fmax differ from minimum/maximum only in NaN handling (torch.fmin docs);
# constant_pad_nd is F.pad's constant mode; the channel_shuffle spellings are one op (torch.nn.ChannelShuffle
# docs). Merged by ``merged_canonical``.
CANONICAL_ALIASES: dict[str, str] = {
    "fmin": "minimum",
    "fmax": "maximum",
    "native_channel_shuffle": "channel_shuffle",
    "constant_pad_nd": "pad",
    "native_dropout": "dropout",
    "native_norm": "norm",
    "native_group_norm": "group_norm",
    "feature_dropout": "dropout",
}

_OPERATOR_LABELS = {label: canonical for canonical, label in _OPERATORS.values()}
_DIM_SUFFIX = re.compile(r"_?[123]d$")


def _bare(label: str) -> tuple[str, str]:
    """``torch.cumsum`` -> (``torch``, ``cumsum``); ``nn.Conv2d`` -> (``nn``, ``Conv2d``); ``+`` -> ("", "+")."""
    prefix, _, name = label.rpartition(".")
    return prefix, name


def _has_doc(obj) -> bool:
    return bool((getattr(obj, "__doc__", None) or "").strip())


@functools.lru_cache(maxsize=4096)
def _undocumented_torch_function(name: str) -> bool:
    """True when ``torch.<name>`` has no docstring and neither ``F.<name>`` nor ``Tensor.<name>`` does.

    torch attaches the reference documentation of its functions as docstrings (torch/_torch_docs.py,
    torch/_tensor_docs.py, torch/nn/functional.py): a function with none of the three is not in the torch
    reference (e.g. ``torch.constant_pad_nd``, ``torch.slice_inverse``, ``torch.convolution``).
    """
    fn = getattr(torch, name, None)
    if fn is None:
        return False
    if _has_doc(fn):
        return False
    if not name.startswith("_") and _has_doc(getattr(F, name, None)):
        return False
    return not _has_doc(getattr(torch.Tensor, name, None))


def is_internal(label: str, qualname: str = "") -> bool:
    """True for an ATen-level name no model author writes.

    Rules, in order: a qualname or label under ``torch.ops.`` or a private module (``torch._``); a bare name
    starting with ``_``; ``native_*``, ``*_with_indices``, ``*_backward``, ``*_forward``; ``*_copy`` whose base
    is itself a torch function (``transpose_copy``; ``index_copy`` stays: there is no ``torch.index``); a
    ``torch.*`` function with no reference documentation (``_undocumented_torch_function``). Operators
    (``+``), ``nn.*`` modules and transformers class names are never internal by the last rule.
    """
    if label in _OPERATOR_LABELS:
        return False
    if any(s.startswith(p) for s in (label, qualname) for p in _PRIVATE_QUALNAMES):
        return True
    prefix, name = _bare(label)
    if not name or name.startswith("_"):
        return True
    if prefix not in ("torch", "F", "Tensor", "torch.Tensor", "nn", "torch.nn", "torch.nn.functional"):
        return False  # transformers classes and other libraries' names
    if prefix in ("nn", "torch.nn"):
        return False
    if name.startswith(_INTERNAL_PREFIXES) or name.endswith(_INTERNAL_SUFFIXES):
        return True
    if name.endswith("_copy") and callable(getattr(torch, name[: -len("_copy")], None)):
        return True
    if prefix == "torch":
        return _undocumented_torch_function(name)
    return False


def label_canonical(label: str) -> str:
    """The canonical operation name of a seed-op label (``task/op_names.py`` rules plus ``CANONICAL_ALIASES``).

    ``+`` -> ``add``; ``F.relu`` / ``torch.relu_`` / ``Tensor.relu`` -> ``relu``; ``nn.ReLU`` -> ``relu``;
    ``nn.BatchNorm2d`` -> ``batch_norm`` (the function the module calls); ``torch.transpose_copy`` ->
    ``transpose``; a transformers class name is returned unchanged.
    """
    if label in _OPERATOR_LABELS:
        return _OPERATOR_LABELS[label]
    prefix, name = _bare(label)
    if prefix in ("nn", "torch.nn"):
        return merged_canonical(_module_function(name))
    if prefix in ("torch", "F", "Tensor", "torch.Tensor", "torch.nn.functional"):
        return merged_canonical(canonical_name(name))
    return label


def _module_function(name: str) -> str:
    """The functional name behind an ``nn`` class name: the first of its snake-case name, its lower-case name,
    the snake-case name without ``_loss`` or without the ``1d/2d/3d`` suffix that ``F`` or ``torch`` defines
    (``SiLU`` -> ``silu``, ``CrossEntropyLoss`` -> ``cross_entropy``, ``BatchNorm2d`` -> ``batch_norm``);
    the snake-case name when none is defined."""
    base = snake(name)
    for cand in (base, name.lower(), re.sub(r"_loss$", "", base), _DIM_SUFFIX.sub("", base)):
        if callable(getattr(F, cand, None)) or callable(getattr(torch, cand, None)):
            return canonical_name(cand)
    return canonical_name(base)


def merged_canonical(canonical: str) -> str:
    """Map a canonical name onto the one it computes the same thing as (``fmin`` -> ``minimum``)."""
    seen = set()
    while canonical not in seen:
        seen.add(canonical)
        if canonical in CANONICAL_ALIASES:
            canonical = CANONICAL_ALIASES[canonical]
        elif canonical.endswith("_copy") and callable(getattr(torch, canonical[: -len("_copy")], None)):
            canonical = canonical_name(canonical[: -len("_copy")])
        elif canonical.startswith("native_") and callable(getattr(torch, canonical[len("native_"):], None)):
            canonical = canonical_name(canonical[len("native_"):])
        else:
            break
    return canonical


def alias_groups(labels: list[str]) -> dict[str, str]:
    """Map each label to the representative label of its alias group (labels with one ``label_canonical``).

    The representative is a public label (``is_internal`` False) whose name is the op's canonical name when
    there is one, first in sorted order (``torch.native_channel_shuffle`` and ``nn.ChannelShuffle`` map to
    ``F.channel_shuffle``; ``torch.fmin`` to ``torch.minimum``; ``torch.bmm`` to ``torch.matmul``).
    Every input label appears as a key; a label with no alias maps to itself.
    """
    groups: dict[str, list[str]] = {}
    for label in labels:
        groups.setdefault(label_canonical(label), []).append(label)
    out: dict[str, str] = {}
    for canonical, members in groups.items():
        ordered = sorted(set(members), key=lambda lab: (is_internal(lab), _bare(lab)[1] != canonical, lab))
        for lab in members:
            out[lab] = ordered[0]
    return out
