"""Sort along the last dim, ascending, values only. Tier 3.
Stops at aten.sort."""

import torch


def sort_values(x):
    return torch.sort(x, dim=-1).values


def get_inputs():
    return [torch.randn(4, 8, 96)]
