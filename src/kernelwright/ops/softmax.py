"""Softmax and log-softmax over the last dimension, forward and backward in one pair of kernels.

    softmax:      y = exp(x - max(x)) / sum(exp(x - max(x)))
    log_softmax:  y = x - max(x) - log(sum(exp(x - max(x))))

Everything is computed in fp32 with one rounding at the store. Only the output is saved for the
backward (the input is never needed):

    softmax:      dx = y * (dy - sum(dy * y))
    log_softmax:  dx = dy - exp(y) * sum(dy)

A row that fits one program (`block_n >= n`) is reduced in registers — 16-bit rows of 16384
and more are held in their own dtype (ops/_held.py: half the registers of fp32).
The backward's 16-bit rows of 4097-16384 columns instead take the looped kernel (two
reads, the second from L2), compiled per row length: faster there than holding dy and y. Rows
past the one-row widths, up to 32 chunks (524288 columns forward, 262144 backward), are split
over programs that each hold one chunk and wait for each other's statistics
(ops/_softmax_split.py, ops/_split.py): one read and one write of the row. Past that an online
pass — running max and rescaled running sum in one read — and a second read of the row to
write y; rows that long do not all stay in L2 between the passes: at worst this form moves 3/2
of the minimal bytes. The table's L2 flags (eviction hints, the write pass from the row's end)
serve part of the second read from L2.
`-inf` entries give 0 (softmax) / -inf (log_softmax); a row of all `-inf` gives NaN, as PyTorch
does.

Layer order: kernels (ops/_softmax_kernels.py; split rows: ops/_softmax_split.py) → launchers →
custom ops → autograd Function → `softmax`/`log_softmax` → `Softmax`/`LogSoftmax` → references.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from kernelwright.ops._held import held_row_fits
from kernelwright.ops._softmax_kernels import (
    _softmax_bwd_kernel,
    _softmax_bwd_looped_kernel,
    _softmax_fwd_kernel,
    _softmax_fwd_looped_kernel,
)
from kernelwright.ops._softmax_split import (  # noqa: F401
    _softmax_bwd_split_kernel,  # the kernels too: optimize's resource report lists this module's
    _softmax_bwd_words_kernel,
    _softmax_fwd_split_kernel,
    _softmax_fwd_words_kernel,
    split_bwd_launch,
    split_fwd_launch,
)
from kernelwright.ops._split import split_count
from kernelwright.runtime import device_info, lookup
from kernelwright.runtime.alloc import empty_like
from kernelwright.runtime.checks import check_tensor, rows_view
from kernelwright.runtime.launch import (
    LaunchConfig,
    PlanCache,
    cdiv,
    next_pow2,
    table_rows,
    traced,
    two_pass_flags,
)
from kernelwright.runtime.tables.softmax import TABLE

# --------------------------------------------------------------------------- launchers


def _config(kernel: str, x: torch.Tensor, config: LaunchConfig | None) -> LaunchConfig:
    return config or lookup(TABLE, "softmax", kernel, device_info(x.device), x.shape[-1])


def _looped_row(kernel: str, x: torch.Tensor) -> LaunchConfig:
    return lookup(TABLE, "softmax", kernel, device_info(x.device), 2**31 - 1)


def _split_count(x: torch.Tensor, cfg: LaunchConfig) -> int:
    """Programs per row of `x` ([M, N]) under a split row `cfg`; 0: not split."""
    M, N = x.shape
    return split_count(N, cfg.block_n, M, device_info(x.device)) if cfg.split_row else 0


def forward_config(x: torch.Tensor, config: LaunchConfig | None = None) -> LaunchConfig:
    """The forward's launch config for `x` ([M, N]): the table's row for its length; the table's
    looped row instead where a one-row config would hold more than `_held.MAX_HELD_ROW_BYTES`
    or a split row could not be split (`_split.split_count`). An explicit `config` is taken as
    given, but a split row that cannot be split runs looped at its `block_n`."""
    cfg = _config("fwd", x, config)
    n = x.shape[-1]
    if config is None:
        one_row = cfg.block_n >= n
        if (one_row and not held_row_fits(n, x.element_size())) or (
            not one_row and cfg.split_row and not _split_count(x, cfg)
        ):
            cfg = _looped_row("fwd", x)
    return cfg


def _widest_one_row(kernel: str, x: torch.Tensor) -> LaunchConfig | None:
    """The table's widest one-row config (a row whose `block_n` covers its bound) with
    `block_n` x's row length rounded up to a power of two; None where x's rows are wider."""
    n = x.shape[-1]
    one_row = [c for max_n, c in table_rows(TABLE, kernel, device_info(x.device).arch)
               if c.block_n >= max_n and not c.split_row]  # fmt: skip
    if not one_row or one_row[-1].block_n < n:
        return None
    return one_row[-1].with_(block_n=next_pow2(n))


def backward_config(y: torch.Tensor, config: LaunchConfig | None = None) -> LaunchConfig:
    """The backward's launch config for `y` ([M, N]): the table's row for its length; the
    table's looped row where a split row could not be split; and for 4-byte values, where the
    table's row is looped but the row fits the table's widest one-row config, that config. An
    explicit `config` is taken as given (a split row that cannot be split runs looped at its
    `block_n`).

    The table's looped rows under the one-row widths suit 16-bit values; with fp32 ones the
    one-row kernel is faster (it holds dy and y as fp32 below HOLD_FROM columns whatever the
    input dtype)."""
    cfg = _config("bwd", y, config)
    if config is None and cfg.block_n < y.shape[-1]:
        if cfg.split_row and not _split_count(y, cfg):
            cfg = _looped_row("bwd", y)
        elif not cfg.split_row and y.element_size() > 2:
            cfg = _widest_one_row("bwd", y) or cfg
    return cfg


def _build_plan(kernel: str, x: torch.Tensor, is_log: bool, config: LaunchConfig | None):
    """(kernel, grid, constexprs) of the forward (`kernel` "fwd") or backward ("bwd") over
    `x` ([M, N], M > 0: the input, or the saved output); a split row: (None, cfg, splits)."""
    M, N = x.shape
    fwd = kernel == "fwd"
    cfg = forward_config(x, config) if fwd else backward_config(x, config)
    constexprs = {"IS_LOG": is_log, "BLOCK_N": cfg.block_n, "num_warps": cfg.num_warps}
    if cfg.block_n >= N:
        one_row = _softmax_fwd_kernel if fwd else _softmax_bwd_kernel
        return one_row, (cdiv(M, cfg.rows),), {**constexprs, "ROWS": cfg.rows}
    splits = _split_count(x, cfg)
    if splits:
        return None, cfg, splits
    looped = _softmax_fwd_looped_kernel if fwd else _softmax_bwd_looped_kernel
    return looped, (M,), {**constexprs, **two_pass_flags(cfg)}


_PLANS = PlanCache()  # (kernel, M, N, dtype, device, is_log) -> `_build_plan`'s plan


def _rows(t: torch.Tensor, m: int, n: int) -> torch.Tensor:
    """`t` as [m, n]: itself, or the view of a contiguous tensor of another rank."""
    return t if t.dim() == 2 else t.view(m, n)


def _plan(kernel: str, t: torch.Tensor, m: int, n: int, is_log: bool, config) -> tuple:
    """`_build_plan`'s plan over `t`'s m rows of n, memoized where the table chooses the
    config."""
    if config is not None:
        return _build_plan(kernel, _rows(t, m, n), is_log, config)
    key = (kernel, m, n, t.dtype, t.device, is_log)
    plan = _PLANS.get_for(key, TABLE, kernel)
    if plan is None:
        plan = _build_plan(kernel, _rows(t, m, n), is_log, None)
        _PLANS.put_for(key, TABLE, kernel, device_info(t.device).arch, plan)
    return plan


def softmax_fwd_launch(
    x: torch.Tensor,  # [M, N], stride(1) == 1
    y: torch.Tensor,  # [M, N], stride(1) == 1
    is_log: bool,
    config: LaunchConfig | None = None,
) -> None:
    M, N = x.shape
    _fwd_launch(x, y, M, N, x.stride(0), y.stride(0), is_log, config)


def _fwd_launch(x, y, M: int, N: int, sx: int, sy: int, is_log: bool, config) -> None:
    """`softmax_fwd_launch` over M rows of N values `sx` / `sy` apart in x / y: [M, N] views,
    or contiguous tensors of any rank (rows N apart), launched on as they are."""
    if M == 0:
        return
    kernel, grid, constexprs = _plan("fwd", x, M, N, is_log, config)
    if kernel is None:  # a split row: (cfg, splits)
        split_fwd_launch(_rows(x, M, N), _rows(y, M, N), is_log, grid, constexprs)
    else:
        kernel[grid](x, y, M, N, sx, sy, **constexprs)


def softmax_bwd_launch(
    dy: torch.Tensor,  # [M, N], stride(1) == 1 (stride(0) may be 0)
    y: torch.Tensor,  # [M, N], stride(1) == 1: the saved forward output
    dx: torch.Tensor,  # [M, N], stride(1) == 1
    is_log: bool,
    config: LaunchConfig | None = None,
) -> None:
    M, N = y.shape
    _bwd_launch(dy, y, dx, M, N, (dy.stride(0), y.stride(0), dx.stride(0)), is_log, config)


def _bwd_launch(dy, y, dx, M: int, N: int, strides: tuple, is_log: bool, config) -> None:
    """`softmax_bwd_launch` over M rows of N, as `_fwd_launch` (`strides`: dy's, y's, dx's)."""
    if M == 0:
        return
    kernel, grid, constexprs = _plan("bwd", y, M, N, is_log, config)
    if kernel is None:
        dy, y, dx = _rows(dy, M, N), _rows(y, M, N), _rows(dx, M, N)
        split_bwd_launch(dy, y, dx, is_log, grid, constexprs)
    else:
        kernel[grid](dy, y, dx, M, N, *strides, **constexprs)


# --------------------------------------------------------------------------- custom ops
# Registered so torch.compile(fullgraph=True) treats each launch as one opaque node. Eager calls
# go straight to the launcher.


@torch.library.custom_op("kernelwright::softmax_fwd", mutates_args=("y",))
def _softmax_fwd_op(x: torch.Tensor, y: torch.Tensor, is_log: bool) -> None:
    softmax_fwd_launch(x, y, is_log)


@_softmax_fwd_op.register_fake
def _(x, y, is_log) -> None:
    return None


@torch.library.custom_op("kernelwright::softmax_bwd", mutates_args=("dx",))
def _softmax_bwd_op(dy: torch.Tensor, y: torch.Tensor, dx: torch.Tensor, is_log: bool) -> None:
    softmax_bwd_launch(dy, y, dx, is_log)


@_softmax_bwd_op.register_fake
def _(dy, y, dx, is_log) -> None:
    return None


# --------------------------------------------------------------------------- autograd


class _SoftmaxFunction(torch.autograd.Function):
    # y (and dx) in x's shape, returned as allocated (not a view made here, which the caller
    # could not modify in place). Contiguous tensors are launched on as they are (rows n
    # apart, whatever their rank); others through [M, N] views.
    @staticmethod
    def forward(ctx, x, is_log):
        n = x.shape[-1]  # > 0, checked by the caller
        y = empty_like(x)
        if traced(x):
            x2 = rows_view("softmax", "x", x)
            _softmax_fwd_op(x2, y.view(-1, n), is_log)
        elif x.is_contiguous():
            _fwd_launch(x, y, x.numel() // n, n, n, n, is_log, None)
        else:
            x2 = rows_view("softmax", "x", x)
            softmax_fwd_launch(x2, y if x2 is x else y.view(-1, n), is_log)
        ctx.save_for_backward(y)  # the output only: the backward never reads x
        ctx.is_log = is_log
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        n = y.shape[-1]
        dx = empty_like(y)  # y was allocated contiguous: so is dx, in its shape
        if not traced(dy) and dy.is_contiguous():
            _bwd_launch(dy, y, dx, y.numel() // n, n, (n, n, n), ctx.is_log, None)
            return dx, None
        y2, dx2 = (y, dx) if y.dim() == 2 else (y.view(-1, n), dx.view(-1, n))
        dy2 = rows_view("softmax", "dy", dy)
        if traced(dy):
            _softmax_bwd_op(dy2, y2, dx2, ctx.is_log)
        else:
            softmax_bwd_launch(dy2, y2, dx2, ctx.is_log)
        return dx, None


# --------------------------------------------------------------------------- public API


def _check(op: str, x: torch.Tensor, dim: int) -> None:
    check_tensor(op, "x", x)
    if dim not in (-1, x.dim() - 1):
        raise ValueError(
            f"{op}: only the last dimension is supported (dim=-1), got dim={dim} for shape "
            f"{tuple(x.shape)}; move the dimension last (x.movedim({dim}, -1)) and back."
        )
    if x.shape[-1] == 0:
        raise ValueError(f"{op}: argument 'x' has an empty last dimension, shape {tuple(x.shape)}")


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Softmax over the last dimension of `x` (any leading dims), forward and backward in Triton.

    Args:
        x: [..., N] float32/float16/bfloat16, on a CUDA GPU (CPU under TRITON_INTERPRET=1).
            Computed in fp32, returned in x's dtype.
        dim: must be the last dimension (-1 or x.dim() - 1).
    """
    _check("softmax", x, dim)
    return _SoftmaxFunction.apply(x, False)


def log_softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Log-softmax over the last dimension of `x`; arguments as for `softmax`."""
    _check("log_softmax", x, dim)
    return _SoftmaxFunction.apply(x, True)


class Softmax(torch.nn.Module):
    """Drop-in for torch.nn.Softmax(dim=-1)."""

    def __init__(self, dim: int = -1):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return softmax(x, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class LogSoftmax(torch.nn.Module):
    """Drop-in for torch.nn.LogSoftmax(dim=-1)."""

    def __init__(self, dim: int = -1):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return log_softmax(x, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


# --------------------------------------------------------------------------- references


def softmax_ref(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """fp32 reference (differentiable)."""
    return torch.softmax(x.float(), dim=dim)


def log_softmax_ref(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """fp32 reference (differentiable)."""
    return torch.log_softmax(x.float(), dim=dim)


def softmax_eager(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Eager PyTorch in the input's dtype (the `torch` benchmark provider)."""
    return torch.softmax(x, dim=dim)


def log_softmax_eager(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Eager PyTorch in the input's dtype."""
    return torch.log_softmax(x, dim=dim)
