"""Render a motif (a window of traced calls, ``compose.motifs.cut.Motif``) as a self-contained KernelBench task.

The task's ``Model`` holds the motif's parameters (``nn.Parameter``, trained-like values: a norm scale
``N(1, 0.1^2)``, a bias ``N(0, 0.02^2)``, a matrix ``N(0, 1 / fan_in)`` as ``nn.Linear`` / ``nn.Conv``
initialise theirs in scale) and its ``torch.nn`` modules (their constructor from the traced module's
``extra_repr``, less the keyword arguments at their default, ``module_source``; normalisation layers get the
trained-like statistics of ``compose.source``), and its
``forward`` makes the motif's calls in trace order. Integer literals and shapes built from the trace's
sentinel sizes become ``batch_size`` / ``seq_len`` (module-level constants) and a ``float16`` literal the
task's dtype (``compose.motifs.trace``), so the same motif renders at any batch, sequence length and dtype.

Inputs are drawn by the kind the miner found for them (``Motif.inputs[i]["kind"]``): ``normal``
(activations: ``randn``), ``trig`` (``cos`` / ``sin`` values: uniform in [-1, 1]), ``mask`` (an additive
attention mask: causal when its last two sizes are equal, else 10 % of keys masked, with the dtype's lowest
value as transformers' eager masks use), ``bool_mask`` and ``index`` (``randint`` below the embedding size).
"""

from __future__ import annotations

import ast
import inspect
import math
import re
from functools import lru_cache

from opforge.compose.motifs.trace import is_overflow_guard, template_refs
from opforge.compose.source import _norm_state_lines, task_source
from opforge.task.op_names import snake

TASK_DTYPE = "DTYPE"  # placeholder of the task's dtype in rendered expressions
_BINARY = {"add": "+", "sub": "-", "mul": "*", "div": "/", "matmul": "@", "pow": "**"}
_DUNDER = {"__add__": "+", "__sub__": "-", "__mul__": "*", "__truediv__": "/", "__matmul__": "@",
           "__pow__": "**", "__mod__": "%", "__floordiv__": "//", "__and__": "&", "__or__": "|",
           "__xor__": "^", "__gt__": ">", "__lt__": "<", "__ge__": ">=", "__le__": "<=", "__eq__": "==",
           "__ne__": "!="}
_RDUNDER = {"__radd__": "+", "__rsub__": "-", "__rmul__": "*", "__rtruediv__": "/", "__rpow__": "**",
            "__rmatmul__": "@"}


class RenderError(ValueError):
    """A motif call cannot be written as source (an unsupported argument or operator)."""


# Keyword arguments a newer torch added to ``nn`` constructors, with the default it gave them: the motif library
# was traced on torch 2.13, whose ``nn.BatchNorm*d`` and ``nn.GroupNorm`` take ``bias`` (default True; an older
# torch's affine norm always has a bias). ``module_source`` drops such a keyword at that default where this
# torch's constructor lacks it.
ADDED_KWARG_DEFAULTS = {"bias": True}


@lru_cache(maxsize=4096)
def module_source(source: str) -> str:
    """``nn.X(...)`` constructor source without its keyword arguments whose literal value equals (same type
    and value) the default of that parameter in this torch's ``nn.X.__init__``: ``nn.BatchNorm1d(384,
    eps=1e-05, momentum=0.1, affine=True, bias=True, track_running_stats=True)`` -> ``nn.BatchNorm1d(384)``.
    An ``extra_repr`` lists every argument, also those a newer torch added (BatchNorm's and GroupNorm's
    ``bias``), which an older torch's constructor rejects; written as a model author writes it, the
    constructor builds the same module on both. A keyword this torch's constructor lacks is dropped too when it
    holds the default the torch that added it gave it (``ADDED_KWARG_DEFAULTS``), and kept otherwise (the
    constructor then raises: that module cannot be built here). Source that is not such a call is returned
    unchanged."""
    import torch

    try:
        tree = ast.parse(source, mode="eval")
        call = tree.body
        if not isinstance(call, ast.Call) or not call.keywords:
            return source
        cls = eval(ast.unparse(call.func), {"nn": torch.nn, "torch": torch})  # noqa: S307 - nn.X of the trace
        params = inspect.signature(cls.__init__).parameters
    except (SyntaxError, AttributeError, NameError, TypeError, ValueError):
        return source
    keep = []
    for kw in call.keywords:
        p = params.get(kw.arg) if kw.arg else None
        try:
            value = ast.literal_eval(kw.value)
        except ValueError:
            keep.append(kw)
            continue
        if p is None and not any(q.kind is inspect.Parameter.VAR_KEYWORD for q in params.values()) \
                and kw.arg in ADDED_KWARG_DEFAULTS and type(value) is type(ADDED_KWARG_DEFAULTS[kw.arg]) \
                and value == ADDED_KWARG_DEFAULTS[kw.arg]:
            continue
        if p is None or p.default is inspect.Parameter.empty or type(value) is not type(p.default) \
                or value != p.default:
            keep.append(kw)
    call.keywords = keep
    return ast.unparse(tree)


class Symbols:
    """Maps traced integers to size expressions: ``batch`` / ``seq`` are the trace's sentinel sizes."""

    def __init__(self, batch: int, seq: int | None):
        self.batch, self.seq = batch, seq

    def expr(self, v: int) -> str:
        """``v`` as an expression of ``batch_size`` / ``seq_len`` when it is built from the sentinels."""
        if isinstance(v, bool) or not isinstance(v, int) or abs(v) < 2:
            return repr(v)
        forms = []
        b, s = self.batch, self.seq
        if s:
            forms += [(b * s, "batch_size * seq_len"), (s * s, "seq_len * seq_len"), (s, "seq_len")]
        forms.append((b, "batch_size"))
        for m, text in forms:
            if v % m == 0:
                c = v // m
                if b and c % b == 0 or s and c % s == 0:
                    continue
                return text if c == 1 else f"{text} * {c}"
        return repr(v)


def literal(obj, sym: Symbols, names: dict[int, str], in_index: bool = False) -> str:
    """Source of one argument template (``compose.motifs.trace._Recorder.encode``)."""
    if isinstance(obj, bool) or obj is None or isinstance(obj, str):
        return repr(obj)
    if isinstance(obj, int):
        return sym.expr(obj)
    if isinstance(obj, float):
        return repr(obj)
    if isinstance(obj, list):
        return "[" + ", ".join(literal(v, sym, names) for v in obj) + "]"
    if isinstance(obj, dict):
        if "T" in obj:
            return names[obj["T"]]
        if "lit" in obj:
            return repr(obj["lit"])
        if "tuple" in obj:
            items = [literal(v, sym, names, in_index) for v in obj["tuple"]]
            if in_index:
                return ", ".join(items) if len(items) != 1 else items[0] + ","
            return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
        if "slice" in obj:
            a, b, c = (literal(v, sym, names) if v is not None else "" for v in obj["slice"])
            if in_index:
                return f"{a}:{b}" + (f":{c}" if c else "")
            return f"slice({a or None}, {b or None}, {c or None})"
        if "ellipsis" in obj:
            return "..."
        if "dtype" in obj:
            return TASK_DTYPE if obj["dtype"] == "float16" else f"torch.{obj['dtype']}"
        if "float" in obj:
            return f"float('{obj['float']}')"
        if "memory_format" in obj:
            return f"torch.{obj['memory_format']}"
    raise RenderError(f"argument {obj!r} has no source form")


def _strip_device(args: list, kwargs: dict) -> tuple[list, dict]:
    args = [a for a in args if not (isinstance(a, dict) and "device" in a)]
    kwargs = {k: v for k, v in kwargs.items() if not (isinstance(v, dict) and "device" in v)}
    return args, kwargs


def expression(call: dict, sym: Symbols, names: dict[int, str], module_attr: str = "") -> str:
    """Source expression of one traced call (a dict of ``motif_trace.Call`` fields)."""
    args, kwargs = _strip_device(call["args"], call["kwargs"])
    kwargs = {k: v for k, v in kwargs.items() if k not in ("inplace", "_stacklevel")}
    name, spelling = call["name"], call["spelling"]
    lit = [literal(a, sym, names) for a in args]
    kw = [f"{k}={literal(v, sym, names)}" for k, v in kwargs.items()]
    if spelling == "module":
        return f"self.{module_attr}({', '.join(lit + kw)})"
    if spelling == "operator":
        if name == "__getitem__":
            return f"{lit[0]}[{literal(args[1], sym, names, in_index=True)}]"
        if name in _DUNDER and len(lit) == 2:
            return f"{_wrap(lit[0])} {_DUNDER[name]} {_wrap(lit[1])}"
        if name in _RDUNDER and len(lit) == 2:
            return f"{_wrap(lit[1])} {_RDUNDER[name]} {_wrap(lit[0])}"
        if name == "__neg__":
            return f"-{_wrap(lit[0])}"
        raise RenderError(f"operator {name} has no source form")
    if spelling == "method":
        base = name[:-1] if name.endswith("_") and not name.startswith("_") else name
        if base in _BINARY and len(lit) == 2 and not kw:
            return f"{_wrap(lit[0])} {_BINARY[base]} {_wrap(lit[1])}"
        if base.startswith("_"):
            raise RenderError(f"private method {name}")
        return f"{_wrap(lit[0])}.{base}({', '.join(lit[1:] + kw)})"
    if spelling.startswith(("F.", "torch.")):
        return f"{spelling}({', '.join(lit + kw)})"
    raise RenderError(f"call {name} ({spelling}) has no source form")


def _wrap(text: str) -> str:
    return text if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*(\[[^\]]*\])?|-?[0-9.e+-]+", text) else f"({text})"


def call_expression_fn(trace, call):
    """A callable running ``call`` alone on tensors of its traced input shapes, and those tensors (meta)."""
    import dataclasses

    import torch
    import torch.nn.functional as F
    from torch import nn

    vids = call.inputs()
    names = {v: f"a{i}" for i, v in enumerate(vids)}
    d = dataclasses.asdict(call)
    ns = {"torch": torch, "F": F, "nn": nn, TASK_DTYPE: torch.float16, "math": math}
    if call.kind == "module":
        if not call.module:
            raise RenderError(f"module {call.name} is not public in torch.nn")
        with torch.device("meta"):
            ns["self"] = type("S", (), {"m": eval(call.module, ns).to(torch.float16)})()  # noqa: S307
    expr = expression(d, Symbols(0, None), names, module_attr="m")
    fn = eval(f"lambda {', '.join(names.values())}: {expr}", ns)  # noqa: S307 - our own rendered source
    tensors = []
    for v in vids:
        val = trace.values[v]
        dt = getattr(torch, val.dtype)
        if dt.is_floating_point:
            tensors.append(torch.empty(val.shape, dtype=dt, device="meta"))
        else:
            tensors.append(torch.zeros(val.shape, dtype=dt, device="meta"))
    return fn, tensors


# ---- whole tasks ----

def _shape(shape, sym: Symbols, vary=None) -> str:
    """Dims that vary with batch / sequence length as size expressions, the others as numbers."""
    vary = vary if vary is not None and len(vary) == len(shape) else [True] * len(shape)
    return ", ".join(sym.expr(int(d)) if v else repr(int(d)) for d, v in zip(shape, vary, strict=True))


_SCALE_NAMES = ("weight", "gamma", "scale", "alpha", "g", "ls", "layer_scale", "lambda")


def _param_init(p: dict, sym: Symbols) -> str:
    """Trained-like values of a parameter read directly by the motif: a vector (one non-unit dim) named like a
    scale (``weight``, ``gamma``, ``layer_scale``...) ~ N(1, 0.1^2), any other vector (a bias, a shift) ~
    N(0, 0.1^2) (the magnitudes ``compose.source`` gives normalisation state), a matrix ~ N(0, 1 / fan_in)."""
    shape = p["shape"]
    dims = _shape(shape, sym, [False] * len(shape)) or "()"
    leaf = re.sub(r"_?\d+$", "", p["name"].split(".")[-1].lower())
    if sum(1 for d in shape if int(d) != 1) <= 1:
        if leaf in _SCALE_NAMES or leaf.endswith(("weight", "scale", "gamma")):
            return f"torch.randn({dims}) * 0.1 + 1.0"
        return f"torch.randn({dims}) * 0.1"
    fan_in = math.prod(int(d) for d in shape[1:])
    return f"torch.randn({dims}) * {1 / math.sqrt(max(fan_in, 1)):.6g}"


def _input_factory(inp: dict, sym: Symbols) -> str:
    shape = inp["shape"]
    vary = inp.get("vary")
    dims = _shape(shape, sym, vary)
    vary = vary if vary is not None and len(vary) == len(shape) else [True] * len(shape)

    def dim(k):
        return sym.expr(int(shape[k])) if vary[k] else repr(int(shape[k]))

    kind = inp["kind"]
    float_dt = TASK_DTYPE if inp["dtype"] == "float16" else f"torch.{inp['dtype']}"
    if kind == "index":
        dt = "" if inp["dtype"] == "int64" else f", dtype=torch.{inp['dtype']}"
        return f"torch.randint(0, {int(inp.get('bound') or 2)}, ({dims},){dt})"
    square = len(shape) >= 2 and shape[-1] == shape[-2]
    if kind == "bool_mask":
        if square:
            a, b = dim(-2), dim(-1)
            return f"torch.ones({a}, {b}, dtype=torch.bool).tril().expand({dims}).contiguous()"
        return f"torch.rand({dims}) > 0.1"
    if kind == "mask":
        if square:
            a, b = dim(-2), dim(-1)
            where = f"torch.ones({a}, {b}, dtype=torch.bool).triu(1)"
        else:
            where = f"torch.rand({dims}) < 0.1"
        return f"torch.zeros({dims}, dtype={float_dt}).masked_fill({where}, torch.finfo({float_dt}).min)"
    if kind == "trig":
        return f"torch.rand({dims}, dtype={float_dt}) * 2 - 1"
    scale = float(inp.get("scale") or 1.0)
    if scale != 1.0:
        return f"torch.randn({dims}, dtype={float_dt}) * {scale:.6g}"
    return f"torch.randn({dims}, dtype={float_dt})"


def _attr(name: str, used: set[str]) -> str:
    base = re.sub(r"[^0-9a-zA-Z_]", "_", name) or "m"
    if base[0].isdigit():
        base = "m_" + base
    attr, k = base, 1
    while attr in used or attr in ("forward", "training"):
        attr, k = f"{base}_{k}", k + 1
    used.add(attr)
    return attr


INPUT_NAMES = ("x", "y", "z", "w", "u", "v", "s", "t")
# Calls that return a tuple whatever its length: a traced one-element result (``unbind`` of a dim of size 1) is
# the tuple's first element, not the tuple.
TUPLE_RESULT = frozenset({"unbind", "split", "split_with_sizes", "chunk", "tensor_split", "unsafe_split"})
# Casts written out in a model (``x.to(torch.float32)`` before a norm in a bf16 model): left out where the task's
# dtype makes them a cast to the dtype the value already has (a pure copy a kernel may skip).
SAME_DTYPE_CASTS = frozenset({"to", "float", "half", "bfloat16", "type_as", "type"})
# Contiguity of a traced value, inferred while rendering (the trace records shapes, not strides): views that keep
# a contiguous input contiguous; calls whose output is dense whatever the input's layout; calls whose output may
# be a strided view. Any other call's output is contiguous when all its tensor inputs are (elementwise ops and
# reductions allocate their outputs in their inputs' layout).
CONTIGUOUS_KEEPING_VIEWS = frozenset({"view", "reshape", "flatten", "unflatten", "unsqueeze", "squeeze", "view_as",
                                      "reshape_as", "contiguous"})
DENSE_OUTPUT = frozenset({"linear", "matmul", "__matmul__", "mm", "bmm", "addmm", "baddbmm", "layer_norm",
                          "rms_norm", "embedding", "Linear", "LayerNorm", "RMSNorm", "Embedding"})
STRIDED_OUTPUT = frozenset({"transpose", "permute", "expand", "expand_as", "__getitem__", "narrow", "split",
                            "split_with_sizes", "chunk", "t", "movedim", "moveaxis", "swapaxes", "select", "unbind",
                            "unfold", "diagonal", "as_strided", "einsum", "tensor_split"})


def output_contiguous(call: dict, contiguous: set[int]) -> bool:
    """Whether ``call``'s outputs are contiguous, given the value ids known ``contiguous`` (see
    ``CONTIGUOUS_KEEPING_VIEWS``, ``DENSE_OUTPUT``, ``STRIDED_OUTPUT``)."""
    name = call["name"]
    if name == "contiguous" or name in DENSE_OUTPUT:
        return True
    if name in STRIDED_OUTPUT:
        return False
    ins = template_refs(call["args"]) + template_refs(call["kwargs"])
    return bool(ins) and all(i in contiguous for i in ins)


def render_motif(motif, batch: int, seq: int | None, dtype: str, docstring: str) -> str:
    """KernelBench source of ``motif`` at ``batch`` x ``seq`` (``seq`` ignored by a motif without a sequence
    axis) in ``dtype`` (``float32``, ``bfloat16`` or ``float16``). A ``.contiguous()`` of a value that is
    contiguous at these sizes is left out (inferred while rendering, ``output_contiguous``, then checked by one
    run of the source on ``meta``): a copy that copies nothing is no work for a kernel. An output that is an
    input unchanged, or the value of an earlier output again, is not returned. Raises ``RenderError`` for a call with no source form, or when every output
    is an input unchanged."""
    copies: list[int] = []
    code = _render(motif, batch, seq, dtype, docstring, frozenset(), copies)
    if not copies:
        return code
    try:
        noop = _noop_copies(code)
    except Exception:  # noqa: BLE001 - a source that does not run on meta: kept as rendered (the filters judge it)
        return code
    if len(noop) != len(copies) or not any(noop):
        return code
    return _render(motif, batch, seq, dtype, docstring, frozenset(c for c, n in zip(copies, noop, strict=True) if n),
                   [])


def _noop_copies(code: str) -> list[bool]:
    """Per ``.contiguous()`` call of one forward of ``code`` on ``meta``, in order: whether its input was
    contiguous already."""
    import torch
    from opforge.task.source import load_task
    from torch.overrides import TorchFunctionMode

    seen: list[bool] = []

    class Copies(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func is torch.Tensor.contiguous:
                seen.append(bool(args[0].is_contiguous()))
            return func(*args, **(kwargs or {}))

    with torch.device("meta"):
        task = load_task(code, "motif")
        model = task.build()
        inputs = task.inputs()
        with Copies(), torch.no_grad():
            model(*inputs)
    return seen


def _render(motif, batch: int, seq: int | None, dtype: str, docstring: str, elide: frozenset[int],
            copies: list[int]) -> str:
    """``render_motif``'s source with the ``.contiguous()`` calls of ``motif.calls`` indices ``elide`` left
    out; appends to ``copies`` the indices of the ``.contiguous()`` calls rendered, in order."""
    import torch

    sym = Symbols(motif.batch, motif.seq)
    names: dict[int, str] = {}
    used_inputs: set[str] = set()
    letters = iter(INPUT_NAMES)
    for inp in motif.inputs:
        want = inp.get("name") or ""
        if not want or want in used_inputs:
            want = next(letters, f"x{len(used_inputs)}")
            while want in used_inputs:
                want = next(letters, f"x{len(used_inputs)}_")
        used_inputs.add(want)
        names[inp["vid"]] = want
    attrs: set[str] = set()
    init_lines, state_lines, fwd = [], [], []
    for p in motif.params:
        attr = _attr(p["name"].split(".")[-1] or "weight", attrs)
        names[p["vid"]] = f"self.{attr}"
        init_lines.append(f"self.{attr} = nn.Parameter({_param_init(p, sym)})")
    def rendered_dtype(traced: str) -> str:
        return dtype if traced == "float16" else traced

    value_dtype = {i["vid"]: rendered_dtype(i["dtype"]) for i in motif.inputs}
    value_dtype.update({p["vid"]: dtype for p in motif.params})
    for call in motif.calls:
        for o, (_, dt) in zip(call["outputs"], call.get("out_shapes") or [], strict=False):
            if o is not None:
                value_dtype[o] = rendered_dtype(dt)
    contiguous = {i["vid"] for i in motif.inputs} | {p["vid"] for p in motif.params}
    for index, call in enumerate(motif.calls):
        module_attr = ""
        ins = template_refs(call["args"])
        outs = call["outputs"]
        same_cast = call["name"] in SAME_DTYPE_CASTS and value_dtype.get(ins[0] if ins else -1) == \
            value_dtype.get(outs[0] if outs else -2)
        no_copy = call["name"] == "contiguous" and ins and (ins[0] in contiguous or index in elide)
        if (same_cast or no_copy or is_overflow_guard(call["name"], call["args"], call["kwargs"])) and \
                len(outs) == 1 and outs[0] is not None and len(ins) == 1 and ins[0] in names:
            # a cast to the dtype the value has, a copy of a contiguous value, or an overflow guard: no call
            names[outs[0]] = names[ins[0]]
            if ins[0] in contiguous or index in elide:
                contiguous.add(outs[0])
            continue
        if output_contiguous(call, contiguous):
            contiguous.update(o for o in outs if o is not None)
        if call["name"] == "contiguous":
            copies.append(index)
        if call["spelling"] == "module":
            leaf = call.get("module_path", "").split(".")[-1]
            module_attr = _attr(leaf if leaf and not leaf.isdigit() else snake(call["name"]), attrs)
            ctor = module_source(call["module"])
            init_lines.append(f"self.{module_attr} = {ctor}")
            with torch.device("meta"):
                mod = eval(ctor, {"nn": torch.nn, "torch": torch})  # noqa: S307 - traced extra_repr
            state_lines += _norm_state_lines(mod, module_attr)
        expr = expression(call, sym, names, module_attr)
        var = f"v{len(fwd)}"
        fwd.append(f"{var} = {expr}")
        if len(outs) == 1 and outs[0] is not None and call["name"] not in TUPLE_RESULT:
            names[outs[0]] = var
        else:
            for i, o in enumerate(outs):
                if o is not None:
                    names[o] = f"{var}[{i}]"
    # an output that is an input unchanged (the calls between them left out above) is no work for a kernel and
    # no result of the task: it is not returned, nor a value returned twice; a motif with no other output has no
    # source form
    passed = {names[i["vid"]] for i in motif.inputs}
    returned = list(dict.fromkeys(names[o] for o in motif.outputs if names[o] not in passed))
    if not returned:
        raise RenderError("every output of the motif is one of its inputs unchanged")
    fwd.append("return " + ", ".join(returned))
    if state_lines:
        init_lines += ["with torch.no_grad():  # trained-like normalisation state",
                       *["    " + line for line in state_lines]]
    if dtype != "float32":
        init_lines.append(f"self.to(torch.{dtype})")
    code_dtype = f"torch.{dtype}"

    def sub(lines):
        return [line.replace(TASK_DTYPE, code_dtype) for line in lines]

    constants = [f"batch_size = {batch}"]
    if motif.seq:
        constants.append(f"seq_len = {seq}")
    inputs = [f"{names[i['vid']]} = {_input_factory(i, sym)}" for i in motif.inputs]
    return task_source(
        imports=["import torch.nn.functional as F"], docstring=docstring, init_lines=sub(init_lines),
        forward_args=[names[i["vid"]] for i in motif.inputs], forward_lines=sub(fwd), constants=constants,
        input_lines=sub(inputs), returned=", ".join(names[i["vid"]] for i in motif.inputs))
