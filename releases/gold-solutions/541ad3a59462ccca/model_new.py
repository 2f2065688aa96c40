"""ResMLP token mixing (affine -> token Linear -> layer scale -> residual -> affine): a vector pre-pass writes the
bf16-rounded affine (as the reference rounds it), one cuBLASLt GEMM on it, and one fused epilogue kernel that
rounds after each op like the reference and writes both outputs (kernels/fused.cu)."""

import opforge_kernels
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.beta = nn.Parameter(torch.randn(1, 1, 384) * 0.1)
        self.alpha = nn.Parameter(torch.randn(1, 1, 384) * 0.1 + 1.0)
        self.ls1 = nn.Parameter(torch.randn(384) * 0.1 + 1.0)
        self.beta_1 = nn.Parameter(torch.randn(1, 1, 384) * 0.1)
        self.alpha_1 = nn.Parameter(torch.randn(1, 1, 384) * 0.1 + 1.0)
        self.linear_tokens = nn.Linear(in_features=196, out_features=196)
        self.to(torch.bfloat16)

    def forward(self, x):
        lt = self.linear_tokens
        v5, v6 = opforge_kernels.resmlp_forward(x, self.alpha, self.beta, lt.weight, lt.bias, self.ls1, self.alpha_1,
                                                self.beta_1)
        return v5, v6
