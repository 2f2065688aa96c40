"""Donut-Swin: residual add + LayerNorm(384) + MLP(384 -> 1536 -> 384, ReLU) + residual, float16
(kernels/swin_block_mlp.cu).

One warp-per-token kernel writes v2 = y + x and its LayerNorm; two cuBLASLt fp16 GEMMs carry bias + ReLU and
bias + the v2 residual (C operand) in their epilogues. Predicted ~0.045 ms vs roofline 0.022 ms and torch.compile
0.076 ms on an H200.
"""

import opforge_kernels
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.layernorm_after = nn.LayerNorm((384,))
        self.dense = nn.Linear(in_features=384, out_features=1536)
        self.dense_1 = nn.Linear(in_features=1536, out_features=384)
        self.to(torch.float16)

    def forward(self, x, y):
        ln, d1, d2 = self.layernorm_after, self.dense, self.dense_1
        return opforge_kernels.swin_block_mlp(x.contiguous(), y.contiguous(), ln.weight, ln.bias, ln.eps, d1.weight,
                                              d1.bias, d2.weight, d2.bias)
