"""CaiT talking-heads attention output z + gamma * proj((x.permute @ y).transpose.reshape): a tensor-core kernel with
the permutes fused into its loads and stores, a cuBLASLt GEMM with the bias epilogue, and a vector kernel applying
gamma and the residual z with the reference's fp16 roundings (kernels/fused.cu)."""

import opforge_kernels
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.gamma_1 = nn.Parameter(torch.randn(192) * 0.1 + 1.0)
        self.proj = nn.Linear(in_features=192, out_features=192)
        self.to(torch.float16)

    def forward(self, x, y, z):
        return opforge_kernels.talking_heads_out(x, y, z, self.proj.weight, self.proj.bias, self.gamma_1)
