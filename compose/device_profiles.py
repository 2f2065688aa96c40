"""Device profiles for the composer's cost model.

Peak numbers are datasheet values (NVIDIA H100 SXM5 and H200 SXM datasheets: FP32 non-tensor 67 TFLOP/s,
HBM3 3.35 TB/s and HBM3e 4.8 TB/s). Eager PyTorch reaches only part of them; the ``*_efficiency`` factors
and ``launch_overhead_ms`` are starting guesses to be calibrated against measured eager times
(benchmarks/ on the lent GPU). The ``cpu`` profile describes one 2-core CI machine (measured loosely:
~20 GFLOP/s fp32 GEMM, ~5 GB/s effective elementwise bandwidth).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceProfile:
    """Roofline parameters. Units: FLOP/s, bytes/s, ms, bytes."""

    name: str
    peak_flops: float
    bandwidth: float
    launch_overhead_ms: float
    flop_efficiency: float
    bandwidth_efficiency: float
    memory_cap_bytes: int
    window_ms: tuple[float, float]
    sizes: dict[str, tuple[int, ...]]  # candidate values of each non-batch size symbol
    max_batch: int


_GPU_SIZES = {"C": (16, 32, 64, 128), "K": (16, 32, 64, 128, 256), "L": (64, 128, 256, 512),
              "H": (16, 32, 64), "W": (16, 32, 64), "D": (8, 16)}

PROFILES: dict[str, DeviceProfile] = {
    "h100": DeviceProfile("h100", 67e12, 3.35e12, 0.006, 0.35, 0.6, 8 << 30, (1.0, 100.0), _GPU_SIZES, 1 << 20),
    "h200": DeviceProfile("h200", 67e12, 4.8e12, 0.006, 0.35, 0.6, 8 << 30, (1.0, 100.0), _GPU_SIZES, 1 << 20),
    "cpu": DeviceProfile("cpu", 20e9, 5e9, 0.02, 1.0, 1.0, 1 << 30, (1.0, 100.0),
                         {"C": (8, 16, 32), "K": (8, 16, 32, 64), "L": (16, 32, 64), "H": (8, 16, 32),
                          "W": (8, 16, 32), "D": (4, 8)}, 4096),
    # tiny sizes for tests: every candidate runs in milliseconds on CPU
    "test": DeviceProfile("test", 20e9, 5e9, 0.02, 1.0, 1.0, 64 << 20, (0.0, 1.0),
                          {"C": (4, 8), "K": (4, 8), "L": (8, 12), "H": (6, 8), "W": (6, 8), "D": (4,)}, 4),
}


def get_profile(name: str) -> DeviceProfile:
    """Profile by name (case-insensitive). Raises ValueError listing the known names."""
    try:
        return PROFILES[name.lower()]
    except KeyError:
        raise ValueError(f"unknown device profile {name!r}; known: {', '.join(PROFILES)}") from None
