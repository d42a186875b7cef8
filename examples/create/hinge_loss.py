"""Hinge loss with +-1 targets: y = mean(clamp(1 - pred * target, min=0)), a scalar. Tier 2."""

import torch


def hinge_loss(pred, target):
    return torch.clamp(1.0 - pred * target, min=0.0).mean()


def get_inputs():
    return [torch.randn(4, 8, 96), torch.randint(0, 2, (4, 8, 96)).float() * 2.0 - 1.0]
