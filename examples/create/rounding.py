"""Rounding and sign: a straight-through quantizer's forward, round(x * 4) / 4 plus a sign
term (both have zero gradient almost everywhere). Tier 1, function form."""

import torch


def rounding(x):
    return torch.round(x * 4.0) / 4.0 + 0.1 * torch.sign(x) * torch.trunc(x)


def get_inputs():
    return [torch.randn(16, 256) * 3]
