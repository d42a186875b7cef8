"""Squared ReLU (Primer, Nemotron MLPs): y = relu(x)^2. Tier 1, function form."""

import torch


def relu_squared(x):
    return torch.square(torch.relu(x))


def get_inputs():
    return [torch.randn(4, 8, 96)]
