"""GELU, tanh approximation: y = 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3))). Tier 1."""

import torch
import torch.nn.functional as F


def gelu_tanh(x):
    return F.gelu(x, approximate="tanh")


def get_inputs():
    return [torch.randn(4, 8, 96)]
