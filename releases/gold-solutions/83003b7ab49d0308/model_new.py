"""F.unfold(kernel_size=2) -> + y -> GELU (erf) as one CUDA kernel (kernels/unfold_gelu.cu).

The unfold is never materialised: each output element (b, c*kh*kw + i*kw + j, l) reads
x[b, c, l // OW + i, l % OW + j] directly (the x plane is tiny and reused through L1), adds y and applies the exact
GELU. y and the output stream as 16-byte vectors over the flat tensor.
Bytes: x + y + out = 1.46 GB at batch 384 -> about 0.31 ms at H200 HBM bandwidth (roofline_ms 0.304,
compile_ms 0.632).
"""

import opforge_kernels
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.gelu = nn.GELU()

    def forward(self, x, y):
        return opforge_kernels.unfold_add_gelu(x.contiguous(), y.contiguous(), 2, 2)
