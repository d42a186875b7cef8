"""Softmax over the last dim. Tier 2, KernelBench layout."""

import torch
from torch import nn


class Model(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1)


def get_inputs():
    return [torch.randn(4, 8, 96)]


def get_init_inputs():
    return []
