"""Gated linear unit over the last dim: a, b = x.chunk(2, -1); y = a * sigmoid(b). Tier 1.

KernelBench layout. x is read in two equal parts of its last dim: the kernels read each part
in place, and the backward writes both halves of dx into one tensor.
"""

import torch
import torch.nn.functional as F


class Model(torch.nn.Module):
    def forward(self, x):
        return F.glu(x, dim=-1)


def get_inputs():
    return [torch.randn(4, 8, 192)]


def get_init_inputs():
    return []
