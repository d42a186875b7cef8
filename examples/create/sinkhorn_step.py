"""One Sinkhorn step on [N, M] scores: softmax over each row, then each column normalised to sum
to one. Tier 3.

Stops at aten.sum: reductions over two sets of dims, neither holding the other (the rows', then
the columns'): each program of a row kernel owns whole rows, so the column sums cross programs;
that needs kernels chained through a full-size intermediate, which create does not generate.
"""

import torch


def sinkhorn_step(scores):
    p = torch.softmax(scores, dim=-1)
    return p / p.sum(dim=0, keepdim=True)


def get_inputs():
    return [torch.randn(24, 40)]
