"""Huber (smooth-L1-like) loss with delta, mean over every element: a scalar. Tier 2."""

import torch
from torch import nn


class Model(nn.Module):
    def __init__(self, delta: float):
        super().__init__()
        self.delta = delta

    def forward(self, pred, target):
        return nn.functional.huber_loss(pred, target, reduction="mean", delta=self.delta)


def get_inputs():
    return [torch.randn(4, 8, 96), torch.randn(4, 8, 96)]


def get_init_inputs():
    return [0.75]
