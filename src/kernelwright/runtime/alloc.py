"""Output allocation. Tests switch on poisoning so that elements a kernel never writes show up.

Every op allocates its outputs through `empty()`. Under `poisoned()` the buffers are filled
with NaN (floats) or a sentinel (integers), so a missing store fails the comparison with the
reference instead of passing on memory that happened to hold the right value or zeros.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch

# Process-wide, not thread-local: autograd runs CUDA backward passes on its own worker thread,
# which must see the flag too.
_poison = False


def poisoning() -> bool:
    return _poison


@contextlib.contextmanager
def poisoned(enabled: bool = True) -> Iterator[None]:
    """Within this block, every buffer kernelwright allocates starts as NaN."""
    global _poison
    before = _poison
    _poison = enabled
    try:
        yield
    finally:
        _poison = before


def empty(
    shape: Sequence[int],
    *,
    dtype: torch.dtype,
    device: torch.device,
    order: Sequence[int] | None = None,
) -> torch.Tensor:
    """A new tensor (never a view). `order`: the dims from outermost to innermost in memory
    (torch.empty_permuted), e.g. [0, 2, 1, 3] for a [B, H, S, D] tensor stored as [B, S, H, D]."""
    if order is None:
        out = torch.empty(tuple(shape), dtype=dtype, device=device)
    else:
        out = torch.empty_permuted(tuple(shape), tuple(order), dtype=dtype, device=device)
    if poisoning() and not torch.compiler.is_compiling():
        out.fill_(float("nan") if out.is_floating_point() else -(2**30))
    return out


def empty_like(t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A new contiguous tensor (never a view) in `t`'s shape, in `t`'s dtype unless given."""
    if not t.is_contiguous():
        return empty(t.shape, dtype=dtype or t.dtype, device=t.device)
    # A contiguous `t`'s own strides are contiguous ones, and torch.empty_like keeps the strides
    # of a dense tensor: the tensor `empty` would give, without parsing a torch.Size (the
    # costlier call on the host, where eager training loops at moderate sizes are bound).
    out = torch.empty_like(t) if dtype is None else torch.empty_like(t, dtype=dtype)
    if poisoning() and not torch.compiler.is_compiling():
        out.fill_(float("nan") if out.is_floating_point() else -(2**30))
    return out
