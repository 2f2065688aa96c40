"""Flint attention with sink logits: scores (float32 in, 3xTF32 tensor cores), scale, mask, sink-softmax, bf16
rounding and P @ V (bf16 tensor cores) in one CUDA kernel per (batch, head) (kernels/sink_attention.cu)."""

import opforge_kernels
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.sinks = nn.Parameter(torch.randn(32) * 0.1)
        self.to(torch.bfloat16)

    def forward(self, x, y, mask, z):
        return opforge_kernels.sink_attention(x, y, mask, self.sinks, z, 0.08838834764831845)
