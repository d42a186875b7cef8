"""cumprod and prod with backward formulas the row templates lower, swapped in while tracing.

PyTorch's own derivatives of cumprod and prod are right at zeros, but their traced forms shift
the row by one column (prod: `cat` of a slice) or pick the first zero through a scatter; a row
tile has no lowering for either. While a reference is traced, `products()` routes
`torch.cumprod` / `Tensor.cumprod` / `aten.cumprod` and the `prod` spellings through autograd
Functions whose forward is the same op and whose backward is written with row ops only
(scans, row sums and products, element-wise masks), exact at zeros:

- cumprod along a row, y_j = prod_{k <= j} x_k:
  before the row's first zero, dx_i = (sum_{j >= i} dy_j y_j) / x_i (y_j / x_i is the product
  without x_i; x_i is not zero there); at the first zero z, dx_z = sum_{j >= z} dy_j w_j with
  w = cumprod(x with x_z set to 1) (w_j is the product up to j without x_z); after it, 0 (every
  such product holds x_z).
- prod over a row: with no zero in the row dx_i = dy * p / x_i (p the product of the row); with
  exactly one zero, its gradient is dy times the product of the others and the rest are 0; with
  two or more, every gradient is 0.

Anything else (a dtype argument, named dims, `out=`) goes to PyTorch unchanged.
"""

from __future__ import annotations

import contextlib

import torch
from torch.overrides import TorchFunctionMode

aten = torch.ops.aten

_CUMPROD = {torch.cumprod, torch.Tensor.cumprod, aten.cumprod.default}
_PROD = {torch.prod, torch.Tensor.prod, aten.prod.default, aten.prod.dim_int}
# set while a backward formula runs: its own cumprod/prod calls are the plain ops
_QUIET = [False]


@contextlib.contextmanager
def _quiet():
    _QUIET[0] = True
    try:
        yield
    finally:
        _QUIET[0] = False


def _cumprod_grad(x: torch.Tensor, y: torch.Tensor, dy: torch.Tensor, d: int) -> torch.Tensor:
    zero = x == 0
    seen = torch.cumsum(zero.to(x.dtype), d)  # zeros up to and including each position
    before, first = seen == 0, zero & (seen == 1)
    # before the first zero: the products after i, summed from the row's end, over x_i
    after = torch.flip(torch.cumsum(torch.flip(dy * y, [d]), d), [d])
    grad = torch.where(before, after / torch.where(before, x, 1.0), 0.0)
    # at the first zero: the products up to each j >= z without x_z, weighted by dy_j
    w = torch.cumprod(torch.where(first, 1.0, x), d)
    at_zero = torch.sum(torch.where(seen >= 1, dy * w, 0.0), d, keepdim=True)
    return torch.where(first, at_zero, grad)


class _Cumprod(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim):
        y = torch.cumprod(x, dim)
        ctx.save_for_backward(x, y)
        ctx.dim = dim
        return y

    @staticmethod
    def backward(ctx, dy):
        x, y = ctx.saved_tensors
        with _quiet():
            return _cumprod_grad(x, y, dy, ctx.dim), None


def _prod_grad(x: torch.Tensor, dy: torch.Tensor, dim: int | None) -> torch.Tensor:
    zero = x == 0
    if dim is None:  # every dim: one row of every element
        count = torch.sum(zero.to(x.dtype))
        others = torch.prod(torch.where(zero, 1.0, x))
    else:
        count = torch.sum(zero.to(x.dtype), dim, keepdim=True)
        others = torch.prod(torch.where(zero, 1.0, x), dim, keepdim=True)  # the nonzero ones
    one = (count == 1) & zero  # the only zero of its row: the product of the others
    return dy * torch.where(count == 0, others / x, torch.where(one, others, 0.0))


class _Prod(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, keepdim):
        ctx.save_for_backward(x)
        ctx.dim, ctx.keepdim = dim, keepdim
        return torch.prod(x) if dim is None else torch.prod(x, dim, keepdim)

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        if ctx.dim is not None and not ctx.keepdim:
            dy = dy.unsqueeze(ctx.dim)
        with _quiet():
            return _prod_grad(x, dy, ctx.dim), None, None


def _split(args: tuple, kwargs: dict, names: list[str]) -> dict | None:
    """The call's arguments by name (positional in `names` order), None for anything else."""
    if len(args) - 1 > len(names):
        return None
    got = dict(zip(names, args[1:], strict=False))
    for k, v in kwargs.items():
        if k not in names or k in got:
            return None
        got[k] = v
    return got


class _Products(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        x = args[0] if args else None
        plain = (
            _QUIET[0]
            or not isinstance(x, torch.Tensor)
            or not x.is_floating_point()
            or kwargs.get("dtype") is not None
        )
        if not plain and func in _CUMPROD:
            got = _split(args, kwargs, ["dim", "dtype"])
            if got is not None and isinstance(got.get("dim"), int) and got.get("dtype") is None:
                return _Cumprod.apply(x, got["dim"] % max(x.dim(), 1))
        if not plain and func in _PROD:
            got = _split(args, kwargs, ["dim", "keepdim", "dtype"])
            dim = None if got is None else got.get("dim")
            if got is not None and got.get("dtype") is None and (dim is None or
                                                                 isinstance(dim, int)):  # fmt: skip
                dim = None if dim is None else dim % max(x.dim(), 1)
                return _Prod.apply(x, dim, bool(got.get("keepdim", False)))
        return func(*args, **kwargs)


def products() -> TorchFunctionMode:
    """The mode to trace a reference under (see the module doc)."""
    return _Products()
