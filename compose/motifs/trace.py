"""Trace the forward of a real model into a data-flow graph of op calls, the raw material of motifs.

A ``TorchFunctionMode`` records every call user code makes (the model's own modules and functions; a
``torch.nn`` leaf module such as ``nn.Linear`` or ``nn.Conv2d`` is one call, whatever it calls inside), with
its arguments as a template in which every tensor is a reference to a traced value. Values are the model's
inputs, its parameters and buffers, tensors made by factory calls (``arange``, ``zeros``, ``tensor``) and the
outputs of calls. A value is *data* when it derives from a model input or a parameter, *constant* when it
derives only from factories and buffers (position ids, causal masks, rotary ``cos`` / ``sin``); motifs are
cut from data calls only, and a constant that enters a motif becomes one of its inputs.

Every model is traced twice, at the sentinel sizes and at ``BATCH_2`` / ``SEQ_2``; integer literals and
dimensions that are equal in both traces are constants of the model (``{"lit": v}`` in a template,
``Value.vary`` False), so a vocabulary size that happens to be a multiple of a sentinel never becomes a size
expression. The model runs on the ``meta`` device (no weights, no memory) in ``float16``, which no model code names
itself (models upcast to ``float32`` explicitly and cast back to the input's dtype), so a ``float16``
literal in a call stands for "the task's dtype" and a motif can be rendered in any floating dtype. The batch
and sequence sizes are the sentinel primes ``BATCH`` and ``SEQ``, so integer literals and shapes built from
them are recognised and become the size symbols ``batch_size`` and ``seq_len`` when a motif is rendered
(``compose.motifs.render.symbolic``).

Usage::

    trace = trace_transformers("llama")          # a shrunk default config (1-2 layers), on meta
    data_calls = [c for c in trace.calls if c.data]
"""

from __future__ import annotations

import contextlib
import math
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
from opforge.task.op_names import (
    NON_COMPUTE,
    canonical_for_function,
    function_name,
    labels_for_function,
    module_label,
)
from torch.overrides import TorchFunctionMode
from torch.utils.flop_counter import FlopCounterMode

BATCH = 13  # sentinel batch size of every trace (a prime no default config uses as a size)
SEQ = 97  # sentinel sequence length of text models
# The second trace's sizes: an integer equal in both traces is a constant of the model, never a size symbol.
BATCH_2, SEQ_2 = 11, 89
TRACE_DTYPE = torch.float16  # stands for "the task's dtype" in recorded literals
IMAGE_SIZE = 224  # pixel_values side when the config names none
TIMEOUT_S = 120

_CONTAINERS = (torch.nn.Sequential, torch.nn.ModuleList, torch.nn.ModuleDict)
# Calls that make a tensor from no tensor: their outputs are constants.
FACTORIES = frozenset({"arange", "zeros", "ones", "full", "empty", "tensor", "as_tensor", "linspace",
                       "logspace", "eye", "zeros_like", "ones_like", "full_like", "empty_like", "tril_indices",
                       "triu_indices", "randn", "rand", "randint", "normal"})
# Calls that are the identity in eval mode: their output is their input.
IDENTITY_IN_EVAL = frozenset({"dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout",
                              "feature_alpha_dropout"})
LAYOUT_OF_BOUNDARY = frozenset({"view", "reshape", "transpose", "permute", "contiguous", "flatten",
                                "unflatten"})
HEAVY_CANONICAL = frozenset({"linear", "matmul", "bmm", "baddbmm", "addmm", "addbmm", "einsum", "conv1d",
                             "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
                             "scaled_dot_product_attention", "lstm", "gru", "rnn_tanh", "rnn_relu",
                             "multi_head_attention_forward", "convolution", "tensordot"})


OVERFLOW_GUARD = 1e4  # |bound| of a clamp that only guards against float16 overflow (finfo.max - 1000 in T5)


def is_overflow_guard(name: str, args: list, kwargs: dict) -> bool:
    """A ``clamp`` whose bounds are all at least ``OVERFLOW_GUARD`` in magnitude: a no-op on activations."""
    if name not in ("clamp", "clip", "clamp_", "clip_"):
        return False
    bounds = [b.get("lit", b) if isinstance(b, dict) else b for b in list(args[1:3]) + list(kwargs.values())]
    nums = [b for b in bounds if isinstance(b, (int, float)) and not isinstance(b, bool)]
    return bool(nums) and all(abs(b) >= OVERFLOW_GUARD for b in nums)



class TraceError(RuntimeError):
    """A model could not be built or traced; the message names the model and the cause."""


@dataclass
class Value:
    """One traced tensor. ``origin``: ``input`` (a model input), ``param`` / ``buffer`` (state of the model,
    ``name`` its dotted name), ``call`` (output ``out_index`` of call ``producer``)."""

    vid: int
    shape: tuple[int, ...]
    dtype: str
    origin: str
    data: bool
    producer: int | None = None
    out_index: int = 0
    name: str = ""
    boundary: bool = False
    vary: list = field(default_factory=list)  # per dim: moves with batch / sequence length (second trace)


@dataclass
class Call:
    """One op call of user code.

    Attributes:
        index: position in the trace. kind: ``function`` or ``module`` (a ``torch.nn`` leaf).
        name: the function's bare name (``linear``, ``__getitem__``, ``view``) or the module class name.
        spelling: how it is written in source: ``F.silu`` / ``torch.rsqrt`` (a namespace function),
            ``method`` (``x.view(...)``), ``operator`` (``a + b``, ``x[...]``) or ``module``.
        args / kwargs: templates; a tensor is ``{"T": vid}`` (``compose.motifs.trace.encode``).
        outputs: value ids of the tensors returned (a tuple output keeps its positions, None for non-tensors).
        module: ``nn.X(<extra_repr>)`` constructor source of a module call.
        scope: dotted path of the innermost user module running the call (``layers.0.mlp``) and its class.
        counted: the call is an op of the task's ``ops`` labels (not a cast, view read or copy).
        heavy: a GEMM, convolution, attention or recurrent op. flops: FLOPs on the traced shapes.
        data: the call reads a data value (see the module docstring).
    """

    index: int
    kind: str
    name: str
    spelling: str
    args: list
    kwargs: dict
    outputs: list
    module: str = ""
    scope: str = ""
    scope_class: str = ""
    counted: bool = True
    heavy: bool = False
    flops: float = 0.0
    data: bool = True
    canonical: str = ""
    module_path: str = ""
    index_bound: int = 0
    out_shapes: list = field(default_factory=list)
    module_params: int = 0
    out_vary: list = field(default_factory=list)  # per output, per dim: moves with batch / sequence length

    def inputs(self) -> list[int]:
        """Value ids this call reads, in order of appearance (repeats removed)."""
        out: list[int] = []
        _refs(self.args, out)
        _refs(self.kwargs, out)
        return list(dict.fromkeys(out))


@dataclass
class Trace:
    """A traced forward: ``values`` by id, ``calls`` in call order, ``outputs`` the model's returned values."""

    model: str
    library: str
    values: dict[int, Value] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)
    config: dict = field(default_factory=dict)

    def users(self) -> dict[int, list[int]]:
        """value id -> indices of the calls that read it."""
        out: dict[int, list[int]] = {}
        for c in self.calls:
            for v in c.inputs():
                out.setdefault(v, []).append(c.index)
        return out


def template_refs(obj) -> list[int]:
    """Value ids of the tensors in an argument template (``{"T": vid}`` leaves), in order, repeats kept."""
    out: list[int] = []
    _refs(obj, out)
    return out


def _refs(obj, out: list[int]) -> None:
    if isinstance(obj, dict):
        if "T" in obj and len(obj) == 1:
            out.append(obj["T"])
            return
        for v in obj.values():
            _refs(v, out)
    elif isinstance(obj, list):
        for v in obj:
            _refs(v, out)


def _dtype_name(dt: torch.dtype) -> str:
    return str(dt).replace("torch.", "")


class _Recorder(TorchFunctionMode):
    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.trace_values: dict[int, Value] = {}
        self.calls: list[Call] = []
        self.by_obj: dict[int, int] = {}  # id(tensor) -> value id
        self.keep: list[Any] = []  # every tensor seen, so that no id() is reused
        self.state = {id(p): ("param", n) for n, p in model.named_parameters()}
        self.state.update({id(b): ("buffer", n) for n, b in model.named_buffers()})
        self.stack: list[tuple[str, Any]] = []  # ("leaf", pending call) | ("user", path)
        self.paths = {id(m): n for n, m in model.named_modules()}
        self.inputs: set[int] = set()

    # ---- values ----
    def value_of(self, t: torch.Tensor) -> int:
        key = id(t)
        if key in self.by_obj:
            return self.by_obj[key]
        vid = len(self.trace_values)
        origin, name = self.state.get(key, ("input" if key in self.inputs else "const", ""))
        data = origin in ("input", "param")
        self.trace_values[vid] = Value(vid, tuple(t.shape), _dtype_name(t.dtype), origin, data, name=name)
        self.by_obj[key] = vid
        self.keep.append(t)
        return vid

    def encode(self, obj):
        """JSON-able template of a call argument; tensors become ``{"T": vid}``."""
        if isinstance(obj, torch.Tensor):
            return {"T": self.value_of(obj)}
        if isinstance(obj, (bool, int, str)) or obj is None:
            return obj
        if isinstance(obj, float):
            return obj if math.isfinite(obj) else {"float": str(obj)}
        if isinstance(obj, torch.Size):
            return {"tuple": [int(v) for v in obj]}
        if isinstance(obj, tuple):
            return {"tuple": [self.encode(v) for v in obj]}
        if isinstance(obj, list):
            return [self.encode(v) for v in obj]
        if isinstance(obj, slice):
            return {"slice": [self.encode(obj.start), self.encode(obj.stop), self.encode(obj.step)]}
        if obj is Ellipsis:
            return {"ellipsis": True}
        if isinstance(obj, torch.dtype):
            return {"dtype": _dtype_name(obj)}
        if isinstance(obj, torch.device):
            return {"device": True}
        if isinstance(obj, torch.memory_format):
            return {"memory_format": str(obj).replace("torch.", "")}
        if isinstance(obj, dict):
            return {"dict": {str(k): self.encode(v) for k, v in obj.items()}}
        raise TypeError(f"unsupported argument of type {type(obj).__name__}")

    def record_outputs(self, call: Call, out, reads_data: bool) -> None:
        items = list(out) if isinstance(out, (tuple, list)) else [out]
        for i, t in enumerate(items):
            if not isinstance(t, torch.Tensor):
                call.outputs.append(None)
                call.out_shapes.append([[], ""])
                continue
            call.out_shapes.append([list(t.shape), _dtype_name(t.dtype)])
            vid = len(self.trace_values)
            self.trace_values[vid] = Value(vid, tuple(t.shape), _dtype_name(t.dtype), "call", reads_data,
                                           producer=call.index, out_index=i)
            self.by_obj[id(t)] = vid  # an in-place call maps its tensor to the new value
            self.keep.append(t)
            call.outputs.append(vid)

    def scope(self) -> tuple[str, str]:
        for kind, obj in reversed(self.stack):
            if kind == "user":
                return obj
        return ("", "")

    # ---- module hooks ----
    def pre(self, mod, args):
        if self.stack and self.stack[-1][0] in ("leaf", "inner", "identity"):
            self.stack.append(("inner", None))  # inside a leaf module: not user code
            return
        if type(mod).__module__.startswith("torch.nn") and not isinstance(mod, _CONTAINERS):
            name = type(mod).__name__
            if name.lower() in IDENTITY_IN_EVAL or name in ("Dropout", "Dropout1d", "Dropout2d", "Dropout3d",
                                                            "AlphaDropout", "Identity"):
                self.stack.append(("identity", None))
                return
            call = self._new_call("module", name, "module", [self.encode(a) for a in args], {})
            call.module = _module_source(mod)
            call.module_path = self.paths.get(id(mod), "")
            call.module_params = sum(p.numel() for p in mod.parameters())
            call.index_bound = int(getattr(mod, "num_embeddings", 0) or 0)
            call.heavy = name.startswith(("Linear", "Conv", "LazyLinear", "LSTM", "GRU", "RNN", "Bilinear",
                                          "MultiheadAttention"))
            call.canonical = module_label(type(mod))
            self.stack.append(("leaf", call))
        else:
            for t in _tensors(list(args)):
                if id(t) in self.by_obj:
                    self.trace_values[self.by_obj[id(t)]].boundary = True
            self.stack.append(("user", (self.paths.get(id(mod), ""), type(mod).__name__)))

    def post(self, mod, args, out):
        if not self.stack:
            return
        kind, obj = self.stack.pop()
        if kind == "identity":
            if isinstance(out, torch.Tensor) and args and isinstance(args[0], torch.Tensor):
                self.by_obj[id(out)] = self.value_of(args[0])
                self.keep.append(out)
        elif kind == "leaf":
            self._finish(obj, out)
        elif kind == "user":
            for t in _tensors(out):
                if id(t) in self.by_obj:
                    self.trace_values[self.by_obj[id(t)]].boundary = True

    def _new_call(self, kind, name, spelling, args, kwargs) -> Call:
        call = Call(index=len(self.calls), kind=kind, name=name, spelling=spelling, args=args, kwargs=kwargs,
                    outputs=[])
        call.scope, call.scope_class = self.scope()
        return call

    def _finish(self, call: Call, out) -> None:
        reads = call.inputs()
        call.data = any(self.trace_values[v].data for v in reads) or call.kind == "module"
        self.calls.append(call)
        self.record_outputs(call, out, call.data)

    # ---- functions ----
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.stack and self.stack[-1][0] in ("leaf", "inner", "identity"):
            return func(*args, **kwargs)
        name = function_name(func)
        canonical = canonical_for_function(func)
        if name in IDENTITY_IN_EVAL and not kwargs.get("training", args[2] if len(args) > 2 else False):
            return args[0]
        out = func(*args, **kwargs)
        if name in ("shape", "dtype", "device", "size", "dim", "ndim", "numel", "is_floating_point",
                    "__get__", "__len__", "__bool__", "__int__", "__index__", "__float__", "item", "tolist",
                    "__format__", "__repr__", "stride", "is_contiguous", "data_ptr", "element_size"):
            return out
        tensors_out = isinstance(out, torch.Tensor) or (
            isinstance(out, (tuple, list)) and any(isinstance(t, torch.Tensor) for t in out))
        if not tensors_out:
            return out
        try:
            enc_args = [self.encode(a) for a in args]
            enc_kwargs = {k: self.encode(v) for k, v in kwargs.items()}
        except TypeError:
            enc_args, enc_kwargs = None, None
        spelling = _spelling(func, name)
        call = self._new_call("function", name, spelling, enc_args if enc_args is not None else [],
                              enc_kwargs or {})
        call.canonical = canonical
        call.counted = name not in NON_COMPUTE and canonical not in NON_COMPUTE
        call.heavy = canonical in HEAVY_CANONICAL
        if enc_args is None:
            call.spelling = "unsupported"
        if name in FACTORIES and not call.inputs():
            call.data = False
            self.calls.append(call)
            self.record_outputs(call, out, False)
            return out
        self._finish(call, out)
        return out


def _spelling(func, name: str) -> str:
    labels = labels_for_function(func)
    for lab in labels:
        if lab.startswith(("F.", "torch.")) and not lab.startswith("torch.Tensor"):
            return lab
    if name.startswith("__") and name.endswith("__"):
        return "operator"
    return "method"


def _module_source(mod: torch.nn.Module) -> str:
    """``nn.X(<extra_repr>)`` with in-place flags off; '' when the class is not public in ``torch.nn`` or the
    source does not rebuild a module of the same class with the same parameter and buffer shapes."""
    cls = type(mod)
    if getattr(torch.nn, cls.__name__, None) is not cls:
        return ""
    rep = mod.extra_repr().replace("inplace=True", "inplace=False")
    source = f"nn.{cls.__name__}({rep})"
    try:
        with torch.device("meta"):
            rebuilt = eval(source, {"nn": torch.nn, "torch": torch})  # noqa: S307 - torch's own extra_repr
    except Exception:  # noqa: BLE001 - an extra_repr that is not constructor source
        return ""

    def shapes(m):
        return [tuple(t.shape) for t in (*m.parameters(), *m.buffers())]

    if type(rebuilt) is not cls or shapes(rebuilt) != shapes(mod):
        return ""
    return source


def trace_module(model: torch.nn.Module, make_inputs, name: str, library: str) -> Trace:
    """Trace ``model(**make_inputs(batch, seq))`` (meta tensors) at the sentinel sizes and at the second
    sizes, and mark what is constant (see the module docstring). Raises what the forward raises."""
    trace = _trace_once(model, make_inputs(BATCH, SEQ), name, library)
    try:
        other = _trace_once(model, make_inputs(BATCH_2, SEQ_2), name, library)
    except Exception:  # noqa: BLE001 - no second trace: every size-like integer is read by its factors
        other = None
    _mark_constants(trace, other)
    _count_flops(trace)
    _mark_boundaries(trace)
    return trace


def _mark_constants(a: Trace, b: Trace | None) -> None:
    """Wrap the integers of ``a``'s call templates that ``b`` repeats as ``{"lit": v}`` and set which dims of
    values and outputs vary; calls are aligned by position while their names agree."""
    def walk(x, y):
        if isinstance(x, bool) or not isinstance(x, (int, list, dict)):
            return x
        if isinstance(x, int):
            return {"lit": x} if isinstance(y, int) and not isinstance(y, bool) and x == y else x
        if isinstance(x, list):
            return [walk(u, y[i] if isinstance(y, list) and i < len(y) else None) for i, u in enumerate(x)]
        if "T" in x and len(x) == 1:
            return x
        return {k: walk(u, y.get(k) if isinstance(y, dict) else None) for k, u in x.items()}

    def vary(s1, s2):
        if s2 is None or len(s1) != len(s2):
            return [True] * len(s1)
        return [int(u) != int(v) for u, v in zip(s1, s2, strict=True)]

    for v in a.values.values():
        v.vary = [True] * len(v.shape)
    for c in a.calls:
        c.out_vary = [[True] * len(sh) for sh, _ in c.out_shapes]
    if b is None:
        return
    by_origin = {}
    for v in b.values.values():
        if v.origin in ("input", "param", "buffer"):
            by_origin[(v.origin, v.name, sum(1 for u in by_origin if u[0] == v.origin))] = v
    seen: dict[str, int] = {}
    for v in a.values.values():
        if v.origin in ("input", "param", "buffer"):
            k = seen.get(v.origin, 0)
            seen[v.origin] = k + 1
            other = by_origin.get((v.origin, v.name, k))
            v.vary = vary(v.shape, other.shape if other else None)
    for ca, cb in zip(a.calls, b.calls, strict=False):
        if ca.name != cb.name or len(ca.outputs) != len(cb.outputs):
            break
        ca.args = walk(ca.args, cb.args)
        ca.kwargs = walk(ca.kwargs, cb.kwargs)
        ca.out_vary = [vary(sa, sb) for (sa, _), (sb, _) in zip(ca.out_shapes, cb.out_shapes, strict=True)]
        for o, flags in zip(ca.outputs, ca.out_vary, strict=True):
            if o is not None:
                a.values[o].vary = flags


def _trace_once(model: torch.nn.Module, kwargs: dict, name: str, library: str) -> Trace:
    rec = _Recorder(model)
    for v in kwargs.values():
        if isinstance(v, torch.Tensor):
            rec.inputs.add(id(v))
            rec.value_of(v)
    h1 = torch.nn.modules.module.register_module_forward_pre_hook(rec.pre)
    h2 = torch.nn.modules.module.register_module_forward_hook(rec.post)
    try:
        with torch.no_grad(), warnings.catch_warnings(), rec:
            warnings.simplefilter("ignore")
            out = model(**kwargs)
    finally:
        h1.remove()
        h2.remove()
    trace = Trace(model=name, library=library, values=rec.trace_values, calls=rec.calls)
    for t in _tensors(out):
        if id(t) in rec.by_obj:
            trace.outputs.append(rec.by_obj[id(t)])
    return trace


def _mark_boundaries(trace: Trace) -> None:
    """Mark the values a motif may start or end at: model inputs and outputs, the outputs of modules (set
    while tracing) and the data inputs and outputs of heavy calls."""
    for v in trace.values.values():
        if v.origin in ("input", "param"):
            v.boundary = True
    for v in trace.outputs:
        trace.values[v].boundary = True
    for c in trace.calls:
        if c.heavy or c.kind == "module":
            for v in c.inputs() + [o for o in c.outputs if o is not None]:
                if trace.values[v].data:
                    trace.values[v].boundary = True
    # a view, transpose or reshape of a boundary value is one too, and so is its source
    for _ in range(3):
        for c in trace.calls:
            if c.name not in LAYOUT_OF_BOUNDARY or not c.data:
                continue
            ins = [v for v in c.inputs() if trace.values[v].data]
            outs = [o for o in c.outputs if o is not None]
            if len(ins) == 1 and len(outs) == 1:
                a, b = trace.values[ins[0]], trace.values[outs[0]]
                if a.boundary or b.boundary:
                    a.boundary = b.boundary = True


def _tensors(out) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict) or hasattr(out, "values"):
        with contextlib.suppress(Exception):
            return [t for v in out.values() for t in _tensors(v)]
    if isinstance(out, (tuple, list)):
        return [t for v in out for t in _tensors(v)]
    return []


def _count_flops(trace: Trace) -> None:
    """FLOPs of each heavy call from its input shapes (``FlopCounterMode`` on fresh meta tensors)."""
    for c in trace.calls:
        if not c.heavy or c.spelling == "unsupported":
            continue
        with contextlib.suppress(Exception):
            c.flops = call_flops(trace, c)


def call_flops(trace: Trace, call: Call) -> float:
    """FLOPs of one call, re-run on meta tensors of the traced shapes. Raises when it cannot be re-run."""
    from opforge.compose.motifs.render import call_expression_fn

    fn, tensors = call_expression_fn(trace, call)
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        fn(*tensors)
    return float(counter.get_total_flops())


# ---- model builders ----

def _text_or_image_inputs(model, cfg, batch: int = BATCH, seq: int = SEQ) -> dict | None:
    import inspect

    from opforge.seeds.relevance import _find

    main = getattr(model, "main_input_name", "input_ids")
    params = set(inspect.signature(model.forward).parameters)
    with torch.device("meta"):
        if main == "input_ids":
            out = {"input_ids": torch.zeros(batch, seq, dtype=torch.long)}
            if getattr(cfg, "is_encoder_decoder", False) and "decoder_input_ids" in params:
                out["decoder_input_ids"] = torch.zeros(batch, seq, dtype=torch.long)
            return out
        if main == "pixel_values":
            ch = _find(cfg, "num_channels") or 3
            side = _find(cfg, "image_size") or IMAGE_SIZE
            return {"pixel_values": torch.empty(batch, ch, side, side, dtype=TRACE_DTYPE)}
    return None


def trace_transformers(model_type: str, keep_layers: int = 1) -> Trace:
    """Trace ``model_type``'s base model (``MODEL_MAPPING``) from its default config, depth cut to
    ``keep_layers`` (more where a config mixes layer types), eager attention, on meta in ``TRACE_DTYPE``.

    Raises ``TraceError`` naming the family when it has no text or image input, cannot be built or traced.
    """
    from opforge.seeds.relevance import _meta_reads_mode, _quiet, _shrink, _time_limit
    from transformers import CONFIG_MAPPING, MODEL_MAPPING

    try:
        with _quiet(), _time_limit(TIMEOUT_S):
            cfg = CONFIG_MAPPING[model_type]()
            _shrink(cfg)
            for f in ("num_hidden_layers", "num_layers", "n_layer"):
                v = getattr(cfg, f, None)
                if isinstance(v, int) and not isinstance(v, bool) and v > keep_layers and \
                        not getattr(cfg, "layer_types", None):
                    with contextlib.suppress(Exception):
                        setattr(cfg, f, keep_layers)
            with contextlib.suppress(Exception):
                cfg._attn_implementation = "eager"
            with torch.device("meta"):
                model = MODEL_MAPPING[type(cfg)](cfg)
            model = model.to(TRACE_DTYPE).eval()
            kwargs = _text_or_image_inputs(model, cfg)
            if kwargs is None:
                raise TraceError(f"transformers:{model_type}: no input_ids / pixel_values input")
            with _meta_reads_mode():  # data-dependent reads of meta tensors answer as the no-padding case
                trace = trace_module(model, lambda b, s: _text_or_image_inputs(model, cfg, b, s),
                                     f"transformers:{model_type}", "transformers")
    except TraceError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure of a third-party model is reported by name
        raise TraceError(f"transformers:{model_type}: {type(exc).__name__}: {str(exc)[:200]}") from None
    trace.config = {"max_positions": int(getattr(cfg, "max_position_embeddings", 0) or 0),
                    "hidden_size": int(getattr(cfg, "hidden_size", 0) or 0),
                    "native_dtype": _native_dtype(cfg, kwargs)}
    return trace


def _native_dtype(cfg, kwargs) -> str:
    """The dtype the family's checkpoints run in: the config's own, else bfloat16 for text models (their
    released checkpoints are bf16) and float32 for vision models."""
    dt = getattr(cfg, "dtype", None) or getattr(cfg, "torch_dtype", None)
    name = str(dt).replace("torch.", "") if dt is not None else ""
    if name in ("float32", "bfloat16", "float16"):
        return name
    return "bfloat16" if "input_ids" in kwargs else "float32"


def trace_torchvision(name: str) -> Trace:
    """Trace a torchvision classification model (``torchvision.models.get_model(name)``) on a 224 x 224
    image, on meta in ``TRACE_DTYPE``. Raises ``TraceError`` (torchvision missing, build or trace failure)."""
    try:
        import torchvision
    except Exception as exc:  # noqa: BLE001 - torchvision absent or broken
        raise TraceError(f"torchvision:{name}: torchvision unavailable ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0][:160] if str(exc) else 'not installed'})") from None
    try:
        with torch.device("meta"):
            model = torchvision.models.get_model(name, weights=None)
        model = model.to(TRACE_DTYPE).eval()
        trace = _trace_positional(model, IMAGE_SIZE, f"torchvision:{name}", "torchvision")
    except Exception as exc:  # noqa: BLE001
        raise TraceError(f"torchvision:{name}: {type(exc).__name__}: {str(exc)[:200]}") from None
    trace.config = {"max_positions": 0, "hidden_size": 0, "native_dtype": "float32"}
    return trace


def trace_timm(name: str) -> Trace:
    """Trace a timm model (``timm.create_model(name)``, no pretrained weights) on its default input size,
    on meta. Raises ``TraceError`` (timm missing, build or trace failure)."""
    try:
        import timm
    except Exception as exc:  # noqa: BLE001
        raise TraceError(f"timm:{name}: timm unavailable ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0][:160] if str(exc) else 'not installed'})") from None
    try:
        with torch.device("meta"):
            model = timm.create_model(name, pretrained=False)
            side = int((getattr(model, "default_cfg", {}) or {}).get("input_size", (3, 224, 224))[-1])
        model = model.to(TRACE_DTYPE).eval()
        trace = _trace_positional(model, side, f"timm:{name}", "timm")
    except Exception as exc:  # noqa: BLE001
        raise TraceError(f"timm:{name}: {type(exc).__name__}: {str(exc)[:200]}") from None
    trace.config = {"max_positions": 0, "hidden_size": 0, "native_dtype": "float32"}
    return trace


def _trace_positional(model, side: int, name: str, library: str) -> Trace:
    class Wrap(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = model

        def forward(self, pixel_values):
            return self.inner(pixel_values)

    def image(batch, seq):
        return {"pixel_values": torch.empty(batch, 3, side, side, dtype=TRACE_DTYPE, device="meta")}

    return trace_module(Wrap(), image, name, library)
