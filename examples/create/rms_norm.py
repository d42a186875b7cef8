"""RMSNorm with weight (Llama): y = x * rsqrt(mean(x^2) + eps) * w. Tier 2, KernelBench."""

import torch
from torch import nn


class Model(nn.Module):
    def __init__(self, hidden: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x):
        variance = x.pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(variance + self.eps) * self.weight


def get_inputs():
    return [torch.randn(4, 8, 96)]


def get_init_inputs():
    return [96]
