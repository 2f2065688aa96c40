"""Sample operator graphs from the seed catalog: chains and small DAG patterns, shape-checked on ``meta``.

Patterns (``k`` = number of ops, the combining op included):
  ``chain``            x -> op1 -> ... -> opk
  ``residual``         y = chain_{k-1}(x); out = y + x          (needs shape(y) == shape(x))
  ``gating``           y = chain_{k-1}(x); out = y * x
  ``reduce_broadcast`` y = chain_{k-2}(x); r = reduce(y, dim=-1, keepdim=True); out = y - r
  ``concat``           a = op(x), b = op'(x); c = torch.cat([a, b], dim=1); then k-3 more ops
Deterministic: everything is drawn from the ``random.Random`` passed in.
"""

from __future__ import annotations

import random
import re
from collections import defaultdict

from opforge.compose.device_profiles import DeviceProfile
from opforge.compose.graph import OpGraph
from opforge.seeds.seed_op import TEMPLATES, SeedOp
from opforge.seeds.tensors import resolve_value

# Names of the module-level size constants the rendered task uses for each size symbol.
SIZE_NAMES = {"N": "batch_size", "C": "channels", "K": "features", "L": "seq_len", "H": "height",
              "W": "width", "D": "depth"}
BASE_BATCH = 4
PROBE_BATCH = 3  # second batch value used to tell batch-dependent dims apart
REDUCERS = ("torch.mean", "torch.sum", "torch.amax", "torch.amin", "torch.logsumexp", "torch.std", "torch.var")

# Ops returning one tensor per slice (the count grows with the input): at task sizes they build hundreds of
# millions of view objects, so the composer leaves them out.
VARIADIC_OUTPUT = re.compile(r"(^|\.)(split|unbind|tensor_split|hsplit|vsplit|dsplit|unsafe_split)(_copy)?$")

# Category weights of op choice unless the caller sets them (``opforge compose --categories``), on top of 1
# per category. ``linalg`` (matrix decompositions: torch.svd, torch.qr, torch.pinverse, torch.nuclear_norm...)
# is off: on one H200, none of the 22 of 1,100 candidates holding one was accepted, in either of two runs
# (sessions 11-12, benchmarks/results/gpu_verdicts_h200_s11.csv and _s12.csv): 14-15 ran a batched cuSOLVER
# call past the 1.6 s GPU step limit (the cost model's FLOP counter sees no FLOPs in them, so it picks
# huge batches), the others gave degenerate or too slow outputs. CUDA-Agent-Ops-6K has no such op either.
DEFAULT_CATEGORY_WEIGHTS = {"linalg": 0.0}

OP_MIXES = {
    # CUDA-Agent-Ops-6K: share of rows with 1..5 ops (204/5026/457/168/74 of 5,929 torch rows).
    "ops6k": {1: 0.034, 2: 0.838, 3: 0.076, 4: 0.028, 5: 0.012},
    "uniform": {1: 0.2, 2: 0.2, 3: 0.2, 4: 0.2, 5: 0.2},
}


def parse_op_mix(spec: str) -> dict[int, float]:
    """``ops6k`` | ``uniform`` | ``1:0.2,2:0.3,...`` -> normalised {k: weight}. Raises ValueError."""
    if spec in OP_MIXES:
        return dict(OP_MIXES[spec])
    out: dict[int, float] = {}
    try:
        for part in spec.split(","):
            k, w = part.split(":")
            out[int(k)] = float(w)
    except ValueError:
        raise ValueError(f"bad --op-mix {spec!r}: use ops6k, uniform or '1:0.2,2:0.3,...'") from None
    if not out or any(k < 1 or k > 5 for k in out) or any(w < 0 for w in out.values()) or sum(out.values()) <= 0:
        raise ValueError(f"bad --op-mix {spec!r}: op counts must be 1..5 with non-negative weights")
    total = sum(out.values())
    return {k: w / total for k, w in sorted(out.items())}


class SamplingError(Exception):
    pass


class Sampler:
    """Draws graphs from ``ops`` (torch seed ops; stochastic ones dropped unless ``allow_stochastic``).

    ``category_weights`` (category -> weight, default 1) weighs the category an op is drawn from, over
    ``DEFAULT_CATEGORY_WEIGHTS``; an op of a category weighing 0 is never drawn."""

    def __init__(self, ops: list[SeedOp], profile: DeviceProfile, allow_stochastic: bool = False,
                 category_weights: dict[str, float] | None = None):
        self.profile = profile
        self.category_weights = {**DEFAULT_CATEGORY_WEIGHTS, **(category_weights or {})}
        usable = [o for o in ops if o.library == "torch" and o.meta_ok and (allow_stochastic or not o.stochastic)
                  and o.output_dtype == "float32" and o.inputs and not VARIADIC_OUTPUT.search(o.label)]
        self.by_label = {o.label: o for o in usable}
        # ops that may follow another op: float primary input with unconstrained values and a template
        self.chainable: dict[int, list[tuple[SeedOp, str]]] = defaultdict(list)
        for o in usable:
            if o.inputs[0].dtype == "float32" and o.inputs[0].values == "normal":
                for t in o.templates:
                    self.chainable[len(TEMPLATES[t])].append((o, t))
        # ops that may start a graph: any usable op whose primary input has a batch dim
        self.starters = [o for o in usable if _primary_shape(o, None) and _primary_shape(o, None)[0] == "N"]
        self.reducers = [self.by_label[r] for r in REDUCERS if r in self.by_label]

    # ---- op choice, spreading over categories ----
    def _pick(self, rng: random.Random, items: list, key=lambda it: it):
        by_cat: dict[str, list] = defaultdict(list)
        for it in items:
            by_cat[key(it).category].append(it)
        cats = sorted(by_cat)
        weights = [self.category_weights.get(c, 1.0) for c in cats]
        if sum(weights) <= 0:
            raise SamplingError("category weights exclude every op")
        cat = rng.choices(cats, weights)[0]
        return rng.choice(by_cat[cat])

    # ---- building blocks ----
    def _start(self, rng: random.Random, g: OpGraph) -> str:
        for _ in range(20):
            seed = self._pick(rng, self.starters)
            templates = [t for t in seed.templates if TEMPLATES[t][0] == "N"] or [None]
            t = rng.choice(templates)
            shape = list(TEMPLATES[t]) if t else list(seed.inputs[0].shape)
            local = {s: rng.choice(self.profile.sizes[s]) for s in ("C", "K", "L", "H", "W", "D")}
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
            node = self._apply(rng, g, seed, [first], local, first_shape=names)
            if node:
                return node
            g.remove(first)
        raise SamplingError("no starting op fits")

    def _apply(self, rng, g: OpGraph, seed: SeedOp, args: list[str], local: dict[str, int],
               first_shape: list | None = None, extra_from: list[str] | None = None) -> str | None:
        """Add ``seed`` consuming ``args`` (primary first); create graph inputs for its other tensors."""
        local = dict(local)
        local.setdefault("K", rng.choice(self.profile.sizes["K"]))
        new_inputs = []
        all_args = list(args)
        if extra_from is None:
            for spec in seed.inputs[1:]:
                if isinstance(spec.shape, str):  # like:<i>: the same shape as that input
                    sym = first_shape if first_shape is not None else self._symbolic_shape(g, args[0])
                    if sym is None:
                        self._drop(g, new_inputs)
                        return None
                    shape = list(sym)
                else:
                    shape = [SIZE_NAMES["N"] if d == "N" else (local[d] if isinstance(d, str) else d)
                             for d in spec.shape]
                    if "N" in spec.shape and not self._batch_first(g, args[0]):
                        self._drop(g, new_inputs)
                        return None
                inp = g.add_input(shape, spec.dtype, spec.values)
                new_inputs.append(inp)
                all_args.append(inp)
        else:
            all_args += extra_from
        init = {k: resolve_value(v, local) for k, v in seed.init_args.items()}
        call = {k: resolve_value(v, local) for k, v in seed.call_args.items()}
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
            g.run("meta", {**g.sizes, "batch_size": PROBE_BATCH})
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
        """Shape of ``node``'s output as size names / ints, or None if a dim depends on the batch
        other than by equality (then no extra input can be written for it)."""
        a = g.run("meta")[node].shape
        b = g.run("meta", {**g.sizes, "batch_size": PROBE_BATCH})[node].shape
        if len(a) != len(b):
            return None
        out = []
        for x, y in zip(a, b, strict=True):
            if x == y:
                out.append(int(x))
            elif x == g.sizes["batch_size"] and y == PROBE_BATCH:
                out.append(SIZE_NAMES["N"])
            else:
                return None
        return out

    def _next(self, rng, g: OpGraph, prev: str, tries: int = 25) -> str | None:
        shape = tuple(g.run("meta")[prev].shape)
        options = self.chainable.get(len(shape), [])
        if not options:
            return None
        for _ in range(tries):
            seed, t = self._pick(rng, options, key=lambda it: it[0])
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
    def sample(self, rng: random.Random, k: int) -> tuple[OpGraph, str]:
        """A graph with exactly ``k`` ops and the pattern used. Raises SamplingError after 50 attempts."""
        for _ in range(50):
            pattern = self._pattern(rng, k)
            g = OpGraph()
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

    def _chain(self, rng, g, start: str, n: int) -> str | None:
        node = start
        for _ in range(n):
            node = self._next(rng, g, node)
            if node is None:
                return None
        return node

    def _build(self, rng, g: OpGraph, pattern: str, k: int) -> bool:
        x = self._start(rng, g)
        if pattern == "chain":
            return self._chain(rng, g, x, k - 1) is not None
        if pattern in ("residual", "gating"):
            y = self._chain(rng, g, x, k - 2)
            if y is None:
                return False
            src = g.args_of(x)[0]  # the graph input feeding the first op
            if tuple(g.run("meta")[y].shape) != g.input_shape(src) or g.g.nodes[src]["dtype"] != "float32":
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
            options = self.chainable.get(len(shape), [])
            for _ in range(25):
                seed, t = self._pick(rng, options, key=lambda it: it[0])
                local = dict(zip(TEMPLATES[t], shape, strict=True))
                b = self._apply(rng, g, seed, [src], local)
                if b is None:
                    continue
                vals = g.run("meta")
                if vals[b].shape == vals[x].shape and seed.label != g.g.nodes[x]["label"]:
                    break
                g.remove(b)
            else:
                return False
            cat = self.by_label.get("torch.cat")
            if cat is None:
                return False
            c = self._apply(rng, g, cat, [x], {}, extra_from=[b])
            return c is not None and self._chain(rng, g, c, k - 3) is not None
        raise ValueError(pattern)


def _primary_shape(o: SeedOp, t):
    if o.templates:
        return TEMPLATES[o.templates[0]]
    return o.inputs[0].shape if isinstance(o.inputs[0].shape, list) else None


def _resolve_index(values: str, local: dict[str, int]) -> str:
    if values.startswith("index:") and values[6:] in local:
        return f"index:{local[values[6:]]}"
    return values
