"""1-D convolution with a learned weight and bias, padding keeps the length. Tier 3.
Stops at aten.convolution."""

import torch
from torch import nn


class Conv1d(nn.Module):
    def __init__(self, c_in: int = 8, c_out: int = 12, kernel: int = 3):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(c_out, c_in, kernel) * 0.2)
        self.bias = nn.Parameter(torch.randn(c_out) * 0.1)

    def forward(self, x):
        return nn.functional.conv1d(x, self.weight, self.bias, padding=1)


def get_inputs():
    return [torch.randn(4, 8, 50)]
