"""Sampling head: x / 0.7 (temperature) -> top-k (k=50) mask -> softmax, float32 [64, 262208], without a sort
(kernels/topk_softmax.cu).

Radix threshold select: a per-row histogram of the top 12 bits of order-preserving float keys (all SMs, chunks of
8192), the bin of the 50th largest, a gather pass that writes the row's zeros and lists the few hundred candidates
at or above that bin, and one block per row that finds the exact 50th largest among them (8-bit radix passes in
shared memory), the row max and the softmax sum, and scatters the kept probabilities. Degenerate rows (candidate
overflow) fall back to exact radix passes over the whole row.
HBM traffic: x read twice, out written once (12 B / element): predicted about 3x roofline_ms 0.0280 and well under
compile_ms 0.376.
"""

import opforge_kernels
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return opforge_kernels.topk_softmax(x.contiguous(), 50, 0.7)
