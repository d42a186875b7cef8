"""LeakyReLU with slope 0.01: y = x if x > 0 else 0.01 * x. Tier 1, function form."""

import torch
import torch.nn.functional as F


def leaky_relu(x):
    return F.leaky_relu(x, negative_slope=0.01)


def get_inputs():
    return [torch.randn(4, 8, 96)]
