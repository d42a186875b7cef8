"""SiLU / swish: y = x * sigmoid(x). Tier 1, KernelBench layout."""

import torch
from torch import nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.nn.functional.silu(x)


def get_inputs():
    return [torch.randn(4, 8, 96)]


def get_init_inputs():
    return []
