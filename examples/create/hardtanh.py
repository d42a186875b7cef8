"""HardTanh: y = clamp(x, min_val, max_val), here [-1.5, 2.0]. Tier 1."""

import torch
from torch import nn


class HardTanh(nn.Module):
    def __init__(self, min_val: float = -1.5, max_val: float = 2.0):
        super().__init__()
        self.min_val = min_val
        self.max_val = max_val

    def forward(self, x):
        return nn.functional.hardtanh(x, self.min_val, self.max_val)


def get_inputs():
    return [torch.randn(4, 8, 96) * 2]
