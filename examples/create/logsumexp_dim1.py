"""Logsumexp over dim 1 of [N, C, L]: y[n, l] = log(sum_c exp(x[n, c, l])). Tier 2."""

import torch


def logsumexp_dim1(x):
    return torch.logsumexp(x, dim=1)


def get_inputs():
    return [torch.randn(4, 16, 50)]
