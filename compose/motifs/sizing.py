"""Size a motif for the runtime window: its roofline cost as a function of batch and sequence length.

Every traced size is a monomial ``c * batch^p * seq^q`` of the trace's sentinel sizes
(``motif_render.Symbols``), so each value's element count is one too, and so are each op's bytes (its inputs
and outputs, read or written once) and FLOPs (a traced heavy op's FLOPs scale with its output's element
count: a GEMM, convolution or attention product does a fixed amount of work per output element at fixed
inner sizes). The predicted eager time is the profile's roofline per op plus its launch overhead
(``compose.graphs.cost_model``'s rule); ``choose_sizes`` picks the batch and sequence length from the shape
vocabulary whose predicted time is nearest the window's log-midpoint, inside the memory caps and never past
the family's longest sequence.
"""

from __future__ import annotations

import math

from opforge.compose.device_profiles import DeviceProfile
from opforge.compose.motifs.cut import Motif
from opforge.compose.motifs.trace import template_refs

_ITEM = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int64": 8, "int32": 4, "bool": 1,
         "int8": 1, "uint8": 1}


def dim_form(v: int, batch: int, seq: int) -> tuple[int, int, int]:
    """``v`` as (c, p, q) with v = c * batch^p * seq^q, the largest sentinel powers that divide it."""
    p = q = 0
    c = int(v)
    if c >= 2:
        if seq:
            while q < 2 and c % seq == 0:
                c //= seq
                q += 1
        if batch and c % batch == 0:
            c //= batch
            p = 1
    return c, p, q


def _numel_form(shape, batch: int, seq: int, vary=None) -> tuple[int, int, int]:
    vary = vary if vary is not None and len(vary) == len(shape) else [True] * len(shape)
    c, p, q = 1, 0, 0
    for d, moves in zip(shape, vary, strict=True):
        dc, dp, dq = dim_form(int(d), batch, seq) if moves else (int(d), 0, 0)
        c, p, q = c * dc, p + dp, q + dq
    return c, p, q


class MotifCost:
    """Per-op FLOPs and bytes of a motif at any batch / sequence length and dtype (see the module docstring)."""

    def __init__(self, motif: Motif):
        self.motif = motif
        b, s = motif.batch, motif.seq
        shapes = {d["vid"]: (d["shape"], d["dtype"], d.get("vary")) for d in motif.inputs + motif.params}
        self.params = {d["vid"] for d in motif.params}
        self.ops: list[tuple[list, float, tuple]] = []  # (values read and written, flops at trace, out form)
        self.value_form: dict[int, tuple[tuple[int, int, int], str]] = {
            v: (_numel_form(sh, b, s, vy), dt) for v, (sh, dt, vy) in shapes.items()}
        for call, shape_list in zip(motif.calls, motif_out_shapes(motif), strict=True):
            varies = call.get("out_vary") or [None] * len(shape_list)
            for o, (sh, dt), vy in zip(call["outputs"], shape_list, varies, strict=True):
                if o is not None:
                    self.value_form[o] = (_numel_form(sh, b, s, vy), dt)
        for call in motif.calls:
            if not call.get("counted", True):
                continue
            vals = template_refs(call["args"]) + template_refs(call["kwargs"]) + [o for o in call["outputs"] if o is not None]
            out = next((o for o in call["outputs"] if o is not None), None)
            self.ops.append((vals, float(call.get("flops", 0.0)), self.value_form[out][0] if out is not None else
                             (1, 0, 0)))
        self.module_param_bytes = sum(_module_params(c) for c in motif.calls if c["spelling"] == "module")
        self._forms: dict[str, tuple] = {}  # dtype -> byte polynomials (``_polynomials``)

    def _bytes(self, vid: int, batch: int, seq: int, dtype: str) -> int:
        (c, p, q), dt = self.value_form[vid]
        return c * batch ** p * seq ** q * _item(dt, dtype)

    def _polynomials(self, dtype: str) -> tuple:
        """Bytes in ``dtype`` as integer polynomials in (batch, seq): {(p, q): coefficient} of each op (its
        values read and written, each once), of the inputs and of every value plus the module parameters.
        Integer arithmetic, so ``_eval`` gives exactly the sum of ``_bytes`` in any order."""
        if dtype not in self._forms:
            def poly(vids) -> tuple[tuple[int, int, int], ...]:
                terms: dict[tuple[int, int], int] = {}
                for v in vids:
                    (c, p, q), dt = self.value_form[v]
                    terms[(p, q)] = terms.get((p, q), 0) + c * _item(dt, dtype)
                return tuple((c, p, q) for (p, q), c in terms.items())

            ops = [poly(dict.fromkeys(vals)) for vals, _, _ in self.ops]
            inputs = poly([d["vid"] for d in self.motif.inputs])
            alive = poly(self.value_form) + ((self.module_param_bytes * _ITEM[dtype], 0, 0),)
            self._forms[dtype] = (ops, inputs, alive)
        return self._forms[dtype]

    def op_costs(self, batch: int, seq: int, dtype: str) -> list[tuple[float, int]]:
        """(FLOPs, bytes) of each op at ``batch`` x ``seq`` in ``dtype``."""
        b0, s0 = self.motif.batch, self.motif.seq
        polys = self._polynomials(dtype)[0]
        out = []
        for (_, flops, (_, p, q)), poly in zip(self.ops, polys, strict=True):
            scale = (batch / b0) ** p * ((seq / s0) ** q if s0 else 1.0)
            out.append((flops * scale, _eval(poly, batch, seq)))
        return out

    def predict_ms(self, batch: int, seq: int, dtype: str, profile: DeviceProfile) -> float:
        """Predicted eager ms: roofline of each op plus the profile's launch overhead per op."""
        peak = profile.peak_for(dtype) * profile.flop_efficiency
        bw = profile.bandwidth * profile.bandwidth_efficiency
        return sum(1e3 * max(f / peak, by / bw) + profile.launch_overhead_ms
                   for f, by in self.op_costs(batch, seq, dtype))

    def input_bytes(self, batch: int, seq: int, dtype: str) -> int:
        return _eval(self._polynomials(dtype)[1], batch, seq)

    def peak_bytes(self, batch: int, seq: int, dtype: str) -> int:
        """Every value alive at once (an upper bound) plus module parameters."""
        return _eval(self._polynomials(dtype)[2], batch, seq)

    def at_seq(self, seq: int, batches: list[int], dtype: str, profile: DeviceProfile
               ) -> list[tuple[int, int, int, float]]:
        """(batch, input bytes, peak bytes, predicted ms) for each of ``batches`` at ``seq``: the values of
        ``input_bytes``, ``peak_bytes`` and ``predict_ms``, bit for bit (the same float operations in the same
        order), with the sequence's powers taken once."""
        b0, s0 = self.motif.batch, self.motif.seq
        ops, inputs, alive = self._polynomials(dtype)
        peak = profile.peak_for(dtype) * profile.flop_efficiency
        bw = profile.bandwidth * profile.bandwidth_efficiency
        ovh = profile.launch_overhead_ms

        def in_batch(poly) -> list[tuple[int, int]]:  # (coefficient, power of batch) at this seq
            return [(c * seq ** q, p) for c, p, q in poly]

        per_op = [(flops, p, (seq / s0) ** q if s0 else 1.0, in_batch(poly))
                  for (_, flops, (_, p, q)), poly in zip(self.ops, ops, strict=True)]
        inputs_b, alive_b = in_batch(inputs), in_batch(alive)
        out = []
        for b in batches:
            t = sum(1e3 * max(flops * ((b / b0) ** p * sscale) / peak,
                              sum(c * b ** pb for c, pb in poly) / bw) + ovh
                    for flops, p, sscale, poly in per_op)
            out.append((b, sum(c * b ** p for c, p in inputs_b), sum(c * b ** p for c, p in alive_b), t))
        return out


def _item(value_dtype: str, dtype: str) -> int:
    """Bytes per element of a value recorded as ``value_dtype`` in a task of ``dtype``: values traced in
    float16 (the motif's floating dtype) take the task's."""
    return _ITEM[dtype] if value_dtype == "float16" else _ITEM.get(value_dtype, 4)


def _eval(poly: tuple[tuple[int, int, int], ...], batch: int, seq: int) -> int:
    return sum(c * batch ** p * seq ** q for c, p, q in poly)


def _module_params(call: dict) -> int:
    """Parameter count of a module call (recorded when it was traced)."""
    return int(call.get("module_params", 0))


def motif_out_shapes(motif: Motif) -> list[list[tuple[list, str]]]:
    """(shape, dtype) of each output of each call, from the motif's recorded ``out_shapes``."""
    return [[(sh, dt) for sh, dt in c.get("out_shapes", [])] or [([], "float16")] * len(c["outputs"])
            for c in motif.calls]


def choose_sizes(cost: MotifCost, profile: DeviceProfile, dtype: str, batches: list[int], seqs: list[int],
                 target_ms: float, band: tuple[float, float] | None = None,
                 rng=None) -> tuple[int, int, float] | None:
    """(batch, seq, predicted ms) among ``batches`` x ``seqs`` (``seqs`` ignored without a sequence axis), within
    the profile's input and memory caps: with ``band`` (lo, hi ms) and ``rng`` a random one of those predicted
    inside the band (sizes vary between candidates of one motif), else one within 2x of the nearest
    ``target_ms`` in log distance (the nearest itself without ``rng``). None when no size fits the caps."""
    best, inside = None, []
    for s in (seqs if cost.motif.seq else [0]):
        for b, inputs, alive, t in cost.at_seq(s, batches, dtype, profile):
            if inputs > profile.input_cap_bytes or alive > profile.memory_cap_bytes:
                continue
            d = abs(math.log(max(t, 1e-9) / target_ms))
            if best is None or d < best[0]:
                best = (d, b, s, t)
            if band is not None and band[0] <= t <= band[1]:
                inside.append((b, s, t))
    if inside and rng is not None:
        return rng.choice(inside)
    if best is not None and rng is not None:
        # nothing inside the band: one of the sizes within 2x of the nearest, so repeated draws of one motif
        # still differ
        near = [(b, s, t) for s in (seqs if cost.motif.seq else [0]) for b in batches
                if cost.input_bytes(b, s, dtype) <= profile.input_cap_bytes
                and cost.peak_bytes(b, s, dtype) <= profile.memory_cap_bytes
                for t in [cost.predict_ms(b, s, dtype, profile)]
                if abs(math.log(max(t, 1e-9) / target_ms)) <= best[0] + math.log(2)]
        return rng.choice(near)
    return None if best is None else best[1:]
