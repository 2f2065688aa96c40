"""Small modules the probe tests import by qualname (``tests.probe_modules.<Name>``)."""

import torch
from torch import nn


class HalfInitialised(nn.Module):
    """Linear layer plus a bias left as ``torch.empty`` memory, as many MoE expert blocks do."""

    def __init__(self, in_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, in_features)
        self.shift = nn.Parameter(torch.empty(in_features))

    def forward(self, x):
        return self.linear(x) + self.shift


class FullyInitialised(HalfInitialised):
    """The same module with its ``torch.empty`` parameter filled in by the constructor."""

    def __init__(self, in_features: int):
        super().__init__(in_features)
        nn.init.zeros_(self.shift)


class UnseededInit(FullyInitialised):
    """Initialised, but from Python's ``random`` (not torch's seed): two seeded builds differ."""

    def __init__(self, in_features: int):
        super().__init__(in_features)
        import random

        with torch.no_grad():
            self.shift.fill_(random.random())
