"""GeGLU with the tanh-approximate GELU (Gemma MLP): y = gelu_tanh(gate) * up. Tier 1."""

import torch
import torch.nn.functional as F


def geglu_tanh(gate, up):
    return F.gelu(gate, approximate="tanh") * up


def get_inputs():
    return [torch.randn(4, 8, 96), torch.randn(4, 8, 96)]
