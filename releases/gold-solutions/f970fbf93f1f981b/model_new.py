"""nn.Linear(768 -> 3072) -> masked_fill(y, 0), bfloat16: cuBLASLt GEMM + bias epilogue, then an in-place mask
kernel, run in L2-sized chunks of rows (kernels/linear_mask.cu).

The GEMM mainloop is cuBLASLt's (bf16 in, fp32 accumulate, bias added in the epilogue); the rows are processed in
chunks whose output (about 16 MB) stays in the 50 MB L2, so the mask kernel reads and rewrites the fresh output in L2
instead of HBM: HBM traffic is x + W + mask + out once (1.33 GB at [48, 2583]) instead of re-reading and re-writing
the 762 MB output. Predicted about 1.0 ms, GEMM-bound (585 GFLOP), vs compile_ms 1.26, roofline_ms 0.59.
"""

import opforge_kernels
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(in_features=768, out_features=3072)
        self.to(torch.bfloat16)  # parameters in the task's dtype, as the reference

    def forward(self, x, y):
        return opforge_kernels.linear_bias_masked_fill(
            x.contiguous(), self.linear.weight.contiguous(), self.linear.bias.contiguous(), y.contiguous(), 0.0)
