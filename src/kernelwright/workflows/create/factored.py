"""cosine_similarity written with its row constants outside the sum, swapped in while tracing.

PyTorch divides each input by its (clamped) norm and then sums the product:
sum((x1 / max(|x1|, eps)) * (x2 / max(|x2|, eps))). The sum's argument then needs both norms, two
reductions of the same row, so a looped row kernel walks the row twice (the norms, then the
sum). Taken out of the sum, the same value is sum(x1 * x2) / (max(|x1|, eps) * max(|x2|, eps)):
three reductions that need nothing but the inputs, one walk of the row. The clamps are the same,
so the value and both gradients are the reference's up to rounding (each norm still clamped on
its own, a gradient of 0 through a clamped norm). The products cannot overflow where the
reference does not: |x1 x2| <= (x1^2 + x2^2) / 2, and the norms' squares are summed either way.

While a reference is traced, `factored()` routes `F.cosine_similarity` / `torch.cosine_similarity`
through that form (the inputs broadcast to one shape first, as PyTorch's do). Anything else goes
to PyTorch unchanged.
"""

from __future__ import annotations

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
