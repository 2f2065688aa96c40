"""LayerNorm(96) -> Linear(96 -> 384) -> GELU, float32 (kernels/ln_linear_gelu.cu).

A warp-per-row LayerNorm kernel writes the GEMM operand once, pre-split for 3xTF32; one cuBLASLt GEMM on TF32
tensor cores (float32 accuracy) applies bias + GELU in its epilogue. Predicted ~0.03 ms vs roofline 0.028 ms and
torch.compile 0.085 ms on an H200.
"""

import opforge_kernels
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm2 = nn.LayerNorm((96,))
        self.linear = nn.Linear(in_features=96, out_features=384)
        self.gelu = nn.GELU()

    def forward(self, x):
        n, lin = self.norm2, self.linear
        return opforge_kernels.ln_linear_gelu(x.contiguous(), n.weight, n.bias, n.eps, lin.weight, lin.bias)
