"""Output comparison on CUDA in one pass over memory: a Triton kernel behind ``execution.error_stats``.

The torch formulation of a tolerance comparison (``execution._chunk_stats``) makes about a dozen passes
over both tensors (isnan, isinf, differences, divisions, where, max, each a kernel and a temporary); on a
GPU shared by many sandboxes those comparisons cost more GPU time than the forward calls they check
(measured on an H200, 2026-11-21, kernel time per task: determinism 57 ms with torch comparisons, 28 with
this kernel; degenerate 39 and 16; record in the git history of docs/benchmark-log.md). This kernel reads
each element of both tensors once, in their own dtype (half, bfloat16, float32 computed in float32; float64
in float64), and writes one maximum and one count per block; a second, tiny reduction and one host read
finish it.

Semantics are ``execution._chunk_stats``': per element ``|out - ref| / (atol + rtol |ref|)`` where both
are finite; ``inf`` where NaNs are not in the same places or an infinity is not matched exactly; 0 where
both are the same non-finite value. ``out`` may be one element, compared with every element of ``ref``.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

BLOCK = 4096


@triton.jit
def _tolerance_kernel(ref_ptr, out_ptr, err_ptr, within_ptr, n, atol, rtol,
                      OUT_SCALAR: tl.constexpr, F64: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(ref_ptr + offs, mask=mask, other=0.0)
    if OUT_SCALAR:
        b = tl.load(out_ptr + offs * 0, mask=mask, other=0.0)
    else:
        b = tl.load(out_ptr + offs, mask=mask, other=0.0)
    if F64:
        a = a.to(tl.float64)
        b = b.to(tl.float64)
    else:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    nan_a = a != a
    nan_b = b != b
    inf_a = tl.abs(a) == float("inf")
    inf_b = tl.abs(b) == float("inf")
    mismatch = (nan_a != nan_b) | ((inf_a | inf_b) & (a != b))
    finite = ~(nan_a | nan_b | inf_a | inf_b)
    err = tl.where(finite, tl.abs(a - b) / (atol + rtol * tl.abs(a)), 0.0)
    err = tl.where(mismatch, float("inf"), err)
    err = tl.where(mask, err, 0.0)
    tl.store(err_ptr + pid, tl.max(err, axis=0))
    tl.store(within_ptr + pid, tl.sum(tl.where(mask & (err <= 1.0), 1, 0).to(tl.int64), axis=0))


def error_stats_cuda(ref: torch.Tensor, out: torch.Tensor, atol: float, rtol: float) -> tuple[float, int]:
    """(max error, elements within tolerance) of flat, floating-point CUDA tensors ``ref`` and ``out``
    (``out`` of ``ref``'s numel, or of one element); both on one device, ``ref.numel() > 0``. One host
    read. Raises whatever Triton raises for a dtype it cannot load (callers fall back to torch)."""
    n = ref.numel()
    f64 = ref.dtype == torch.float64 or out.dtype == torch.float64
    blocks = triton.cdiv(n, BLOCK)
    err = torch.empty(blocks, dtype=torch.float64 if f64 else torch.float32, device=ref.device)
    within = torch.empty(blocks, dtype=torch.int64, device=ref.device)
    with torch.cuda.device(ref.device) if ref.is_cuda else contextlib.nullcontext():  # CPU: Triton's interpreter
        _tolerance_kernel[(blocks,)](ref, out, err, within, n, atol, rtol, OUT_SCALAR=out.numel() == 1 and n > 1,
                                     F64=f64, BLOCK=BLOCK, num_warps=8)
    worst, count = torch.stack([err.max().double(), within.sum().double()]).tolist()
    return worst, int(count)
