"""Channel RMSNorm of [N, C, H, W] over C: y = x * rsqrt(mean_c(x^2) + eps) * w[c]. Tier 2."""

import torch
from torch import nn


class ChannelRMSNorm(nn.Module):
    def __init__(self, channels: int = 12, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(channels, 1, 1))
        self.eps = eps

    def forward(self, x):
        ms = x.pow(2).mean(dim=1, keepdim=True)
        return x * torch.rsqrt(ms + self.eps) * self.weight


def get_inputs():
    return [torch.randn(2, 12, 6, 10)]
