"""Probe a candidate op: find a working recipe on the ``meta`` device, then confirm it on CPU.

A *draft* is a ``SeedOp`` whose recipe may be incomplete: ``templates`` empty means "try every shape
template of ``seed_op.TEMPLATES`` for the primary input". The probe returns the validated ``SeedOp`` or a
``SkipRecord`` with a reason code:

* ``no_recipe`` - no template worked on ``meta`` (the last error is kept as detail);
* ``no_meta_kernel`` + CPU fallback failed; ``cpu_error`` - meta worked, the real forward raised;
* ``non_tensor_output`` - the op returns no tensor; ``shape_mismatch`` - CPU and meta shapes disagree;
* ``non_finite`` - every value recipe gives NaN/Inf.

``probe_dtypes`` then finds which floating dtypes (``seed_op.FLOAT_DTYPES``) a validated op's CPU forward
accepts. Probes run in sandboxed child processes during a harvest (``seeds.probe_pool``).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from opforge.seeds.categories import categorize
from opforge.seeds.seed_op import (
    AUTO_TEMPLATES,
    FLOAT_DTYPES,
    PROBE_SIZES,
    TEMPLATES,
    SeedOp,
    SkipRecord,
    TensorSpec,
)
from opforge.seeds.tensors import concrete_shape, make_tensor, resolve_value
from torch.utils._python_dispatch import TorchDispatchMode


class ProbeFailure(Exception):
    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


def resolve_qualname(qualname: str) -> Any:
    """Import ``pkg.mod.Name`` (or ``pkg.mod.Class.attr``, ``pkg.mod:Name``, ``/abs/file.py:Name``) and return
    the object (``seeds.user_ops.resolve``).

    Raises ImportError / AttributeError naming the path (and the closest names) when it does not resolve.
    """
    from opforge.seeds.user_ops import resolve

    return resolve(qualname)


def first_tensor(out) -> tuple[torch.Tensor | None, int | None]:
    if isinstance(out, torch.Tensor):
        return out, None
    if isinstance(out, (tuple, list)):
        for i, o in enumerate(out):
            if isinstance(o, torch.Tensor):
                return o, i
    return None, None


def _config_obj(op: SeedOp):
    if op.config_class is None:
        return None
    return resolve_qualname(op.config_class)(**(op.config or {}))


def build_callable(op: SeedOp, sizes: dict[str, int], device: str):
    """The module instance (modules) or the function object (functions) for ``op`` at ``sizes``."""
    obj = resolve_qualname(op.qualname)
    if op.kind == "function":
        return obj
    init = {k: resolve_value(v, sizes) for k, v in op.init_args.items()}
    with torch.device(device):
        if op.config_class is not None:
            return obj(_config_obj(op), **init)
        return obj(**init)


def make_inputs(op: SeedOp, sizes: dict[str, int], device: str, generator=None,
                value_override: str | None = None) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    """Concrete positional tensors and tensor keyword params for one call of ``op`` at ``sizes``."""
    shapes: list[tuple[int, ...]] = []
    tensors = []
    for i, spec in enumerate(op.inputs):
        if value_override and spec.dtype == "float32" and spec.values == "normal":
            spec = spec.model_copy(update={"values": value_override})
        shape = concrete_shape(spec, sizes, shapes)
        shapes.append(shape)
        tensors.append(make_tensor(spec, shape, sizes, device, generator if i == 0 else None))
    params = {k: make_tensor(s, concrete_shape(s, sizes, shapes), sizes, device) for k, s in op.params.items()}
    return tensors, params


def call_op(op: SeedOp, fn, tensors, params, sizes):
    call = {k: resolve_value(v, sizes) for k, v in op.call_args.items()}
    if op.tensor_list:
        return fn(list(tensors), **params, **call)
    return fn(*tensors, **params, **call)


def with_template(op: SeedOp, template: str) -> SeedOp:
    first = op.inputs[0].model_copy(update={"shape": list(TEMPLATES[template])})
    return op.model_copy(update={"inputs": [first, *op.inputs[1:]]})


def _meta_try(op: SeedOp) -> tuple[torch.Size, str]:
    fn = build_callable(op, PROBE_SIZES, "meta")
    tensors, params = make_inputs(op, PROBE_SIZES, "meta")
    out, idx = first_tensor(call_op(op, fn, tensors, params, PROBE_SIZES))
    if out is None:
        raise ProbeFailure("non_tensor_output", type(out).__name__)
    return out.shape, idx


_EMPTY_FACTORIES = {
    torch.ops.aten.empty.memory_format,
    torch.ops.aten.empty_strided.default,
    torch.ops.aten.empty_like.default,
    torch.ops.aten.new_empty.default,
    torch.ops.aten.new_empty_strided.default,
}


class PoisonEmpty(TorchDispatchMode):
    """Fill every floating tensor made by an ``empty`` factory with NaN.

    A parameter built with ``torch.empty`` and never initialised (as the fused expert weights of many
    transformers MoE blocks are, until ``PreTrainedModel._init_weights`` runs) then shows as NaN instead
    of whatever the allocator handed back, which made the old "two builds agree" check pass by luck.
    """

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in _EMPTY_FACTORIES and out.is_floating_point():
            out.fill_(float("nan"))
        return out


def _check_initialised(op: SeedOp, seed: int) -> None:
    """Raise ``uninitialized_state`` when a build leaves state at NaN-poisoned or unseeded values.

    Both builds run under ``PoisonEmpty``, so no comparison ever sees allocator garbage: an unpoisoned twin
    could reuse freed NaN-filled memory and match the poisoned build by chance (ExaoneMoeSparseMoEBlock's
    expert weights passed that way now and then, and the re-probe test flaked).
    """
    builds = []
    for _ in range(2):
        torch.manual_seed(seed)
        with PoisonEmpty():
            builds.append(build_callable(op, PROBE_SIZES, "cpu"))
    fn, twin = builds
    for (k, a), b in zip(fn.state_dict().items(), twin.state_dict().values(), strict=True):
        if not a.is_floating_point():
            continue
        if bool(torch.isnan(a).any()):
            raise ProbeFailure("uninitialized_state", f"{k} is left as torch.empty memory by the constructor")
        if not torch.equal(a, b):
            raise ProbeFailure("uninitialized_state", f"{k} differs between two seeded builds")


def _cpu_run(op: SeedOp, values: str | None, seed: int = 0):
    torch.manual_seed(seed)
    fn = build_callable(op, PROBE_SIZES, "cpu")
    if isinstance(fn, torch.nn.Module):
        _check_initialised(op, seed)
    gen = torch.Generator().manual_seed(1234)
    tensors, params = make_inputs(op, PROBE_SIZES, "cpu", gen, values)
    with torch.no_grad():
        a = call_op(op, fn, tensors, params, PROBE_SIZES)
        b = call_op(op, fn, tensors, params, PROBE_SIZES)  # no re-seed in between: RNG use shows
    return a, b


def probe(draft: SeedOp) -> SeedOp | SkipRecord:
    """Validate ``draft`` and fill in its recipe; see the module docstring for skip reasons."""
    try:
        return _probe(draft)
    except ProbeFailure as f:
        return SkipRecord(label=draft.label, qualname=draft.qualname, library=draft.library,
                          reason=f.reason, detail=f.detail[:300])
    except Exception as exc:  # building the op itself failed
        return SkipRecord(label=draft.label, qualname=draft.qualname, library=draft.library,
                          reason="build_error", detail=f"{type(exc).__name__}: {exc}"[:300])


def _cpu_confirm(op: SeedOp):
    """One real forward on CPU, retrying value recipes for ops with a restricted domain (log, acos, ...).

    Returns ``(values, out_a, out_b, output_index)``; raises ProbeFailure."""
    err = ""
    for values in (None, "unit", "positive"):
        try:
            a, b = _cpu_run(op, values)
        except Exception as exc:
            err = f"{type(exc).__name__}: {exc}"
            continue
        out_a, idx = first_tensor(a)
        if out_a is None:
            raise ProbeFailure("non_tensor_output", type(a).__name__)
        if out_a.is_floating_point() and out_a.numel() and not torch.isfinite(out_a).all():
            err = f"non-finite output with values={values or 'normal'}"
            continue
        return values, out_a, first_tensor(b)[0], idx
    raise ProbeFailure("non_finite" if err.startswith("non-finite") else "cpu_error", err)


def _probe(draft: SeedOp) -> SeedOp:
    candidates = draft.templates or (list(AUTO_TEMPLATES) if _is_auto(draft) else [])
    variants = [(t, with_template(draft, t)) for t in candidates] or [(None, draft)]
    ok: list[tuple[str | None, SeedOp, tuple, tuple]] = []  # (template, op, meta shape, cpu result)
    last_err, meta_any = "", False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for t, op in variants:
            try:
                meta_shape, _ = _meta_try(op)
                meta_any = True
            except ProbeFailure:
                raise
            except Exception as exc:
                last_err = f"{t or 'recipe'}: {type(exc).__name__}: {exc}"
                if not _no_meta_kernel(last_err):
                    continue
                meta_shape = None  # no meta kernel: fall back to the CPU check alone
            try:
                result = _cpu_confirm(op)
            except ProbeFailure as f:
                if f.reason == "non_tensor_output":
                    raise
                last_err = f"{t or 'recipe'}: {f.detail}"
                continue
            if meta_shape is not None and tuple(meta_shape) != tuple(result[1].shape):
                last_err = f"{t}: meta {tuple(meta_shape)} vs cpu {tuple(result[1].shape)}"
                continue
            ok.append((t, op, meta_shape, result))
    if not ok:
        reason = "no_recipe" if meta_any or not _no_meta_kernel(last_err) else "no_meta_kernel"
        if "non-finite" in last_err:
            reason = "non_finite"
        raise ProbeFailure(reason, last_err)
    _, op, meta_shape, (values, out_a, out_b, idx) = ok[0]
    meta_ok = all(m is not None for _, _, m, _ in ok)
    stochastic = out_a.shape != out_b.shape or not torch.equal(out_a, out_b) and not (
        out_a.is_floating_point() and torch.allclose(out_a, out_b, equal_nan=True, rtol=0, atol=0))
    if values:
        op = op.model_copy(update={"inputs": [
            s.model_copy(update={"values": values}) if s.dtype == "float32" and s.values == "normal" else s
            for s in op.inputs]})
    if op.library == "torch" and meta_ok:
        traced = _traced_labels(op)
        if len(traced) != 1 or op.label not in traced[0]:
            raise ProbeFailure("untraceable_label", f"a call of {op.label} traces as {traced}")
    in_shape = concrete_shape(op.inputs[0], PROBE_SIZES, []) if op.inputs else ()
    name = op.label.split(".")[-1]
    return op.model_copy(update={
        "templates": [t for t, *_ in ok if t is not None] or op.templates,
        "output_index": idx,
        "output_dtype": str(out_a.dtype).replace("torch.", ""),
        "output_shape": list(out_a.shape),
        "stochastic": bool(stochastic) or draft.stochastic,
        "meta_ok": meta_ok,
        "validated": "meta+cpu" if meta_ok else "cpu",
        "category": op.category or categorize(name, tuple(out_a.shape) == tuple(in_shape)),
    })


class _CallOnce(torch.nn.Module):
    def __init__(self, op: SeedOp, fn):
        super().__init__()
        self.op, self.fn = op, fn

    def forward(self, *tensors):
        return call_op(self.op, self.fn, list(tensors[:len(self.op.inputs)]),
                       dict(zip(self.op.params, tensors[len(self.op.inputs):], strict=True)), PROBE_SIZES)


def _traced_labels(op: SeedOp) -> list[tuple[str, ...]]:
    """Labels the op tracer recovers from one ``meta`` call of ``op`` (it must find exactly ``op.label``:
    the composer's ``ops`` column is checked against this tracer)."""
    from opforge.task.trace import trace_ops

    fn = build_callable(op, PROBE_SIZES, "meta")
    tensors, params = make_inputs(op, PROBE_SIZES, "meta")
    return [t.labels for t in trace_ops(_CallOnce(op, fn), [*tensors, *params.values()])]


def _is_auto(op: SeedOp) -> bool:
    return bool(op.inputs) and op.inputs[0].shape == []


def _no_meta_kernel(err: str) -> bool:
    e = err.lower()
    return any(s in e for s in ("meta", "data-dependent", "data dependent", "item()", "not implemented",
                                "notimplemented", "unbacked", "nonzero"))


def auto_input(**kw) -> TensorSpec:
    """Primary-input placeholder for a draft whose template the probe chooses."""
    return TensorSpec(shape=[], **kw)


def probe_dtypes(op: SeedOp) -> list[str]:
    """The ``FLOAT_DTYPES`` whose CPU forward ``op`` (a validated op) accepts, float32 always first.

    For bfloat16 and float16: the op is built seeded on CPU (a module is cast with ``.to(dtype)``), its
    floating inputs and parameters are cast to the dtype, and one forward at ``PROBE_SIZES`` must return
    (at ``op.output_index``) a finite tensor of that dtype; an op whose float32 output is not floating
    (``argmax``, ``isnan``...) must return the same dtype as in float32, and counts only when something
    floating was cast. Any exception rejects that dtype.
    """
    out = ["float32"]
    for name in FLOAT_DTYPES[1:]:
        try:
            ok = _runs_in(op, getattr(torch, name))
        except Exception:  # noqa: BLE001 - an op that fails in a dtype does not accept it
            ok = False
        if ok:
            out.append(name)
    return out


def _runs_in(op: SeedOp, dtype: torch.dtype) -> bool:
    torch.manual_seed(0)
    fn = build_callable(op, PROBE_SIZES, "cpu")
    cast_any = False
    if isinstance(fn, torch.nn.Module):
        cast_any = any(t.is_floating_point() for t in (*fn.parameters(), *fn.buffers()))
        fn = fn.to(dtype)
    tensors, params = make_inputs(op, PROBE_SIZES, "cpu", torch.Generator().manual_seed(1234))
    cast_any = cast_any or any(t.is_floating_point() for t in (*tensors, *params.values()))

    def cast(t: torch.Tensor) -> torch.Tensor:
        return t.to(dtype) if t.is_floating_point() else t

    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = call_op(op, fn, [cast(t) for t in tensors], {k: cast(v) for k, v in params.items()},
                         PROBE_SIZES)
    if op.output_index is not None and isinstance(result, (tuple, list)):
        result = result[op.output_index]
    if not isinstance(result, torch.Tensor):
        return False
    if op.output_dtype in FLOAT_DTYPES:
        return result.dtype == dtype and bool(torch.isfinite(result).all())
    return cast_any and str(result.dtype).replace("torch.", "") == op.output_dtype
