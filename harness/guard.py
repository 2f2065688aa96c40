"""The compute ban at run time, inside the candidate's server process (``harness.candidate_process``).

What may run (the same lists as RULES.md and as the extension's symbol audit, ``harness.symbols``):

* ``ALLOWED_ATEN``: allocation, metadata / views, copies, dtype conversions, concatenation and fills -
  no aten op that computes a result from tensor values other than moving or converting them. Composite
  layout helpers (``.to()``, ``.float()``, ``.flatten()``, ``.view_as()``, ``.T``, ``expand_as``,
  ``unflatten``, ``movedim``, ``type_as``, ``contiguous``, ``reshape_as``...) reach the dispatcher as these
  ops, so an honest solution's layout code passes.
* while ``model_new.py`` is imported and ``ModelNew`` is built (``GuardState.construct``): every aten op. A
  constructor copied from the reference computes (``nn.Parameter(torch.randn(c, k) * 0.2)``, a rotary table
  from ``torch.arange(...).float() / d``, ``torch.nn.init``), and nothing it computes can depend on an input or
  a reference weight: inputs come later, fresh per call, and the reference weights are loaded afterwards under
  the forward rules, so a value derived at construction from the module's own initial weights is stale.
* ops of the extension's own namespaces (``torch.ops.<ns>.*``).

``DispatchGuard`` is a ``TorchDispatchMode`` entered for the candidate's whole life (import, construction,
weight loading, every call) in the main thread and, through ``guard_all_threads``, in every thread started
from Python afterwards (``threading``, ``_thread``); the intra-op and inter-op pools of ATen carry the mode
over with the caller's thread-local state. A violation is recorded and raised as ``GuardViolation`` (a
``BaseException``: a candidate's ``except Exception`` does not swallow it; the record stays either way).

This process runs candidate code, so nothing here decides a verdict: the findings are reported to the
grader as hints, next to the checks the grader makes itself (outputs, inputs, time, static audits).
``config_state`` / ``pin_config`` hold the runtime settings that change precision or speed (threads,
TF32, matmul precision, cuDNN flags, deterministic algorithms), pinned before the candidate's code is
imported and compared after each call.
"""

from __future__ import annotations

import _thread
import threading
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

ALLOWED_ATEN = frozenset({
    # allocation and fills
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros", "zeros_like",
    "new_zeros", "ones", "ones_like", "new_ones", "full", "full_like", "new_full", "zero_", "fill_",
    "resize_", "lift_fresh", "lift_fresh_copy", "scalar_tensor",
    # metadata and views
    "view", "_unsafe_view", "_reshape_alias", "reshape", "as_strided", "expand", "t", "transpose",
    "permute", "squeeze", "unsqueeze", "slice", "select", "narrow", "unbind", "split", "split_with_sizes",
    "chunk", "unfold", "diagonal", "detach", "alias", "view_as_real", "view_as_complex", "unsafe_split",
    "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "is_same_size", "record_stream",
    "_has_compatible_shallow_copy_type", "result_type", "_local_scalar_dense",
    # copies and conversions
    "clone", "copy_", "_to_copy", "contiguous", "resolve_conj", "resolve_neg", "cat", "stack",
    # composite layout helpers (the profiler and C++ callers see these names; their parts are above)
    "to", "flatten", "unflatten", "view_as", "reshape_as", "expand_as", "type_as", "numpy_T", "matrix_H",
    "mT", "mH", "movedim", "moveaxis", "swapaxes", "swapdims", "squeeze_", "unsqueeze_", "t_", "transpose_",
    "float", "double", "half", "bfloat16", "int", "long", "short", "bool", "char", "byte",
})


class GuardViolation(BaseException):  # noqa: N818 - a violation, not an error of the harness
    """A torch op outside the allow-list ran in the candidate's process."""


class GuardState:
    """What every thread's guard shares: the phase and the record.

    Attributes:
        namespaces: op namespaces of the candidate's extension that may run.
        construct: True while model_new.py is imported and ModelNew is built (every aten op allowed).
        violations: ``ns.op`` names seen that were not allowed, in order, de-duplicated.
    """

    def __init__(self, namespaces: tuple[str, ...] = ("opforge_kernels",)):
        self.namespaces = frozenset(namespaces)
        self.construct = True
        self.violations: list[str] = []

    def allowed(self, ns: str, name: str) -> bool:
        if ns in self.namespaces:
            return True
        if ns != "aten":
            return False
        return self.construct or name in ALLOWED_ATEN


class DispatchGuard(TorchDispatchMode):
    """The allow-list at the dispatcher for one thread (see the module docstring)."""

    def __init__(self, state: GuardState):
        super().__init__()
        self.state = state

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        ns = getattr(func, "namespace", "")
        name = func._schema.name.split("::")[-1] if hasattr(func, "_schema") else str(func)
        if not self.state.allowed(ns, name):
            op = f"{ns}.{name}"
            if op not in self.state.violations:
                self.state.violations.append(op)
            raise GuardViolation(f"torch op {op} ran in the candidate's process")
        return func(*args, **(kwargs or {}))


# ``TorchDispatchMode`` wraps each subclass's ``__torch_dispatch__`` in ``torch._disable_dynamo``, which imports
# ``torch._dynamo`` (sympy and the rest: about 5 s of one core, measured on an H200 machine, 2026-11-29) at the
# guard's first op, in every candidate's process. Nothing there runs ``torch.compile`` (``harness.policy`` denies it
# and ``torch._*``), so the wrapper is told that the method itself is its dynamo-disabled form and never imports.
_RAW_DISPATCH = getattr(DispatchGuard.__torch_dispatch__, "__wrapped__", None)
if _RAW_DISPATCH is not None:
    setattr(_RAW_DISPATCH, "__dynamo_disable", _RAW_DISPATCH)  # noqa: B010 - the name torch's wrapper reads


def guard_all_threads(state: GuardState) -> DispatchGuard:
    """Enter a ``DispatchGuard`` in this thread for the rest of the process's life, and in every thread
    started from Python from now on (``_thread.start_new_thread``, which ``threading`` uses too)."""
    start = _thread.start_new_thread

    def guarded_start(function, args, kwargs=None):
        def run(*a, **k):
            with DispatchGuard(state):
                return function(*a, **k)

        return start(run, args, kwargs or {})

    _thread.start_new_thread = guarded_start
    threading._start_new_thread = guarded_start
    mode = DispatchGuard(state)
    mode.__enter__()
    return mode


def config_state() -> dict[str, Any]:
    """Runtime settings that change the precision or the speed of torch math in this process."""
    m = torch.backends.cuda.matmul
    cudnn = torch.backends.cudnn
    return {"threads": torch.get_num_threads(), "interop_threads": torch.get_num_interop_threads(),
            "matmul_tf32": bool(m.allow_tf32), "cudnn_tf32": bool(cudnn.allow_tf32),
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "fp16_reduced": bool(m.allow_fp16_reduced_precision_reduction),
            "bf16_reduced": bool(m.allow_bf16_reduced_precision_reduction),
            "cudnn_enabled": bool(cudnn.enabled), "cudnn_benchmark": bool(cudnn.benchmark),
            "cudnn_deterministic": bool(cudnn.deterministic),
            "deterministic": torch.are_deterministic_algorithms_enabled(),
            "default_dtype": str(torch.get_default_dtype()), "grad_enabled": torch.is_grad_enabled()}


def pin_config(threads: int, allow_tf32: bool = False) -> dict[str, Any]:
    """Pin this process's settings: ``threads`` intra-op threads (one inter-op thread), TF32 off unless
    ``allow_tf32`` (full float32 otherwise), cuDNN on without autotuning, denormals kept (not flushed),
    float32 default dtype. Returns ``config_state()``; the grader pins both servers the same way."""
    torch.set_num_threads(max(1, int(threads)))
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass  # already set (only possible before the first parallel work)
    torch.backends.cuda.matmul.allow_tf32 = allow_tf32
    torch.backends.cudnn.allow_tf32 = allow_tf32
    torch.set_float32_matmul_precision("high" if allow_tf32 else "highest")
    torch.backends.cudnn.enabled = True
    torch.backends.cudnn.benchmark = False
    torch.set_flush_denormal(False)
    torch.set_default_dtype(torch.float32)
    return config_state()


def _span(t: torch.Tensor) -> tuple[str, int, int]:
    s = t.untyped_storage()
    return (str(t.device), s.data_ptr(), s.data_ptr() + s.nbytes())


def aliases(outputs: list[torch.Tensor], others: dict[str, torch.Tensor]) -> list[str]:
    """Names in ``others`` (inputs, parameters, buffers) whose storage overlaps any output's storage."""
    found = []
    spans = [_span(o) for o in outputs if o.numel() > 0]
    for name, t in others.items():
        if not isinstance(t, torch.Tensor) or t.numel() == 0:
            continue
        dev, lo, hi = _span(t)
        if any(d == dev and a < hi and lo < b for d, a, b in spans):
            found.append(name)
    return found
