"""Swin2SR window merge + LayerNorm + residual: y + layernorm_before(x.transpose(2, 3) viewed as rows), one CUDA
kernel with the transpose fused into its loads (kernels/transpose_layernorm_add.cu)."""

import opforge_kernels
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.layernorm_before = nn.LayerNorm((180,))
        self.to(torch.bfloat16)

    def forward(self, x, y):
        ln = self.layernorm_before
        return opforge_kernels.transpose_layernorm_add(x, y, ln.weight, ln.bias, ln.eps)
