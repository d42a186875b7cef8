"""Cumulative product over the last dim, inputs kept in [0.5, 1.5). Tier 2.

A scan (`tl.cumprod`); the backward divides the reversed sum of dy * y by x before the row's
first zero and takes the products without x at that zero, so it is exact at zeros.
"""

import torch


def cumprod(x):
    return torch.cumprod(x, dim=-1)


def get_inputs():
    return [torch.rand(4, 8, 40) + 0.5]
