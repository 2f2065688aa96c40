"""PVT-v2 attention tail (float16): proj(merge_heads(softmax(x / sqrt(32)) @ y)) + z, one CUDA kernel per tile of 64 query
rows (softmax, P @ V, head merge, Linear, bias and residual all in shared memory / registers;
kernels/attn_proj.cu)."""

import opforge_kernels
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(in_features=64, out_features=64)
        self.to(torch.float16)

    def forward(self, x, y, z):
        return opforge_kernels.attn_proj(x, y, z, self.proj.weight, self.proj.bias, 5.656854249492381)
