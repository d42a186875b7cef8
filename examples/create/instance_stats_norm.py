"""Instance-norm-like over (H, W): y = (x - mean) / sqrt(var + eps), no affine. Tier 2."""

import torch


def instance_stats_norm(x):
    mean = x.mean(dim=(-2, -1), keepdim=True)
    var = x.var(dim=(-2, -1), keepdim=True, unbiased=False)
    return (x - mean) / torch.sqrt(var + 1e-5)


def get_inputs():
    return [torch.randn(2, 4, 6, 10)]
