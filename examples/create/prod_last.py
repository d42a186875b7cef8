"""Product over the last dim: y[r] = prod(x[r, :]), inputs kept near 1. Tier 3.

Stops at aten.slice: prod's backward is built from scans.
"""

import torch


def prod_last(x):
    return torch.prod(x, dim=-1)


def get_inputs():
    return [torch.rand(4, 8, 40) + 0.5]
