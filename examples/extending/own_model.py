"""Recipe 2, own model: a small pre-norm MLP block whose forward ``opforge motifs --model`` cuts into motifs.

``example_inputs(batch, seq)`` is the example-inputs function (``--inputs-fn``); ``--input-shape batch,seq,256``
says the same with shapes.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class GatedBlock(nn.Module):
    """x + W2(silu(W1 x) * W3 x) after an RMS norm, then a LayerNorm'd squared-ReLU head. [batch, seq, 256]."""

    def __init__(self, hidden: int = 256, inner: int = 512):
        super().__init__()
        self.norm = nn.RMSNorm(hidden, eps=1e-6)
        self.gate = nn.Linear(hidden, inner, bias=False)
        self.up = nn.Linear(hidden, inner, bias=False)
        self.down = nn.Linear(inner, hidden, bias=False)
        self.head_norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, hidden)

    def forward(self, x):
        h = self.norm(x)
        x = x + self.down(F.silu(self.gate(h)) * self.up(h))
        y = self.head(self.head_norm(x))
        return torch.relu(y) ** 2 * 0.5 + x


def example_inputs(batch: int, seq: int):
    """One [batch, seq, 256] activation (called on the ``meta`` device)."""
    return torch.randn(batch, seq, 256)
