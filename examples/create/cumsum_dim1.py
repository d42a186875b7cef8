"""Cumulative sum over dim 1 of [N, C, L]: y[n, c, l] = sum_{k <= c} x[n, k, l]. Tier 2."""

import torch


def cumsum_dim1(x):
    return torch.cumsum(x, dim=1)


def get_inputs():
    return [torch.randn(4, 16, 50)]
