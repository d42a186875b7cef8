"""Top-k values along the last dim (k = 5, largest first). Tier 3.
Stops at aten.topk."""

import torch
from torch import nn


class Model(nn.Module):
    def __init__(self, k: int):
        super().__init__()
        self.k = k

    def forward(self, x):
        return torch.topk(x, self.k, dim=-1).values


def get_inputs():
    return [torch.randn(4, 8, 96)]


def get_init_inputs():
    return [5]
