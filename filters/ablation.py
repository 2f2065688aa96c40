"""Op ablation on a task's own code: a ``torch.fx`` trace of ``Model.forward``, run with ops taken out.

``trace_task`` traces the built model (``torch.fx.Tracer``; ``torch.nn`` modules stay whole, as
``call_module`` nodes) and runs the graph once on the task's inputs (``TracedTask.record``), recording per
node what it returned (shape, dtype, strides, device). From that, ``removals`` lists what can be taken out, each a
``Removal`` that the graph is run with (``TracedTask.run``, a ``torch.fx.Interpreter``):

* ``bypass``: one op's output is replaced by one of its tensor inputs of the same shape and dtype (the op
  is skipped): ``relu`` after ``relu``, ``clamp(0, 1)`` after a sigmoid, a pad by zero, ``tile`` by ones,
  ``BatchNorm`` in eval with default running statistics.
* ``layout_run``: a run of two to ``MAX_LAYOUT_RUN`` adjacent shape / layout ops (``LAYOUT_OPS``: each one
  the only user of the one before) whose last output has the shape and dtype of the first one's input is
  skipped as a whole: a transpose and the transpose that undoes it, ``unsqueeze`` then ``squeeze``, a
  reshape and its inverse.
* ``knockout``: an op no bypass fits (its shape or dtype differs from all its inputs) has its
  floating-point output(s) replaced by seeded noise of unit scale or more (``randn * (rms + 1)``): when the
  task's outputs do not change, they do not depend on the op's values (``topk -> zeros_like``).

An op here is a ``call_function`` / ``call_method`` / ``call_module`` node that returns a tensor or a
tuple / list of tensors; indexing into a tuple, ``getattr`` on a non-tensor and calls that return no tensor
(``size``, ``dim``) are plumbing. Ops named in ``exempt`` (default none) are not bypassed or knocked out
alone; they may be part of a layout run.

Copies (``COPY_OPS``: ``clone``, ``detach``, ``contiguous``, ``.to`` / ``.type`` / ``.float()``...) are
bypassed (``how`` = ``copy``) only when they are *pure*: the result has the shape, dtype, device and strides of
the tensor copied (``clone``, ``detach``, ``.contiguous()`` of a contiguous tensor, ``.to`` of the same dtype
and device, ``.float()`` on float32). Such a copy is a no-op a kernel skips, so a task that makes one is
rejected whatever else it computes: the copy is the no-op it names (``copy_`` into a fresh tensor is caught by
the plain bypass). A copy that changes the strides (``.contiguous()`` after a transpose,
``.to(memory_format=...)``) lays the data out anew: it is not taken out alone, only in a layout run.

Numerical-safety constants are part of the computation: an ``add`` / ``sub`` of a constant of magnitude at
most ``max_eps`` (a Python number, or a one-element tensor attribute), or a ``clamp`` / ``clamp_min`` whose
lower bound is such a constant (``clamp(p, 1e-7, 1 - 1e-7)``), whose result reaches ``rsqrt``, ``sqrt``, a ``log``, ``reciprocal``, the
divisor of a division or a fractional / negative ``pow`` (through shape and cast ops) is never bypassed
(``safety_constant``): ``x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)`` keeps its ``+ 1e-6``,
although taking it out changes the output by far less than the tolerance. An ``eps=`` argument of a call is
never removed on its own (ablation removes whole calls).

Labels: each op is described by ``{"op", "node", "line"}``: ``op`` as the task calls it (``torch.tile``,
``F.relu``, ``Tensor.transpose``, ``BatchNorm3d`` for modules, ``+`` for operators), ``node`` the fx node's
name, ``line`` the task's source line the op was traced from (None when not found).

Input mutation: when the graph holds in-place ops (a method or function whose name ends in ``_``, an
``inplace=True`` argument or module), a removal could let one write into a tensor it did not write before,
so those runs get a clone of the inputs, and bypasses that hand a parameter / buffer (``get_attr``) on are
not tried.
"""

from __future__ import annotations

import operator
import sys
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
from torch.fx import Interpreter, Node

# Shape / layout ops (method, function or lower-cased module name) that may be taken out as a run.
LAYOUT_OPS = frozenset({
    "transpose", "permute", "t", "T", "mT", "view", "reshape", "flatten", "unflatten", "squeeze", "unsqueeze",
    "movedim", "moveaxis", "swapaxes", "swapdims", "view_as", "reshape_as", "contiguous", "to", "type", "float",
    "double", "half", "bfloat16", "clone",
})
# Ops not taken out alone by default (see the module docstring); a threshold of the ``trivial`` filter.
DEFAULT_EXEMPT: tuple[str, ...] = ()
# Calls that copy or re-label a tensor: taken out alone only as a pure copy (module docstring).
COPY_OPS = frozenset({"clone", "detach", "contiguous", "to", "type", "type_as", "float", "double", "half",
                      "bfloat16", "cpu", "cuda"})
# Numerical safety (module docstring): ops that add / floor a constant, the ops it protects, the ops between.
SAFETY_OPS = frozenset({"add", "add_", "sub", "sub_", "clamp", "clamp_", "clamp_min", "clamp_min_", "clip",
                        "clip_"})
GUARDED_OPS = frozenset({"rsqrt", "rsqrt_", "sqrt", "sqrt_", "log", "log_", "log2", "log2_", "log10", "log10_",
                         "reciprocal", "reciprocal_"})
DIVISIONS = frozenset({"truediv", "div", "div_", "true_divide", "divide", "floordiv", "floor_divide", "remainder"})
MAX_EPS = 1e-3
_PASS_THROUGH = LAYOUT_OPS | {"expand", "expand_as", "broadcast_to", "unsqueeze", "squeeze", "abs"}
MAX_LAYOUT_RUN = 4
KNOCKOUT_SEED = 4
_OPERATORS = {operator.add: "+", operator.sub: "-", operator.mul: "*", operator.truediv: "/",
              operator.floordiv: "//", operator.mod: "%", operator.pow: "**", operator.matmul: "@",
              operator.neg: "-x", operator.getitem: "[]", operator.and_: "&", operator.or_: "|",
              operator.xor: "^", operator.invert: "~", operator.lt: "<", operator.le: "<=", operator.gt: ">",
              operator.ge: ">=", operator.eq: "==", operator.ne: "!="}
_NAMESPACES = (("torch", torch), ("F", torch.nn.functional), ("torch.special", torch.special),
               ("torch.fft", torch.fft), ("torch.linalg", torch.linalg))


class TraceFailure(Exception):
    """The task's forward could not be traced or its graph does not reproduce the eager outputs."""


@dataclass
class NodeInfo:
    """What a node returned in the recorded run: ``kind`` "tensor" (``shape``, ``dtype``), "tensors" (a
    tuple / list with tensors; ``floating`` True when one of them is floating point) or "other"."""

    kind: str
    shape: tuple[int, ...] | None = None
    dtype: torch.dtype | None = None
    floating: bool = False
    plumbing: bool = False
    stride: tuple[int, ...] | None = None
    device: str | None = None


@dataclass
class Removal:
    """Nodes taken out together. ``bypass`` maps each skipped node to the node whose value it passes on;
    ``knockout`` holds nodes whose floating outputs become noise. ``how``: bypass / copy / layout_run /
    knockout."""

    how: str
    bypass: dict[Node, Node] = field(default_factory=dict)
    knockout: tuple[Node, ...] = ()

    def nodes(self) -> list[Node]:
        return [*self.bypass, *self.knockout]


def op_name(gm: torch.fx.GraphModule, n: Node) -> str:
    """Short name of the call: method name, function ``__name__`` (the attribute for ``getattr``), or the
    module's class name in lower case."""
    if n.op == "call_method":
        return str(n.target)
    if n.op == "call_module":
        return type(gm.get_submodule(str(n.target))).__name__.lower()
    if n.target is getattr and len(n.args) > 1:
        return str(n.args[1])
    return getattr(n.target, "__name__", str(n.target))


def op_label(gm: torch.fx.GraphModule, n: Node) -> str:
    """The call as a task writes it: ``torch.tile``, ``F.relu``, ``Tensor.transpose``, ``+``, or the
    module's class name (``BatchNorm3d``)."""
    if n.op == "call_method":
        return f"Tensor.{n.target}"
    if n.op == "call_module":
        return type(gm.get_submodule(str(n.target))).__name__
    fn = n.target
    if fn in _OPERATORS:
        return _OPERATORS[fn]
    if fn is getattr and len(n.args) > 1:
        return f"Tensor.{n.args[1]}"
    name = getattr(fn, "__name__", str(fn))
    for prefix, ns in _NAMESPACES:
        if getattr(ns, name, None) is fn:
            return f"{prefix}.{name}"
    return f"{getattr(fn, '__module__', None) or 'torch'}.{name}"


def _info(value: Any) -> NodeInfo:
    if isinstance(value, torch.Tensor):
        return NodeInfo("tensor", tuple(value.shape), value.dtype, value.is_floating_point() or value.is_complex(),
                        stride=tuple(value.stride()), device=str(value.device))
    if isinstance(value, (tuple, list)) and any(isinstance(v, torch.Tensor) for v in value):
        return NodeInfo("tensors", floating=any(isinstance(v, torch.Tensor) and v.is_floating_point()
                                                for v in value))
    return NodeInfo("other")


def _noise_like(value: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Seeded normal noise of ``value``'s shape and dtype, scaled by ``rms(value) + 1``."""
    v = value.detach()
    scale = v.abs().float().pow(2).mean().sqrt() + 1.0 if v.numel() else 1.0
    noise = torch.randn(v.shape, generator=gen, device=v.device, dtype=v.dtype)
    return noise * scale.to(v.dtype) if isinstance(scale, torch.Tensor) else noise


class _Runner(Interpreter):
    """Interpreter that applies a ``Removal`` and, with ``record``, keeps each node's ``NodeInfo``; with
    ``timed`` (CUDA), records an event pair around each of those nodes."""

    def __init__(self, gm, removal: Removal | None = None, record: dict | None = None,
                 timed: set[Node] | None = None, events: dict | None = None):
        super().__init__(gm, garbage_collect_values=True)
        self.removal = removal or Removal("none")
        self.record, self.timed, self.events = record, timed or set(), events
        self.gen: torch.Generator | None = None

    def run_node(self, n: Node) -> Any:
        if n in self.removal.bypass:
            return self.env[self.removal.bypass[n]]
        if n in self.timed:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = super().run_node(n)
            end.record()
            self.events.setdefault(n, []).append((start, end))
        else:
            out = super().run_node(n)
        if self.record is not None:
            self.record[n] = _info(out)
            if n.op in ("call_function", "call_method") and n.target in (operator.getitem, getattr) and n.args:
                first = n.args[0]
                self.record[n].plumbing = not (isinstance(first, Node)
                                               and isinstance(self.env.get(first), torch.Tensor))
        if n in self.removal.knockout:
            out = self._knock(out)
        return out

    def _knock(self, out: Any) -> Any:
        if self.gen is None:
            device = out.device if isinstance(out, torch.Tensor) else next(
                v.device for v in out if isinstance(v, torch.Tensor))
            self.gen = torch.Generator(device=device)
            self.gen.manual_seed(KNOCKOUT_SEED)
        if isinstance(out, torch.Tensor):
            return _noise_like(out, self.gen) if out.is_floating_point() else out
        replaced = [_noise_like(v, self.gen) if isinstance(v, torch.Tensor) and v.is_floating_point() else v
                    for v in out]
        return type(out)(*replaced) if hasattr(out, "_fields") else type(out)(replaced)


def _is_inplace(gm, n: Node) -> bool:
    if n.op == "call_module":
        return bool(getattr(gm.get_submodule(str(n.target)), "inplace", False))
    if n.op not in ("call_function", "call_method"):
        return False
    name = op_name(gm, n)
    return (name.endswith("_") and not name.startswith("_")) or n.kwargs.get("inplace") is True


class TracedTask:
    """A task's forward as an fx graph, with the task's source for labels.

    Attributes:
        gm: the ``GraphModule`` (shares the model's parameters and submodules).
        info: node -> ``NodeInfo`` of the recorded run (filled by ``record``).
        ops: the op nodes (see the module docstring), in graph order.
        inplace: the graph holds in-place ops.
    """

    def __init__(self, gm: torch.fx.GraphModule, code: str = "", filename: str = "<task>"):
        self.gm, self.code, self.filename = gm, code, filename
        self.info: dict[Node, NodeInfo] = {}
        self.ops: list[Node] = []
        self.inplace = any(_is_inplace(gm, n) for n in gm.graph.nodes)

    def run(self, inputs: list[Any], removal: Removal | None = None, timed: set[Node] | None = None,
            events: dict | None = None) -> Any:
        """The graph's output for ``inputs`` with ``removal`` applied (inputs cloned when the graph
        mutates in place), under ``no_grad``."""
        if self.inplace and removal is not None:
            inputs = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
        with torch.no_grad():
            return _Runner(self.gm, removal, timed=timed, events=events).run(*inputs)

    def record(self, inputs: list[Any]) -> Any:
        """Run the graph unchanged, record every node's ``NodeInfo`` and the op nodes; returns the output."""
        record: dict[Node, NodeInfo] = {}
        with torch.no_grad():
            out = _Runner(self.gm, record=record).run(*inputs)
        self.info = record
        self.ops = [n for n in self.gm.graph.nodes
                    if n.op in ("call_function", "call_method", "call_module") and n in record
                    and record[n].kind in ("tensor", "tensors") and not record[n].plumbing]
        return out

    def describe(self, n: Node) -> dict[str, Any]:
        """``{"op", "node", "line"}`` of one node (module docstring)."""
        return {"op": op_label(self.gm, n), "node": n.name, "line": self._line(n)}

    def _line(self, n: Node) -> str | None:
        line, lines = n.meta.get("task_line"), self.code.splitlines()
        return lines[line - 1].strip()[:160] if line and 0 < line <= len(lines) else None

    def removals(self, exempt: tuple[str, ...] | list[str] = DEFAULT_EXEMPT, limit: int | None = None,
                 max_eps: float = MAX_EPS) -> list[Removal]:
        """Candidate removals (module docstring): bypasses (pure copies among them) in graph order, then
        layout runs, then knockouts; at most ``limit``. Numerical-safety constants of magnitude at most
        ``max_eps`` are kept."""
        exempt = set(exempt)
        single, runs, knock = [], [], []
        for n in self.ops:
            name = op_name(self.gm, n)
            if name in exempt or self.safety_constant(n, max_eps):
                continue
            if name in COPY_OPS:
                src = self._pure_copy_source(n)
                if src is not None:
                    single.append(Removal("copy", {n: src}))
                continue
            inputs = self._bypass_inputs(n)
            if inputs:
                single.extend(Removal("bypass", {n: i}) for i in inputs)
            elif self.info[n].floating and any(u.op != "output" for u in n.users):
                # noise in an output itself always shows: only ops with a downstream op are knocked out
                knock.append(Removal("knockout", knockout=(n,)))
        for chain in self._layout_chains():
            for i in range(len(chain)):
                for j in range(i + 1, min(len(chain), i + MAX_LAYOUT_RUN)):
                    first_in = chain[i].args[0]
                    if self._same(first_in, chain[j]):
                        # each skipped node passes on its predecessor's value (the interpreter frees a
                        # value after its last use, so the run's input is gone once the first op ran)
                        passes = {chain[i]: first_in, **{chain[k]: chain[k - 1] for k in range(i + 1, j + 1)}}
                        runs.append(Removal("layout_run", passes))
        out = single + runs + knock
        return out if limit is None else out[:limit]

    def _pure_copy_source(self, n: Node) -> Node | None:
        """The node a pure copy ``n`` copies (module docstring), None when ``n`` is not one."""
        src = n.args[0] if n.args else None
        if not isinstance(src, Node) or (self.inplace and src.op == "get_attr"):
            return None
        a, b = self.info.get(src), self.info.get(n)
        if a is None or b is None or not a.kind == b.kind == "tensor":
            return None
        same = (a.shape, a.dtype, a.stride, a.device) == (b.shape, b.dtype, b.stride, b.device)
        return src if same else None

    def safety_constant(self, n: Node, max_eps: float = MAX_EPS) -> bool:
        """``n`` adds (or floors at) a constant of magnitude at most ``max_eps`` whose result reaches a guarded
        op (module docstring) through shape, cast and ``abs`` ops."""
        name = op_name(self.gm, n)
        if name not in SAFETY_OPS:
            return False
        if name.startswith(("clamp", "clip")):  # the lower bound: clamp(p, eps, 1 - eps) before a log
            operands = [*n.args[1:2], n.kwargs.get("min")]
        else:
            operands = [*n.args, n.kwargs.get("other")]
        values = [self._constant(a) for a in operands]
        if not any(v is not None and 0 < abs(v) <= max_eps for v in values):
            return False
        return self._reaches_guard(n)

    def _constant(self, a: Any) -> float | None:
        if isinstance(a, (int, float)) and not isinstance(a, bool):
            return float(a)
        if isinstance(a, Node) and a.op == "get_attr":
            try:
                value = _attr(self.gm, str(a.target))
            except AttributeError:
                return None
            if isinstance(value, torch.Tensor) and value.numel() == 1 and value.is_floating_point():
                return float(value.detach().reshape(()).item())
        return None

    def _reaches_guard(self, n: Node, depth: int = 4) -> bool:
        for user in n.users:
            name = op_name(self.gm, user) if user.op in ("call_function", "call_method", "call_module") else ""
            if name in GUARDED_OPS:
                return True
            if name in DIVISIONS and len(user.args) > 1 and user.args[1] is n:
                return True
            if name in ("pow", "pow_") and user.args and user.args[0] is n and len(user.args) > 1 \
                    and isinstance(user.args[1], (int, float)) and (user.args[1] < 0 or user.args[1] % 1):
                return True
            if depth and (name in _PASS_THROUGH or name in SAFETY_OPS) and self._reaches_guard(user, depth - 1):
                return True
        return False

    def _same(self, a: Any, b: Node) -> bool:
        ia, ib = self.info.get(a) if isinstance(a, Node) else None, self.info.get(b)
        return (ia is not None and ib is not None and ia.kind == ib.kind == "tensor"
                and ia.shape == ib.shape and ia.dtype == ib.dtype)

    def _bypass_inputs(self, n: Node) -> list[Node]:
        if self.info[n].kind != "tensor":
            return []
        found = []
        for a in [*n.args, *n.kwargs.values()]:
            if isinstance(a, Node) and a not in found and self._same(a, n):
                if self.inplace and a.op == "get_attr":
                    continue
                found.append(a)
        return found

    def _layout_chains(self) -> list[list[Node]]:
        """Maximal chains of layout ops, each the only user of the one before and fed by it first."""
        layout = [n for n in self.ops if op_name(self.gm, n) in LAYOUT_OPS and self.info[n].kind == "tensor"]
        nxt: dict[Node, Node] = {}
        for n in layout:
            src = n.args[0] if n.args else None
            if isinstance(src, Node) and src in layout and len(src.users) == 1:
                nxt[src] = n
        heads = [n for n in layout if n not in nxt.values()]
        chains = []
        for h in heads:
            chain = [h]
            while chain[-1] in nxt:
                chain.append(nxt[chain[-1]])
            if len(chain) > 1:
                chains.append(chain)
        return chains


def _attr(gm: torch.fx.GraphModule, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


class _LineTracer(torch.fx.Tracer):
    """``torch.fx.Tracer`` that notes in ``node.meta["task_line"]`` the line of the task's source (frames
    whose code object's file name is ``filename``) each node was created from; cheaper than the tracer's
    own ``record_stack_traces``, which symbolises whole stacks."""

    def __init__(self, filename: str):
        super().__init__()
        self.filename = filename

    def create_node(self, *args, **kwargs) -> Node:
        node = super().create_node(*args, **kwargs)
        frame = sys._getframe(1)
        while frame is not None and frame.f_code.co_filename != self.filename:
            frame = frame.f_back
        if frame is not None:
            node.meta["task_line"] = frame.f_lineno
        return node


def trace_task(model: Any, code: str = "", filename: str = "<task>") -> TracedTask:
    """``TracedTask`` of ``model``'s forward (not yet recorded). Module attributes that tracing changes
    (a forward that stores on ``self``) are put back. Raises ``TraceFailure`` naming the tracer's error."""
    if not isinstance(model, torch.nn.Module):
        raise TraceFailure(f"model is a {type(model).__name__}, not an nn.Module")
    saved = [(m, dict(m.__dict__)) for m in model.modules()]
    tracer = _LineTracer(filename)
    try:
        graph = tracer.trace(model)
        gm = torch.fx.GraphModule(tracer.root, graph)
    except Exception as exc:  # noqa: BLE001 - any tracer failure means "not judged by ablation"
        raise TraceFailure(f"{type(exc).__name__}: {str(exc)[:200]}") from None
    finally:
        for m, attrs in saved:
            now = m.__dict__
            if now.keys() != attrs.keys() or any(now[k] is not v for k, v in attrs.items()):
                m.__dict__.clear()
                m.__dict__.update(attrs)
    return TracedTask(gm, code, filename)
