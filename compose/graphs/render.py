"""Render an ``OpGraph`` to KernelBench-format task source in the layout every rendered task shares
(``compose.source.task_source``)."""

from __future__ import annotations

from opforge.compose.graphs.axes import fan_in, op_name
from opforge.compose.graphs.graph import OpGraph
from opforge.compose.source import _norm_state_lines, literal, task_source
from opforge.task.op_names import snake

_OPERATORS = {"+": "+", "-": "-", "*": "*", "/": "/"}
_INPUT_NAMES = ("x", "y", "z", "w", "u", "v", "s", "t")


def _kwargs(d: dict) -> str:
    return ", ".join(f"{k}={literal(v)}" for k, v in d.items())


def _factory(shape: list, dtype: str, values: str, float_dtype: str = "float32") -> str:
    """Source of a random tensor; float tensors in ``float_dtype`` (the task's dtype)."""
    dims = ", ".join(str(d) for d in shape)
    tup = f"({dims},)" if len(shape) == 1 else f"({dims})"
    if values.startswith("index:"):
        return f"torch.randint(0, {values[6:]}, {tup})"
    if values == "bool" or dtype == "bool":
        return f"torch.rand({dims}) > 0.5"
    kw = "" if float_dtype == "float32" else f", dtype=torch.{float_dtype}"
    if values == "unit":
        return f"torch.rand({dims}{kw})"
    if values == "positive":
        return f"torch.rand({dims}{kw}) + 0.1"
    return f"torch.randn({dims}{kw})"


# Trained-like values of the parameters of functional normalisation ops (``F.batch_norm``, ``F.layer_norm``...),
# the module statistics of ``_NORM_STATE`` written as expressions of a factory: name -> (scale, shift, kind).
_FUNCTIONAL_NORM = {"weight": ("0.1", "1.0", "randn"), "bias": ("0.1", None, "randn"),
                    "running_mean": ("0.1", None, "randn"), "running_var": ("1.0", "0.5", "rand")}


def _param_factory(graph: OpGraph, node: str, pname: str, shape: list, dtype: str, values: str) -> str:
    """Source of parameter ``pname`` of op ``node``: a GEMM / conv weight (and its bias) scaled by the weight's
    fan-in as ``torch.nn.init`` scales ``nn.Linear`` / ``nn.Conv*`` (randn / sqrt(fan_in): unit-variance
    outputs for unit-variance inputs); normalisation statistics and affine parameters trained-like
    (``_FUNCTIONAL_NORM``); anything else by its value kind."""
    fac = _factory(shape, dtype, values, graph.dtype)
    if dtype != "float32" or values not in ("normal", "positive"):
        return fac  # index and mask tensors
    attrs, seed = graph.g.nodes[node], graph.seeds[node]
    name = op_name(seed.label)
    weight = attrs["params"].get("weight")
    fan = fan_in(name, pname, shape)
    if fan is None and pname == "bias" and weight is not None:
        fan = fan_in(name, "weight", weight[0])
    if fan is not None and values == "normal":
        return f"{fac} / {fan} ** 0.5"
    if seed.category == "normalization" and pname in _FUNCTIONAL_NORM:
        scale, shift, kind = _FUNCTIONAL_NORM[pname]
        base = _factory(shape, dtype, "unit" if kind == "rand" else "normal", graph.dtype)
        expr = f"{base} * {scale}" if scale != "1.0" else base
        return f"{expr} + {shift}" if shift else expr
    return fac


def _input_factory(graph: OpGraph, node: str) -> str:
    """Source of graph input ``node``; the right operand of a batched GEMM is divided by the square root of its
    contracted size (``fan_in_axis``), as a weight would be."""
    a = graph.g.nodes[node]
    fac = _factory(a["shape"], a["dtype"], a["values"], graph.dtype)
    axis = a.get("fan_in_axis")
    if axis is None:
        return fac
    return f"{fac} / {a['shape'][axis]} ** 0.5"


def render_graph(graph: OpGraph, docstring: str) -> str:
    """KernelBench source for ``graph``: ``Model`` with the ops in topological order, module-level size
    constants for the input shapes, ``get_inputs()`` and ``get_init_inputs()`` (empty: sizes are literals)."""
    g = graph.g
    names: dict[str, str] = {n: _INPUT_NAMES[i] if i < len(_INPUT_NAMES) else f"x{i}"
                             for i, n in enumerate(graph.inputs())}
    init_lines, fwd_lines, state_lines = [], [], []
    used_attrs: set[str] = set()
    fdt = graph.dtype
    for j, n in enumerate(graph.ops()):
        a, seed = g.nodes[n], graph.seeds[n]
        args = [names[p] for p in graph.args_of(n)]
        for pname, (shape, dtype, values) in a["params"].items():
            attr = f"{pname}_{j}"
            fac = _param_factory(graph, n, pname, shape, dtype, values)
            # running statistics are state, not trainable weights (torch refuses grads through them)
            if dtype == "float32" and not pname.startswith("running_"):
                init_lines.append(f"self.{attr} = nn.Parameter({fac})")
            else:
                init_lines.append(f"self.register_buffer({attr!r}, {fac})")
        pkw = {p: f"self.{p}_{j}" for p in a["params"]}
        kw = ", ".join([f"{k}={v}" for k, v in pkw.items()] + ([_kwargs(a["call_args"])] if a["call_args"] else []))
        label = a["label"]
        if label in _OPERATORS:
            expr = f"{args[0]} {_OPERATORS[label]} {args[1]}"
        elif seed.kind == "module":
            cls = label if label.startswith("nn.") or seed.library == "user" else seed.qualname
            attr = snake(label.split(".")[-1])
            while attr in used_attrs:
                attr += "_"
            used_attrs.add(attr)
            init_lines.append(f"self.{attr} = {cls}({_kwargs(a['init_args'])})")
            state_lines += _norm_state_lines(_meta_module(graph, n), attr)
            expr = f"self.{attr}({', '.join(args)}{', ' + kw if kw else ''})"
        else:
            call_args = f"[{', '.join(args)}]" if seed.tensor_list else ", ".join(args)
            expr = f"{label}({call_args}{', ' + kw if kw else ''})"
        index = a.get("output_index", seed.output_index)
        if index is not None:
            expr = f"{expr}[{index}]"
        out = f"v{j}"
        fwd_lines.append(f"{out} = {expr}")
        names[n] = out
    fwd_lines.append(f"return {names[graph.output()]}")
    if state_lines:
        init_lines += ["with torch.no_grad():  # trained-like normalisation state (not PyTorch's identity defaults)",
                       *["    " + line for line in state_lines]]
    if fdt != "float32":
        init_lines.append(f"self.to(torch.{fdt})  # parameters and buffers in the task's dtype")
    inputs = graph.inputs()
    used_sizes = [s for s in graph.sizes if any(s in g.nodes[i]["shape"] for i in inputs)]
    get_inputs = [f"{names[i]} = {_input_factory(graph, i)}" for i in inputs]
    return task_source(
        imports=["import torch.nn.functional as F"], docstring=docstring, init_lines=init_lines,
        definitions=_own_op_sources(graph),
        forward_args=[names[i] for i in inputs], forward_lines=fwd_lines,
        constants=[f"{s} = {graph.sizes[s]}" for s in used_sizes],
        input_lines=get_inputs, returned=", ".join(names[i] for i in inputs))


def _own_op_sources(graph: OpGraph) -> list[str]:
    """The source of each own op (``SeedOp.library == "user"``, ``seeds.user_ops``) the graph calls, once each in
    call order, so the task defines the class or function it names."""
    from opforge.seeds.user_ops import user_source

    out: dict[str, str] = {}
    for n in graph.ops():
        seed = graph.seeds[n]
        if seed.library == "user" and seed.qualname not in out:
            out[seed.qualname] = user_source(seed.qualname)
    return list(out.values())


def _meta_module(graph: OpGraph, node: str):
    """The module of op ``node`` built on ``meta`` (no memory), to read which state it has."""
    from opforge.compose.graphs.graph import _module

    return _module(graph.seeds[node], graph.g.nodes[node]["init_args"], "meta")
