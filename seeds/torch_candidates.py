"""Enumerate candidate seed ops from the installed torch: ``torch.nn`` modules, ``torch.nn.functional``
functions, ``torch.*`` tensor functions and the functions of the public namespaces of ``NAMESPACES`` (none by
default; ``namespace_candidates`` lists ``torch.special.*``), each turned into a probe draft by the argument-name
rules."""

from __future__ import annotations

import inspect
from collections.abc import Iterator

import torch
import torch.nn as nn
import torch.nn.functional as F
from opforge.seeds.arg_rules import FUNCTION_ARGS, MODULE_ARGS, SAME_SHAPE_ARGS, TENSOR_ARGS
from opforge.seeds.probe import auto_input
from opforge.seeds.seed_op import SeedOp, SkipRecord, TensorSpec
from torch.overrides import get_ignored_functions, get_testing_overrides

# Module classes that are containers or abstract bases, not operators.
_NOT_OPS = {
    "Module", "Sequential", "ModuleList", "ModuleDict", "ParameterList", "ParameterDict", "Container",
    "Parameter", "UninitializedParameter", "UninitializedBuffer", "Buffer",
}


def _draft_skip(label, qualname, reason, detail=""):
    return SkipRecord(label=label, qualname=qualname, library="torch", reason=reason, detail=detail)


def _split_params(sig: inspect.Signature, rules: dict) -> tuple[list[str], dict, str | None]:
    """Required tensor args (in order), required non-tensor args with values, first missing rule."""
    tensors, args = [], {}
    for p in sig.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.default is not inspect.Parameter.empty:
            continue
        if p.name in TENSOR_ARGS:
            tensors.append(p.name)
        elif p.name in rules:
            args[p.name] = rules[p.name]
        else:
            return tensors, args, p.name
    return tensors, args, None


def module_candidates(version: str) -> Iterator[SeedOp | SkipRecord]:
    """Drafts for every public ``torch.nn`` module class (losses included, containers excluded)."""
    for name in sorted(dir(nn)):
        cls = getattr(nn, name)
        if not (isinstance(cls, type) and issubclass(cls, nn.Module)) or name in _NOT_OPS or name.startswith("_"):
            continue
        label, qual = f"nn.{name}", f"torch.nn.{name}"
        try:
            init_sig = inspect.signature(cls.__init__)
        except (TypeError, ValueError):
            yield _draft_skip(label, qual, "no_signature")
            continue
        params = list(init_sig.parameters.values())[1:]
        init = {}
        missing = None
        for p in params:
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.default is not inspect.Parameter.empty:
                continue
            if p.name in MODULE_ARGS:
                init[p.name] = MODULE_ARGS[p.name]
            else:
                missing = p.name
                break
        if missing:
            yield _draft_skip(label, qual, f"no_rule:{missing}")
            continue
        try:
            fwd = inspect.signature(cls.forward)
        except (TypeError, ValueError):
            yield _draft_skip(label, qual, "no_signature")
            continue
        n_tensor = sum(1 for p in list(fwd.parameters.values())[1:]
                       if p.default is inspect.Parameter.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD))
        if n_tensor == 0:
            yield _draft_skip(label, qual, "no_tensor_input")
            continue
        inputs = [auto_input()] + [TensorSpec(shape="like:0") for _ in range(n_tensor - 1)]
        yield SeedOp(label=label, qualname=qual, library="torch", library_version=version, kind="module",
                     init_args=init, inputs=inputs)


def _function_draft(label, qual, fn, sig, version) -> SeedOp | SkipRecord:
    tensors, args, missing = _split_params(sig, FUNCTION_ARGS)
    if missing:
        return _draft_skip(label, qual, f"no_rule:{missing}")
    if not tensors:
        return _draft_skip(label, qual, "no_tensor_input")
    inputs = [auto_input()]
    for t in tensors[1:]:
        if t not in SAME_SHAPE_ARGS:
            return _draft_skip(label, qual, f"no_rule:{t}", "tensor argument of unknown shape")
        inputs.append(TensorSpec(shape="like:0"))
    return SeedOp(label=label, qualname=qual, library="torch", library_version=version, kind="function",
                  call_args=args, inputs=inputs)


def functional_candidates(version: str) -> Iterator[SeedOp | SkipRecord]:
    """Drafts for public ``torch.nn.functional`` functions."""
    overrides = get_testing_overrides()
    for name in sorted(dir(F)):
        fn = getattr(F, name)
        if name.startswith("_") or isinstance(fn, type) or not callable(fn) or name.endswith("_"):
            continue
        if getattr(fn, "__module__", "") and not str(getattr(fn, "__module__", "")).startswith(("torch", "None")) \
                and fn not in overrides:
            continue
        label, qual = f"F.{name}", f"torch.nn.functional.{name}"
        try:
            sig = inspect.signature(overrides.get(fn, fn))
        except (TypeError, ValueError):
            yield _draft_skip(label, qual, "no_signature")
            continue
        yield _function_draft(label, qual, fn, sig, version)


def torch_function_candidates(version: str) -> Iterator[SeedOp | SkipRecord]:
    """Drafts for ``torch.*`` functions that torch lists as overridable tensor functions."""
    overrides = get_testing_overrides()
    ignored = get_ignored_functions()
    for name in sorted(dir(torch)):
        if name.startswith("_") or name.endswith("_"):
            continue
        fn = getattr(torch, name, None)
        if fn is None or isinstance(fn, type) or not callable(fn) or fn in ignored or fn not in overrides:
            continue
        label, qual = f"torch.{name}", f"torch.{name}"
        try:
            sig = inspect.signature(overrides[fn])
        except (TypeError, ValueError):
            yield _draft_skip(label, qual, "no_signature")
            continue
        yield _function_draft(label, qual, fn, sig, version)


# Public torch namespaces whose functions the default harvest adds as seed-op candidates besides ``torch.*`` and
# ``F.*``, labelled ``<namespace>.<name>``. None: ``torch.special`` is mostly special functions no model block calls
# (Chebyshev / Hermite / Laguerre polynomials, Bessel functions; several have no gradient), so its functions
# enter a catalog one spec entry at a time (``torch.special.erfcx``: recognised and traced under that label).
# ``torch.linalg`` and ``torch.fft`` are matrix factorisations or complex-valued, not fusion epilogues.
NAMESPACES: tuple[str, ...] = ()


def namespace_candidates(version: str, namespace: str) -> Iterator[SeedOp | SkipRecord]:
    """Drafts for the public functions of ``namespace`` (e.g. ``torch.special``) that torch lists as
    overridable tensor functions; one whose name is also a ``torch.*`` or ``F.*`` function (``expm1``,
    ``softmax``: the same operation) is left to that one."""
    import importlib

    overrides = get_testing_overrides()
    ns = importlib.import_module(namespace)
    for name in sorted(dir(ns)):
        fn = getattr(ns, name, None)
        if name.startswith("_") or fn is None or isinstance(fn, type) or not callable(fn) or fn not in overrides \
                or hasattr(torch, name) or hasattr(F, name):
            continue
        label = qual = f"{namespace}.{name}"
        try:
            sig = inspect.signature(overrides[fn])
        except (TypeError, ValueError):
            yield _draft_skip(label, qual, "no_signature")
            continue
        yield _function_draft(label, qual, fn, sig, version)


def torch_candidates() -> Iterator[SeedOp | SkipRecord]:
    version = torch.__version__.split("+")[0]
    yield from module_candidates(version)
    yield from functional_candidates(version)
    yield from torch_function_candidates(version)
    for ns in NAMESPACES:
        yield from namespace_candidates(version, ns)
