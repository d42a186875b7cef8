"""Arctan activation scaled to (-1, 1): y = (2 / pi) * atan(x). Tier 1.

atan has no portable Triton builtin (libdevice is GPU-only): it is lowered to a range reduction
and a polynomial, which run on the GPU and in the CPU interpreter alike.
"""

import math

import torch


def arctan_activation(x):
    return torch.atan(x) * (2.0 / math.pi)


def get_inputs():
    return [torch.randn(8, 64)]
