"""Mistral4 RMSNorm(4096) + router Linear(4096 -> 128), bfloat16 (kernels/rmsnorm_router.cu).

A CTA-per-token RMSNorm (row in registers, 16-byte loads / stores, the reference's two bf16 roundings) and one
cuBLASLt bf16 GEMM reading the L2-warm normalised rows. Predicted ~0.035-0.04 ms vs roofline 0.022 ms and
torch.compile 0.055 ms on an H200.
"""

import opforge_kernels
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4096) * 0.1 + 1.0)
        self.weight_1 = nn.Parameter(torch.randn(128, 4096) * 0.015625)
        self.to(torch.bfloat16)

    def forward(self, x):
        v7, v9 = opforge_kernels.rmsnorm_router(x.contiguous(), self.weight, self.weight_1, 1e-06)
        return v7, v9
