"""Anti-hacking checks shared by verification and profiling (one suite, used by ``harness.evaluate``).

* ``DispatchGuard``: a ``TorchDispatchMode`` active during every call of the candidate's forward. Every
  aten op that reaches the dispatcher - from Python (``torch.relu``, ``x.relu()``, ``F.relu``,
  ``torch.ops.aten.relu``, a function bound before the guard) or from C++ inside the extension
  (``at::relu``) - is checked against an allow-list of allocation, view and copy ops; ops of the
  extension's own namespaces pass. Anything else is a violation: recorded and raised as ``GuardViolation``
  (a ``BaseException``, so a candidate's ``except Exception`` cannot swallow it; the record stays either
  way). Kernels the extension launches itself never reach the dispatcher and are what the candidate is for.
* ``precision_state``: TF32 / reduced-precision flags, compared before and after each candidate call.
* ``tamper_state``: identities of the clocks, the CUDA timing entry points and the harness's own checks
  (guard, comparison), compared after the candidate's code ran (a patch is a hack even though the
  harness keeps its own references).
* ``aliases``: output storage overlapping an input or a parameter / buffer (a returned input, an answer
  cached in a buffer).
* ``audited_ops``: a second, independent look at the same rule: one candidate call under the profiler,
  whose RecordFunction observers see every dispatcher op even when the candidate steps around Python
  dispatch modes (``_disable_current_modes``, popping the mode stack); the op names must pass the same
  allow-list.
* ``foreign_streams`` (CUDA): one candidate call under the profiler (CUPTI); every kernel, copy and
  memset it issues must run on the stream the harness called it on. Work on a side stream is a hack even
  though the device-wide synchronisation in timing already charges its time.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# aten ops a candidate's forward may dispatch: allocation, metadata / views, copies and fills. No op that
# computes a result from tensor values other than moving them.
ALLOWED_ATEN = frozenset({
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros", "zeros_like",
    "new_zeros", "zero_", "fill_", "full", "full_like", "new_full", "resize_", "lift_fresh",
    "view", "_unsafe_view", "reshape", "as_strided", "expand", "t", "transpose", "permute", "squeeze",
    "unsqueeze", "slice", "select", "narrow", "unbind", "split", "split_with_sizes", "chunk", "detach",
    "alias", "clone", "copy_", "_to_copy", "contiguous", "view_as_real", "view_as_complex",
    "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "is_same_size", "_local_scalar_dense",
    "record_stream", "resolve_conj", "resolve_neg", "result_type", "_has_compatible_shallow_copy_type",
})


class GuardViolation(BaseException):  # noqa: N818 - a violation, not an error of the harness
    """A torch op outside the allow-list ran during the candidate's forward."""


class DispatchGuard(TorchDispatchMode):
    """Allow-list at the dispatcher (see the module docstring).

    Args:
        namespaces: op namespaces of the candidate's own extension (``torch.ops.<ns>.*``) that may run.

    Attributes:
        violations: ``aten.<op>`` names seen that are not allowed, in order, de-duplicated.
    """

    def __init__(self, namespaces: tuple[str, ...] = ("opforge_kernels",)):
        super().__init__()
        self.namespaces = set(namespaces)
        self.violations: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        ns = getattr(func, "namespace", "")
        name = func._schema.name.split("::")[-1] if hasattr(func, "_schema") else str(func)
        if not ((ns == "aten" and name in ALLOWED_ATEN) or ns in self.namespaces):
            op = f"{ns}.{name}"
            if op not in self.violations:
                self.violations.append(op)
            raise GuardViolation(f"torch op {op} ran inside the candidate's forward")
        return func(*args, **(kwargs or {}))


def precision_state() -> dict[str, Any]:
    """Flags that change float32 math precision (TF32 and reduced-precision reductions)."""
    m = torch.backends.cuda.matmul
    return {"matmul_tf32": bool(m.allow_tf32), "cudnn_tf32": bool(torch.backends.cudnn.allow_tf32),
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "fp16_reduced": bool(m.allow_fp16_reduced_precision_reduction),
            "bf16_reduced": bool(m.allow_bf16_reduced_precision_reduction)}


def pin_precision(allow_tf32: bool = False) -> dict[str, Any]:
    """Set TF32 on or off for matmul and cuDNN (default off, full fp32); returns ``precision_state()``."""
    torch.backends.cuda.matmul.allow_tf32 = allow_tf32
    torch.backends.cudnn.allow_tf32 = allow_tf32
    torch.set_float32_matmul_precision("high" if allow_tf32 else "highest")
    return precision_state()


def tamper_state() -> dict[str, int]:
    """``id`` of every clock / CUDA timing entry point a timer patch would replace, and of the harness's
    own checking functions (the guard, the comparison)."""
    objs = {"time.perf_counter": time.perf_counter, "time.perf_counter_ns": time.perf_counter_ns,
            "time.time": time.time, "time.monotonic": time.monotonic,
            "torch.cuda.synchronize": torch.cuda.synchronize, "torch.cuda.Event": torch.cuda.Event,
            "torch.cuda.Event.record": torch.cuda.Event.record,
            "torch.cuda.Event.elapsed_time": torch.cuda.Event.elapsed_time,
            "torch.cuda.Event.synchronize": torch.cuda.Event.synchronize,
            "torch.cuda.current_stream": torch.cuda.current_stream,
            "torch.Tensor.__eq__": torch.Tensor.__eq__, "torch.allclose": torch.allclose}
    from opforge.filters import execution
    from opforge.harness import timing

    objs.update({f"harness.timing.{n}": getattr(timing, n) for n in timing.PROTECTED})
    # the checks themselves: a candidate importing them and replacing them must not go unnoticed
    objs.update({"DispatchGuard.__torch_dispatch__": DispatchGuard.__torch_dispatch__,
                 "TorchDispatchMode.__enter__": TorchDispatchMode.__enter__,
                 "TorchDispatchMode.__exit__": TorchDispatchMode.__exit__,
                 "guard.aliases": aliases, "guard.precision_state": precision_state,
                 "execution.tolerance_error": execution.tolerance_error,
                 "execution.flatten_tensors": execution.flatten_tensors})
    return {k: id(v) for k, v in objs.items()}


def _span(t: torch.Tensor) -> tuple[str, int, int]:
    s = t.untyped_storage()
    return (str(t.device), s.data_ptr(), s.data_ptr() + s.nbytes())


def aliases(outputs: list[torch.Tensor], others: dict[str, torch.Tensor]) -> list[str]:
    """Names in ``others`` (inputs, parameters, buffers) whose storage overlaps any output's storage."""
    found = []
    spans = [_span(o) for o in outputs if o.numel() > 0]
    for name, t in others.items():
        if not isinstance(t, torch.Tensor) or t.numel() == 0:
            continue
        dev, lo, hi = _span(t)
        if any(d == dev and a < hi and lo < b for d, a, b in spans):
            found.append(name)
    return found


def audited_ops(call, namespaces: tuple[str, ...] = ("opforge_kernels",)) -> list[str]:
    """Dispatcher ops of ``call()`` outside the allow-list (``ns::op`` names, de-duplicated, in order),
    as recorded by ``torch.profiler`` (CPU activity)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        call()
    bad: list[str] = []
    for e in prof.events():
        ns, _, op = e.name.partition("::")
        if not op:
            continue  # not a dispatcher op (a profiler range)
        if (ns == "aten" and op in ALLOWED_ATEN) or ns in namespaces:
            continue
        if e.name not in bad:
            bad.append(e.name)
    return bad


def foreign_streams(call, device: str) -> list[int]:
    """Stream ids (CUPTI's) other than the calling stream's that GPU work of ``call()`` ran on.

    A marker kernel (``fill_``) is issued on the current stream first; its stream id is the reference.
    Raises RuntimeError when the profiler records no GPU activity (e.g. CUPTI unavailable).
    """
    from torch.profiler import ProfilerActivity, profile

    marker = torch.empty(1, device=device)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        marker.fill_(1.0)
        call()
        torch.cuda.synchronize()
    gpu = [e for e in prof.profiler.kineto_results.events()
           if e.device_type() == torch.autograd.DeviceType.CUDA]
    if not gpu:
        raise RuntimeError("the profiler saw no GPU activity")
    gpu.sort(key=lambda e: e.start_ns())
    home = gpu[0].device_resource_id()
    return sorted({e.device_resource_id() for e in gpu} - {home})
