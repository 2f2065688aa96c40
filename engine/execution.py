"""What the execution filters share: the task being run (``TaskRun``), seeded builds, and output comparison.

Seeds: the model is built after ``torch.manual_seed(BUILD_SEED)``, inputs are drawn after
``torch.manual_seed(INPUT_SEED)`` (``ALT_INPUT_SEED`` for the second draw of the degenerate filter), and
every forward call that is compared starts from ``torch.manual_seed(CALL_SEED)``.

Tolerance: outputs are judged with ``torch.allclose(ref, out, atol, rtol)`` at the tolerance of the
reference's dtype (``opforge.task.precision``: 1e-2 for float32 and float16, KernelBench's
``eval_kernel_against_ref`` default; 2e-2 for bfloat16). ``tolerance_error`` expresses a difference in units
of that tolerance: <= 1 means "allclose would pass".

GPU locking: on CUDA each build, input draw, forward call and output comparison of a ``TaskRun`` holds the
GPU's ``compute`` lock shared (``engine.gpu_locks.gpu_work``) for just that step, so a neighbour waiting
to time its task waits for one step, not for a whole filter.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from opforge.engine.gpu_locks import gpu_work
from opforge.task.precision import tolerance
from opforge.task.source import LoadedTask, flatten_tensors, load_task

BUILD_SEED, INPUT_SEED, CALL_SEED, ALT_INPUT_SEED = 0, 1, 2, 3


@dataclass
class TaskRun:
    """One task going through the filter chain inside a worker process.

    Attributes:
        code: the KernelBench-format source.
        task_id: the id used in messages and the ledger.
        device: "cpu" or "cuda" (the child's visible GPU).
        task, model, inputs, outputs: filled in by the ``eager`` filter; later filters reuse them.
            ``outputs`` is the flat list of output tensors of ``model(*inputs)`` after ``CALL_SEED``.
        unseeded_outputs: outputs of a later call made without re-seeding (left by the
            ``runtime_screen`` filter, consumed by ``determinism``), or None.
        compiled: the ``torch.compile``-d model left by the ``compile`` filter for the ``runtime`` filter
            to time, or None.
        inputs_reproducible: True once a fresh ``draw_inputs()`` was found equal to ``inputs``
            (``same_inputs``; set by the ``determinism`` filter), so a later filter may drop ``inputs`` to
            save GPU memory and draw them again.
        screen_ms: the ``runtime_screen`` filter's one timed call (ms), which sizes the ``runtime`` filter's
            bursts (``engine.timing.burst_size``), or None.
        forward_calls: how many ``call``s this task has made in this process. The first one holds the GPU
            lock as a "first_forward" step, the later ones as "forward" steps: a first call carries the
            task's one-time costs (cuDNN plans for its shapes, kernels loaded on first use), so only later
            calls are held to the GPU-time limit (``engine.sandbox.GpuStepWatch``).
    """

    code: str
    task_id: str = "<task>"
    device: str = "cpu"
    task: LoadedTask | None = None
    model: Any = None
    inputs: list[Any] = field(default_factory=list)
    outputs: list[torch.Tensor] = field(default_factory=list)
    unseeded_outputs: list[torch.Tensor] | None = None
    compiled: Any = None
    inputs_reproducible: bool = False
    forward_calls: int = 0
    screen_ms: float | None = None

    def load(self) -> LoadedTask:
        if self.task is None:
            self.task = load_task(self.code, self.task_id)
        return self.task

    def build_model(self):
        """``Model(*get_init_inputs())`` after ``BUILD_SEED``, built under ``torch.device(device)`` (so a GPU
        initialises its own parameters), moved there, in ``eval()`` mode."""
        task = self.load()
        torch.manual_seed(BUILD_SEED)
        with gpu_work(self.device), torch.device(self.device):  # parameters are initialised on the device
            model = task.build()
            if isinstance(model, torch.nn.Module):
                model = model.to(self.device).eval()
        return model

    def draw_inputs(self, seed: int = INPUT_SEED) -> list[Any]:
        """``get_inputs()`` after ``torch.manual_seed(seed)``, tensors moved to the device."""
        task = self.load()
        torch.manual_seed(seed)
        with gpu_work(self.device), torch.device(self.device):  # drawn on the device: no host copy
            inputs = task.inputs()
            return [x.to(self.device) if isinstance(x, torch.Tensor) else x for x in inputs]

    @property
    def forward_kind(self) -> str:
        """What the next ``call``'s GPU step is (``gpu_locks.gpu_work``'s ``kind``): "first_forward" before
        the task's first call, then "forward". A caller that holds the lock around a call itself (to time
        it) passes this on, so the step is watched the same way."""
        return "forward" if self.forward_calls else "first_forward"

    def call(self, model=None, inputs=None, seed: int | None = CALL_SEED, lock: bool = True) -> list[torch.Tensor]:
        """Flat output tensors of ``model(*inputs)`` under ``no_grad``; ``seed=None`` keeps the RNG state.
        ``lock=False`` leaves the GPU lock to the callee (a ``torch.compile``-d model whose first call
        compiles, see ``filters.torch_compile``).

        Raises:
            TypeError: the forward returned no tensor.
        """
        model = self.model if model is None else model
        inputs = self.inputs if inputs is None else inputs
        if seed is not None:
            torch.manual_seed(seed)
        kind = self.forward_kind
        self.forward_calls += 1
        with gpu_work(self.device if lock else "cpu", kind=kind), torch.no_grad():
            out = model(*inputs)
        flat = flatten_tensors(out)
        if not flat:
            raise TypeError(f"forward returned {type(out).__name__} with no tensor in it")
        return flat

    def release(self) -> None:
        """Drop the model, tensors and compiled graphs of this task (``torch._dynamo.reset`` when a compiled
        model was kept), so the next task in this process starts with free memory."""
        had_compiled = self.compiled is not None
        self.model = self.compiled = self.unseeded_outputs = None
        self.inputs, self.outputs = [], []
        if had_compiled:
            torch._dynamo.reset()


def same_inputs(a: list[Any], b: list[Any]) -> bool:
    """True when two input lists hold the same values position by position: tensors of equal dtype,
    shape, strides and device whose elements are equal (``torch.equal``: a NaN never equals itself, so
    inputs with NaNs are never called the same), anything else by ``==``. One host sync per tensor."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)):
                return False
            if (x.dtype, x.shape, x.stride(), x.device) != (y.dtype, y.shape, y.stride(), y.device):
                return False
            with gpu_work(x.device):
                if not torch.equal(x, y):
                    return False
        else:
            try:
                if not bool(x == y):
                    return False
            except Exception:  # noqa: BLE001 - values that cannot be compared are not known to be the same
                return False
    return True


CHUNK_ELEMENTS = 1 << 24  # comparisons run over 16M-element slices: a 4 GB output needs no 8 GB copy


def comparable(t: torch.Tensor) -> torch.Tensor:
    """A flat real view/copy of ``t`` for comparisons: complex as (re, im) pairs; bool and int as float64;
    reduced-precision floats as float32."""
    flat = flat_view(t)
    if flat.dtype in (torch.float32, torch.float64):
        return flat
    if flat.is_floating_point():
        return flat.float()
    return flat.to(torch.float64)


def chunks(flat: torch.Tensor):
    """Consecutive slices of at most ``CHUNK_ELEMENTS`` of a flat tensor (views, no copies)."""
    for i in range(0, flat.numel(), CHUNK_ELEMENTS):
        yield flat[i:i + CHUNK_ELEMENTS]


def _chunk_stats(a: torch.Tensor, b: torch.Tensor, atol: float, rtol: float) -> tuple[torch.Tensor, torch.Tensor]:
    """0-dim tensors on the chunks' device: ``max |b - a| / (atol + rtol |a|)`` over the elements finite on
    both sides (``inf`` when NaNs are not in the same places or infinities differ), and the number of
    elements within tolerance. ``b`` may be a one-element tensor. No host sync."""
    b = b.expand_as(a)
    nan_a, nan_b = torch.isnan(a), torch.isnan(b)
    inf_a, inf_b = torch.isinf(a), torch.isinf(b)
    bad = (nan_a != nan_b) | ((inf_a | inf_b) & (a != b))
    finite = ~(nan_a | nan_b | inf_a | inf_b)
    err = torch.where(finite, (a - b).abs() / (atol + rtol * a.abs()), 0.0)
    err = torch.where(bad, float("inf"), err)
    return err.max(), (err <= 1.0).sum()


def error_stats(ref: torch.Tensor, out: torch.Tensor, atol: float | None = None,
                rtol: float | None = None) -> tuple[float, int]:
    """(largest error in tolerance units, number of elements within tolerance) of ``out`` against ``ref``,
    elementwise as in ``tolerance_error``; ``out`` has ``ref``'s numel or one element (one answer for every
    element: the degenerate filter's constant and all-zeros answers). ``ref.numel() > 0``.

    On CUDA one pass of a Triton kernel (``engine.comparison_cuda``) over both tensors in their own dtype;
    elsewhere (or for dtypes the kernel does not load) torch over ``CHUNK_ELEMENTS`` slices, so extra memory
    stays near one slice whatever the output size. Either way one host read: on a GPU shared by many
    processes each sync waits for a time slice. ``atol`` / ``rtol`` left None take the tolerance of
    ``ref``'s dtype (``opforge.task.precision.tolerance``).
    """
    if atol is None or rtol is None:
        d_atol, d_rtol = tolerance(ref.dtype)
        atol, rtol = (d_atol if atol is None else atol), (d_rtol if rtol is None else rtol)
    ref_flat, out_flat = flat_view(ref), flat_view(out.to(ref.device))
    if out_flat.numel() not in (1, ref_flat.numel()) or ref_flat.numel() == 0:
        raise ValueError(f"error_stats: {out_flat.numel()} elements against {ref_flat.numel()}")
    if ref_flat.is_cuda and ref_flat.is_floating_point() and out_flat.is_floating_point():
        try:
            from opforge.engine.comparison_cuda import error_stats_cuda

            return error_stats_cuda(ref_flat, out_flat, atol, rtol)
        except Exception:  # noqa: BLE001 - no Triton, or a dtype it cannot load: the torch path below
            pass
    ref_flat, out_flat = comparable(ref_flat), comparable(out_flat)
    outs = itertools.repeat(out_flat) if out_flat.numel() == 1 else chunks(out_flat)
    parts = [_chunk_stats(a, b, atol, rtol) for a, b in zip(chunks(ref_flat), outs, strict=False)]
    worst, count = torch.stack([torch.stack([p[0] for p in parts]).max().double(),
                                torch.stack([p[1] for p in parts]).sum().double()]).tolist()
    return worst, int(count)


def flat_view(t: torch.Tensor) -> torch.Tensor:
    """``t`` flat, detached, complex as (re, im) pairs; dtype kept (a view where ``reshape`` allows)."""
    t = t.detach()
    if t.is_complex():
        t = torch.view_as_real(t)
    return t.reshape(-1)


def tolerance_error(ref: torch.Tensor, out: torch.Tensor, atol: float | None = None,
                    rtol: float | None = None) -> float:
    """``max |out - ref| / (atol + rtol * |ref|)`` over all elements, as a float.

    0 means identical values; <= 1 means ``torch.allclose(out, ref, rtol, atol)`` holds. NaN on one side
    and not the other, a shape mismatch or mismatched infinities give ``inf``. See ``error_stats`` for how
    it is computed (one host sync per comparison).
    """
    if ref.shape != out.shape:
        return float("inf")
    if ref.numel() == 0:
        return 0.0
    return error_stats(ref, out, atol, rtol)[0]


def outputs_error(ref: list[torch.Tensor], out: list[torch.Tensor], atol: float | None = None,
                  rtol: float | None = None) -> float:
    """The largest ``tolerance_error`` over paired outputs; ``inf`` when the counts differ."""
    if len(ref) != len(out):
        return float("inf")
    with gpu_work(ref[0].device if ref else "cpu"):
        return max((tolerance_error(r, o, atol, rtol) for r, o in zip(ref, out, strict=True)), default=0.0)


def warm_up_cuda_libraries(device: str = "cuda") -> dict[str, Any]:
    """Initialise, in this process, the CUDA libraries and kernels tasks reach: cuBLAS (matmul), cuSOLVER
    (``linalg.svd``, ``linalg.inv``), cuFFT (``fft.rfft``), cuDNN (``conv2d``, and its RNN path through
    ``nn.LSTM``), the fused attention kernels of ``scaled_dot_product_attention`` and the comparison kernel
    of ``error_stats`` (Triton JIT or its cache), on tiny tensors, then hand the cached memory back.

    A library's first use in a process loads it and creates its handle: tenths of a second of CPU work
    inside the first task's forward step, which the sandbox parent would count against the step and GPU-time
    limits (``FilterSettings.gpu_step_limit_s`` / ``gpu_share_limit_s``) and every neighbour waiting to
    time would wait for. For the same reason this runs *without* the GPU's ``compute`` lock: a sandbox
    restarted mid-run would otherwise hold every timing on the GPU while it loads cuDNN, and its own
    kernels here are microseconds on tensors of a few KB. Returns {"seconds": float, "failed": [names]};
    never raises."""
    start = time.perf_counter()
    failed = []
    steps = {
        "cublas": lambda: torch.randn(64, 64, device=device) @ torch.randn(64, 64, device=device),
        "cusolver": lambda: (torch.linalg.svd(torch.randn(2, 8, 8, device=device)),
                             torch.linalg.inv(torch.eye(8, device=device) * 2.0)),
        "cufft": lambda: torch.fft.rfft(torch.randn(4, 64, device=device)),
        "cudnn": lambda: torch.nn.functional.conv2d(torch.randn(1, 3, 8, 8, device=device),
                                                    torch.randn(4, 3, 3, 3, device=device)),
        "cudnn_rnn": lambda: torch.nn.LSTM(8, 8, batch_first=True, device=device)(torch.randn(2, 3, 8, device=device)),
        "attention": lambda: torch.nn.functional.scaled_dot_product_attention(
            *(torch.randn(1, 2, 8, 16, device=device) for _ in range(3))),
        "comparison": lambda: (error_stats(torch.randn(64, device=device), torch.randn(64, device=device)),
                               error_stats(torch.randn(64, device=device), torch.zeros(1, device=device))),
    }
    with torch.no_grad():
        for name, step in steps.items():
            try:
                step()
                torch.cuda.synchronize(device)
            except Exception:  # noqa: BLE001 - only a head start: a task meets and reports the same failure
                failed.append(name)
    torch.cuda.empty_cache()
    return {"seconds": round(time.perf_counter() - start, 3), "failed": failed}


def failure_metrics(exc: BaseException, limit: int = 300) -> dict[str, Any]:
    """Metrics of a caught exception, as ``Filter.reject_failure`` reads them: ``error`` ("Type: message",
    cut to ``limit`` characters), ``error_type`` and ``oom`` (``is_oom``)."""
    return {"error": f"{type(exc).__name__}: {str(exc)[:limit]}", "error_type": type(exc).__name__,
            "oom": is_oom(exc)}


# Messages of CUDA libraries that failed for want of GPU memory. Creating a cuSOLVER / cuBLAS handle
# allocates device memory, and when that fails torch reports an *internal* error of the create call, e.g.
# "cusolver error: CUSOLVER_STATUS_INTERNAL_ERROR, when calling `cusolverDnCreate(handle)`": seen on an
# H200 for a task that creates its first cuSOLVER handle next to 13 busy sandboxes, and the usual cause
# reported for it (e.g. github.com/nerdyrodent/VQGAN-CLIP/issues/143).
OOM_MESSAGES = ("can't allocate memory", "out of memory", "CUBLAS_STATUS_ALLOC_FAILED", "CUFFT_ALLOC_FAILED",
                "CUSOLVER_STATUS_ALLOC_FAILED", "when calling `cusolverDnCreate(handle)`",
                "when calling `cublasCreate(handle)`")


def is_oom(exc: BaseException) -> bool:
    """True for out-of-memory errors on CPU (``MemoryError``, allocator refusal) or CUDA (``OOM_MESSAGES``)."""
    if isinstance(exc, (MemoryError, torch.OutOfMemoryError)):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and any(s in text for s in OOM_MESSAGES)
