"""Reversed cumulative product over the last dim: y[i] = prod_{j >= i} x[j]. Tier 3.

Stops at aten.mul: the product's backward reads the flipped row with element-wise ops (dy * y,
its zero masks), and a flip is lowered only between scans (a reversed cumsum), not as a row of
its own.
"""

import torch


def reverse_cumprod(x):
    return torch.cumprod(x.flip(-1), dim=-1).flip(-1)


def get_inputs():
    return [torch.rand(4, 8, 40) + 0.5]
