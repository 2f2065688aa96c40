"""Conv2d(9->9, k=2) -> * y -> F.normalize(dim=1) -> square -> exp as one CUDA kernel (kernels/conv_norm.cu).

One thread per 4 consecutive output pixels of a row: the 9 x 2 x 5 input values are loaded once up front and
reused by the 2x2 taps, all 9 output channels of the 4 pixels live in registers (compile-time loops, weights as
shared-memory broadcasts), then * y, L2 normalisation over channels (x / max(||x||, 1e-12), as F.normalize),
square and exp, and every channel is written once. (Round 1: a runtime-loop thread-per-pixel version with one
dependent load per tap ran 0.244 ms, latency-bound.)
Bytes: x + y + out = 54 MB at batch 512 -> about 12 us at H200 HBM bandwidth (roofline_ms 0.0113,
compile_ms 0.118).
"""

import opforge_kernels
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv2d = nn.Conv2d(in_channels=9, kernel_size=2, out_channels=9)

    def forward(self, x, y):
        return opforge_kernels.conv_mul_normalize_sq_exp(
            x.contiguous(), y.contiguous(), self.conv2d.weight.contiguous(), self.conv2d.bias.contiguous())
