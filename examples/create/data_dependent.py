"""Branches on a tensor's value: data-dependent control flow. Tier 3: must stop cleanly."""

import torch


def data_dependent(x):
    if x.sum() > 0:
        return torch.relu(x)
    return torch.tanh(x)


def get_inputs():
    return [torch.randn(4, 8, 96)]
