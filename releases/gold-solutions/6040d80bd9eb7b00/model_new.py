"""softmax(x @ y / sqrt(32), dim=-1): scores (tensor cores) and softmax fused in one CUDA kernel per (batch, head)
(kernels/scores_softmax.cu)."""

import opforge_kernels
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        return opforge_kernels.scores_softmax(x, y, 1.0 / 5.656854249492381)
