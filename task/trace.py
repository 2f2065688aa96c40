"""Recover the operations a task's ``Model.forward`` calls by running it under a ``TorchFunctionMode``.

Recorded are the calls made directly by user code (the ``Model`` and any module class defined outside
``torch.nn``): each ``torch.nn`` module call is one op (label ``nn.X``; its canonical names are the functions
it calls itself), each ``torch`` / ``F`` function, ``Tensor`` method and operator is one op. Calls made inside
a ``torch.nn`` module are attributed to it, never listed on their own. Containers (``nn.Sequential``,
``nn.ModuleList``, ``nn.ModuleDict``) are transparent.

Runs on the ``meta`` device by default: no memory, no compute, shapes only.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import torch
from opforge.task.op_names import (
    NON_COMPUTE,
    canonical_for_function,
    canonical_for_module_class,
    function_name,
    labels_for_function,
    module_label,
)
from opforge.task.source import LoadedTask
from torch.overrides import TorchFunctionMode

_CONTAINERS = (torch.nn.Sequential, torch.nn.ModuleList, torch.nn.ModuleDict)
# Recurrent kernels whose meta implementation unrolls every time step in Python (seconds per call).
_RNN_FUNCS = frozenset({"lstm", "gru", "rnn_tanh", "rnn_relu"})


def _meta_rnn_result(name: str, args: tuple):
    """Outputs of ``torch.lstm/gru/rnn_*`` on meta tensors from shapes alone, or None to run the real op.

    Handles the padded-input form ``(input, hx, params, has_biases, num_layers, dropout, train,
    bidirectional, batch_first)``: output is ``input.shape[:-1] + (D * H_out,)`` (D = 2 if bidirectional),
    hidden states keep the shape of ``hx`` (torch.nn.LSTM / GRU / RNN documentation, "Outputs").
    """
    if len(args) != 9 or not isinstance(args[0], torch.Tensor) or not args[0].is_meta:
        return None
    inp, hx, bidirectional = args[0], args[1], bool(args[7])
    first = hx[0] if isinstance(hx, (list, tuple)) else hx
    out = inp.new_empty((*inp.shape[:-1], first.shape[-1] * (2 if bidirectional else 1)))
    if isinstance(hx, (list, tuple)):
        return (out, *(torch.empty_like(h) for h in hx))
    return out, torch.empty_like(hx)


@dataclass
class TracedOp:
    """One op call made by user code.

    Attributes:
        labels: the Ops-6K spellings this call may be written as (``("F.conv2d", "torch.conv2d")``).
        canonical: canonical operation names (one for a function; a module's own function calls).
        kind: ``module`` or ``function``.
    """

    labels: tuple[str, ...]
    canonical: set[str] = field(default_factory=set)
    kind: str = "function"
    cls: type | None = None


def _is_torch_leaf(mod: torch.nn.Module) -> bool:
    return type(mod).__module__.startswith("torch.nn") and not isinstance(mod, _CONTAINERS)


class _Recorder(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.ops: list[TracedOp] = []
        self.stack: list[TracedOp | None] = []  # None = a user frame

    def push(self, mod):
        if self.stack and self.stack[-1] is not None:  # inside a torch.nn leaf: attribute to it
            self.stack.append(self.stack[-1])
        elif _is_torch_leaf(mod):
            op = TracedOp(labels=(module_label(type(mod)),), kind="module", cls=type(mod))
            self.ops.append(op)
            self.stack.append(op)
        else:
            self.stack.append(None)

    def pop(self):
        if self.stack:
            self.stack.pop()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = function_name(func)
        canonical = canonical_for_function(func)
        if name not in NON_COMPUTE and canonical not in NON_COMPUTE:
            owner = self.stack[-1] if self.stack else None
            if owner is not None:
                owner.canonical.add(canonical)
            else:
                self.ops.append(TracedOp(labels=labels_for_function(func), canonical={canonical}))
        if name in _RNN_FUNCS and not kwargs:
            shortcut = _meta_rnn_result(name, args)
            if shortcut is not None:
                return shortcut
        return func(*args, **kwargs)


def trace_ops(model: torch.nn.Module, inputs: list) -> list[TracedOp]:
    """Run ``model(*inputs)`` once and return the ops user code called, in call order.

    The model and inputs should live on the ``meta`` device (or be small); exceptions raised by the
    forward propagate to the caller.
    """
    rec = _Recorder()
    h1 = torch.nn.modules.module.register_module_forward_pre_hook(lambda m, a: rec.push(m))
    h2 = torch.nn.modules.module.register_module_forward_hook(lambda m, a, o: rec.pop())
    try:
        with torch.no_grad(), warnings.catch_warnings(), rec:
            warnings.simplefilter("ignore")
            model(*inputs)
    finally:
        h1.remove()
        h2.remove()
    for op in rec.ops:
        if op.kind == "module" and not op.canonical:
            op.canonical.add(canonical_for_module_class(op.cls))
    return rec.ops


def trace_task(task: LoadedTask, device: str = "meta") -> list[TracedOp]:
    """Build the task's model and inputs on ``device`` (default ``meta``) and trace one forward.

    Raises whatever building or running the task raises (e.g. ``NotImplementedError`` for an op with no
    meta kernel); callers decide how to treat that.
    """
    with torch.device(device):
        model = task.build()
        inputs = task.inputs()
    model.eval()
    return trace_ops(model, inputs)


def op_signature(ops: list[TracedOp]) -> frozenset[str]:
    """The set of canonical operation names (multiplicity and spelling ignored)."""
    out: set[str] = set()
    for op in ops:
        out |= op.canonical
    return frozenset(out)
