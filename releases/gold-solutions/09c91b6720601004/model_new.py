"""CaiT class-attention residual + LayerNorm: v1 = y + gamma_2 * x, v3 = norm1(cat((v1, z), 1)), both written by
one CUDA kernel (kernels/scale_cat_layernorm.cu); the cat is fused into the loads."""

import opforge_kernels
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.gamma_2 = nn.Parameter(torch.randn(192) * 0.1 + 1.0)
        self.norm1 = nn.LayerNorm((192,), eps=1e-06)
        self.to(torch.float16)

    def forward(self, x, y, z):
        v1, v3 = opforge_kernels.scale_cat_layernorm(
            x, y, z, self.gamma_2, self.norm1.weight, self.norm1.bias, self.norm1.eps
        )
        return v1, v3
