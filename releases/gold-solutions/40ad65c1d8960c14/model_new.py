"""F.elu -> abs -> Hardtanh -> cummin(dim=1) -> + y, float16, as one CUDA kernel (kernels/scan.cu).

Each thread owns 8 consecutive channels of one batch item and walks the sequence dimension, keeping the running
minimum in registers: 16-byte loads of x and y, one 16-byte store, loads of eight steps in flight
(round 1 with four: 0.190 ms).
Bytes: x + y + out = 315 MB at [512, 100, 1024] -> about 66 us at H200 HBM bandwidth (roofline_ms 0.0655,
compile_ms 1.80, eager_ms 0.464).
"""

import opforge_kernels
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.hardtanh = nn.Hardtanh()

    def forward(self, x, y):
        return opforge_kernels.elu_abs_hardtanh_cummin_add(x.contiguous(), y.contiguous(), -1.0, 1.0)
