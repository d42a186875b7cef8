"""Cumulative sum of the positive entries over the last dim: cumsum(x * (x > 0)). Tier 2."""

import torch


def masked_cumsum(x):
    return torch.cumsum(x * (x > 0), dim=-1)


def get_inputs():
    return [torch.randn(4, 8, 96)]
