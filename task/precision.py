"""Evaluation tolerances per floating dtype: the one place every filter and the harness take them from.

A candidate output ``out`` matches a reference ``ref`` when ``|out - ref| <= atol + rtol * |ref|`` holds
elementwise (``torch.allclose``), with ``(atol, rtol)`` chosen by the reference's dtype:

| dtype | atol = rtol | source |
|---|---|---|
| float32 (and float64, complex) | 1e-2 | KernelBench ``eval_kernel_against_ref`` and CUDA-Agent's verifier |
| float16 | 1e-2 | as float32: fp16's unit roundoff (2^-11 = 4.9e-4) is 20x below the tolerance |
| bfloat16 | 2e-2 | bf16's unit roundoff is 2^-8 = 3.9e-3; ``torch.testing.assert_close`` uses rtol 1.6e-2 for bf16, rounded up to twice KernelBench's fp32 tolerance so that eager and Inductor (which keeps fp32 intermediates) agree on bf16 tasks |

Integer and bool outputs are compared with the float32 numbers here (an exact answer is within any tolerance);
the grader (``harness.grader``) holds them to an exact match instead (atol 0.5, rtol 0): a relative tolerance
would accept a token index of 100,000 off by up to 1,000.
"""

from __future__ import annotations

import torch

DEFAULT_TOLERANCE = (1e-2, 1e-2)
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (2e-2, 2e-2),
}
# Names of the dtypes a task may be composed in (the ``dtype`` column of a published row).
TASK_DTYPES = ("float32", "bfloat16", "float16")


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """``(atol, rtol)`` for comparing outputs whose reference has ``dtype`` (table in the module doc)."""
    return TOLERANCES.get(dtype, DEFAULT_TOLERANCE)


def task_dtype(tensors) -> str:
    """The lowest floating precision among ``tensors`` (``bfloat16`` < ``float16`` < ``float32``), as a
    name of ``TASK_DTYPES``; ``float32`` when none is a reduced-precision float. Non-tensors are ignored."""
    names = {str(t.dtype).removeprefix("torch.") for t in tensors if isinstance(t, torch.Tensor)}
    for name in ("bfloat16", "float16"):
        if name in names:
            return name
    return "float32"


def dtype_from_name(name: str) -> torch.dtype:
    """``torch.bfloat16`` for ``"bfloat16"`` etc. Raises ValueError naming the choices of ``TASK_DTYPES``."""
    if name not in TASK_DTYPES:
        raise ValueError(f"unknown task dtype {name!r}; choices: {', '.join(TASK_DTYPES)}")
    return getattr(torch, name)
