"""PVT efficient self-attention tail: dense(merge_heads(softmax(x / 8) @ y)) + z as one fused softmax + P @ V
kernel storing the merged-head layout, then one cuBLASLt GEMM with the bias epilogue and z as its C operand
(kernels/attn_dense.cu, kernels/lt_linear.cuh)."""

import opforge_kernels
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.dense = nn.Linear(in_features=512, out_features=512)

    def forward(self, x, y, z):
        return opforge_kernels.attn_dense(x, y, z, self.dense.weight, self.dense.bias, 8.0)
