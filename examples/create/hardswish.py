"""HardSwish (MobileNetV3): y = x * relu6(x + 3) / 6. Tier 1, function form."""

import torch
import torch.nn.functional as F


def hardswish(x):
    return F.hardswish(x)


def get_inputs():
    return [torch.randn(4, 8, 96) * 4]
