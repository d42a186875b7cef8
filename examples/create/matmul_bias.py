"""Linear layer, y = x @ W^T + b. Tier 3 (a matmul): the create workflow must stop cleanly."""

import torch
from torch import nn


class Model(nn.Module):
    def __init__(self, d_in: int, d_out: int):
        super().__init__()
        self.linear = nn.Linear(d_in, d_out)

    def forward(self, x):
        return self.linear(x)


def get_inputs():
    return [torch.randn(4, 8, 96)]


def get_init_inputs():
    return [96, 40]
