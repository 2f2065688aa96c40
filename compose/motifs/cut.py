"""Cut motifs out of traced models: connected windows of 2-8 ops around the work kernel engineers fuse.

A *window* is a run of consecutive data calls of one trace (``compose.motifs.trace``: calls that read a model
input or parameter, in call order) that starts and ends with an op and holds ``MIN_OPS``-``MAX_OPS`` ops
(casts, views reads and copies ride along uncounted). A window becomes a motif when:

* its calls form one connected data-flow graph;
* it gives at most ``MAX_OUTPUTS`` tensors that later calls (or the model's result) read, the last call's
  among them, and reads at most ``MAX_INPUTS`` tensors from outside, each of a kind that can be drawn
  (``value_kind``: an activation, a parameter, rotary ``cos`` / ``sin``, an attention mask, token ids);
* it holds at most ``MAX_HEAVY`` GEMM / convolution / attention ops, and a window with one holds at least
  ``MIN_EPILOGUE`` other compute ops (a GEMM with a real epilogue, not a GEMM and one unary);
* it is not all layout (view, transpose, cat), every call has a source form, and every call's result is read
  by a later call or returned (``dead_calls``).

Motifs are keyed by their structure (calls, literals, shapes): the same window in another layer or family
is one motif with several ``sources``. ``category`` names the fusion the motif is (``norm``,
``norm_residual``, ``gated_mlp``, ``rotary``, ``attention``, ``softmax``, ``conv_norm_act``, ``gemm_epilogue``,
``activation``, ``pool_head``, ``embedding``, ``elementwise``, and ``sampling_head`` for the heads of
``compose.motifs.heads``), the first rule of ``CATEGORY_RULES`` that holds.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from opforge.compose.motifs.render import RenderError, Symbols, expression
from opforge.compose.motifs.trace import BATCH, SEQ, Call, Trace, is_overflow_guard, template_refs

MOTIF_VERSION = 1
MIN_OPS, MAX_OPS = 2, 8
MAX_INPUTS = 4
MAX_OUTPUTS = 2
MAX_HEAVY = 2
MIN_EPILOGUE = 2
# Calls that pass their input's values through (up to layout, dtype or a constant factor): walked through to
# find what a constant input holds.
PASS_THROUGH = frozenset({"to", "float", "half", "bfloat16", "type_as", "view", "reshape", "unsqueeze",
                          "squeeze", "expand", "expand_as", "__getitem__", "transpose", "permute", "contiguous",
                          "clone", "repeat", "repeat_interleave", "mul", "__mul__", "__rmul__", "div",
                          "__truediv__", "flatten", "cat", "stack", "narrow", "select", "detach"})
LAYOUT = frozenset({"view", "reshape", "transpose", "permute", "unsqueeze", "squeeze", "expand", "expand_as",
                    "flatten", "unflatten", "cat", "stack", "split", "chunk", "narrow", "select", "__getitem__",
                    "contiguous", "movedim", "repeat", "repeat_interleave", "t", "split_with_sizes",
                    "unbind", "view_as", "reshape_as", "getitem", "tensor_split"})
MASK_OPS = frozenset({"where", "masked_fill", "full", "triu", "tril", "le", "lt", "ge", "gt", "eq", "ne",
                      "logical_and", "logical_or", "logical_not", "__and__", "__or__", "__invert__", "bitwise_and",
                      "bitwise_or", "min", "finfo"})
TRIG = frozenset({"cos", "sin"})
NORM = frozenset({"rsqrt", "layer_norm", "rms_norm", "group_norm", "batch_norm", "instance_norm", "var",
                  "nn.LayerNorm", "nn.GroupNorm", "nn.BatchNorm1d", "nn.BatchNorm2d", "nn.RMSNorm",
                  "nn.InstanceNorm2d", "norm", "std", "var_mean"})
ACT = frozenset({"silu", "gelu", "relu", "tanh", "sigmoid", "softplus", "mish", "hardswish", "hardsigmoid",
                 "leaky_relu", "elu", "selu", "relu6", "quick_gelu", "nn.SiLU", "nn.GELU", "nn.ReLU", "nn.Tanh",
                 "nn.Sigmoid", "nn.Hardswish", "nn.ReLU6", "nn.Mish", "nn.LeakyReLU", "nn.ELU", "nn.Softplus",
                 "nn.Hardsigmoid", "nn.SELU", "erf"})
POOL = frozenset({"adaptive_avg_pool2d", "avg_pool2d", "max_pool2d", "nn.AdaptiveAvgPool2d", "nn.AvgPool2d",
                  "nn.MaxPool2d", "nn.AdaptiveAvgPool1d"})
CONV = frozenset({"conv1d", "conv2d", "nn.Conv1d", "nn.Conv2d", "nn.Conv3d", "conv3d"})
CATEGORY_RULES = (
    ("attention", lambda c: "softmax" in c and c & {"matmul", "bmm", "baddbmm", "einsum"}),
    ("rotary", lambda c: "trig_input" in c and ("neg" in c or "cat" in c or "stack" in c)),
    ("sampling_head", lambda c: c & {"sort", "topk"} and "masked_fill" in c and c & {"softmax", "log_softmax"}),
    ("conv_norm_act", lambda c: c & CONV and c & (NORM | ACT)),
    ("gated_mlp", lambda c: c & ACT and "gate" in c),
    ("norm_residual", lambda c: c & NORM and "residual" in c),
    ("norm", lambda c: c & NORM),
    ("softmax", lambda c: c & {"softmax", "log_softmax", "logsumexp"}),
    ("pool_head", lambda c: c & POOL and c & {"linear", "nn.Linear", "flatten"}),
    ("embedding", lambda c: c & {"embedding", "nn.Embedding"}),
    ("gemm_epilogue", lambda c: "heavy" in c),
    ("activation", lambda c: c & ACT),
    ("elementwise", lambda c: True),
)


@dataclass
class Motif:
    """A window of traced calls with what it reads and gives (all value ids are those of its trace).

    Attributes:
        motif_id: hash of the structure (calls, literals, input shapes, dtypes). sources: ``library:model``
            names where it was found; scopes: module paths of its calls in the first source (``layers.0.mlp``)
            and their classes (``LlamaMLP``).
        calls: ``motif_trace.Call`` fields of each call, in order. inputs: ``{vid, shape, dtype, kind, bound,
            name}`` of each tensor read from outside (activations, constants); params: ``{vid, name, shape,
            dtype}`` of each parameter read directly (not inside an ``nn`` module). outputs: value ids returned.
        batch / seq: the trace's sentinel sizes (``seq`` 0 without a sequence axis). max_positions: the
            family's longest sequence (0: none). native_dtype: the dtype the family runs in.
        n_ops: ops (counted calls). n_heavy: GEMM / conv / attention ops. category: ``CATEGORY_RULES``.
        flops / bytes_per_op / bytes_fused: FLOPs, the bytes the ops move one by one and the bytes one fused
            kernel moves (inputs, parameters and outputs once), at the traced shapes in ``float16``.
    """

    motif_id: str
    sources: list[str]
    scopes: list[str]
    scope_classes: list[str]
    calls: list[dict]
    inputs: list[dict]
    params: list[dict]
    outputs: list[int]
    batch: int
    seq: int
    max_positions: int
    native_dtype: str
    n_ops: int
    n_heavy: int
    category: str
    flops: float = 0.0
    bytes_per_op: float = 0.0
    bytes_fused: float = 0.0
    library: str = ""
    tags: list[str] = field(default_factory=list)

    def fusion_gain(self) -> float:
        """Bytes moved op by op over bytes moved by one fused kernel (a memory-bound roofline ratio)."""
        return self.bytes_per_op / self.bytes_fused if self.bytes_fused else 1.0

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Motif:
        names = {f.name for f in dataclasses.fields(cls)}
        missing = [f.name for f in dataclasses.fields(cls) if f.name not in d and f.default is dataclasses.MISSING
                   and f.default_factory is dataclasses.MISSING]
        if missing:
            raise ValueError(f"motif {d.get('motif_id', '?')}: missing field(s) {', '.join(missing)}")
        return cls(**{k: v for k, v in d.items() if k in names})


def _nbytes(shape, dtype: str) -> int:
    size = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int64": 8, "int32": 4, "bool": 1,
            "int8": 1, "uint8": 1}.get(dtype, 4)
    n = 1
    for d in shape:
        n *= int(d)
    return n * size


def value_kind(trace: Trace, vid: int, users: dict[int, list[int]]) -> tuple[str, int]:
    """How to draw a value read from outside a motif: (kind, index bound). Kinds: ``normal``, ``trig``,
    ``mask``, ``bool_mask``, ``index``; ``""`` when it cannot be drawn (a constant of unknown meaning)."""
    val = trace.values[vid]
    bound = 0
    for u in users.get(vid, []):
        c = trace.calls[u]
        if c.index_bound:
            bound = c.index_bound
        elif c.name == "embedding" and c.inputs() and c.inputs()[0] == vid and len(c.inputs()) > 1:
            bound = trace.values[c.inputs()[1]].shape[0]
    if val.dtype in ("int64", "int32"):
        return ("index", bound) if bound else ("", 0)
    if val.dtype == "bool":
        return "bool_mask", 0
    if val.data:
        return "normal", 0
    seen = 0
    v = val
    while v.origin == "call" and seen < 12:
        c = trace.calls[v.producer]
        if c.name in TRIG or c.canonical in TRIG:
            return "trig", 0
        if c.name in MASK_OPS or c.canonical in MASK_OPS:
            return "mask", 0
        if c.name not in PASS_THROUGH and c.canonical not in PASS_THROUGH:
            return "", 0
        ins = [i for i in c.inputs() if trace.values[i].dtype not in ("int64", "bool")]
        if not ins:
            return "", 0
        v = trace.values[ins[0]]
        seen += 1
    return "", 0


def _canon(c: Call) -> str:
    return c.canonical if c.kind == "module" else (c.canonical or c.name)


def _signature(calls: list[Call], inputs: list[dict], params: list[dict], outputs: list[int]) -> str:
    remap: dict[int, int] = {}
    for d in inputs + params:
        remap.setdefault(d["vid"], len(remap))
    for c in calls:
        for o in c.outputs:
            if o is not None:
                remap.setdefault(o, len(remap))

    def norm(obj):
        if isinstance(obj, dict):
            if "T" in obj and len(obj) == 1:
                return {"T": remap.get(obj["T"], -1)}
            return {k: norm(v) for k, v in obj.items()}
        if isinstance(obj, list):
            return [norm(v) for v in obj]
        return obj

    body = [[c.name, c.spelling, c.module, norm(c.args), norm(c.kwargs)] for c in calls]
    ins = [[d["shape"], d["dtype"], d.get("kind", "param")] for d in inputs + params]
    return hashlib.sha256(json.dumps([body, ins, [remap.get(o) for o in outputs]], sort_keys=True,
                                     default=str).encode()).hexdigest()[:16]


def _connected(calls: list[Call], produced: dict[int, int]) -> bool:
    parent = list(range(len(calls)))

    def find(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    pos = {c.index: i for i, c in enumerate(calls)}
    for i, c in enumerate(calls):
        for v in c.inputs():
            if v in produced:
                parent[find(i)] = find(pos[produced[v]])
    return len({find(i) for i in range(len(calls))}) == 1


def _categories(trace: Trace, calls: list[Call], inputs: list[dict]) -> set[str]:
    c = {_canon(x) for x in calls} | {x.name for x in calls}
    if any(i["kind"] == "trig" for i in inputs):
        c.add("trig_input")
    if any(x.heavy for x in calls):
        c.add("heavy")
    produced = {o for x in calls for o in x.outputs if o is not None}
    act_out = {o for x in calls if _canon(x) in ACT or x.name in ACT for o in x.outputs if o is not None}
    for x in calls:
        if x.name in ("mul", "__mul__") and len(x.inputs()) == 2 and set(x.inputs()) & act_out:
            c.add("gate")
        if x.name in ("add", "__add__") and len(x.inputs()) == 2:
            a, b = (trace.values[v] for v in x.inputs())
            if a.shape == b.shape and a.data and b.data and (a.vid not in produced or b.vid not in produced):
                c.add("residual")
    return c


def cut_motifs(trace: Trace) -> list[Motif]:
    """Every motif of one trace (see the module docstring), in trace order; duplicates within the trace
    (repeated layers) are kept once."""
    users = trace.users()
    final = set(trace.outputs)
    data_calls = [c for c in trace.calls if c.data]
    out: dict[str, Motif] = {}
    for i in range(len(data_calls)):
        n_ops = 0
        for j in range(i, len(data_calls)):
            c = data_calls[j]
            if c.spelling == "unsupported" or c.name in ("__setitem__", "copy_"):
                break
            n_ops += c.counted
            if n_ops > MAX_OPS:
                break
            if not c.counted or n_ops < MIN_OPS:
                continue
            m = _window(trace, data_calls[i:j + 1], users, final)
            if m is not None and m.motif_id not in out:
                out[m.motif_id] = m
    return list(out.values())


# Calls dropped from a window when they read a motif input (a fresh, contiguous tensor of the task's dtype):
# a copy or a device move there is a no-op a kernel may skip.
ELIDE_ON_INPUT = frozenset({"contiguous", "clone", "detach"})
_IDENTITY_SCALARS = {"mul": 1, "__mul__": 1, "__rmul__": 1, "div": 1, "__truediv__": 1, "add": 0, "__add__": 0,
                     "__radd__": 0, "sub": 0, "__sub__": 0, "pow": 1, "__pow__": 1}
SCORE_PRODUCERS = frozenset({"matmul", "bmm", "__matmul__", "einsum", "baddbmm"})


def _identity_scalar(c: Call) -> bool:
    """A call that multiplies / divides by 1, adds / subtracts 0 or raises to the power 1."""
    if c.name not in _IDENTITY_SCALARS or len(c.args) != 2:
        return False
    b = c.args[1]
    b = b.get("lit", b) if isinstance(b, dict) else b
    return isinstance(b, (int, float)) and not isinstance(b, bool) and b == _IDENTITY_SCALARS[c.name]


def _elide(trace: Trace, calls: list[Call]) -> list[Call]:
    """``calls`` without the no-op copies of motif inputs (``ELIDE_ON_INPUT``), argument-less ``.to()`` (a
    device move) and float16 overflow guards (``is_overflow_guard``); later references to their outputs point
    at their inputs."""
    produced = {o for c in calls for o in c.outputs if o is not None}
    alias: dict[int, int] = {}
    kept = []
    for c in calls:
        c = dataclasses.replace(c, args=_subst(c.args, alias), kwargs=_subst(c.kwargs, alias))
        ins = c.inputs()
        plain_to = c.name == "to" and not [a for a in c.args[1:] if not (isinstance(a, dict) and "device" in a)] \
            and all(isinstance(v, dict) and "device" in v for v in c.kwargs.values())
        if len(ins) == 1 and len(c.outputs) == 1 and c.outputs[0] is not None and \
                ((c.name in ELIDE_ON_INPUT and ins[0] not in produced) or plain_to or
                 is_overflow_guard(c.name, c.args, c.kwargs)):
            alias[c.outputs[0]] = ins[0]
            continue
        kept.append(c)
    return kept


def _subst(obj, alias: dict[int, int]):
    if not alias:
        return obj
    if isinstance(obj, dict):
        if "T" in obj and len(obj) == 1:
            return {"T": alias.get(obj["T"], obj["T"])}
        return {k: _subst(v, alias) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_subst(v, alias) for v in obj]
    return obj


def _input_scale(trace: Trace, vid: int) -> float:
    """Spread of an activation read from outside: ``sqrt(K)`` for a product of two activations over an inner
    size K (attention scores before their scaling), 1 otherwise (normalised activations, GEMM outputs with
    fan-in-scaled weights)."""
    v = trace.values[vid]
    if v.origin != "call":
        return 1.0
    c = trace.calls[v.producer]
    if c.name in SCORE_PRODUCERS or c.canonical in SCORE_PRODUCERS:
        ins = c.inputs()
        if ins and not any(trace.values[i].origin == "param" for i in ins):
            k = trace.values[ins[0]].shape[-1] if trace.values[ins[0]].shape else 1
            return float(max(1, k)) ** 0.5
    return 1.0


def _window(trace: Trace, calls: list[Call], users, final) -> Motif | None:
    if any(_identity_scalar(c) for c in calls):
        return None
    idx = {c.index for c in calls}  # the window's calls, elided ones too: reading a value is not using it later
    window = calls
    calls = _elide(trace, calls)
    if not calls:
        return None
    kept = {c.index for c in calls}
    # a value an elided call passes on (a copy, a device move) is used later when that call's output is used
    # later or returned
    passed_on = {v for c in window if c.index not in kept for o in c.outputs if o is not None
                 and ([u for u in users.get(o, []) if u not in idx] or o in final) for v in c.inputs()}
    produced = {o: c.index for c in calls for o in c.outputs if o is not None}
    if not _connected(calls, produced):
        return None
    last = calls[-1].index
    outputs = []
    for v in produced:
        later = [u for u in users.get(v, []) if u not in idx]
        if later or v in final or v in passed_on:
            outputs.append(v)
    if not outputs or len(outputs) > MAX_OUTPUTS or not any(produced[o] == last for o in outputs):
        return None
    if not all(trace.values[o].boundary for o in outputs):
        return None
    if not all(trace.values[o].dtype in ("float16", "float32", "bfloat16") for o in outputs):
        return None  # a fusion gives activations, not index or mask bookkeeping
    inputs, params = [], []
    for c in calls:
        for v in c.inputs():
            if v in produced or any(d["vid"] == v for d in inputs + params):
                continue
            val = trace.values[v]
            if val.origin == "param":
                params.append({"vid": v, "name": val.name, "shape": list(val.shape), "dtype": val.dtype,
                               "vary": [False] * len(val.shape)})
                continue
            kind, bound = value_kind(trace, v, users)
            if not kind or (val.data and not val.boundary):
                return None
            inputs.append({"vid": v, "shape": list(val.shape), "dtype": val.dtype, "kind": kind,
                           "bound": int(bound), "name": _input_name(trace, v, kind), "vary": list(val.vary),
                           "scale": _input_scale(trace, v) if kind == "normal" else 1.0})
    if len(inputs) > MAX_INPUTS or not inputs:
        return None
    counted = [c for c in calls if c.counted]
    heavy = [c for c in counted if c.heavy]
    compute = [c for c in counted if not c.heavy and _canon(c) not in LAYOUT and c.name not in LAYOUT]
    if calls[-1] not in heavy and calls[-1] not in compute:
        return None  # a window ends with compute, not with a view, cast or copy of its result
    if len(heavy) > MAX_HEAVY or not compute or (heavy and len(compute) < MIN_EPILOGUE):
        return None
    if any(c.kind == "module" and not c.module for c in calls):
        return None
    names = {d["vid"]: f"a{k}" for k, d in enumerate(inputs + params)}
    names.update({o: "t" for o in produced})
    sym = Symbols(BATCH, SEQ)
    try:
        for c in calls:
            expression(dataclasses.asdict(c), sym, names, "m")
    except (RenderError, KeyError):
        return None
    cats = _categories(trace, calls, inputs)
    category = next(name for name, rule in CATEGORY_RULES if rule(cats))
    flops = sum(c.flops for c in calls)
    per_op = 0.0
    for c in counted:
        per_op += sum(_nbytes(trace.values[v].shape, trace.values[v].dtype) for v in c.inputs())
        per_op += sum(_nbytes(trace.values[o].shape, trace.values[o].dtype) for o in c.outputs if o is not None)
    fused = sum(_nbytes(d["shape"], d["dtype"]) for d in inputs + params)
    fused += sum(_nbytes(trace.values[o].shape, trace.values[o].dtype) for o in outputs)
    has_seq = any(_moves_with_seq(d["shape"], d.get("vary")) for d in inputs) or \
        any(_mentions(c, SEQ) for c in calls)
    motif_id = _signature(calls, inputs, params, outputs)
    motif = Motif(
        motif_id=motif_id, sources=[trace.model], scopes=list(dict.fromkeys(c.scope for c in calls)),
        scope_classes=list(dict.fromkeys(c.scope_class for c in calls if c.scope_class)),
        calls=[dataclasses.asdict(c) for c in calls], inputs=inputs, params=params, outputs=outputs,
        batch=BATCH, seq=SEQ if has_seq else 0, max_positions=int(trace.config.get("max_positions", 0)),
        native_dtype=str(trace.config.get("native_dtype", "float32")), n_ops=len(counted), n_heavy=len(heavy),
        category=category, flops=flops, bytes_per_op=float(per_op), bytes_fused=float(fused),
        library=trace.library, tags=sorted(t for t in cats if t in ("residual", "gate", "heavy", "trig_input")))
    return None if dead_calls(motif) else motif


def dead_calls(m: Motif) -> list[str]:
    """Names of the calls of ``m`` whose results neither a later call of the motif reads nor the motif returns
    (a value the model only tested in Python, such as ``isfinite(x).all()`` in an ``if``): a rendered task would
    compute and discard them."""
    read: set[int] = set()
    for c in m.calls:
        read |= set(template_refs(c["args"])) | set(template_refs(c["kwargs"]))
    outs = set(m.outputs)
    return [c["name"] for c in m.calls if not any(o is not None and (o in read or o in outs) for o in c["outputs"])]


def _moves_with_seq(shape, vary) -> bool:
    """A dim that changed between the two traces and is a multiple of the sequence sentinel."""
    vary = vary if vary is not None and len(vary) == len(shape) else [True] * len(shape)
    return any(v and int(d) % SEQ == 0 for d, v in zip(shape, vary, strict=True))


def _mentions(c: Call, n: int) -> bool:
    """An integer literal of ``c`` (not a model constant, ``{"lit": v}``) that is a multiple of ``n``."""
    def walk(x):
        if isinstance(x, bool):
            return False
        if isinstance(x, int):
            return x != 0 and x % n == 0
        if isinstance(x, list):
            return any(walk(v) for v in x)
        if isinstance(x, dict):
            return not ("lit" in x or "T" in x) and any(walk(v) for v in x.values())
        return False

    return walk(c.args) or walk(c.kwargs)


def _input_name(trace: Trace, vid: int, kind: str) -> str:
    if kind == "trig":
        v = trace.values[vid]
        for _ in range(12):
            if v.origin != "call":
                break
            c = trace.calls[v.producer]
            if c.name in TRIG:
                return c.name
            ins = c.inputs()
            if not ins:
                break
            v = trace.values[ins[0]]
        return "freqs"
    return {"mask": "mask", "bool_mask": "mask", "index": "ids"}.get(kind, "")


# ---- the motif library ----

def merge(motifs: list[Motif], more: list[Motif]) -> list[Motif]:
    """``motifs`` with ``more`` added; a motif already present gains the new sources."""
    by_id = {m.motif_id: m for m in motifs}
    for m in more:
        if m.motif_id in by_id:
            have = by_id[m.motif_id]
            have.sources = list(dict.fromkeys(have.sources + m.sources))
        else:
            by_id[m.motif_id] = m
            motifs.append(m)
    return motifs


def write_library(motifs: list[Motif], path: Path, meta: dict) -> Path:
    """Write the motif library (gzip JSON: ``version``, ``meta`` (libraries traced, skipped models),
    ``motifs``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"version": MOTIF_VERSION, "meta": meta, "motifs": [m.to_dict() for m in motifs]}
    with gzip.open(path, "wt", encoding="utf-8") as f:
        json.dump(payload, f, separators=(",", ":"), default=str)
    return path


class MotifLibraryError(ValueError):
    """A motif library file is missing or malformed; the message names the file and the field."""


def read_library(path: Path) -> tuple[list[Motif], dict]:
    """(motifs, meta) of a library written by ``write_library``. Raises ``MotifLibraryError``."""
    path = Path(path)
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise MotifLibraryError(f"{path}: no such motif library (build one with `opforge motifs`)") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise MotifLibraryError(f"{path}: not a gzip JSON motif library ({exc})") from None
    if not isinstance(data, dict) or data.get("version") != MOTIF_VERSION:
        raise MotifLibraryError(f"{path}: field 'version': expected {MOTIF_VERSION}, got "
                                f"{data.get('version') if isinstance(data, dict) else type(data).__name__!r}")
    try:
        return [Motif.from_dict(d) for d in data["motifs"]], data.get("meta", {})
    except (KeyError, TypeError, ValueError) as exc:
        raise MotifLibraryError(f"{path}: field 'motifs': {exc}") from None
