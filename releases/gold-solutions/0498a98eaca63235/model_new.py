"""LayerNorm(96) -> Linear(96 -> 384) -> GELU -> + residual, float16 (kernels/ln_linear_gelu_res.cu).

Warp-per-row LayerNorm writes the GEMM operand; per chunk of 16384 rows a cuBLASLt fp16 GEMM (bias epilogue)
writes an L2-resident pre-activation that a vectorised kernel turns into erf-GELU + residual. Predicted
~0.06-0.08 ms vs roofline 0.036 ms and torch.compile 0.135 ms on an H200.
"""

import opforge_kernels
import torch
import torch.nn as nn

CHUNK_ROWS = 16384


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(96) * 0.1 + 1.0)
        self.bias = nn.Parameter(torch.randn(96) * 0.1)
        self.pointwise_conv1 = nn.Linear(in_features=96, out_features=384)
        self.to(torch.float16)

    def forward(self, x, residual):
        lin = self.pointwise_conv1
        return opforge_kernels.ln_linear_gelu_res(x.contiguous(), residual.contiguous(), self.weight, self.bias, 1e-06,
                                                  lin.weight, lin.bias, CHUNK_ROWS)
