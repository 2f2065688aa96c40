"""F.silu -> amax(dim=-1, keepdim=True) -> subtract, bfloat16, as one CUDA kernel (kernels/silu_amax.cu).

A block stages a contiguous tile of rows (256 rows of the last dimension) into shared memory with coalesced 16-byte
loads (8 in flight per thread; round 1 copied one load at a time and ran 1.05 ms, latency-bound), each thread then
applies silu to one row in shared memory (16-byte vectors; a 144-byte row stride is bank-conflict free), takes its
max and subtracts it in place, and the tile is stored back with coalesced 16-byte stores. silu is rounded to
bfloat16 before the max and the subtraction, as in eager. Bytes: x + out = 1.75 GB at [8, 220, 48, 72, 72] -> about
0.37 ms at H200 HBM bandwidth (roofline_ms 0.365, compile_ms 0.785)."""

import opforge_kernels
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return opforge_kernels.silu_sub_rowmax(x.contiguous())
