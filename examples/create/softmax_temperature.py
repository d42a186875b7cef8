"""Softmax with a temperature: y = softmax(x / T). Tier 2, function form."""

import torch

TEMPERATURE = 0.7


def softmax_temperature(x):
    return torch.softmax(x / TEMPERATURE, dim=-1)


def get_inputs():
    return [torch.randn(4, 8, 96)]
