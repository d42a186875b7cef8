"""Mean squared error over every element, one scalar: y = mean((pred - target)^2). Tier 2."""

import torch
import torch.nn.functional as F


def mse_loss(pred, target):
    return F.mse_loss(pred, target, reduction="mean")


def get_inputs():
    return [torch.randn(4, 8, 96), torch.randn(4, 8, 96)]
