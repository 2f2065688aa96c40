"""NomicBERT: x * y -> Linear(3072 -> 768) -> + z -> LayerNorm(768), bfloat16 (kernels/mul_linear_add_ln.cu).

A vectorised product kernel, one cuBLASLt bf16 GEMM with z as its C operand (the residual add in the GEMM), and a
warp-per-token LayerNorm. Predicted ~0.33-0.36 ms vs roofline 0.156 ms and torch.compile 0.385 ms on an H200.
"""

import opforge_kernels
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.down_proj = nn.Linear(in_features=3072, out_features=768, bias=False)
        self.post_mlp_layernorm = nn.LayerNorm((768,), eps=1e-12)
        self.to(torch.bfloat16)

    def forward(self, x, y, z):
        ln = self.post_mlp_layernorm
        return opforge_kernels.mul_linear_add_ln(x.contiguous(), y.contiguous(), z.contiguous(), self.down_proj.weight,
                                                 ln.weight, ln.bias, ln.eps)
