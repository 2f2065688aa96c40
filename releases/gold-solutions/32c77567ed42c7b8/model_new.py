"""Swin window reverse + roll(3, 3) + LayerNorm(384), float16, as one CUDA kernel (kernels/swin_roll_ln.cu).

The permute and the roll are folded into the load address of each token (one warp per output token); 154 MB
moved at the public shape, predicted ~0.036 ms vs roofline 0.032 ms and torch.compile 0.125 ms on an H200.
"""

import opforge_kernels
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.layernorm_before = nn.LayerNorm((384,))
        self.to(torch.float16)

    def forward(self, x):
        ln = self.layernorm_before
        return opforge_kernels.swin_roll_ln(x.contiguous(), ln.weight, ln.bias, 7, 3, ln.eps)
