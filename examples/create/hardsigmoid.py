"""Hard sigmoid (MobileNetV3): relu6(x + 3) / 6. Its decomposition compares x against -3 and 3
and combines the masks with bitwise ops. Tier 1, function form."""

import torch
import torch.nn.functional as F


def hardsigmoid(x):
    return F.hardsigmoid(x)


def get_inputs():
    return [torch.randn(16, 256) * 4]
