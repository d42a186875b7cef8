"""Softplus with beta and threshold: y = log(1 + exp(beta*x)) / beta. Tier 1, KernelBench."""

import torch
from torch import nn


class Model(nn.Module):
    def __init__(self, beta: float, threshold: float):
        super().__init__()
        self.beta = beta
        self.threshold = threshold

    def forward(self, x):
        return nn.functional.softplus(x, beta=self.beta, threshold=self.threshold)


def get_inputs():
    return [torch.randn(4, 8, 96)]


def get_init_inputs():
    return [1.5, 20.0]
