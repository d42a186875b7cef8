"""Mish: y = x * tanh(softplus(x)). Tier 1, function form."""

import torch
import torch.nn.functional as F


def mish(x):
    return x * torch.tanh(F.softplus(x))


def get_inputs():
    return [torch.randn(4, 8, 96)]
