"""Global response normalisation (ConvNeXt V2) of channels-last [N, H, W, C] features:
g = ||x||_2 over (H, W), y = gamma * x * g / mean_c(g) + beta + x. Tier 3.

Stops at aten.mean: the norm reduces (H, W), the mean over channels of the norms reduces C — two
sets of dims, neither holding the other, and the result feeds back into every element (kernels
chained through a full-size intermediate, which create does not generate).
"""

import torch
from torch import nn


class GlobalResponseNorm(nn.Module):
    def __init__(self, channels: int = 16):
        super().__init__()
        self.gamma = nn.Parameter(torch.zeros(1, 1, 1, channels))
        self.beta = nn.Parameter(torch.zeros(1, 1, 1, channels))

    def forward(self, x):
        g = torch.norm(x, p=2, dim=(1, 2), keepdim=True)
        n = g / (g.mean(dim=-1, keepdim=True) + 1e-6)
        return self.gamma * (x * n) + self.beta + x


def get_inputs():
    return [torch.randn(2, 5, 6, 16)]
