"""SwiGLU (Llama MLP): y = silu(gate) * up. Tier 1, function form with two inputs."""

import torch
import torch.nn.functional as F


def swiglu(gate, up):
    return F.silu(gate) * up


def get_inputs():
    return [torch.randn(4, 8, 96), torch.randn(4, 8, 96)]
