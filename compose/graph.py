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

import json
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
                spec = TensorSpec(shape=[1], dtype=a["dtype"], values=a["values"])
                vals[n] = self._cast(make_tensor(spec, self.input_shape(n, sizes), {}, device, generator))
        for n in self.ops():
            if n in vals:
                continue
            if op_flops is None:
                vals[n] = self._call(n, [vals[a] for a in self.args_of(n)], device)
                continue
            counter = FlopCounterMode(display=False)
            with counter:
                vals[n] = self._call(n, [vals[a] for a in self.args_of(n)], device)
            op_flops[n] = float(counter.get_total_flops())
        return dict(vals)

    def _call(self, n: str, tensors: list[torch.Tensor], device: str) -> torch.Tensor:
        a, seed = self.g.nodes[n], self.seeds[n]
        if device == "meta" and seed.label in RECURRENT_SHAPES:
            # torch's recurrent ops have no meta kernel and decompose into one step per time step
            return RECURRENT_SHAPES[seed.label](tensors[0], a["init_args"])
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


def _seq_out(x: torch.Tensor, init: dict) -> torch.Tensor:
    if not init.get("batch_first") or x.dim() != 3 or x.shape[-1] != init["input_size"]:
        raise ValueError("recurrent seed expects a batch-first [N, L, input_size] input")
    return torch.empty(x.shape[0], x.shape[1], init["hidden_size"], device="meta", dtype=x.dtype)


RECURRENT_SHAPES = {"nn.LSTM": _seq_out, "nn.GRU": _seq_out, "nn.RNN": _seq_out}
# Multiply-accumulate gates per hidden unit (LSTM 4, GRU 3, Elman RNN 1), for the cost model.
RECURRENT_GATES = {"nn.LSTM": 4, "nn.GRU": 3, "nn.RNN": 1}


def _module(seed: SeedOp, init_args: dict, device: str):
    return build_callable(seed.model_copy(update={"init_args": init_args}), {}, device)
