"""Row sum of squares over long rows (50000 columns): y[r] = sum(x[r, :]^2). Tier 2."""

import torch


def row_sum_squares_long(x):
    return x.pow(2).sum(dim=-1)


def get_inputs():
    return [torch.randn(3, 50000)]
