"""Recipe 1, own op: a researcher's ``nn.Module`` and function, added as seed ops by ``own_specs.yaml``.

A rendered task holds each class's or function's source, so it may use only ``torch``, ``nn``, ``F`` and
what it defines itself.
"""

import torch
import torch.nn as nn


class SquaredReLU(nn.Module):
    """relu(x)^2 (Primer, So et al. 2021): two torch ops, one seed op. Shapes: any -> same; any float dtype."""

    def forward(self, x):
        return torch.relu(x) ** 2


def scaled_tanh(x):
    """1.7159 * tanh(2x / 3) (LeCun et al. 1998, "Efficient BackProp"). Shapes: any -> same."""
    return 1.7159 * torch.tanh(x * (2.0 / 3.0))
