"""Sample operator graphs from the seed catalog: chains and small DAG patterns, shape-checked on ``meta``.

Patterns (``k`` = number of ops, the combining op included):
  ``chain``            x -> op1 -> ... -> opk
  ``residual``         y = chain_{k-1}(x); out = y + x          (needs shape(y) == shape(x))
  ``gating``           y = chain_{k-1}(x); out = y * x
  ``reduce_broadcast`` y = chain_{k-2}(x); r = reduce(y, dim=-1, keepdim=True); out = y - r
  ``concat``           a = op(x), b = op'(x); c = torch.cat([a, b], dim=1); then k-3 more ops
Op choice: each op is drawn with its weight (``op_weights``: by default its relevance, how often real models
run it, ``compose.graphs.op_weights``) times the weight of its category (``category_weights``); with probability
``heavy_start`` the first op is a GEMM, convolution, attention or recurrent op (the producer + epilogue shape of
KernelBench level 2 and of most fused kernels in real models). Sizes: on a ``realistic`` device profile every
non-batch size comes from one size context of the shape vocabulary (``compose.graphs.sizing``), otherwise from the
profile's fixed lists. Constructs that change nothing (``compose.graphs.avoid``) are never generated; internal
ATen-level ops (``seeds.public_api.is_internal``) are left out unless ``include_internal``.
Meaning: every tensor axis carries a role (batch, sequence, feature, channel, spatial, head; ``compose.graphs.axes``):
an op's dim arguments are drawn from the axes whose roles it exists for, layout-sensitive ops (convolutions,
pooling, norms, GEMMs) take only inputs in their layout, and the batch stays axis 0 alone. Each tensor carries
an estimated RMS (``compose.graphs.magnitude``): a saturating op (sigmoid, tanh, softmax, exp, special functions) is
drawn only where its input is in its working range. An op's weight is multiplied by its factor at its
position (producer, epilogue, head; ``compose.graphs.positions``).
Deterministic: everything is drawn from the ``random.Random`` passed in.
"""

from __future__ import annotations

import math
import random
import re
from collections import defaultdict

from opforge.compose.device_profiles import DeviceProfile
from opforge.compose.graphs.avoid import CONSTANT_OUTPUT, IDENTITY_ON_REAL, noop_reason
from opforge.compose.graphs.axes import (
    BATCH,
    batch_stays_first,
    bind_dims,
    input_roles,
    input_violation,
    op_dims,
    op_name,
    output_roles,
    template_fits,
)
from opforge.compose.graphs.graph import OpGraph
from opforge.compose.graphs.magnitude import INPUT_RMS, out_rms, saturates
from opforge.compose.graphs.positions import PositionTable, load_positions
from opforge.compose.graphs.sizing import SizeContext, draw_context, layout_kind
from opforge.seeds.public_api import is_internal
from opforge.seeds.seed_op import TEMPLATES, SeedOp
from opforge.seeds.tensors import resolve_value

# Names of the module-level size constants the rendered task uses for each size symbol.
SIZE_NAMES = {"N": "batch_size", "C": "channels", "K": "features", "L": "seq_len", "H": "height",
              "W": "width", "D": "depth", "A": "num_heads", "E": "head_dim"}
BASE_BATCH = 4
PROBE_BATCH = 3  # second batch value used to tell batch-dependent dims apart
REDUCERS = ("torch.mean", "torch.sum", "torch.amax", "torch.amin", "torch.logsumexp", "torch.std", "torch.var")

# Ops returning one tensor per slice (the count grows with the input): at task sizes they build hundreds of
# millions of view objects, so the composer leaves them out.
VARIADIC_OUTPUT = re.compile(r"(^|\.)(split|unbind|tensor_split|hsplit|vsplit|dsplit|unsafe_split)(_copy)?$")

# Category weights of op choice unless the caller sets them (``opforge compose --categories``), on top of 1
# per category. ``linalg`` (matrix decompositions: torch.svd, torch.qr, torch.pinverse, torch.nuclear_norm...)
# is off: on one H200, none of the 22 of 1,100 candidates holding one was accepted, in either of two runs
# (measured 2026-11-22; record in the git history of docs/benchmark-log.md): 14-15 ran a batched cuSOLVER
# call past the 1.6 s GPU step limit (the cost model's FLOP counter sees no FLOPs in them, so it picks
# huge batches), the others gave degenerate or too slow outputs. CUDA-Agent-Ops-6K has no such op either.
DEFAULT_CATEGORY_WEIGHTS = {"linalg": 0.0}
HEAVY_CATEGORIES = ("gemm", "conv", "attention", "recurrent")
# Batched GEMMs whose last extra input is a right operand ([N, K, M], contracted over K).
RIGHT_OPERAND_OPS = frozenset({"bmm", "baddbmm"})
DEFAULT_HEAVY_START = 0.5
# Category of a heavy first op. The relevance table is traced from transformers families only (torchvision is
# optional), where 25 % of models run a convolution; CUDA-Agent-Ops-6K has one in 38 % of its rows. Convolutions
# get a share between the two, GEMMs (linear, matmul, bmm) the largest, attention and RNNs the rest.
HEAVY_START_SHARES = {"gemm": 0.52, "conv": 0.38, "attention": 0.05, "recurrent": 0.05}
FLOAT_DTYPES = ("float32", "bfloat16", "float16")

OP_MIXES = {
    # CUDA-Agent-Ops-6K: share of rows with 1..5 ops (204/5026/457/168/74 of 5,929 torch rows).
    "ops6k": {1: 0.034, 2: 0.838, 3: 0.076, 4: 0.028, 5: 0.012},
    "uniform": {1: 0.2, 2: 0.2, 3: 0.2, 4: 0.2, 5: 0.2},
    # what real models fuse: 3-5 ops common (the mined motifs, compose.motifs.library: p50 5 ops); the selection keeps
    # the accepted pool's own op-count mix (pipeline.select.bucket_shares)
    "models": {2: 0.2, 3: 0.3, 4: 0.3, 5: 0.2},
}


def parse_op_mix(spec: str) -> dict[int, float]:
    """``models`` | ``ops6k`` | ``uniform`` | ``1:0.2,2:0.3,...`` -> normalised {k: weight}. Raises ValueError."""
    if spec in OP_MIXES:
        return dict(OP_MIXES[spec])
    out: dict[int, float] = {}
    try:
        for part in spec.split(","):
            k, w = part.split(":")
            out[int(k)] = float(w)
    except ValueError:
        raise ValueError(f"bad --op-mix {spec!r}: use models, ops6k, uniform or '1:0.2,2:0.3,...'") from None
    if not out or any(k < 1 or k > 5 for k in out) or any(w < 0 for w in out.values()) or sum(out.values()) <= 0:
        raise ValueError(f"bad --op-mix {spec!r}: op counts must be 1..5 with non-negative weights")
    total = sum(out.values())
    return {k: w / total for k, w in sorted(out.items())}


class SamplingError(Exception):
    pass


class Sampler:
    """Draws graphs from ``ops`` (torch seed ops; stochastic ones dropped unless ``allow_stochastic``).

    ``op_weights`` (label -> weight; labels left out weigh 0) and ``category_weights`` (category -> weight,
    default 1, over ``DEFAULT_CATEGORY_WEIGHTS``) multiply; without ``op_weights`` every op weighs 1. An op
    whose weight is 0 is never drawn. ``vocab`` (a ``ShapeVocabulary``) is required by realistic profiles.
    ``heavy_start`` is the probability that the first op is of ``HEAVY_CATEGORIES``. ``positions`` (default: the
    packaged ``compose/data/op_positions.yaml``) multiplies an op's weight by its factor at its position in the
    graph (producer, epilogue, head; ``compose.graphs.positions``)."""

    def __init__(self, ops: list[SeedOp], profile: DeviceProfile, allow_stochastic: bool = False,
                 category_weights: dict[str, float] | None = None, *, vocab=None,
                 op_weights: dict[str, float] | None = None, include_internal: bool = False,
                 heavy_start: float = DEFAULT_HEAVY_START, positions: PositionTable | None = None):
        self.profile = profile
        if profile.realistic and vocab is None:
            raise ValueError(f"device profile {profile.name!r} sizes tasks from a shape vocabulary: pass vocab")
        self.vocab = vocab
        self.heavy_start = heavy_start
        self.category_weights = {**DEFAULT_CATEGORY_WEIGHTS, **(category_weights or {})}
        usable = [o for o in ops if o.library in ("torch", "user") and o.meta_ok and (allow_stochastic or not o.stochastic)
                  and o.output_dtype == "float32" and o.inputs and not VARIADIC_OUTPUT.search(o.label)
                  and not CONSTANT_OUTPUT.search(o.label) and not IDENTITY_ON_REAL.search(o.label)
                  and (include_internal or not is_internal(o.label, o.qualname))]
        self.weights = {o.label: (1.0 if op_weights is None else float(op_weights.get(o.label, 0.0)))
                        * self.category_weights.get(o.category, 1.0) for o in usable}
        usable = [o for o in usable if self.weights[o.label] > 0]
        self.by_label = {o.label: o for o in usable}
        # ops that may follow another op: float primary input with unconstrained values and a template
        self.chainable: dict[int, list[tuple[SeedOp, str]]] = defaultdict(list)
        for o in usable:
            if o.inputs[0].dtype == "float32" and o.inputs[0].values == "normal":
                for t in o.templates:
                    self.chainable[len(TEMPLATES[t])].append((o, t))
        # ops that may start a graph: any usable op whose primary input has a batch dim
        self.starters = [o for o in usable if _primary_shape(o, None) and _primary_shape(o, None)[0] == "N"]
        self.heavy_starters = [o for o in self.starters if o.category in HEAVY_CATEGORIES]
        # reducers of the reduce-broadcast pattern are structural: drawn whatever their weight
        self.reducers = [o for o in ops if o.label in REDUCERS and o.library == "torch"]
        self.dtype = "float32"
        self.context: SizeContext | None = None
        self.names = {o.label: op_name(o.label) for o in ops}
        self._fitting: dict[tuple, list[tuple[SeedOp, str]]] = {}  # (rank, roles) -> chainable options
        table = positions if positions is not None else load_positions()
        self.position_weights = {pos: {lab: w * table.factor(self.names[lab], pos) for lab, w in self.weights.items()}
                                 for pos in ("producer", "epilogue", "head")}

    def supports(self, seed: SeedOp, dtype: str) -> bool:
        """Whether ``seed`` runs in ``dtype``: its probed ``dtypes`` when the catalog records them, else any
        float dtype."""
        dtypes = getattr(seed, "dtypes", None)
        return dtype in dtypes if dtypes else True

    # ---- op choice, by weight ----
    def _pick(self, rng: random.Random, items: list, key=lambda it: it, position: str | None = None):
        items = [it for it in items if self.supports(key(it), self.dtype)]
        table = self.weights if position is None else self.position_weights[position]
        weights = [table[key(it).label] for it in items]
        if not items or sum(weights) <= 0:
            raise SamplingError("op weights exclude every op")
        return rng.choices(items, weights)[0]

    def _k_options(self, rng: random.Random) -> int:
        if self.profile.realistic and self.context is not None:
            return rng.choice(self.context.k_options)
        return rng.choice(self.profile.sizes["K"])

    # ---- building blocks ----
    def _start(self, rng: random.Random, g: OpGraph) -> str:
        heavy = self.heavy_starters and rng.random() < self.heavy_start
        pool = self.starters
        if heavy:
            cats = [c for c in HEAVY_START_SHARES if any(o.category == c for o in self.heavy_starters)]
            cat = rng.choices(cats, [HEAVY_START_SHARES[c] for c in cats])[0]
            pool = [o for o in self.heavy_starters if o.category == cat]
        for _ in range(20):
            seed = self._pick(rng, pool, position="producer")
            templates = [t for t in seed.templates if TEMPLATES[t][0] == "N"] or [None]
            if self.profile.realistic:
                # 2-D [batch, features] inputs are far below a GPU's window at batch <= 512: prefer a layout
                # with a sequence or spatial axis, as in the models the sizes come from
                templates = [t for t in templates if t and set(TEMPLATES[t]) & set("LHWD")] or templates
            t = rng.choice(templates)
            shape = list(TEMPLATES[t]) if t else list(seed.inputs[0].shape)
            local = self._start_sizes(rng, t)
            local["N"] = BASE_BATCH
            names = []
            for d in shape:
                if isinstance(d, int):
                    names.append(d)
                else:
                    names.append(SIZE_NAMES[d])
                    g.sizes.setdefault(SIZE_NAMES[d], local[d])
            local.update({s: g.sizes[SIZE_NAMES[s]] for s in shape if isinstance(s, str)})
            first = g.add_input(names, seed.inputs[0].dtype, _resolve_index(seed.inputs[0].values, local))
            g.g.nodes[first].update(roles=input_roles(shape, t), rms=INPUT_RMS.get(seed.inputs[0].values, 1.0))
            node = self._apply(rng, g, seed, [first], local, first_shape=names)
            if node:
                return node
            g.remove(first)
        raise SamplingError("no starting op fits")

    def _start_sizes(self, rng: random.Random, template: str | None) -> dict[str, int]:
        """Sizes of the symbols for a graph whose first input has ``template``: a vocabulary size context on a
        realistic profile (kept in ``self.context``), the profile's fixed lists otherwise."""
        if not self.profile.realistic:
            sizes = {s: rng.choice(self.profile.sizes[s]) for s in ("C", "K", "L", "H", "W", "D")}
            return {**sizes, "A": 2, "E": rng.choice(self.profile.sizes["D"])}
        self.context = draw_context(self.vocab, layout_kind(template), rng)
        local = dict(self.context.values)
        spatial = self.vocab.values("spatial", 4, 224) or [7]
        fill = {"C": self.context.k_options, "L": self.context.knobs.get("seq_len") or [128], "H": spatial,
                "W": spatial, "D": self.vocab.values("depth", 2, 64) or [8], "A": [8, 12, 16, 32],
                "E": [64, 128]}
        for sym, options in fill.items():
            if sym not in local:
                local[sym] = rng.choice(options)
        local["K"] = self._k_options(rng)
        return local

    def _apply(self, rng, g: OpGraph, seed: SeedOp, args: list[str], local: dict[str, int],
               first_shape: list | None = None, extra_from: list[str] | None = None) -> str | None:
        """Add ``seed`` consuming ``args`` (primary first); create graph inputs for its other tensors. None
        when it does not fit the shapes or would change nothing (``compose.graphs.avoid``)."""
        local = dict(local)
        local.setdefault("K", self._k_options(rng))
        ctx = self.context.values if self.profile.realistic and self.context is not None else {}
        local.setdefault("A", ctx.get("A", 8))  # attention heads / head dim of an op that follows another
        local.setdefault("E", ctx.get("E", 64))
        new_inputs = []
        all_args = list(args)
        in_shape = tuple(g.run("meta")[args[0]].shape)
        roles = g.g.nodes[args[0]].get("roles") or input_roles(["N", *["C"] * (len(in_shape) - 1)])
        if extra_from is None:
            for spec in seed.inputs[1:]:
                if isinstance(spec.shape, str):  # like:<i>: the same shape as that input
                    sym = first_shape if first_shape is not None else self._symbolic_shape(g, args[0])
                    if sym is None:
                        self._drop(g, new_inputs)
                        return None
                    shape = list(sym)
                else:
                    shape = [SIZE_NAMES[d] if d == "N" or (isinstance(d, str) and SIZE_NAMES[d] in g.sizes
                                                           and g.sizes[SIZE_NAMES[d]] == local[d])
                             else (local[d] if isinstance(d, str) else d) for d in spec.shape]
                    if "N" in spec.shape and not self._batch_first(g, args[0]):
                        self._drop(g, new_inputs)
                        return None
                inp = g.add_input(shape, spec.dtype, spec.values)
                g.g.nodes[inp].update(roles=list(roles) if isinstance(spec.shape, str) else input_roles(spec.shape),
                                      rms=INPUT_RMS.get(spec.values, 1.0))
                new_inputs.append(inp)
                all_args.append(inp)
        else:
            all_args += extra_from
        try:
            init = {k: resolve_value(v, local) for k, v in seed.init_args.items()}
            call = {k: resolve_value(v, local) for k, v in seed.call_args.items()}
        except KeyError:  # a size symbol this position does not bind
            self._drop(g, new_inputs)
            return None
        name = self.names.get(seed.label) or op_name(seed.label)
        bound = bind_dims(name, seed, roles, in_shape, init, call, rng)
        if bound is None or input_violation(name, seed, roles, bound[0], bound[1]):
            self._drop(g, new_inputs)
            return None
        init, call, node_attrs = bound
        if name in RIGHT_OPERAND_OPS and new_inputs:
            # the right operand of a batched GEMM is scaled by its fan-in, as a weight is (compose.graphs.magnitude)
            right = g.g.nodes[new_inputs[-1]]
            right["fan_in_axis"] = len(right["shape"]) - 2
            right["rms"] = right["rms"] / math.sqrt(max(g.input_shape(new_inputs[-1])[-2], 1))
        in_rms = [g.g.nodes[a].get("rms", 1.0) for a in all_args]
        if saturates(name, in_rms[0]):
            self._drop(g, new_inputs)
            return None
        params = {k: ([local[d] if isinstance(d, str) else d for d in s.shape], s.dtype, s.values)
                  for k, s in seed.params.items()}
        if any(isinstance(v, str) and v.startswith("index:") for _, _, v in params.values()):
            params = {k: (s, dt, _resolve_index(v, local)) for k, (s, dt, v) in params.items()}
        for i in new_inputs:
            v = g.g.nodes[i]["values"]
            g.g.nodes[i]["values"] = _resolve_index(v, local)
        node = g.add_op(seed, all_args, init, call, params)
        try:
            out = g.run("meta")[node]
            if not out.is_floating_point() or out.dim() == 0 or out.numel() == 0:
                raise SamplingError("non-float, scalar or empty output")
            probe = g.run("meta", {**g.sizes, "batch_size": PROBE_BATCH})[node]
            if not batch_stays_first(tuple(out.shape), tuple(probe.shape), g.sizes.get("batch_size", BASE_BATCH),
                                     PROBE_BATCH):
                raise SamplingError("the batch does not stay axis 0 alone")
            out_roles = output_roles(name, seed, roles, in_shape, tuple(out.shape), init, call)
            if out_roles is None or len(out_roles) != out.dim() or out_roles[0] != BATCH:
                raise SamplingError("output roles unknown")
            scanned = op_dims(name, seed, init, call, len(in_shape)) or []
            reduced = math.prod(in_shape[d] for d in scanned) if scanned else 1
            g.g.nodes[node].update(node_attrs, roles=out_roles,
                                   rms=out_rms(name, in_rms, math.prod(in_shape), out.numel(), reduced))
            if noop_reason(g, node):
                raise SamplingError("changes nothing")
        except Exception:
            g.remove(node)
            self._drop(g, new_inputs)
            return None
        return node

    def _drop(self, g, nodes):
        for n in nodes:
            g.remove(n)

    def _batch_first(self, g: OpGraph, node: str) -> bool:
        sym = self._symbolic_shape(g, node)
        return bool(sym) and sym[0] == SIZE_NAMES["N"]

    def _symbolic_shape(self, g: OpGraph, node: str) -> list | None:
        """Shape of ``node``'s output as size names / ints, or None if a dim depends on the batch other than
        by equality (then no extra input can be written for it). A dim that depends on another size other than
        by equality is written as an int and that size is frozen (``OpGraph.frozen``: the cost model keeps it)."""
        a = g.run("meta")[node].shape
        out: list = [int(x) for x in a]
        for name, value in g.sizes.items():
            probe = PROBE_BATCH if name == "batch_size" else value * 2
            try:
                b = g.run("meta", {**g.sizes, name: probe})[node].shape
            except Exception:  # noqa: BLE001 - the graph refuses that size: keep it fixed
                if name == "batch_size":
                    return None
                g.frozen.add(name)
                continue
            if len(a) != len(b):
                return None
            for i, (x, y) in enumerate(zip(a, b, strict=True)):
                if x == y:
                    continue
                if x == value and y == probe and isinstance(out[i], int):
                    out[i] = name
                elif name == "batch_size":
                    return None
                else:
                    g.frozen.add(name)
        return out

    def _options(self, g: OpGraph, node: str, rank: int) -> list[tuple[SeedOp, str]]:
        """Chainable (op, template) pairs whose template fits the roles of ``node``'s output
        (``axes.template_fits``)."""
        roles = tuple(g.g.nodes[node].get("roles") or ())
        key = (rank, roles)
        if key not in self._fitting:
            self._fitting[key] = [(o, t) for o, t in self.chainable.get(rank, [])
                                  if template_fits(t, list(roles), self.names[o.label])]
        return self._fitting[key]

    def _next(self, rng, g: OpGraph, prev: str, tries: int = 25, position: str = "epilogue") -> str | None:
        shape = tuple(g.run("meta")[prev].shape)
        options = self._options(g, prev, len(shape))
        if not options:
            return None
        for _ in range(tries):
            seed, t = self._pick(rng, options, key=lambda it: it[0], position=position)
            local = dict(zip(TEMPLATES[t], shape, strict=True))
            node = self._apply(rng, g, seed, [prev], local)
            if node:
                return node
        return None

    def _binary(self, g: OpGraph, label: str, a: str, b: str) -> str | None:
        seed = self.by_label.get(label)
        if seed is None:
            return None
        return self._apply(random.Random(0), g, seed, [a], {}, extra_from=[b])

    # ---- patterns ----
    def sample(self, rng: random.Random, k: int, dtype: str = "float32") -> tuple[OpGraph, str]:
        """A graph with exactly ``k`` ops in ``dtype`` and the pattern used; on a realistic profile
        ``self.context`` holds its size context. Raises SamplingError after 50 attempts."""
        if dtype not in FLOAT_DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}; choices: {', '.join(FLOAT_DTYPES)}")
        self.dtype = dtype
        for _ in range(50):
            pattern = self._pattern(rng, k)
            g = OpGraph(dtype=dtype)
            try:
                if self._build(rng, g, pattern, k) and len(g.ops()) == k:
                    g.output()
                    return g, pattern
            except SamplingError:
                continue
        raise SamplingError(f"could not sample a {k}-op graph")

    def _pattern(self, rng, k: int) -> str:
        if k == 1:
            return "chain"
        options = [("chain", 0.55), ("residual", 0.15), ("gating", 0.1), ("reduce_broadcast", 0.1)]
        if k >= 3:
            options.append(("concat", 0.1))
        return rng.choices([o for o, _ in options], [w for _, w in options])[0]

    def _chain(self, rng, g, start: str, n: int, head: bool = False) -> str | None:
        """``n`` ops after ``start``; the last one drawn at the head position when ``head``."""
        node = start
        for i in range(n):
            node = self._next(rng, g, node, position="head" if head and i == n - 1 else "epilogue")
            if node is None:
                return None
        return node

    def _build(self, rng, g: OpGraph, pattern: str, k: int) -> bool:
        x = self._start(rng, g)
        if pattern == "chain":
            return self._chain(rng, g, x, k - 1, head=True) is not None
        if pattern in ("residual", "gating"):
            y = self._chain(rng, g, x, k - 2)
            if y is None:
                return False
            src = g.args_of(x)[0]  # the graph input feeding the first op
            if g.g.nodes[y].get("roles") != g.g.nodes[src].get("roles"):
                return False
            if tuple(g.run("meta")[y].shape) != g.input_shape(src) or g.g.nodes[src]["dtype"] != "float32" \
                    or g.run("meta")[y].dtype != g.run("meta")[src].dtype:
                return False
            return self._binary(g, "+" if pattern == "residual" else "*", y, src) is not None
        if pattern == "reduce_broadcast":
            y = self._chain(rng, g, x, k - 3) if k >= 3 else x
            if y is None or not self.reducers:
                return False
            red = rng.choice(self.reducers)
            seed = red.model_copy(update={"call_args": {"dim": -1, "keepdim": True}})
            r = self._apply(rng, g, seed, [y], {})
            return r is not None and self._binary(g, "-", y, r) is not None
        if pattern == "concat":
            src = g.args_of(x)[0]
            if g.g.nodes[src]["dtype"] != "float32" or len(g.args_of(x)) != 1:
                return False
            shape = g.input_shape(src)
            options = self._options(g, src, len(shape))
            for _ in range(25):
                seed, t = self._pick(rng, options, key=lambda it: it[0], position="epilogue")
                local = dict(zip(TEMPLATES[t], shape, strict=True))
                b = self._apply(rng, g, seed, [src], local)
                if b is None:
                    continue
                vals = g.run("meta")
                if vals[b].shape == vals[x].shape and seed.label != g.g.nodes[x]["label"] \
                        and g.g.nodes[b]["roles"] == g.g.nodes[x]["roles"]:
                    break
                # the branch goes with the inputs only it read (a binary op's second operand)
                inputs = set(g.inputs())
                own = [n for n in g.args_of(b) if n in inputs and g.g.out_degree(n) == 1]
                g.remove(b)
                self._drop(g, own)
            else:
                return False
            cat = self.by_label.get("torch.cat")
            if cat is None:
                return False
            c = self._apply(rng, g, cat, [x], {}, extra_from=[b])
            return c is not None and self._chain(rng, g, c, k - 3, head=True) is not None
        raise ValueError(pattern)


def _primary_shape(o: SeedOp, t):
    if o.templates:
        return TEMPLATES[o.templates[0]]
    return o.inputs[0].shape if isinstance(o.inputs[0].shape, list) else None


def _resolve_index(values: str, local: dict[str, int]) -> str:
    if values.startswith("index:") and values[6:] in local:
        return f"index:{local[values[6:]]}"
    return values
