"""``OpGraph``: a fused task as a networkx ``DiGraph`` of op instances with shape propagation on ``meta``.

Nodes: ``in<i>`` graph inputs (attrs: ``shape`` as size-symbol names, ``dtype``, ``values``) and ``op<i>`` op
instances (attrs: ``label``, the ``SeedOp`` as a dict, ``init_args`` / ``call_args`` with concrete values,
``params`` {name: (shape, dtype, values)}). Edges carry ``arg``, the position of the tensor in the call.
Sizes are named symbols (``batch_size``, ``channels``...) whose values live in ``OpGraph.sizes``, so the cost
model can rescale the batch without rebuilding the graph. ``OpGraph.dtype`` is the floating dtype of the task's
float inputs, parameters and modules (``float32``, ``bfloat16`` or ``float16``); index and mask tensors keep
theirs.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass, field

import networkx as nx
import torch
from opforge.seeds.probe import build_callable, first_tensor, resolve_qualname
from opforge.seeds.seed_op import SeedOp, TensorSpec
from opforge.seeds.tensors import make_tensor
from torch.utils.flop_counter import FlopCounterMode


@dataclass
class OpGraph:
    g: nx.DiGraph = field(default_factory=nx.DiGraph)
    sizes: dict[str, int] = field(default_factory=dict)  # size-constant name -> value
    dtype: str = "float32"  # floating dtype of the task (opforge.task.precision.TASK_DTYPES)
    frozen: set[str] = field(default_factory=set)  # sizes an op depends on other than by equality: kept fixed
    seeds: dict[str, SeedOp] = field(default_factory=dict)  # node -> seed op
    _meta: dict = field(default_factory=dict, repr=False)  # sizes key -> {node: meta tensor}

    # ---- construction ----
    def add_input(self, shape: list[str], dtype: str = "float32", values: str = "normal") -> str:
        name = f"in{sum(1 for n in self.g if n.startswith('in'))}"
        self.g.add_node(name, kind="input", shape=list(shape), dtype=dtype, values=values)
        return name

    def add_op(self, seed: SeedOp, args: list[str], init_args: dict, call_args: dict,
               params: dict[str, tuple[list[int], str, str]]) -> str:
        name = f"op{sum(1 for n in self.g if n.startswith('op'))}"
        self.g.add_node(name, kind="op", label=seed.label, init_args=init_args, call_args=call_args,
                        params=params)
        self.seeds[name] = seed
        for i, a in enumerate(args):
            self.g.add_edge(a, name, arg=i)
        return name

    def remove(self, node: str) -> None:
        self.g.remove_node(node)
        self.seeds.pop(node, None)
        for cache in self._meta.values():
            cache.pop(node, None)

    # ---- queries ----
    def inputs(self) -> list[str]:
        return sorted((n for n in self.g if n.startswith("in")), key=lambda n: int(n[2:]))

    def ops(self) -> list[str]:
        return [n for n in nx.topological_sort(self.g) if n.startswith("op")]

    def args_of(self, node: str) -> list[str]:
        preds = sorted(self.g.in_edges(node, data=True), key=lambda e: e[2]["arg"])
        return [p for p, _, _ in preds]

    def output(self) -> str:
        sinks = [n for n in self.ops() if self.g.out_degree(n) == 0]
        if len(sinks) != 1:
            raise ValueError(f"graph must have exactly one output op, has {sinks}")
        return sinks[0]

    def labels(self) -> list[str]:
        return [self.g.nodes[n]["label"] for n in self.ops()]

    def is_chain(self) -> bool:
        ops = self.ops()
        return all(sum(1 for p in self.args_of(n) if p.startswith("op")) <= 1 for n in ops) and \
            all(self.g.out_degree(n) <= 1 for n in ops) and \
            all(self.g.out_degree(n) == 1 for n in self.inputs())

    def input_shape(self, node: str, sizes: dict[str, int] | None = None) -> tuple[int, ...]:
        sizes = sizes or self.sizes
        return tuple(sizes[d] if isinstance(d, str) else d for d in self.g.nodes[node]["shape"])

    # ---- execution ----
    def run(self, device: str = "meta", sizes: dict[str, int] | None = None, generator=None,
            op_flops: dict[str, float] | None = None) -> dict[str, torch.Tensor]:
        """Execute the graph on ``device`` (default ``meta``: shapes only). Returns node -> output tensor.
        With ``op_flops`` given, every op runs under its own ``FlopCounterMode`` and its FLOPs land there
        (node -> FLOPs; GEMM, conv and attention formulas).

        Raises whatever an op raises for incompatible shapes.
        """
        sizes = sizes or self.sizes
        # meta results are cached per size assignment (counting FLOPs needs every op to run again)
        cached = device == "meta" and op_flops is None
        vals: dict[str, torch.Tensor] = self._meta.setdefault(tuple(sorted(sizes.items())), {}) if cached else {}
        for n in self.inputs():
            if n not in vals:
                a = self.g.nodes[n]
                shape = self.input_shape(n, sizes)
                t = _meta_input(a["dtype"], a["values"], shape) if device == "meta" else None
                if t is None:
                    spec = TensorSpec(shape=[1], dtype=a["dtype"], values=a["values"])
                    t = make_tensor(spec, shape, {}, device, generator)
                vals[n] = self._cast(t)
        for n in self.ops():
            if n in vals:
                continue
            args = [vals[a] for a in self.args_of(n)]
            if device != "meta":
                vals[n] = self._call(n, args, device)
                continue
            vals[n], flops = self._meta_call(n, args, op_flops is not None)
            if op_flops is not None:
                op_flops[n] = flops
        return dict(vals)

    def _meta_call(self, n: str, tensors: list[torch.Tensor], count: bool) -> tuple[torch.Tensor, float | None]:
        """``_call`` on ``meta`` through the shape memo (``_MetaMemo``): the output tensor and, when ``count``,
        the op's FLOPs (``FlopCounterMode``). Raises what the op raises."""
        key = _MEMO.key(self, n, tensors)
        hit = _MEMO.get(key, count)
        if hit is not None:
            return hit
        try:
            if count:
                counter = FlopCounterMode(display=False)
                with counter:
                    out = self._call(n, tensors, "meta")
                flops = float(counter.get_total_flops())
            else:
                out, flops = self._call(n, tensors, "meta"), None
        except Exception as exc:
            _MEMO.put_error(key, exc)
            raise
        _MEMO.put(key, out, flops)
        return out, flops

    def _call(self, n: str, tensors: list[torch.Tensor], device: str) -> torch.Tensor:
        a, seed = self.g.nodes[n], self.seeds[n]
        if device == "meta" and seed.label in RECURRENT_SHAPES:
            # torch's recurrent ops have no meta kernel and decompose into one step per time step
            return RECURRENT_SHAPES[seed.label](tensors[0], a["init_args"])
        if device == "meta" and seed.label == "nn.Bilinear":
            out = bilinear_meta(tensors, a["init_args"], getattr(torch, self.dtype))
            if out is not None:
                return out
        params = {k: self._cast(make_tensor(TensorSpec(shape=list(s), dtype=dt, values=v), tuple(s), {}, device))
                  for k, (s, dt, v) in a["params"].items()}
        if seed.kind == "module":
            fn = _module(seed, a["init_args"], device)
            if self.dtype != "float32":
                fn = fn.to(getattr(torch, self.dtype))
        else:
            fn = resolve_qualname(seed.qualname)
        if seed.tensor_list:
            out = fn(tensors, **params, **a["call_args"])
        else:
            out = fn(*tensors, **params, **a["call_args"])
        t, _ = first_tensor(out)
        if t is None:
            raise TypeError(f"{a['label']} returned no tensor")
        return t

    def _cast(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` in the task's dtype when it is a float32 tensor (index and mask tensors are kept)."""
        if self.dtype != "float32" and t.dtype == torch.float32:
            return t.to(getattr(torch, self.dtype))
        return t

    def to_json(self) -> str:
        """Node-link JSON of the graph (seed ops reduced to their labels)."""
        data = nx.node_link_data(self.g, edges="edges")
        return json.dumps({"sizes": self.sizes, "dtype": self.dtype, **data}, sort_keys=True, default=str)


class _MetaMemo:
    """Results of op calls on ``meta``, keyed by the op and the metadata of its inputs.

    On ``meta`` an op's output depends only on the op (seed op, init / call arguments, parameters, the task's
    dtype) and the metadata of its input tensors (shape, strides, storage offset, dtype, requires_grad), so a
    call seen before is answered with a fresh tensor of the recorded metadata (shape, strides, storage offset,
    dtype; requires_grad as a non-leaf, as an op's output is) and the recorded FLOPs, or the recorded
    exception is raised again. Graphs resampled and resized during composition repeat many calls (an
    ``nn.Bilinear`` on ``meta`` alone runs one batched GEMM per output feature). A call whose inputs or output
    are not plain strided ``meta`` tensors is not recorded. Holds at most ``MAX_ENTRIES`` entries, then starts
    again empty.
    """

    MAX_ENTRIES = 100_000

    def __init__(self):
        self.entries: dict = {}

    def key(self, graph: OpGraph, n: str, tensors: list[torch.Tensor]):
        """The key of op ``n`` of ``graph`` on ``tensors``, or None when the call is not to be recorded."""
        a, seed = graph.g.nodes[n], graph.seeds[n]
        if seed.label in RECURRENT_SHAPES:
            return None  # a shape function already
        metas = []
        for t in tensors:
            if not _plain(t):
                return None
            metas.append((tuple(t.shape), t.stride(), t.storage_offset(), t.dtype, t.requires_grad))
        try:
            op = (seed.label, seed.qualname, seed.kind, seed.tensor_list, seed.config_class, _freeze(seed.config),
                  _freeze(a["init_args"]), _freeze(a["call_args"]), _freeze(a["params"]), a.get("output_index"))
            key = (op, graph.dtype, torch.is_grad_enabled(), tuple(metas))
            hash(key)
        except TypeError:  # an argument that cannot be frozen
            return None
        return key

    def get(self, key, count: bool) -> tuple[torch.Tensor, float | None] | None:
        """(fresh output, FLOPs) recorded for ``key``; None when not recorded (or its FLOPs are wanted and were
        not counted). Raises the recorded exception of a call that failed."""
        entry = self.entries.get(key) if key is not None else None
        if entry is None:
            return None
        if entry[0] == "error":
            raise copy.copy(entry[1])
        _, meta, flops = entry
        if count and flops is None:
            return None
        return _rebuild(*meta), flops

    def put(self, key, out: torch.Tensor, flops: float | None) -> None:
        if key is None or not _plain(out):
            return
        if len(self.entries) >= self.MAX_ENTRIES:
            self.entries.clear()
        meta = (tuple(out.shape), out.stride(), out.storage_offset(), out.dtype, out.requires_grad)
        old = self.entries.get(key)
        if flops is None and old is not None and old[0] == "ok":
            flops = old[2]
        self.entries[key] = ("ok", meta, flops)

    def put_error(self, key, exc: Exception) -> None:
        """Record that the call of ``key`` raised ``exc`` (a copy without traceback or context is kept, so no
        frame of the failed call stays alive; an exception that cannot be copied is not recorded)."""
        if key is None:
            return
        try:
            kept = copy.copy(exc)
        except Exception:  # noqa: BLE001 - an exception type that cannot be rebuilt from its arguments
            return
        if type(kept) is not type(exc) or str(kept) != str(exc):
            return
        kept.__traceback__ = kept.__context__ = kept.__cause__ = None
        if len(self.entries) >= self.MAX_ENTRIES:
            self.entries.clear()
        self.entries[key] = ("error", kept)


_MEMO = _MetaMemo()


def _plain(t) -> bool:
    """A plain strided ``meta`` tensor (no subclass, conjugate or negative bit)."""
    return type(t) is torch.Tensor and t.device.type == "meta" and t.layout == torch.strided \
        and not t.is_conj() and not t.is_neg()


def _rebuild(shape: tuple, stride: tuple, offset: int, dtype: torch.dtype, requires_grad: bool) -> torch.Tensor:
    """A ``meta`` tensor with exactly this shape, strides, storage offset and dtype; with ``requires_grad`` a
    non-leaf (the output of an op on parameters)."""
    numel = math.prod(shape)
    size = offset + 1 + sum((d - 1) * s for d, s in zip(shape, stride, strict=True)) if numel else offset
    base = torch.empty(size, dtype=dtype, device="meta")
    if requires_grad:
        base = base.requires_grad_() * 1
    return base.as_strided(shape, stride, offset)


def _freeze(obj):
    """A hashable form of an argument structure that keeps types apart (1, 1.0, True; tuple, list)."""
    if isinstance(obj, dict):
        return ("dict", tuple(sorted((str(k), _freeze(v)) for k, v in obj.items())))
    if isinstance(obj, (list, tuple)):
        return (type(obj).__name__, tuple(_freeze(v) for v in obj))
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return (type(obj).__name__, obj)
    raise TypeError(f"cannot freeze {type(obj).__name__}")


# make_tensor's dtype for an input of value kind ``values`` and recipe dtype ``dtype`` (seeds.tensors.make_tensor):
# mask values are bool, the others take the recipe's dtype.
_META_DTYPES = {"float32": torch.float32, "int64": torch.int64, "bool": torch.bool}


def _meta_input(dtype: str, values: str, shape: tuple[int, ...]) -> torch.Tensor | None:
    """The ``meta`` tensor ``make_tensor`` returns for a graph input (same shape, dtype and contiguous strides),
    made without its random fill; None for index values and unknown dtypes (then ``make_tensor`` makes it)."""
    if values.startswith("index:") or dtype not in _META_DTYPES:
        return None
    if any(d < 0 for d in shape):
        return None  # make_tensor raises its own error
    kind = torch.bool if values == "bool" or dtype == "bool" else _META_DTYPES[dtype]
    return torch.empty(shape, dtype=kind, device="meta")


def bilinear_meta(tensors: list[torch.Tensor], init: dict, dtype: torch.dtype) -> torch.Tensor | None:
    """The ``meta`` output of ``nn.Bilinear(**init)`` in ``dtype`` on ``tensors`` without running it: shape
    ``x1.shape[:-1] + (out_features,)``, contiguous, the module's dtype, requires_grad as an output of its
    parameters (torch runs one batched GEMM per output feature on ``meta``; ``FlopCounterMode`` counts none
    of them, so the FLOPs are 0 either way). None when the call is not the plain case (inputs of other dtypes
    or shapes, a size-1 or empty dim, other arguments): then the module is run."""
    if set(init) - {"in1_features", "in2_features", "out_features", "bias"} or len(tensors) != 2:
        return None
    in1, in2, out = init.get("in1_features"), init.get("in2_features"), init.get("out_features")
    if not all(type(v) is int and v > 1 for v in (in1, in2, out)) or type(init.get("bias", True)) is not bool:
        return None
    x1, x2 = tensors
    if not (_plain(x1) and _plain(x2)) or x1.dtype != dtype or x2.dtype != dtype or not dtype.is_floating_point:
        return None
    if x1.dim() < 2 or x1.dim() != x2.dim() or x1.shape[:-1] != x2.shape[:-1] or x1.shape[-1] != in1 \
            or x2.shape[-1] != in2 or any(d < 2 for d in x1.shape):
        return None
    shape = (*x1.shape[:-1], out)
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * shape[i + 1]
    return _rebuild(shape, tuple(strides), 0, dtype, torch.is_grad_enabled())


def _seq_out(x: torch.Tensor, init: dict) -> torch.Tensor:
    if not init.get("batch_first") or x.dim() != 3 or x.shape[-1] != init["input_size"]:
        raise ValueError("recurrent seed expects a batch-first [N, L, input_size] input")
    return torch.empty(x.shape[0], x.shape[1], init["hidden_size"], device="meta", dtype=x.dtype)


RECURRENT_SHAPES = {"nn.LSTM": _seq_out, "nn.GRU": _seq_out, "nn.RNN": _seq_out}
# Multiply-accumulate gates per hidden unit (LSTM 4, GRU 3, Elman RNN 1), for the cost model.
RECURRENT_GATES = {"nn.LSTM": 4, "nn.GRU": 3, "nn.RNN": 1}


def _module(seed: SeedOp, init_args: dict, device: str):
    return build_callable(seed.model_copy(update={"init_args": init_args}), {}, device)
