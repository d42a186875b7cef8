"""Signed square root: y = sign(x) * sqrt(|x|). Tier 1."""

import torch


def signed_sqrt(x):
    return torch.sign(x) * torch.sqrt(torch.abs(x))


def get_inputs():
    return [torch.randn(4, 8, 96)]
