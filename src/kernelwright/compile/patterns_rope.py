"""RoPE as Hugging Face writes it: `q * cos + rotate_half(q) * sin`, once for q and once for k."""

from __future__ import annotations

from typing import Any

import torch
from torch.fx import Node

from kernelwright.compile.patterns import Match, _other, arg, kind, value

# --------------------------------------------------------------------------- RoPE


def _half_slice(node: Any, x: Node, half: int, first: bool) -> bool:
    """Whether `node` is `x[..., :half]` (first) or `x[..., half:]` (not first)."""
    if kind(node) != "getitem" or len(node.args) != 2 or node.args[0] is not x:
        return False
    index = node.args[1]
    if not (isinstance(index, tuple) and len(index) == 2 and index[0] is Ellipsis):
        return False
    sl = index[1]
    if not isinstance(sl, slice) or sl.step is not None:
        return False
    return (sl.start, sl.stop) == ((None, half) if first else (half, None))


def _rotate_half(cat: Any) -> Node | None:
    """x for HF's `rotate_half(x)`: `torch.cat((-x[..., h:], x[..., :h]), dim=-1)`, h = D/2."""
    if kind(cat) != "cat" or len(cat.args) < 1:
        return None
    parts = cat.args[0]
    dim = arg(cat, 1, "dim", 0)
    if not (isinstance(parts, (tuple, list)) and len(parts) == 2) or dim != -1:
        return None
    neg, x1 = parts
    if kind(neg) != "neg" or len(neg.args) != 1:
        return None
    x2 = neg.args[0]
    if not isinstance(x1, Node) or kind(x1) != "getitem" or not isinstance(x1.args[0], Node):
        return None
    x = x1.args[0]
    xv = value(x)
    if xv is None or not isinstance(xv.shape[-1], int) or xv.shape[-1] % 2:
        return None
    half = xv.shape[-1] // 2
    if _half_slice(x1, x, half, True) and _half_slice(x2, x, half, False):
        return x
    return None


def _unsqueezed(node: Any) -> tuple[Node, int] | None:
    """(t, dim) for `t.unsqueeze(dim)` / `torch.unsqueeze(t, dim)`."""
    if kind(node) != "unsqueeze" or len(node.args) + len(node.kwargs) != 2:
        return None
    dim = arg(node, 1, "dim")
    return (node.args[0], dim) if isinstance(dim, int) else None


def rope_rotate_half(x: torch.Tensor, cos, sin, unsqueeze_dim: int) -> torch.Tensor:
    """`x * cos.unsqueeze(d) + rotate_half(x) * sin.unsqueeze(d)` for one of q, k: kernelwright's
    rope with no heads on the other side."""
    from kernelwright.ops.rope import rope

    return rope(x, x.narrow(unsqueeze_dim, 0, 0), cos, sin, unsqueeze_dim=unsqueeze_dim)[0]


def match_rope(add: Node) -> Match | None:
    """HF's `q * cos + rotate_half(q) * sin` (cos, sin unsqueezed at dim 1 or 2), for q or k."""
    if kind(add) != "add" or len(add.args) != 2 or add.kwargs:
        return None
    for rot_mul in add.args:
        if kind(rot_mul) != "mul" or len(rot_mul.args) != 2 or rot_mul.kwargs:
            continue
        cat = next((a for a in rot_mul.args if kind(a) == "cat"), None)
        x = _rotate_half(cat)
        if x is None:
            continue
        plain = _other(add, rot_mul)
        if kind(plain) != "mul" or len(plain.args) != 2 or plain.kwargs:
            continue
        cos_u, sin_u = _other(plain, x), _other(rot_mul, cat)
        cos, sin = _unsqueezed(cos_u), _unsqueezed(sin_u)
        if cos is None or sin is None or cos[1] != sin[1]:
            continue
        dim = cos[1]
        x1, x2 = cat.args[0][1], cat.args[0][0].args[0]
        neg = cat.args[0][0]
        nodes = [plain, x1, x2, neg, cat, rot_mul, add]
        order = {n: i for i, n in enumerate(add.graph.nodes)}
        nodes.sort(key=order.__getitem__)
        return Match(
            "q * cos + rotate_half(q) * sin", "rope", rope_rotate_half,
            (x, cos[0], sin[0], dim), {}, nodes, {"x": x, "cos": cos[0], "sin": sin[0]},
            problem=_rope_problem(x, cos[0], sin[0], dim, add),
        )  # fmt: skip
    return None


def _rope_problem(x: Node, cos: Node, sin: Node, dim: int, add: Node) -> str | None:
    xv, cv, sv, out = value(x), value(cos), value(sin), value(add)
    if any(v is None for v in (xv, cv, sv, out)):
        return "no traced value for q, cos or sin"
    if xv.dim() != 4 or dim not in (1, 2):
        return "not [batch, heads, seq, head_dim] with cos/sin unsqueezed at dim 1 or 2"
    if cv.dim() != 3 or tuple(cv.shape) != tuple(sv.shape) or cv.shape[-1] != xv.shape[-1]:
        return "cos/sin are not [batch or 1, seq, head_dim] (partial rotary is not matched)"
    seq = xv.shape[3 - dim]
    if cv.shape[1] != seq or cv.shape[0] not in (1, xv.shape[0]):
        return "cos/sin do not match q's batch and sequence"
    if out.dtype != xv.dtype or tuple(out.shape) != tuple(xv.shape):
        return "the result's dtype or shape differs from q's (eager promotes or broadcasts)"
    if cv.requires_grad or sv.requires_grad:
        return "cos/sin require grad (the kernel gives q and k theirs only)"
    return None
