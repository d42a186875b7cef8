"""Logit soft-capping (Gemma 2): y = cap * tanh(x / cap). Tier 1, function form."""

import torch

CAP = 30.0


def logit_softcap(x):
    return CAP * torch.tanh(x / CAP)


def get_inputs():
    return [torch.randn(4, 8, 96) * 50]
