"""Device profiles for the composer's cost model.

Peak numbers are datasheet values, taken from ``opforge.task.peaks`` (NVIDIA H100 SXM5 and H200 SXM
datasheets: FP32 non-tensor 67 TFLOP/s, BF16 / FP16 dense tensor-core 989 TFLOP/s, HBM3 3.35 TB/s and HBM3e
4.8 TB/s). Eager PyTorch reaches only part of them; the ``*_efficiency`` factors and ``launch_overhead_ms`` are calibrated loosely against measured eager
times (benchmarks/results/h200/filter_run.json: predicted / measured eager time). The ``cpu`` profile describes one 2-core CI machine (measured
loosely: ~20 GFLOP/s fp32 GEMM, ~5 GB/s effective elementwise bandwidth).

Sizing: a ``realistic`` profile takes every non-batch size from the shape vocabulary of real model configs
(``opforge.seeds.vocabulary``; ``compose.graphs.sizing``) and the batch from the vocabulary's batch axis (1-512); the
``cpu`` and ``test`` profiles keep small fixed size lists (``sizes``) so that tasks run in milliseconds on a
CI machine, and scale the batch up to ``max_batch``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from opforge.engine.timing import WINDOW_FLOOR_MS
from opforge.task.peaks import H100_SXM, H200_SXM


@dataclass(frozen=True)
class DeviceProfile:
    """Roofline parameters. Units: FLOP/s, bytes/s, ms, bytes.

    Attributes:
        peak_flops / peak_flops_half: GEMM / conv / attention peak in float32 (TF32 off, as the filters pin
            it) and in bfloat16 / float16.
        memory_cap_bytes: the most a task's tensors (inputs, parameters, every intermediate) may hold.
        input_cap_bytes: the most ``get_inputs()`` may return (it is allocated for every RL rollout).
        window_ms: the runtime window the filters use; ``window_margin``: the predicted time must lie within
            ``[lo * margin, hi / margin]`` (prediction errors on the GPU are of that order).
        sizes / max_batch: the fixed size lists of a non-``realistic`` profile.
        max_op_share: the most of a multi-op task's predicted time one op may take (above it the fusion is
            that one op; the ``trivial`` filter rejects >= 99 % measured, ``trivial:dominated``).
    """

    name: str
    peak_flops: float
    bandwidth: float
    launch_overhead_ms: float
    flop_efficiency: float
    bandwidth_efficiency: float
    memory_cap_bytes: int
    window_ms: tuple[float, float]
    sizes: dict[str, tuple[int, ...]]  # candidate values of each non-batch size symbol (non-realistic profiles)
    max_batch: int
    realistic: bool = False
    peak_flops_half: float = 0.0
    input_cap_bytes: int = 1 << 62
    window_margin: float = 1.0
    max_op_share: float = 1.0

    def peak_for(self, dtype: str) -> float:
        """Peak FLOP/s for GEMM-like work in ``dtype`` (``float32``, ``bfloat16``, ``float16``)."""
        return self.peak_flops_half if dtype != "float32" and self.peak_flops_half else self.peak_flops


_GPU = dict(launch_overhead_ms=0.006, flop_efficiency=0.35, bandwidth_efficiency=0.6, memory_cap_bytes=8 << 30,
            window_ms=(WINDOW_FLOOR_MS, 100.0), sizes={}, max_batch=512, realistic=True,
            peak_flops_half=H200_SXM.peak_for("bfloat16"),
            input_cap_bytes=900_000_000, window_margin=1.6, max_op_share=0.97)

PROFILES: dict[str, DeviceProfile] = {
    "h100": DeviceProfile("h100", H100_SXM.peak_for("float32"), H100_SXM.bandwidth, **_GPU),
    "h200": DeviceProfile("h200", H200_SXM.peak_for("float32"), H200_SXM.bandwidth, **_GPU),
    "cpu": DeviceProfile("cpu", 20e9, 5e9, 0.02, 1.0, 1.0, 1 << 30, (1.0, 100.0),
                         {"C": (8, 16, 32), "K": (8, 16, 32, 64), "L": (16, 32, 64), "H": (8, 16, 32),
                          "W": (8, 16, 32), "D": (4, 8)}, 4096, peak_flops_half=20e9),
    # tiny sizes for tests: every candidate runs in milliseconds on CPU
    "test": DeviceProfile("test", 20e9, 5e9, 0.02, 1.0, 1.0, 64 << 20, (0.0, 1.0),
                          {"C": (4, 8), "K": (4, 8), "L": (8, 12), "H": (6, 8), "W": (6, 8), "D": (4,)}, 4,
                          peak_flops_half=20e9),
}


def get_profile(name: str) -> DeviceProfile:
    """Profile by name (case-insensitive). Raises ValueError listing the known names."""
    try:
        return PROFILES[name.lower()]
    except KeyError:
        raise ValueError(f"unknown device profile {name!r}; known: {', '.join(PROFILES)}") from None


def window_target(profile: DeviceProfile) -> tuple[float, float, float]:
    """(lowest, highest, target) predicted eager ms a sized task may take: the profile's window shrunk by
    ``window_margin`` on both sides, and its log-midpoint."""
    lo, hi = profile.window_ms
    ok_lo, ok_hi = lo * profile.window_margin, hi / profile.window_margin
    return ok_lo, ok_hi, math.sqrt(max(ok_lo, 1e-3) * ok_hi)
