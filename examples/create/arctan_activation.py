"""Arctan activation scaled to (-1, 1): y = (2 / pi) * atan(x). Tier 3.

Stops at aten.atan: no Triton builtin computes it in the CPU interpreter as well as on the GPU
(libdevice is GPU-only), so it is not lowered.
"""

import math

import torch


def arctan_activation(x):
    return torch.atan(x) * (2.0 / math.pi)


def get_inputs():
    return [torch.randn(8, 64)]
