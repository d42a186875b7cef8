"""Cumulative product over the last dim, inputs kept in [0.5, 1.5). Tier 3.

Stops at aten.cumprod: its backward divides by the running product, with a scan of
zero masks to stay exact at zeros; not lowered.
"""

import torch


def cumprod(x):
    return torch.cumprod(x, dim=-1)


def get_inputs():
    return [torch.rand(4, 8, 40) + 0.5]
