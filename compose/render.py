"""Render an ``OpGraph`` (or a transformers seed module) to KernelBench-format task source."""

from __future__ import annotations

import math

from opforge.compose.graph import OpGraph
from opforge.seeds.seed_op import SeedOp
from opforge.task.op_names import snake

_OPERATORS = {"+": "+", "-": "-", "*": "*", "/": "/"}
_INPUT_NAMES = ("x", "y", "z", "w", "u", "v", "s", "t")


def _literal(v) -> str:
    if isinstance(v, float):
        return repr(float(v)) if math.isfinite(v) else f"float('{v}')"
    return repr(v)


def _kwargs(d: dict) -> str:
    return ", ".join(f"{k}={_literal(v)}" for k, v in d.items())


def _factory(shape: list, dtype: str, values: str) -> str:
    dims = ", ".join(str(d) for d in shape)
    tup = f"({dims},)" if len(shape) == 1 else f"({dims})"
    if values.startswith("index:"):
        return f"torch.randint(0, {values[6:]}, {tup})"
    if values == "bool" or dtype == "bool":
        return f"torch.rand({dims}) > 0.5"
    if values == "unit":
        return f"torch.rand({dims})"
    if values == "positive":
        return f"torch.rand({dims}) + 0.1"
    return f"torch.randn({dims})"


def render_graph(graph: OpGraph, docstring: str) -> str:
    """KernelBench source for ``graph``: ``Model`` with the ops in topological order, module-level size
    constants for the input shapes, ``get_inputs()`` and ``get_init_inputs()`` (empty: sizes are literals)."""
    g = graph.g
    names: dict[str, str] = {n: _INPUT_NAMES[i] if i < len(_INPUT_NAMES) else f"x{i}"
                             for i, n in enumerate(graph.inputs())}
    init_lines, fwd_lines = [], []
    used_attrs: set[str] = set()
    for j, n in enumerate(graph.ops()):
        a, seed = g.nodes[n], graph.seeds[n]
        args = [names[p] for p in graph.args_of(n)]
        for pname, (shape, dtype, values) in a["params"].items():
            attr = f"{pname}_{j}"
            fac = _factory(shape, dtype, values)
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
            cls = label if label.startswith("nn.") else seed.qualname
            attr = snake(label.split(".")[-1])
            while attr in used_attrs:
                attr += "_"
            used_attrs.add(attr)
            init_lines.append(f"self.{attr} = {cls}({_kwargs(a['init_args'])})")
            expr = f"self.{attr}({', '.join(args)}{', ' + kw if kw else ''})"
        else:
            call_args = f"[{', '.join(args)}]" if seed.tensor_list else ", ".join(args)
            expr = f"{label}({call_args}{', ' + kw if kw else ''})"
        if seed.output_index is not None:
            expr = f"{expr}[{seed.output_index}]"
        out = f"v{j}"
        fwd_lines.append(f"{out} = {expr}")
        names[n] = out
    fwd_lines.append(f"return {names[graph.output()]}")
    inputs = graph.inputs()
    used_sizes = [s for s in graph.sizes if any(s in g.nodes[i]["shape"] for i in inputs)]
    get_inputs = [f"{names[i]} = {_factory(g.nodes[i]['shape'], g.nodes[i]['dtype'], g.nodes[i]['values'])}"
                  for i in inputs]
    return _task_source(
        imports=["import torch.nn.functional as F"], docstring=docstring, init_lines=init_lines,
        forward_args=[names[i] for i in inputs], forward_lines=fwd_lines,
        constants=[f"{s} = {graph.sizes[s]}" for s in used_sizes],
        input_lines=get_inputs, returned=", ".join(names[i] for i in inputs))


def _task_source(imports: list[str], docstring: str, init_lines: list[str], forward_args: list[str],
                 forward_lines: list[str], constants: list[str], input_lines: list[str], returned: str) -> str:
    """The KernelBench layout shared by every rendered task: imports, ``Model``, size constants,
    ``get_inputs()`` returning ``[returned]`` and an empty ``get_init_inputs()``."""
    ind = "        "
    return "\n".join([
        "import torch",
        "import torch.nn as nn",
        *imports,
        "",
        "",
        "class Model(nn.Module):",
        f'    """{docstring}"""',
        "",
        "    def __init__(self):",
        "        super().__init__()",
        *[ind + line for line in init_lines],
        "",
        f"    def forward(self, {', '.join(forward_args)}):",
        *[ind + line for line in forward_lines],
        "",
        "",
        *constants,
        "",
        "",
        "def get_inputs():",
        *["    " + line for line in input_lines],
        f"    return [{returned}]",
        "",
        "",
        "def get_init_inputs():",
        "    return []",
        "",
    ])


def render_transformers(seed: SeedOp, batch_size: int, docstring: str) -> str:
    """A standalone task wrapping one transformers building block built from its small config."""
    mod, cls = seed.qualname.rsplit(".", 1)
    cmod, ccls = seed.config_class.rsplit(".", 1)
    spec = seed.inputs[0]
    shape = ["batch_size" if d == "N" else d for d in spec.shape]
    init = ", ".join(["config"] + [f"{k}={_literal(v)}" for k, v in seed.init_args.items()])
    out = "out" if seed.output_index is None else f"out[{seed.output_index}]"
    return _task_source(
        imports=[f"from {cmod} import {ccls}", f"from {mod} import {cls}"], docstring=docstring,
        init_lines=[f"config = {ccls}({_kwargs(seed.config or {})})", f"self.block = {cls}({init})"],
        forward_args=["x"], forward_lines=["out = self.block(x)", f"return {out}"],
        constants=[f"batch_size = {batch_size}"], input_lines=[],
        returned=_factory(shape, spec.dtype, spec.values))
