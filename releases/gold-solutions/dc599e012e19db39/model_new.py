"""RMSNorm(128, no affine) * 0.8 in bfloat16 as one CUDA kernel (kernels/rmsnorm_scale.cu).

One pass over memory: 16 lanes per row, 16-byte loads / stores, float32 math. 191 MB moved at the public shape;
predicted ~0.045 ms vs roofline 0.040 ms and torch.compile 0.119 ms on an H200.
"""

import opforge_kernels
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.groupnorm = nn.RMSNorm((128,), eps=1e-05, elementwise_affine=False)
        self.to(torch.bfloat16)

    def forward(self, x):
        eps = self.groupnorm.eps if self.groupnorm.eps is not None else 0.0078125
        return opforge_kernels.rmsnorm_scale(x.contiguous(), eps, 0.7999999999999999)
