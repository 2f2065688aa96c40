"""(y + x^T, LayerNorm(768)(y + x^T)), float32, as one CUDA kernel (kernels/transpose_add_ln.cu).

The transpose is staged through shared memory per (batch, 16-token tile); one warp per token adds, normalises and
writes both outputs once. 1.23 GB moved at the public shape: predicted ~0.29 ms vs roofline 0.257 ms and
torch.compile 0.746 ms on an H200.
"""

import opforge_kernels
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm2 = nn.LayerNorm((768,), eps=1e-06)

    def forward(self, x, y):
        n = self.norm2
        v1, v2 = opforge_kernels.transpose_add_ln(x.contiguous(), y.contiguous(), n.weight, n.bias, n.eps)
        return v1, v2
