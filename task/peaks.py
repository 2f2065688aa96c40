"""Datasheet peaks of the GPUs opforge measures on: memory bandwidth and dense FLOP/s per dtype.

Sources (NVIDIA datasheets; the dense figure, i.e. half of the "with sparsity" one where the sheet lists
that):

* H100 SXM5 (NVIDIA H100 Tensor Core GPU datasheet): HBM3 3.35 TB/s; FP64 34 TFLOP/s, FP64 tensor core
  67 TFLOP/s; FP32 (non-tensor) 67 TFLOP/s; TF32 tensor core 494.5; BF16 / FP16 tensor core 989 TFLOP/s;
  FP8 / INT8 tensor core 1,979 TFLOP/s (TOPS).
* H100 PCIe (same datasheet): HBM2e 2.0 TB/s; FP64 tensor core 51 TFLOP/s; FP32 51 TFLOP/s; BF16 / FP16
  tensor core 756 TFLOP/s; INT8 1,513 TOPS.
* H200 SXM (NVIDIA H200 Tensor Core GPU datasheet): HBM3e 4.8 TB/s; compute as the H100 SXM5.

float32 work uses the FP32 non-tensor peak: opforge pins TF32 off for every measurement (filters, grader).
float64 uses the FP64 tensor-core peak, 8-bit integer types the INT8 one; any other dtype the FP32 one.

This module imports nothing (no torch), so the composer's device profiles and the CLI can read it cheaply.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class DevicePeaks:
    """Peaks of one device. Units: bytes/s and FLOP/s.

    Attributes:
        name: short name (``h200``), as ``GPU_PEAKS`` keys it.
        label: the device as its datasheet names it (``NVIDIA H200 SXM``).
        bandwidth: memory bandwidth, bytes/s.
        flops: dense peak FLOP/s by dtype name (``float32``, ``bfloat16``...); ``float32`` is required and
            serves every dtype not listed.
    """

    name: str
    label: str
    bandwidth: float
    flops: dict[str, float] = field(default_factory=dict)

    def __post_init__(self):
        if self.bandwidth <= 0 or "float32" not in self.flops or min(self.flops.values()) <= 0:
            raise ValueError(f"DevicePeaks {self.name!r}: needs a positive bandwidth and a positive float32 peak")

    def peak_for(self, dtype: str) -> float:
        """Dense peak FLOP/s for work in ``dtype`` (a torch dtype name without ``torch.``); the ``float32``
        peak for a dtype the datasheet figures do not list."""
        return self.flops.get(str(dtype).removeprefix("torch."), self.flops["float32"])

    def describe(self) -> str:
        """One line naming the figures: ``NVIDIA H200 SXM: 4.8 TB/s, FP32 67 TFLOP/s, BF16/FP16 989 TFLOP/s``."""
        return (f"{self.label}: {self.bandwidth / 1e12:g} TB/s, FP32 {self.flops['float32'] / 1e12:g} TFLOP/s, "
                f"BF16/FP16 {self.peak_for('bfloat16') / 1e12:g} TFLOP/s (dense, datasheet)")


_SXM_FLOPS = {"float32": 67e12, "float64": 67e12, "bfloat16": 989e12, "float16": 989e12, "int8": 1979e12,
              "uint8": 1979e12, "float8_e4m3fn": 1979e12, "float8_e5m2": 1979e12}
_PCIE_FLOPS = {"float32": 51e12, "float64": 51e12, "bfloat16": 756e12, "float16": 756e12, "int8": 1513e12,
               "uint8": 1513e12, "float8_e4m3fn": 1513e12, "float8_e5m2": 1513e12}

H100_SXM = DevicePeaks("h100", "NVIDIA H100 SXM5", 3.35e12, dict(_SXM_FLOPS))
H100_PCIE = DevicePeaks("h100-pcie", "NVIDIA H100 PCIe", 2.0e12, dict(_PCIE_FLOPS))
H200_SXM = DevicePeaks("h200", "NVIDIA H200 SXM", 4.8e12, dict(_SXM_FLOPS))

GPU_PEAKS: dict[str, DevicePeaks] = {p.name: p for p in (H100_SXM, H100_PCIE, H200_SXM)}
# Used where no GPU is named (CPU runs, unknown GPUs): the GPU opforge's releases are measured on.
DEFAULT_PEAKS = H200_SXM


def get_peaks(name: str) -> DevicePeaks:
    """Peaks by short name (``h200``, ``h100``, ``h100-pcie``; case-insensitive).

    Raises:
        ValueError: an unknown name (the message lists the known ones).
    """
    try:
        return GPU_PEAKS[str(name).lower()]
    except KeyError:
        raise ValueError(f"unknown device peaks {name!r}; known: {', '.join(GPU_PEAKS)}") from None


def peaks_for_gpu(gpu_name: str | None) -> DevicePeaks | None:
    """Peaks of a GPU from its model name as ``nvidia-smi`` / ``torch.cuda.get_device_name`` report it
    (``NVIDIA H200``, ``NVIDIA H100 80GB HBM3``, ``NVIDIA H100 PCIe``); None for a GPU not listed here."""
    name = (gpu_name or "").upper()
    if "H200" in name:
        return H200_SXM
    if "H100" in name:
        return H100_PCIE if "PCIE" in name else H100_SXM
    return None
