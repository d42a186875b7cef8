"""GeGLU on a fused gate/up projection (one matmul's output, then chunk): tanh GELU. Tier 1.

y = gelu_tanh(gate) * up with gate, up = h.chunk(2, dim=-1): the kernel takes h whole.
"""

import torch
import torch.nn.functional as F


def geglu_fused(h):
    gate, up = h.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up


def get_inputs():
    return [torch.randn(4, 8, 192)]
