"""Sawtooth of period 1 that keeps the sign of its input: y = fmod(x, 1.0). Tier 3.

Stops at aten.fmod: an exact remainder needs libdevice's fmod, which the CPU interpreter lacks
(a - b * trunc(a / b) is off by b where the quotient rounds across an integer).
"""

import torch


def fmod_sawtooth(x):
    return torch.fmod(x, 1.0)


def get_inputs():
    return [torch.randn(8, 64) * 3]
