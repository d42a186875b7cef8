"""Row constants taken out of sums, so a looped row kernel walks a long row once.

A sum over the row whose argument needs another reduction of the same row (a norm, a max) is a
second level: the looped kernels walk the row for the first, then again for the sum. When that
reduction reaches the sum only as a factor of a product, it can leave the sum:
sum(x1 / n1 * x2 / n2) = sum(x1 * x2) / (n1 * n2), and every sum needs the inputs alone.

- `factored()`: while a reference is traced, `F.cosine_similarity` / `torch.cosine_similarity`
  are computed in that form, sum(x1 * x2) / (max(|x1|, eps) * max(|x2|, eps)) (the inputs
  broadcast to one shape first, as PyTorch's do). PyTorch divides first; the clamps are the
  same, so the value and both gradients are the reference's up to rounding.
- `factor_sums(gm)`: the same rewrite on a traced forward graph, for any sum over the row whose
  argument is a product (mul/div) of factors that are either free of the row's reductions or
  constant along the row (a keepdim reduction of it, or a value computed from such), e.g.
  `(F.normalize(a) * F.normalize(b)).sum(-1)` written by hand. The backward graph is AOT
  Autograd's and is not touched: it reads the same saved values.

A product cannot cancel, so only factors leave a sum: a row constant added inside it (KL's
lse) would cancel against the row's other terms (docs/create.md). The products cannot
overflow where the reference does not either when the constants are norms: |x1 x2| <=
(x1^2 + x2^2) / 2, and the norms' squares are summed anyway.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

_COSINE = {F.cosine_similarity, torch.cosine_similarity}


def _cosine(x1: torch.Tensor, x2: torch.Tensor, dim: int = 1, eps: float = 1e-8) -> torch.Tensor:
    x1, x2 = torch.broadcast_tensors(x1, x2)
    n1 = torch.linalg.vector_norm(x1, dim=dim).clamp_min(eps)
    n2 = torch.linalg.vector_norm(x2, dim=dim).clamp_min(eps)
    return torch.sum(x1 * x2, dim) / (n1 * n2)


class _Factored(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _COSINE and len(args) >= 2 and set(kwargs) <= {"dim", "eps"}:
            x1, x2 = args[0], args[1]
            rest = dict(zip(("dim", "eps"), args[2:], strict=False))
            if (
                isinstance(x1, torch.Tensor)
                and isinstance(x2, torch.Tensor)
                and x1.is_floating_point()
                and x2.is_floating_point()
                and x1.dtype == x2.dtype
                and not (set(rest) & set(kwargs))
            ):
                got = {**rest, **kwargs}
                dim, eps = got.get("dim", 1), got.get("eps", 1e-8)
                if isinstance(dim, int) and isinstance(eps, (int, float)):
                    # torch functions called here are not routed through this mode again
                    return _cosine(x1, x2, dim, float(eps))
        return func(*args, **kwargs)


def factored() -> TorchFunctionMode:
    """The mode to trace a reference under (see the module doc)."""
    return _Factored()


# --------------------------------------------------------------------------- the graph rewrite

_aten = torch.ops.aten
_SUM = _aten.sum.dim_IntList


def _shape(node) -> tuple[int, ...] | None:
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return tuple(val.shape) if isinstance(val, torch.Tensor) else None


def _row_dims(sum_node: torch.fx.Node) -> tuple[int, ...] | None:
    src = _shape(sum_node.args[0])
    dims = sum_node.args[1] if len(sum_node.args) > 1 else None
    if src is None or not dims:
        return None
    return tuple(sorted(d % len(src) for d in dims))


_REDUCTIONS = frozenset(["sum", "mean", "amax", "amin", "prod", "var", "var_mean", "std", "max",
                         "min", "argmax", "argmin", "logsumexp", "cumsum", "cumprod"])  # fmt: skip


def _needs_row(node, memo: dict) -> bool:
    """Whether `node` depends on a reduction (or a scan): conservatively, over any dims."""
    if not isinstance(node, torch.fx.Node):
        return False
    if node not in memo:
        name = getattr(getattr(node.target, "overloadpacket", None), "__name__", "")
        memo[node] = node.op == "call_function" and (
            name in _REDUCTIONS or any(_needs_row(a, memo) for a in node.all_input_nodes)
        )
    return memo[node]


def _constant_along(node, dims, full: tuple[int, ...]) -> bool:
    shape = _shape(node)
    if shape is None:
        return not isinstance(node, torch.fx.Node)  # a number
    shape = (1,) * (len(full) - len(shape)) + shape
    return len(shape) == len(full) and all(shape[d] == 1 for d in dims)


def _factors(node, out: list, power: int) -> None:
    """`node` as a product: (factor, +1 or -1) pairs, through mul and div."""
    if isinstance(node, torch.fx.Node) and node.op == "call_function":
        if node.target is _aten.mul.Tensor:
            _factors(node.args[0], out, power)
            _factors(node.args[1], out, power)
            return
        if node.target is _aten.div.Tensor and not node.kwargs:
            _factors(node.args[0], out, power)
            _factors(node.args[1], out, -power)
            return
    out.append((node, power))


def _add(graph: torch.fx.Graph, fake, target, *args) -> torch.fx.Node:
    """A new node `target(*args)` with its value's fake tensor (the shape the profile reads)."""
    new = graph.call_function(target, args)
    vals = [a.meta["val"] if isinstance(a, torch.fx.Node) else a for a in args]
    with fake:
        new.meta["val"] = target(*vals)
    return new


def factor_sums(gm: torch.fx.GraphModule) -> int:
    """Rewrite, in place, every sum over the row whose argument is a product with factors that
    need the row's reductions and are constant along it; returns how many were rewritten."""
    from torch._guards import detect_fake_mode

    graph = gm.graph
    done = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not _SUM or node.kwargs:
            continue
        dims, full = _row_dims(node), _shape(node.args[0])
        if dims is None or full is None:
            continue
        memo: dict = {}
        if not _needs_row(node.args[0], memo):
            continue  # one level already
        factors: list = []
        _factors(node.args[0], factors, 1)
        inner, outer = [], []
        for f, p in factors:
            base = f
            while isinstance(base, torch.fx.Node) and base.target is _aten.expand.default:
                base = base.args[0]  # a broadcast of a row constant to the row's shape
            if not isinstance(f, torch.fx.Node):
                outer.append((f, p))  # a number: applied once a row, after the sum
            elif not _needs_row(f, memo):
                inner.append((f, p))
            elif _constant_along(base, dims, full):
                outer.append((base, p))
            else:
                break  # a factor that varies along the row and needs its reductions
        else:
            needed = [f for f, _ in outer if isinstance(f, torch.fx.Node)]
            if not needed or not any(p > 0 for _, p in inner):
                continue  # nothing of the row's reductions leaves the sum, or nothing stays
            fake = detect_fake_mode([n.meta.get("val") for n in graph.nodes])
            keep = bool(node.args[2]) if len(node.args) > 2 else False
            add = functools.partial(_add, graph, fake)
            with graph.inserting_before(node):
                nums = [f for f, p in inner if p > 0]
                arg = nums[0]
                for f in nums[1:]:
                    arg = add(_aten.mul.Tensor, arg, f)
                for f, p in inner:
                    if p < 0:
                        arg = add(_aten.div.Tensor, arg, f)
                out = add(_SUM, arg, list(node.args[1]), keep)
                for f, p in outer:
                    if isinstance(f, torch.fx.Node) and not keep:
                        lead = len(full) - len(_shape(f))
                        f = add(_aten.squeeze.dims, f, [d - lead for d in dims if d >= lead])
                    out = add(_aten.mul.Tensor if p > 0 else _aten.div.Tensor, out, f)
            node.replace_all_uses_with(out)
            graph.erase_node(node)
            done += 1
    if done:
        graph.eliminate_dead_code()
        gm.recompile()
    return done
