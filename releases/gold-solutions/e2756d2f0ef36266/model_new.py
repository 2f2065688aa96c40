"""nn.Linear(3 -> 16) -> + y -> min(dim=-1, keepdim=True), float16, as one CUDA kernel (kernels/linear_min.cu).

One thread per row (pixel): the 3-wide dot products for all 16 outputs in float32 registers (weights and bias in
shared memory), each rounded to half as the float16 GEMM does, + y (two 16-byte loads), rounded again, min.
The [B, H, W, 16] linear output is never written. Bytes: x + y + out = 248 MB at [512, 110, 110] -> about 52 us at
H200 HBM bandwidth (roofline_ms 0.0516, compile_ms 0.487).
"""

import opforge_kernels
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(in_features=3, out_features=16)
        self.to(torch.float16)  # parameters in the task's dtype, as the reference

    def forward(self, x, y):
        return opforge_kernels.linear_add_min(
            x.contiguous(), y.contiguous(), self.linear.weight.contiguous(), self.linear.bias.contiguous())
