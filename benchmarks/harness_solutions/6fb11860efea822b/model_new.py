"""logsigmoid(x) * x as one CUDA kernel (kernels/fused.cu)."""

import opforge_kernels
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return opforge_kernels.fused_forward(x)
