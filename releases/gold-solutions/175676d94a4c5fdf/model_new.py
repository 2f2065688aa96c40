"""CaiT talking-heads attention output z + gamma * proj((x.permute @ y).transpose.reshape): a tensor-core kernel with
the permutes fused into its loads and stores, then a cuBLASLt GEMM with z, bias and gamma folded into its epilogue
(kernels/fused.cu)."""

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
