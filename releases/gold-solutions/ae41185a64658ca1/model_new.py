"""FocalNet: transpose + LayerNorm + LayerNorm + Linear(192 -> 387), float32 (kernels/focal_ln_linear.cu).

One kernel fuses the transpose (through shared memory) with both LayerNorms and writes v2 and the GEMM operand
once, pre-split for 3xTF32; the Linear is one cuBLASLt GEMM on TF32 tensor cores over K = 3 x 192 (float32
accuracy) with the bias in its epilogue. Predicted ~0.11-0.13 ms vs roofline 0.111 ms and torch.compile 0.329 ms
on an H200.
"""

import opforge_kernels
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm((192,))
        self.norm1 = nn.LayerNorm((192,))
        self.projection_in = nn.Linear(in_features=192, out_features=387)

    def forward(self, x):
        n, n1, p = self.norm, self.norm1, self.projection_in
        v2, v5 = opforge_kernels.focal_ln_linear(x.contiguous(), n.weight, n.bias, n.eps, n1.weight, n1.bias, n1.eps,
                                                 p.weight, p.bias)
        return v2, v5
