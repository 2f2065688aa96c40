"""Audit of the built extension: its sources and the symbols its ``.so`` imports, checked by the grader.

The extension may allocate, read tensor metadata, copy, get CUDA streams and launch its own kernels. It may
not reach torch's compute or step around the dispatcher guard (``harness.guard``), so the grader rejects:

* ``symbol:`` an imported symbol (``nm -D --undefined-only``, demangled) that is
  - an operator entry point ``at::_ops::<op>::call`` / ``redispatch`` of an aten op outside
    ``harness.guard.ALLOWED_ATEN`` (``at::relu``, ``x * y`` and ``torch::matmul`` all compile to these);
  - a per-backend kernel (``at::native::``, ``at::cpu::``, ``at::cuda::`` math and BLAS, ``at::meta::``,
    ``at::composite*::``), the dispatcher itself (``c10::Dispatcher``, ``c10::OperatorHandle``), the
    thread-local dispatch key set (``tls_set_dispatch_key_*``, ``IncludeDispatchKeyGuard``,
    ``_force_tls_local_dispatch_key_set``), profiler / RecordFunction observers, TorchScript;
  - a library function outside the library policy (``harness.libraries``: cuBLAS / cuBLASLt for GEMM,
    cuDNN for convolution, each with its handle and descriptor management; no other library: cuFFT,
    cuSPARSE, cuSOLVER, cuRAND, NCCL, cuTENSOR, NPP...);
  - a way around this audit or the process: ``dlopen`` / ``dlsym``, ``PyImport_*``, ``PyRun_*``,
    ``PyEval_EvalCode``, ``Py_CompileString*``, new processes or process groups (``fork``, ``clone``,
    ``setsid``, ``exec*``, ``system``, ``popen``, ``posix_spawn``), ``ptrace`` / ``process_vm_*``. A raw
    ``syscall`` is denied in the sources only: every nvcc-built extension imports it (an honest CUDA
    extension built on an H200 with torch 2.11 / CUDA 13 imports ``syscall@GLIBC_2.2.5``).
* ``source:`` a source text token for what every torch extension imports anyway and so cannot be told
  apart by symbol: ``ExcludeDispatchKeyGuard`` / ``AutoDispatchBelow*`` / ``DispatchKeySet`` (dispatch key
  exclusion), calls back into Python (``.attr(``, ``getattr(``, ``py::module_::import``, ``py::eval`` /
  ``py::exec``, ``py::globals``, any direct ``Py...(`` call of the Python C API), and the obfuscations that would hide a token (``##`` token
  pasting, ``\\u`` universal character names); and the library policy's source checks
  (``harness.libraries.source_violations``: a denied library's identifier or header, a cuBLAS / cuDNN function
  outside the GEMM / convolution families, a cuDNN graph without a convolution).

Standard C/C++ runtime, CUDA runtime / driver calls, pybind11 and the tensor accessors pass.
"""

from __future__ import annotations

import re
import subprocess
from functools import lru_cache
from pathlib import Path

from opforge.harness.guard import ALLOWED_ATEN
from opforge.harness.libraries import call_allowed, source_violations

DENIED_PREFIXES = (
    "at::native::", "at::cpu::", "at::meta::", "at::compositeexplicitautograd", "at::compositeimplicitautograd",
    "at::sparse", "at::mps::", "at::cuda::blas", "at::cuda::cublas", "at::cuda::native", "c10::Dispatcher",
    "c10::OperatorHandle", "c10::impl::OperatorEntry", "c10::impl::tls_set_dispatch_key",
    "c10::impl::IncludeDispatchKeyGuard", "c10::impl::_force_tls_local_dispatch_key_set",
    "c10::impl::raw_local_dispatch_key_set", "at::RecordFunction", "at::addGlobalCallback",
    "at::addThreadLocalCallback", "at::removeCallback", "at::clearCallbacks", "at::clearGlobalCallbacks",
    "at::clearThreadLocalCallbacks", "at::enableRecordFunction", "at::RecordFunctionGuard",
    "torch::autograd::profiler", "torch::profiler", "torch::jit::", "at::ThreadLocalState::setThreadLocalState",
)
DENIED_C = re.compile(r"^(dlopen|dlsym|dlvsym|dlmopen|PyImport_\w+|PyRun_\w+|PyEval_EvalCode\w*|Py_CompileString\w*|"
                      r"fork|vfork|clone\d?|setsid|setpgid|daemon|execv\w*|execl\w*|execve|system|popen|posix_spawn\w*|"
                      r"ptrace|process_vm_\w+)(@.*)?$")
# at::cuda:: names an extension needs: streams, devices, contexts, allocators, launch checks
CUDA_OK = re.compile(r"^at::cuda::(get\w*Stream\w*|setCurrentCUDAStream|getCurrentDeviceProperties|"
                     r"getDeviceProperties|device_count|current_device|set_device|CUDAStream|warp_size|detail::)")
DENIED_TOKENS = ("ExcludeDispatchKeyGuard", "AutoDispatchBelow", "DispatchKeySet", "tls_set_dispatch_key",
                 "IncludeDispatchKeyGuard", "RecordFunction", ".attr(", "module_::import", "module::import",
                 "py::eval", "py::exec", "pybind11::eval", "pybind11::exec", "py::globals", "pybind11::globals",
                 "getattr(", "dlsym", "dlopen", "syscall", "at::native", "at::cpu::", "c10::Dispatcher", "##")
_UCN = re.compile(r"\\[uU][0-9a-fA-F]{4}")
_PY_CAPI = re.compile(r"\b_?Py[A-Z][A-Za-z]*_?\w*\s*\(")  # a direct call of the Python C API
_OPS = re.compile(r"^at::_ops::(\w+)::(call|redispatch)\(")


@lru_cache(maxsize=1)
def _op_names() -> dict[str, str]:
    """``at::_ops`` struct name -> aten op name, over every registered schema (``name`` or
    ``name_overload``)."""
    import torch

    out = {}
    for s in torch._C._jit_get_all_schemas():
        if s.name.startswith("aten::"):
            name = s.name[len("aten::"):]
            out[f"{name}_{s.overload_name}" if s.overload_name else name] = name
    return out


def imported_symbols(so_path: str | Path) -> list[str]:
    """Undefined dynamic symbols of ``so_path``, demangled (``nm -D --undefined-only -C``).

    Raises:
        RuntimeError: ``nm`` is missing or fails.
    """
    try:
        proc = subprocess.run(["nm", "-D", "--undefined-only", "-C", str(so_path)], capture_output=True,
                              text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"nm on {so_path}: {exc}") from None
    if proc.returncode != 0:
        raise RuntimeError(f"nm on {so_path} failed: {proc.stderr.strip()[:300]}")
    return [line.split(None, 1)[1].strip() for line in proc.stdout.splitlines() if len(line.split(None, 1)) == 2]


def denied_symbols(symbols: list[str]) -> list[str]:
    """The symbols of ``symbols`` the rules above deny, in order, de-duplicated (a short name each: the
    op's ``at::_ops`` name, or the symbol cut before its argument list)."""
    names = _op_names()
    bad: list[str] = []
    for sym in symbols:
        short = sym.split("(")[0]
        m = _OPS.match(sym)
        if m:
            op = names.get(m.group(1), m.group(1))
            if op not in ALLOWED_ATEN:
                short = f"at::_ops::{m.group(1)}"
            else:
                continue
        elif not (short.startswith(DENIED_PREFIXES) or DENIED_C.match(short) or call_allowed(short) is False
                  or (short.startswith("at::cuda::") and not CUDA_OK.match(short))):
            continue
        if short not in bad:
            bad.append(short)
    return bad


def denied_tokens(sources: dict[str, str]) -> list[str]:
    """``"<file>:<token>"`` for each denied token in the extension sources (the harness's own binding files
    are not passed in)."""
    bad = []
    for rel, text in sorted(sources.items()):
        for tok in DENIED_TOKENS:
            if tok in text:
                bad.append(f"{rel}:{tok}")
        if _UCN.search(text):
            bad.append(f"{rel}:\\u")
        m = _PY_CAPI.search(text)
        if m:
            bad.append(f"{rel}:{m.group(0).rstrip('( ')}")
        bad += [f"{rel}:{t}" for t in source_violations(text)]
    return bad


def audit_extension(so_path: str | Path | None, sources: dict[str, str]) -> list[str]:
    """Hack labels (``symbol:...``, ``source:...``) for a built extension; empty when it passes."""
    hacks = [f"source:{t}" for t in denied_tokens(sources)]
    if so_path is not None:
        hacks += [f"symbol:{s}" for s in denied_symbols(imported_symbols(so_path))]
    return hacks
