"""Roofline of a KernelBench task: FLOPs and bytes of each op, traced on ``meta``, and the fusion gain.

Ops are the calls user code makes, as ``opforge.task.trace`` records them: each ``torch.nn`` module call is
one op (whatever it calls inside), each ``torch`` / ``F`` function, ``Tensor`` method and operator is one
op. Calls that ``trace`` leaves out of an op signature because they compute nothing (``.to``,
``.contiguous()``, indexing...) are ops here too: a cast or a copy moves data.

Per op, from one forward on the ``meta`` device (no memory, no compute):

* ``flops``: what ``torch.utils.flop_counter.FlopCounterMode`` counts inside the op (matmul, conv,
  attention, ...; element-wise work and reductions count 0, memory-bound by far at these peaks); for
  ``torch.lstm`` / ``gru`` / ``rnn_*``, whose ``meta`` run is shape-only, ``2 x numel`` of every weight matrix
  per time step and batch row.
* ``bytes``: the tensors the op reads that existed before it (its tensor inputs, the parameters and
  buffers it reads) plus the tensors it returns or writes in place, each counted once at its footprint
  (``itemsize x`` the elements its strides reach: a broadcast ``expand`` counts its source once). An op
  whose aten calls are all views or metadata (``view``, ``transpose``, ``detach``, ``.to`` of the same
  dtype...) moves no data and costs 0 bytes. A gather (``embedding``, ``index_select``, ``gather``,
  ``index``) reads at most as much of its source as it returns.
* ``ms = max(flops / peak(dtype), bytes / bandwidth)`` with the peak of the op's dtype (its first floating
  output, else input; ``opforge.task.peaks``).

``per_op_ms`` is the sum of the ops' times (each op a perfect kernel of its own, reading and writing
memory); ``roofline_ms`` the time of one ideal fused kernel: ``max(sum of flops / peak(dtype), fused bytes
/ bandwidth)``, where the fused bytes are the forward's inputs, parameters and buffers read (each at most
once) plus its outputs (an output that is an unchanged input is not written). ``fusion_gain = per_op_ms /
roofline_ms`` is what fusing the task can win at best (1.0 when nothing moves). The peaks default to the
H200 SXM datasheet (``opforge.task.peaks.DEFAULT_PEAKS``).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import torch
from opforge.task.op_names import function_name, labels_for_function, module_label
from opforge.task.peaks import DEFAULT_PEAKS, DevicePeaks
from opforge.task.source import LoadedTask, TaskFormatError, load_task
from opforge.task.trace import _RNN_FUNCS, _is_torch_leaf, _meta_rnn_result
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

# aten gathers: they read at most as much of their source (the first tensor argument) as they return.
_GATHERS = frozenset({"embedding", "index_select", "gather", "index", "take", "take_along_dim", "embedding_bag",
                      "_embedding_bag"})
# aten calls that take a tensor for its shape, dtype and device only: they read none of its data.
_SHAPE_ONLY = frozenset({"empty_like", "zeros_like", "ones_like", "full_like", "rand_like", "randn_like",
                         "randint_like", "new_empty", "new_zeros", "new_ones", "new_full", "new_empty_strided"})


class RooflineError(ValueError):
    """The task could not be measured on ``meta`` (it fails to load, to build or to run there: an op with no
    ``meta`` kernel, data-dependent work such as ``.item()`` or ``nonzero``). The message names the task,
    the stage and the exception."""


@dataclass(frozen=True)
class OpCost:
    """One op's roofline. Units: FLOPs, bytes, ms.

    Attributes:
        label: the op as user code calls it (``nn.Linear``, ``torch.relu``, ``Tensor.view``, ``+``).
        flops / bytes: counted as the module docstring says.
        dtype: the dtype whose peak ``ms`` used.
        ms: ``max(flops / peak(dtype), bytes / bandwidth)``.
    """

    label: str
    flops: float
    bytes: float
    dtype: str
    ms: float


@dataclass(frozen=True)
class Roofline:
    """A task's roofline (module docstring). Units: FLOPs, bytes, ms.

    Attributes:
        flops: total FLOPs of one forward.
        bytes: bytes one ideal fused kernel moves (inputs, parameters and buffers read, outputs written).
        ops: per-op costs, in call order (calls that return no tensor and move nothing are left out).
        compute_ms: ``sum(flops / peak(dtype))``; ``memory_ms``: ``bytes / bandwidth``.
        per_op_ms: the sum of ``ops[i].ms``.
        roofline_ms: ``max(compute_ms, memory_ms)``, one ideal fused kernel.
        fusion_gain: ``per_op_ms / roofline_ms`` (1.0 when ``roofline_ms`` is 0).
        peaks: short name of the device peaks used (``h200``).
    """

    flops: float
    bytes: float
    ops: tuple[OpCost, ...]
    compute_ms: float
    memory_ms: float
    per_op_ms: float
    roofline_ms: float
    fusion_gain: float
    peaks: str

    @property
    def bound(self) -> str:
        """``compute`` or ``memory``: which term sets ``roofline_ms``."""
        return "compute" if self.compute_ms > self.memory_ms else "memory"

    def as_metrics(self, max_ops: int = 32) -> dict[str, Any]:
        """JSON-ready dict: the totals, ``bound``, ``op_count`` and at most ``max_ops`` ops as
        ``{"op", "flops", "bytes", "ms"}`` (the costliest first)."""
        top = sorted(self.ops, key=lambda o: -o.ms)[:max_ops]
        return {"flops": self.flops, "bytes": self.bytes, "compute_ms": _round(self.compute_ms),
                "memory_ms": _round(self.memory_ms), "per_op_ms": _round(self.per_op_ms),
                "roofline_ms": _round(self.roofline_ms), "fusion_gain": round(self.fusion_gain, 4),
                "bound": self.bound, "peaks": self.peaks, "op_count": len(self.ops),
                "ops": [{"op": o.label, "flops": o.flops, "bytes": o.bytes, "ms": _round(o.ms)} for o in top]}


def _round(ms: float) -> float:
    return float(f"{ms:.6g}")


def footprint(t: torch.Tensor) -> int:
    """Bytes of the distinct elements ``t``'s strides reach: ``itemsize x`` the product of its sizes over the
    dims with a non-zero stride (0 for an empty tensor)."""
    if t.numel() == 0:
        return 0
    n = 1
    for size, stride in zip(t.shape, t.stride(), strict=True):
        if stride != 0:
            n *= size
    return n * t.element_size()


def _float_dtype(tensors) -> str | None:
    for t in tensors:
        if t.is_floating_point() or t.is_complex():
            return str(t.dtype).removeprefix("torch.")
    return None


class _Op:
    """Bookkeeping of one op while it runs."""

    def __init__(self, index: int, label: str):
        self.index, self.label = index, label
        self.flops_start = 0.0
        self.flops = 0.0
        self.moved = False
        self.reads: dict[int, tuple[torch.Tensor, int]] = {}  # id -> (tensor, bytes read)
        self.writes: dict[int, torch.Tensor] = {}
        self.inputs: list[torch.Tensor] = []
        self.outputs: list[torch.Tensor] = []


class _State:
    """What the function mode and the dispatch mode share: the op running now and the tensor graph."""

    def __init__(self):
        self.ops: list[_Op] = []
        self.current: _Op | None = None
        self.producer: dict[int, int] = {}  # tensor id -> index of the op whose aten call made it
        self.base: dict[int, torch.Tensor] = {}  # view id -> the tensor it views
        self.mutated: set[int] = set()  # ids of tensors that existed before an op which wrote them in place
        self.keep: list[torch.Tensor] = []  # every tensor seen, so no id is reused while measuring

    def note(self, t: torch.Tensor) -> None:
        self.keep.append(t)

    def internal_root(self, t: torch.Tensor, op: _Op) -> tuple[torch.Tensor, bool]:
        """Follow views made inside ``op`` back to a tensor ``op`` did not make (True) or to one it made by
        computing (False)."""
        while self.producer.get(id(t)) == op.index:
            if id(t) not in self.base:
                return t, False
            t = self.base[id(t)]
        return t, True

    def root(self, t: torch.Tensor) -> torch.Tensor:
        """The tensor ``t`` is a view of, through every view (itself when it is none)."""
        while id(t) in self.base:
            t = self.base[id(t)]
        return t


class _BytesMode(TorchDispatchMode):
    """Records, for each aten call, what the running op reads, makes and writes."""

    def __init__(self, state: _State):
        super().__init__()
        self.state = state

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        st, op = self.state, self.state.current
        ins = [a for a in tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        outs = [o for o in tree_leaves(out) if isinstance(o, torch.Tensor)]
        for t in (*ins, *outs):
            st.note(t)
        if op is None:  # outside any op (the forward's own plumbing): nothing to attribute
            return out
        moves = not (func.is_view or torch.Tag.inplace_view in func.tags) and bool(outs)
        for o in outs:
            if id(o) not in st.producer and not any(o is i for i in ins):
                st.producer[id(o)] = op.index
                if func.is_view and ins:
                    st.base[id(o)] = ins[0]
        if not moves:
            return out
        op.moved = True
        packet = func.overloadpacket.__name__
        out_bytes = sum(footprint(o) for o in outs)
        for pos, t in enumerate([] if packet in _SHAPE_ONLY else ins):
            self._read(op, t, min(footprint(t), out_bytes) if pos == 0 and packet in _GATHERS else footprint(t))
        schema = func._schema
        for arg, value in zip(schema.arguments, args, strict=False):
            if arg.alias_info is not None and arg.alias_info.is_write and isinstance(value, torch.Tensor):
                r, external = st.internal_root(value, op)
                if external:
                    op.writes[id(r)] = value
                    st.mutated.add(id(st.root(r)))
        for name, value in kwargs.items():  # out= arguments
            arg = next((a for a in schema.arguments if a.name == name), None)
            if arg is not None and arg.alias_info is not None and arg.alias_info.is_write \
                    and isinstance(value, torch.Tensor):
                r, external = st.internal_root(value, op)
                if external:
                    op.writes[id(r)] = value
        return out

    def _read(self, op: _Op, t: torch.Tensor, nbytes: int) -> None:
        r, external = self.state.internal_root(t, op)
        if not external:
            return
        if r is not t:  # a view made inside the op of a tensor from outside: the whole of that tensor
            nbytes = footprint(r)
        prev = op.reads.get(id(r))
        op.reads[id(r)] = (r, max(nbytes, prev[1] if prev else 0))


class _OpMode(TorchFunctionMode):
    """Delimits the ops user code calls (``trace``'s rule) and counts each one's FLOPs."""

    def __init__(self, state: _State, counter):
        super().__init__()
        self.state, self.counter = state, counter
        self.stack: list[_Op | None] = []  # None = a user frame

    def _begin(self, label: str) -> _Op:
        op = _Op(len(self.state.ops), label)
        op.flops_start = self.counter.get_total_flops()
        self.state.ops.append(op)
        self.state.current = op
        return op

    def _end(self, op: _Op, out: Any) -> None:
        op.flops += self.counter.get_total_flops() - op.flops_start
        op.outputs = [o for o in tree_leaves(out) if isinstance(o, torch.Tensor)]
        for o in op.outputs:
            self.state.note(o)
        self.state.current = None

    # module calls (global forward hooks)
    def push(self, mod: torch.nn.Module) -> None:
        if self.stack and self.stack[-1] is not None:
            self.stack.append(self.stack[-1])
        elif _is_torch_leaf(mod):
            self.stack.append(self._begin(module_label(type(mod))))
        else:
            self.stack.append(None)

    def pop(self, out: Any) -> None:
        if not self.stack:
            return
        frame = self.stack.pop()
        if frame is not None and (not self.stack or self.stack[-1] is not frame):
            self._end(frame, out)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        owner = self.stack[-1] if self.stack else None
        op = None if owner is not None else self._begin(labels_for_function(func)[0])
        current = owner or op
        out = None
        if function_name(func) in _RNN_FUNCS and not kwargs:
            out = _meta_rnn_result(function_name(func), args)
            if out is not None:
                self._rnn(current, args)
        if out is None:
            out = func(*args, **kwargs)
        if op is not None:
            self._end(op, out)
        return out

    def _rnn(self, op: _Op, args: tuple) -> None:
        """Reads and FLOPs of a shape-only recurrent call (``_meta_rnn_result``): input, states and weights
        read, ``2 x numel(W)`` FLOPs per weight matrix, time step and batch row."""
        inp, hx, params = args[0], args[1], args[2]
        tensors = [inp, *(hx if isinstance(hx, (list, tuple)) else [hx]), *params]
        op.moved = True
        for t in tensors:
            if isinstance(t, torch.Tensor):
                self.state.note(t)
                op.reads[id(t)] = (t, footprint(t))
        rows = inp.numel() // max(1, inp.shape[-1])
        op.flops += 2.0 * rows * sum(w.numel() for w in params if isinstance(w, torch.Tensor) and w.dim() == 2)


def _op_cost(state: _State, op: _Op, peaks: DevicePeaks) -> OpCost:
    dtype = _float_dtype(op.outputs) or _float_dtype(t for t, _ in op.reads.values()) or "float32"
    nbytes = 0
    if op.moved:
        nbytes = sum(b for _, b in op.reads.values())
        written = dict(op.writes)
        for o in op.outputs:
            r, external = state.internal_root(o, op)
            if not external:
                written.setdefault(id(o), o)
        nbytes += sum(footprint(t) for t in written.values())
    ms = 1e3 * max(op.flops / peaks.peak_for(dtype), nbytes / peaks.bandwidth)
    return OpCost(op.label, float(op.flops), float(nbytes), dtype, ms)


def _fused_bytes(state: _State, outputs: list[torch.Tensor]) -> int:
    """Forward inputs, parameters and buffers read (per tensor at most its own footprint) plus outputs."""
    per_root: dict[int, list] = {}
    for op in state.ops:
        if not op.moved:
            continue
        for t, nbytes in op.reads.values():
            r = state.root(t)
            if id(r) in state.producer:
                continue  # made by an earlier op: stays inside the fused kernel
            entry = per_root.setdefault(id(r), [r, {}])
            entry[1][id(t)] = max(nbytes, entry[1].get(id(t), 0))
    read = sum(min(footprint(r), sum(views.values())) for r, views in per_root.values())
    written, seen = 0, set()
    for o in outputs:
        if id(o) in seen:
            continue
        seen.add(id(o))
        r = state.root(o)
        if id(r) not in state.producer and id(r) not in state.mutated:
            continue  # an input (or a view of one) handed back unchanged
        written += footprint(o)
    return read + written


def measure(model: Any, inputs: list[Any], peaks: DevicePeaks = DEFAULT_PEAKS) -> Roofline:
    """Roofline of one forward ``model(*inputs)`` (module docstring), run under ``no_grad``.

    The model and inputs should live on ``meta``. Exceptions raised by the forward propagate.
    """
    from torch.utils.flop_counter import FlopCounterMode

    state = _State()
    counter = FlopCounterMode(display=False)
    mode = _OpMode(state, counter)
    h1 = torch.nn.modules.module.register_module_forward_pre_hook(lambda m, a: mode.push(m))
    h2 = torch.nn.modules.module.register_module_forward_hook(lambda m, a, o: mode.pop(o))
    try:
        with torch.no_grad(), warnings.catch_warnings(), counter, _BytesMode(state), mode:
            warnings.simplefilter("ignore")
            out = model(*inputs)
    finally:
        h1.remove()
        h2.remove()
    outputs = [o for o in tree_leaves(out) if isinstance(o, torch.Tensor)]
    costs = [_op_cost(state, op, peaks) for op in state.ops]
    costs = [c for c, op in zip(costs, state.ops, strict=True) if op.moved or op.outputs or c.flops]
    flops = sum(c.flops for c in costs)
    compute_ms = 1e3 * sum(c.flops / peaks.peak_for(c.dtype) for c in costs)
    fused = _fused_bytes(state, outputs)
    memory_ms = 1e3 * fused / peaks.bandwidth
    per_op = sum(c.ms for c in costs)
    fused_ms = max(compute_ms, memory_ms)
    gain = per_op / fused_ms if fused_ms > 0 else 1.0
    if not math.isfinite(gain):
        gain = 1.0
    return Roofline(float(flops), float(fused), tuple(costs), compute_ms, memory_ms, per_op, fused_ms, gain,
                    peaks.name)


def roofline(task: str | LoadedTask, peaks: DevicePeaks = DEFAULT_PEAKS, name: str = "<task>") -> Roofline:
    """Roofline of a KernelBench-format task (source or ``LoadedTask``) on ``peaks`` (default H200 SXM),
    traced on ``meta`` (module docstring). Shapes, dtypes and the model's parameters come from the task's
    own ``get_init_inputs()`` / ``get_inputs()``; no memory is allocated for them.

    Raises:
        RooflineError: the source does not load, or building the model, drawing the inputs or running the
            forward fails on ``meta`` (message: task name, stage, exception type and text).
    """
    if isinstance(task, LoadedTask):
        loaded = task
    else:
        try:
            loaded = load_task(task, name)
        except TaskFormatError as exc:
            raise RooflineError(str(exc)) from exc
    stage = "build"
    try:
        with torch.device("meta"):
            model = loaded.build()
            stage = "get_inputs"
            inputs = loaded.inputs()
        if isinstance(model, torch.nn.Module):
            model.eval()
        stage = "forward"
        with torch.device("meta"):  # tensors the forward makes itself land on meta too
            return measure(model, inputs, peaks)
    except Exception as exc:  # noqa: BLE001 - any failure of the task on meta is reported as one error type
        raise RooflineError(f"{loaded.name}: {stage} on meta failed: {type(exc).__name__}: "
                            f"{str(exc)[:300]}") from exc
