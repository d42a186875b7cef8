"""Reversed cumulative sum over the last dim: y[r, j] = sum_{k >= j} x[r, k]. Tier 2."""

import torch


def reverse_cumsum(x):
    return torch.flip(torch.cumsum(torch.flip(x, [-1]), dim=-1), [-1])


def get_inputs():
    return [torch.randn(4, 8, 96)]
