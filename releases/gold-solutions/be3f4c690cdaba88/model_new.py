"""DenseNet layer tail: ReLU -> 3x3 conv (cuDNN) and ReLU(BN(cat[y, conv])) in one fused pass (kernels/fused.cu)."""

import opforge_kernels
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.relu2 = nn.ReLU()
        self.conv2 = nn.Conv2d(128, 32, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1), bias=False)
        self.norm1 = nn.BatchNorm2d(544)
        self.relu1 = nn.ReLU()

    def forward(self, x, y):
        bn = self.norm1
        v1, v4 = opforge_kernels.dense_layer_forward(x, y, self.conv2.weight, bn.weight, bn.bias, bn.running_mean,
                                                     bn.running_var, bn.eps)
        return v1, v4
