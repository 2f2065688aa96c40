"""Axis misuse: does a task's ``forward`` run an axis-wise op over the batch axis, or roll a flattened tensor?

A softmax, log-softmax or softmin, a cumulative scan (``cumsum``, ``cumprod``, ``cummax``, ``cummin``,
``logcumsumexp``), a sort (``sort``, ``argsort``, ``msort``), ``topk`` / ``kthvalue``, an arg-reduction
(``argmax`` / ``argmin``, ``max`` / ``min`` with a dim), ``chunk`` / ``split`` or ``torch.gradient`` taken over
the batch axis mixes independent samples: no real model does it, and a kernel writer reading such a task
learns nothing about the op's real use. ``roll`` without ``dims`` rolls the flattened tensor (every sample
shifted into the next). ``axis_misuse(code)`` flags both.

The batch axis is dim 0 of the first input of ``get_inputs()``, followed through ``forward`` as a measured
property, not a guess from the source: the forward runs twice on the ``meta`` device (shapes only, no memory),
once as written and once with the batch doubled (or, when that fails, changed to a prime no input size
equals). Every input whose dim 0
equals the first input's takes the new batch; when a module-level size constant holds the batch (``batch_size
= 16``), that constant is rewritten instead (``task.sizes.with_sizes``), so code that reads it
(``x.view(batch_size, -1)``) still runs. An axis of an op's input carries the batch when its size differs
between the two runs (also when the batch is flattened together with other axes).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import torch
from opforge.task.sizes import size_constants, with_sizes
from opforge.task.source import load_task
from torch.overrides import TorchFunctionMode

# Op name (``__name__`` of the torch function, method or ``F`` function) -> (position of the dim argument in
# the call, counting the input as 0; keyword name; default when absent). Default ``"implicit"``: the implicit
# softmax dim of ``F.softmax(x)`` (0 for 0-, 1- and 3-D inputs, else 1: torch.nn.functional._get_softmax_dim).
DIM_OPS: dict[str, tuple[int | None, str, object]] = {
    "softmax": (1, "dim", "implicit"), "log_softmax": (1, "dim", "implicit"), "softmin": (1, "dim", "implicit"),
    "cumsum": (1, "dim", None), "cumprod": (1, "dim", None), "cummax": (1, "dim", None),
    "cummin": (1, "dim", None), "logcumsumexp": (1, "dim", None),
    "sort": (1, "dim", -1), "argsort": (1, "dim", -1), "msort": (None, "", 0),
    "topk": (2, "dim", -1), "kthvalue": (2, "dim", -1),
    "argmax": (1, "dim", "flat"), "argmin": (1, "dim", "flat"), "max": (1, "dim", "all"), "min": (1, "dim", "all"),
    "chunk": (2, "dim", 0), "split": (2, "dim", 0), "tensor_split": (2, "dim", 0),
    "roll": (2, "dims", "flat"), "gradient": (None, "dim", "every"),
}
# Primes tried as the changed batch (the first one no input size equals).
_PRIMES = (13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73, 79, 83, 89, 97)
_BATCH_NAMES = ("batch_size", "batch", "bs", "n", "N", "B", "batch_dim")


@dataclass
class AxisCheck:
    """Result of ``axis_misuse``.

    Attributes:
        misused: True when a misuse was found, False when the forward ran twice and none was found, None when
            the forward could not be traced (``reasons`` holds why).
        reasons: one line per misuse, e.g. ``softmax over the batch axis (dim 0 of [16, 128, 768])``.
    """

    misused: bool | None
    reasons: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return self.misused is True

    @property
    def reason(self) -> str:
        return "; ".join(self.reasons)


@dataclass
class _Call:
    name: str
    shape: tuple[int, ...]
    dims: object  # tuple of ints, or a marker string ("flat", "all", "every")


def _resolve(name: str, args: tuple, kwargs: dict) -> _Call | None:
    """The call's input shape and dims, or None when it is not an axis-wise use of ``name``."""
    if not args or not isinstance(args[0], torch.Tensor):
        return None
    x = args[0]
    pos, key, default = DIM_OPS[name]
    if key and key in kwargs:
        value = kwargs[key]
    elif pos is not None and len(args) > pos:
        value = args[pos]
    else:
        value = default
    if name in ("max", "min") and isinstance(value, torch.Tensor):
        return None  # the elementwise max / min of two tensors
    if name == "sort" and isinstance(value, bool):
        value = -1
    nd = x.dim()
    if value is None:
        value = default
    if value == "implicit":
        value = 0 if nd in (0, 1, 3) else 1
    if isinstance(value, str) or value is None:
        return _Call(name, tuple(x.shape), value or "all")
    if nd == 0:
        return None
    dims = value if isinstance(value, (list, tuple)) else [value]
    try:
        return _Call(name, tuple(x.shape), tuple(int(d) % nd for d in dims))
    except (TypeError, ValueError):
        return None


class _DimRecorder(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.calls: list[_Call] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in DIM_OPS:
            call = _resolve(name, args, kwargs)
            if call is not None:
                self.calls.append(call)
        return func(*args, **kwargs)


class _Partial(Exception):
    """The forward failed after recording ``calls``."""

    def __init__(self, calls: list[_Call], error: Exception):
        super().__init__(f"{type(error).__name__}: {error}")
        self.calls = calls


def _trace(code: str, batch: int | None, name: str) -> list[_Call]:
    """Run ``code``'s forward on meta (first-dim inputs set to ``batch`` when given) and record the calls.
    Raises ``_Partial`` holding the calls made before the forward failed."""
    task = load_task(code, name)
    with torch.device("meta"):
        model = task.build()
        inputs = task.inputs()
    if batch is not None:
        inputs = _rebatch(inputs, batch)
    model.eval()
    rec = _DimRecorder()
    try:
        with torch.no_grad(), warnings.catch_warnings(), rec:
            warnings.simplefilter("ignore")
            model(*inputs)
    except Exception as exc:  # noqa: BLE001 - keep what ran before the failure
        raise _Partial(rec.calls, exc) from exc
    return rec.calls


def _first_batch(inputs: list) -> int | None:
    for t in inputs:
        if isinstance(t, torch.Tensor) and t.dim() >= 1:
            return int(t.shape[0])
    return None


def _rebatch(inputs: list, batch: int) -> list:
    old = _first_batch(inputs)
    out = []
    for t in inputs:
        if isinstance(t, torch.Tensor) and t.dim() >= 1 and t.shape[0] == old:
            out.append(torch.empty((batch, *t.shape[1:]), dtype=t.dtype, device="meta"))
        else:
            out.append(t)
    return out


def _sizes_of(inputs: list) -> set[int]:
    return {int(s) for t in inputs if isinstance(t, torch.Tensor) for s in t.shape}


def _runs(code: str, name: str) -> tuple[list[_Call], list[_Call], str]:
    """The calls of the forward as written and with the batch changed (see the module doc), and "" or the
    error that stopped the second forward early (its calls are then the ones made before it)."""
    task = load_task(code, name)
    with torch.device("meta"):
        inputs = task.inputs()
    batch = _first_batch(inputs)
    if batch is None:
        raise ValueError("get_inputs() returns no tensor with a dim")
    first = _trace(code, None, name)
    constants = size_constants(code, name)
    holders = [k for k, v in constants.items() if v == batch]
    named = [k for k in holders if k in _BATCH_NAMES]
    holder = named[0] if named else (holders[0] if len(holders) == 1 else None)
    error: Exception | None = None
    partial: list[_Call] = []
    for other in _other_batches(batch, inputs):
        if holder is not None:
            try:
                changed = with_sizes(code, {holder: other}, name)
                with torch.device("meta"):
                    moved = _first_batch(load_task(changed, name).inputs()) == other
                if moved:
                    return first, _trace(changed, None, name), ""
            except _Partial as exc:
                error, partial = exc, max(partial, exc.calls, key=len)
            except Exception as exc:  # noqa: BLE001 - the constant is not (only) the batch: change the inputs
                error = exc
        try:
            return first, _trace(code, other, name), ""
        except _Partial as exc:
            error, partial = exc, max(partial, exc.calls, key=len)
    if partial:  # the ops that ran at the other batch before it failed
        return first[:len(partial)], partial, str(error)
    raise error if error is not None else ValueError("no other batch runs")


def _other_batches(batch: int, inputs: list) -> list[int]:
    """Batches tried in place of ``batch``: twice it (every divisor of the batch still divides it), then a
    prime no input size equals."""
    prime = next(p for p in _PRIMES if p not in _sizes_of(inputs) and p != batch)
    return [2 * batch, prime]


def _misuse(a: _Call, b: _Call) -> str | None:
    batch_axes = {i for i, (x, y) in enumerate(zip(a.shape, b.shape, strict=True)) if x != y}
    shape = list(a.shape)
    if a.name == "roll" and a.dims == "flat":
        return f"roll without dims (the flattened {shape} tensor)" if len(shape) > 1 or batch_axes else None
    if not batch_axes:
        return None
    if a.dims == "flat":
        return f"{a.name} over the flattened tensor, batch included ({shape})"
    if a.dims == "every":
        return f"{a.name} over every axis, batch included ({shape})"
    if a.dims == "all":
        return None  # a full reduction (max / min without a dim)
    hit = sorted(set(a.dims) & batch_axes)
    if hit:
        return f"{a.name} over the batch axis (dim {hit[0]} of {shape})"
    return None


def axis_misuse(code: str, name: str = "<task>") -> AxisCheck:
    """Whether ``code`` (a KernelBench-format task source) runs a softmax, scan, sort, topk, arg-reduction,
    ``chunk`` / ``split`` or ``torch.gradient`` over the batch axis, or a ``roll`` without dims (module doc).

    Returns an ``AxisCheck``: truthy when misused, with one reason per misuse; ``misused`` is None (falsy) when
    the forward does not run on ``meta`` (an op without a meta kernel, a data-dependent read) or runs a
    different sequence of such ops at the other batch, with the error in ``reasons``. Never raises for a bad
    task source.
    """
    try:
        first, second, stopped = _runs(code, name)
    except _Partial as exc:
        return AxisCheck(None, [f"untraced: {str(exc)[:180]}"])
    except Exception as exc:  # noqa: BLE001 - any failure of the task is a result, not a crash
        return AxisCheck(None, [f"untraced: {type(exc).__name__}: {str(exc)[:160]}"])
    if [c.name for c in first] != [c.name for c in second] or \
            any(len(a.shape) != len(b.shape) for a, b in zip(first, second, strict=True)):
        return AxisCheck(None, ["untraced: the forward runs other ops at another batch"])
    reasons = []
    for a, b in zip(first, second, strict=True):
        why = _misuse(a, b)
        if why and why not in reasons:
            reasons.append(why)
    if stopped and not reasons:
        return AxisCheck(None, [f"untraced: at another batch the forward fails: {stopped[:160]}"])
    return AxisCheck(bool(reasons), reasons)
