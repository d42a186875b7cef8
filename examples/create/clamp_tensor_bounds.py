"""Clamp with element-wise tensor bounds: y = min(max(x, lo), hi), lo < 0 < hi. Tier 1."""

import torch


def clamp_tensor_bounds(x, lo, hi):
    return x.clamp(min=lo, max=hi)


def get_inputs():
    shape = (4, 8, 96)
    return [torch.randn(shape), -0.2 - torch.rand(shape), 0.2 + torch.rand(shape)]
