"""Jagged mean in the graph: `torch.segment_reduce(data, "mean", lengths= | offsets=)`.

(A Python loop over segments never reaches a graph whole: compile/loops.py rewrites it first.)
"""

from __future__ import annotations

import torch
from torch.fx import Node

from kernelwright.compile.patterns import Match, arg, kind, value

# --------------------------------------------------------------------------- jagged mean


def segment_mean(data: torch.Tensor, lengths=None, offsets=None) -> torch.Tensor:
    """`torch.segment_reduce(data, "mean", lengths= | offsets=, axis=0)` through jagged_mean:
    NaN for an empty segment, as eager gives; lengths that do not sum to the rows of `data` are
    a device-side assert, as eager's error."""
    from kernelwright.ops.jagged_mean import jagged_mean

    if offsets is None:
        zero = torch.zeros(1, dtype=torch.int64, device=lengths.device)
        offsets = torch.cat([zero, torch.cumsum(lengths, 0)])
    offsets = offsets.to(torch.int64)
    total = data.shape[0]
    torch._assert_async(
        (offsets[0] == 0) & (offsets[-1] == total),
        "segment_reduce: lengths must sum to the rows of data",
    )
    out = jagged_mean(data.reshape(total, -1), offsets, validate=False)
    empty = (offsets[1:] == offsets[:-1]).unsqueeze(-1)
    out = torch.where(empty, torch.full_like(out, float("nan")), out)
    return out.view(offsets.shape[0] - 1, *data.shape[1:])


def match_segment_mean(node: Node) -> Match | None:
    """`torch.segment_reduce(data, "mean", lengths=L)` (or `offsets=O`) along axis 0."""
    if kind(node) != "segment_reduce":
        return None
    data, reduce = arg(node, 0, "data"), arg(node, 1, "reduce")
    lengths, offsets = arg(node, 2, "lengths"), node.kwargs.get("offsets")
    bounds = lengths if lengths is not None else offsets
    if reduce != "mean" or not isinstance(data, Node) or not isinstance(bounds, Node):
        return None
    problem = None
    extra = set(node.kwargs) - {"lengths", "offsets", "axis", "unsafe"}
    if len(node.args) > 2 or extra or node.kwargs.get("initial") is not None:
        problem = "indices=, initial= or arguments past lengths/offsets"
    elif node.kwargs.get("axis", 0) != 0:
        problem = "axis is not 0"
    elif lengths is not None and offsets is not None:
        problem = "both lengths and offsets"
    bv = value(bounds)
    if problem is None and (
        bv is None or bv.dim() != 1 or bv.dtype not in (torch.int64, torch.int32)
    ):
        problem = "lengths/offsets are not a 1-D integer tensor (a batched segment_reduce)"
    kwargs = {"lengths": lengths} if lengths is not None else {"offsets": offsets}
    return Match(
        "segment_reduce(data, 'mean')", "jagged_mean", segment_mean, (data,), kwargs, [node],
        {"data": data}, problem,
    )  # fmt: skip
