"""Flint shared-expert tail z + (y + down_proj(x)): cuBLASLt GEMMs in row chunks taking the residual as their C
operand, the residual sum y + z computed chunk by chunk on a second stream under the GEMMs (kernels/fused.cu)."""

import opforge_kernels
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.down_proj = nn.Linear(in_features=1024, out_features=2048, bias=False)
        self.to(torch.bfloat16)

    def forward(self, x, y, z):
        return opforge_kernels.shared_expert_residual_forward(x, y, z, self.down_proj.weight)
