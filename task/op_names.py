"""Op labels (Ops-6K spelling) and canonical operation names for torch callables.

*Label*: how CUDA-Agent-Ops-6K spells an op: ``nn.Conv2d`` for a module class, ``F.gelu`` for a
``torch.nn.functional`` function, ``torch.cumsum`` for a ``torch`` function, ``Tensor.relu`` for a method.
*Canonical name*: one name per operation whatever its spelling, so ``torch.relu``, ``F.relu``,
``x.relu()`` and ``nn.ReLU`` are all ``relu`` (docs/DESIGN.md §3, contamination tier 1).
"""

from __future__ import annotations

import functools
import re

import torch
import torch.nn.functional as F

# Synonyms that torch exposes under several names. Source: torch's own alias list in the docs of each
# function ("Alias for ..."), e.g. torch.multiply -> torch.mul, torch.clip -> torch.clamp.
_SYNONYMS = {
    "multiply": "mul", "subtract": "sub", "divide": "div", "true_divide": "div", "absolute": "abs",
    "clip": "clamp", "negative": "neg", "arccos": "acos", "arcsin": "asin", "arctan": "atan",
    "arctan2": "atan2", "arccosh": "acosh", "arcsinh": "asinh", "arctanh": "atanh", "greater": "gt",
    "greater_equal": "ge", "less": "lt", "less_equal": "le", "not_equal": "ne", "fix": "trunc",
    "mm": "matmul", "bmm": "matmul", "matmul": "matmul", "concat": "cat", "concatenate": "cat",
    "swapaxes": "transpose", "swapdims": "transpose", "moveaxis": "movedim", "row_stack": "vstack",
    "special_expit": "sigmoid", "expit": "sigmoid", "clamp_min": "clamp", "clamp_max": "clamp",
    "max_pool1d_with_indices": "max_pool1d", "max_pool2d_with_indices": "max_pool2d",
    "max_pool3d_with_indices": "max_pool3d", "adaptive_max_pool1d_with_indices": "adaptive_max_pool1d",
    "adaptive_max_pool2d_with_indices": "adaptive_max_pool2d",
    "adaptive_max_pool3d_with_indices": "adaptive_max_pool3d", "upsample": "interpolate",
    "upsample_nearest": "interpolate", "upsample_bilinear": "interpolate", "view": "reshape",
    "view_as": "reshape", "reshape_as": "reshape", "flatten": "reshape", "unflatten": "reshape",
    "ger": "outer", "native_layer_norm": "layer_norm", "native_batch_norm": "batch_norm",
    "cudnn_batch_norm": "batch_norm", "hardsigmoid": "hardsigmoid", "dsplit": "split",
    "hsplit": "split", "vsplit": "split", "tensor_split": "split", "split_with_sizes": "split",
    "chunk": "split", "unsafe_split": "split", "unsafe_chunk": "split",
}

# Dunder operators: (canonical name, Ops-6K label).
_OPERATORS = {
    "__add__": ("add", "+"), "__radd__": ("add", "+"), "__iadd__": ("add", "+"),
    "__sub__": ("sub", "-"), "__rsub__": ("sub", "-"), "__isub__": ("sub", "-"),
    "__mul__": ("mul", "*"), "__rmul__": ("mul", "*"), "__imul__": ("mul", "*"),
    "__truediv__": ("div", "/"), "__rtruediv__": ("div", "/"), "__itruediv__": ("div", "/"),
    "__matmul__": ("matmul", "@"), "__rmatmul__": ("matmul", "@"), "__pow__": ("pow", "**"),
    "__rpow__": ("pow", "**"), "__neg__": ("neg", "-x"), "__abs__": ("abs", "abs"),
    "__mod__": ("remainder", "%"), "__floordiv__": ("floor_divide", "//"),
    "__gt__": ("gt", ">"), "__lt__": ("lt", "<"), "__ge__": ("ge", ">="), "__le__": ("le", "<="),
    "__eq__": ("eq", "=="), "__ne__": ("ne", "!="), "__and__": ("logical_and", "&"),
    "__or__": ("logical_or", "|"), "__xor__": ("logical_xor", "^"), "__invert__": ("logical_not", "~"),
    "__getitem__": ("getitem", "[]"), "__setitem__": ("setitem", "[]="),
}

_METHOD_OPERATORS = {"add": "+", "sub": "-", "mul": "*", "div": "/", "matmul": "@", "pow": "**", "neg": "-x",
                     "remainder": "%", "floor_divide": "//", "rsub": "-"}

# Calls that read metadata or move data without computing: never part of an op signature.
NON_COMPUTE = frozenset({
    "size", "dim", "shape", "dtype", "device", "numel", "ndim", "ndimension", "is_contiguous",
    "contiguous", "__len__", "__bool__", "__format__", "__index__", "__int__", "__float__", "__iter__",
    "__repr__", "__hash__", "__array__", "requires_grad", "is_cuda", "data_ptr", "stride", "storage_offset",
    "element_size", "nelement", "is_floating_point", "is_complex", "get_device", "to", "cpu", "cuda",
    "type", "type_as", "float", "double", "half", "bfloat16", "detach", "requires_grad_", "item",
    "tolist", "grad", "data", "T", "mT", "getitem", "setitem", "__setstate__", "__reduce_ex__",
    "__deepcopy__", "_is_view", "__get__", "names", "layout", "is_sparse", "is_quantized", "is_meta",
    "new_zeros", "new_ones", "new_empty", "new_full", "new_tensor", "copy_", "fill_", "zero_", "is_nested",
    "dim_order", "untyped_storage", "_has_compatible_shallow_copy_type", "has_names",
})


def snake(name: str) -> str:
    """``ConvTranspose2d`` -> ``conv_transpose2d``; ``ReLU`` -> ``relu``; ``GELU`` -> ``gelu``."""
    s = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name)
    s = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", s)
    return s.lower().replace("re_lu", "relu")


# Python operators as ``ops`` labels spell them (``a + b`` is labelled ``+``, ``a @ b`` ``@``)
_SYMBOL_OPS = {"+": "add", "-": "sub", "*": "mul", "/": "div", "@": "matmul"}


def label_op(label: str) -> str:
    """Canonical operation name of an ``ops`` label or a traced call's label: ``nn.ConvTranspose2d`` or
    ``ConvTranspose2d`` -> ``conv_transpose2d``, ``F.scaled_dot_product_attention`` ->
    ``scaled_dot_product_attention``, ``Tensor.reshape`` -> ``reshape``, ``@`` -> ``matmul``."""
    if label in _SYMBOL_OPS:
        return _SYMBOL_OPS[label]
    return canonical_name(snake(label.split(".")[-1]))


def canonical_name(name: str) -> str:
    """Canonical operation name for a bare function or method name (``relu_`` -> ``relu``)."""
    if name in _OPERATORS:
        return _OPERATORS[name][0]
    if name.startswith("__i") and name.endswith("__"):
        name = "__" + name[3:]
    base = name.strip("_") if name.startswith("__") else name.rstrip("_").lstrip("_")
    return _SYNONYMS.get(base, base)


@functools.lru_cache(maxsize=1)
def _label_index() -> dict[int, tuple[str, ...]]:
    """Map ``id(callable)`` -> Ops-6K labels for every public torch / F / torch.special function (aliases
    kept)."""
    index: dict[int, list[str]] = {}
    for prefix, ns in (("F", F), ("torch", torch), ("torch.special", torch.special)):
        for attr in dir(ns):
            if attr.startswith("_"):
                continue
            obj = getattr(ns, attr, None)
            if callable(obj) and not isinstance(obj, type):
                index.setdefault(id(obj), []).append(f"{prefix}.{attr}")
    return {k: tuple(v) for k, v in index.items()}


def function_name(func) -> str:
    """Bare name of a callable seen by a ``TorchFunctionMode`` (property getters resolve to the property)."""
    name = getattr(func, "__name__", None) or type(func).__name__
    if name in ("__get__", "__set__"):
        owner = getattr(func, "__self__", None)
        name = getattr(owner, "__name__", name)
    return name


def labels_for_function(func) -> tuple[str, ...]:
    """Ops-6K labels a callable may be written as (``F.conv2d`` is ``torch.conv2d``: both returned)."""
    labels = _label_index().get(id(func))
    if labels:
        return labels
    name = function_name(func)
    if name in _OPERATORS:
        return (_OPERATORS[name][1],)
    # torch reports ``a + b`` as ``Tensor.add`` (not ``__add__``): both spellings are possible
    if name in _METHOD_OPERATORS:
        return (f"Tensor.{name}", _METHOD_OPERATORS[name])
    return (f"Tensor.{name}",)


def canonical_for_function(func) -> str:
    return canonical_name(function_name(func))


def canonical_for_module_class(cls: type) -> str:
    """Fallback canonical name of a module class that called no traceable function (``nn.LSTM`` -> ``lstm``)."""
    return canonical_name(snake(cls.__name__))


def module_label(cls: type) -> str:
    """``nn.X`` for torch.nn classes, the bare class name otherwise (transformers modules in Ops-6K)."""
    if cls.__module__.startswith("torch.nn"):
        return f"nn.{cls.__name__}"
    return cls.__name__
