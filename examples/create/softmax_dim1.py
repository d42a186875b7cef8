"""Softmax over the channel dim of [N, C, L]: y = softmax(x, dim=1). Tier 2."""

import torch
from torch import nn


class Model(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return torch.softmax(x, dim=self.dim)


def get_inputs():
    return [torch.randn(4, 16, 50)]


def get_init_inputs():
    return [1]
