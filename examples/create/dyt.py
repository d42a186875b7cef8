"""Dynamic Tanh (DyT, "Transformers without Normalization"): y = gamma * tanh(alpha*x) + beta.

A scalar `alpha` and per-feature `gamma`, `beta`: element-wise forward, but the parameters'
gradients reduce over rows. Tier 2, module form.
"""

import torch
from torch import nn


class DyT(nn.Module):
    def __init__(self, hidden: int = 96, alpha0: float = 0.5):
        super().__init__()
        self.alpha = nn.Parameter(torch.full((), alpha0))
        self.gamma = nn.Parameter(torch.ones(hidden))
        self.beta = nn.Parameter(torch.zeros(hidden))

    def forward(self, x):
        return self.gamma * torch.tanh(self.alpha * x) + self.beta


def get_inputs():
    return [torch.randn(4, 8, 96)]
