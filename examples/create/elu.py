"""ELU with alpha = 1: y = x if x > 0 else alpha * (exp(x) - 1). Tier 1, module form."""

import torch
from torch import nn


class ELU(nn.Module):
    def __init__(self, alpha: float = 1.0):
        super().__init__()
        self.alpha = alpha

    def forward(self, x):
        return nn.functional.elu(x, alpha=self.alpha)


def get_inputs():
    return [torch.randn(4, 8, 96)]
