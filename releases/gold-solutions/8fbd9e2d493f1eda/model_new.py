"""BiT pre-activation: relu(group_norm(x + y, 32)), one CUDA kernel with one block per (sample, group) holding the
group in shared memory (kernels/add_groupnorm_relu.cu)."""

import opforge_kernels
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(1024) * 0.1 + 1.0)
        self.bias = nn.Parameter(torch.randn(1024) * 0.1)
        self.activation = nn.ReLU()

    def forward(self, x, y):
        return opforge_kernels.add_groupnorm_relu(x, y, self.weight, self.bias, 32, 1e-05)
