"""Product over the last dim: y[r] = prod(x[r, :]), inputs kept near 1. Tier 2.

The backward is dy * p / x without a zero in the row, the product of the others at a row's only
zero, and 0 with two or more.
"""

import torch


def prod_last(x):
    return torch.prod(x, dim=-1)


def get_inputs():
    return [torch.rand(4, 8, 40) + 0.5]
