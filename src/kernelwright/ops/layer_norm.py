"""LayerNorm: y = (x - mean(x)) / sqrt(var(x) + eps) * w + b, over the last dimension.

Matches `torch.nn.functional.layer_norm(x, (N,), w, b, eps)`: the statistics are computed in
fp32 (mean and rstd saved as [M] fp32 for the backward), the affine transform too, and y is
rounded once, to x's dtype. The variance is the mean of squared deviations from the mean, never
E[x^2] - E[x]^2, which cancels catastrophically when |mean| >> std (a second pass over the row
held in registers; in the looped kernel, per-lane Welford sums merged exactly).

The backward, by row length (the launch table and the thresholds beside it): a row held by one
program, which also keeps its fp32 dW/dB sums (from SPLIT_DWDB_FROM columns, and for few rows
where those partial sums would be a large share of the memory, `_partials.few_rows`: dx alone,
then the column kernel reads x and dy again, ops/_norm_reduce.py; from SPLIT_DWDB_FROM columns
and CORUN_MIN_ROWS rows, dx programs and dW/dB column programs in one launch, ops/_corun.py);
past that, up to 32 chunks, the row split over a group of programs that exchange their chunk
sums (ops/_split.py), one read of x and dy; past that a looped kernel. The kernels are in
ops/_ln.py.

Layer order: launchers → custom ops → autograd Function → `layer_norm` → `LayerNorm`.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from kernelwright.ops._corun import layer_norm_bwd_corun_launch
from kernelwright.ops._ln import (
    _layer_norm_bwd_kernel,
    _layer_norm_bwd_looped_kernel,
    _layer_norm_bwd_split_kernel,
    _layer_norm_fwd_kernel,
    _layer_norm_fwd_looped_kernel,
)
from kernelwright.ops._norm_reduce import norm_dw_launch
from kernelwright.ops._partials import few_rows, sum_partials
from kernelwright.ops._split import launch as launch_split
from kernelwright.ops._split import split_count
from kernelwright.runtime import device_info, lookup
from kernelwright.runtime.alloc import empty
from kernelwright.runtime.checks import check_same_device, check_shape, check_tensor, rows_view
from kernelwright.runtime.launch import LaunchConfig, cdiv, pdl_args, traced, two_pass_flags
from kernelwright.runtime.tables import layer_norm as _table
from kernelwright.runtime.tables.layer_norm import TABLE

__all__ = ["LayerNorm", "layer_norm", "layer_norm_eager", "layer_norm_ref"]

# --------------------------------------------------------------------------- launchers


def _config(kernel: str, x: torch.Tensor, config: LaunchConfig | None) -> LaunchConfig:
    return config or lookup(TABLE, "layer_norm", kernel, device_info(x.device), x.shape[-1])


def layer_norm_fwd_launch(
    x: torch.Tensor,  # [M, N], stride(1) == 1
    weight: torch.Tensor | None,  # [N]
    bias: torch.Tensor | None,  # [N]
    y: torch.Tensor,  # [M, N], stride(1) == 1
    mean: torch.Tensor,  # [M] fp32
    rstd: torch.Tensor,  # [M] fp32
    eps: float,
    config: LaunchConfig | None = None,
) -> None:
    M, N = x.shape
    if M == 0:
        return
    cfg = _config("fwd", x, config)
    common = dict(HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None, BLOCK_N=cfg.block_n)
    w = weight if weight is not None else x  # never read when absent
    b = bias if bias is not None else x
    args = (x, w, b, y, mean, rstd, M, N, x.stride(0), y.stride(0), eps)
    if cfg.block_n >= N:
        grid = (cdiv(M, cfg.rows),)
        early = cfg.block_n <= _table.EARLY_AFFINE_MAX_N
        _layer_norm_fwd_kernel[grid](
            *args, ROWS=cfg.rows, EARLY_AFFINE=early, num_warps=cfg.num_warps, **common
        )
    else:
        offsets_64 = (M - 1) * max(x.stride(0), y.stride(0)) + N >= 2**31
        _layer_norm_fwd_looped_kernel[(M,)](
            *args,
            num_warps=cfg.num_warps,
            OFFSETS_64=offsets_64,
            **common,
            **two_pass_flags(cfg),
        )


def layer_norm_bwd_launch(
    dy: torch.Tensor,  # [M, N], stride(1) == 1
    x: torch.Tensor,  # [M, N], stride(1) == 1
    weight: torch.Tensor | None,  # [N]
    mean: torch.Tensor,  # [M] fp32
    rstd: torch.Tensor,  # [M] fp32
    dx: torch.Tensor,  # [M, N], stride(1) == 1
    dw: torch.Tensor | None,  # [N], weight's dtype; None when dW is not wanted
    db: torch.Tensor | None,  # [N], bias's dtype; None when dB is not wanted
    config: LaunchConfig | None = None,
) -> None:
    M, N = x.shape
    if M == 0:
        for grad in (dw, db):
            if grad is not None:
                grad.zero_()
        return
    cfg = _config("bwd", x, config)
    fits = cfg.block_n >= N
    if not fits and cfg.split_row:
        splits = split_count(N, cfg.block_n, M, device_info(x.device))
        if splits:
            _bwd_split_launch(dy, x, weight, mean, rstd, dx, dw, db, cfg, splits)
            return
    row_blocks = cdiv(M, cfg.rows) if fits else M
    programs = max(1, min(row_blocks, device_info(x.device).sm_count * cfg.programs_per_sm))
    grads = (dw is not None) + (db is not None)
    dwdb_block = _config("bwd_dwdb", x, None).block_n
    share = _table.PARTIALS_SHARE
    few = few_rows(M, N, programs * grads, dx.element_size(), dwdb_block, share, x.device)
    wide = N >= _table.SPLIT_DWDB_FROM
    corun = wide and M >= _table.CORUN_MIN_ROWS
    if fits and grads and corun and device_info(x.device).sm_count >= _table.CORUN_MIN_SMS:
        layer_norm_bwd_corun_launch(dy, x, weight, mean, rstd, dx, dw, db, cfg, **_table.CORUN)
        return
    if fits and grads and (wide or few):
        layer_norm_bwd_launch(dy, x, weight, mean, rstd, dx, None, None, config=cfg)
        layer_norm_dwdb_launch(dy, x, mean, rstd, dw, db)
        return
    # One fp32 dW (dB) row per program, summed below: deterministic, no bf16 atomics. The fused
    # kernel stores whole rows; the looped one adds into them, so they start at zero.
    dw_partial, db_partial = _partial_rows(programs, x, dw, db, zeroed=not fits)
    args = (
        *_bwd_tensors(dy, x, weight, mean, rstd, dx, dw_partial, db_partial),
        M,
        N,
        dy.stride(0),
        x.stride(0),
        dx.stride(0),
    )
    common = dict(
        HAS_WEIGHT=weight is not None,
        HAS_DW=dw is not None,
        HAS_DB=db is not None,
        BLOCK_N=cfg.block_n,
        **pdl_args(device_info(x.device)),  # its launch overlaps the kernel before it
    )
    if fits:
        _layer_norm_bwd_kernel[(programs,)](
            *args,
            ROWS=cfg.rows,
            PREFETCH=cfg.num_stages > 1,
            num_warps=cfg.num_warps,
            **common,
        )
    else:
        _layer_norm_bwd_looped_kernel[(programs,)](*args, num_warps=cfg.num_warps, **common)
    _sum_partials(dw_partial, dw, db_partial, db)


def _bwd_split_launch(dy, x, weight, mean, rstd, dx, dw, db, cfg: LaunchConfig, splits: int):
    """The split-row backward (`_layer_norm_bwd_split_kernel`): `splits` programs per group, about
    sm_count * programs_per_sm programs in all, each group a partial dW/dB row."""
    M, N = x.shape
    dev = device_info(x.device)
    blocks = cdiv(M, cfg.rows)
    groups = max(1, min(blocks, dev.sm_count * cfg.programs_per_sm // splits))
    dw_partial, db_partial = _partial_rows(groups, x, dw, db)
    launch_split(
        _layer_norm_bwd_split_kernel,
        _bwd_tensors(dy, x, weight, mean, rstd, dx, dw_partial, db_partial),
        (M, N, dy.stride(0), x.stride(0), dx.stride(0), groups),
        cfg,
        splits,
        2,
        programs=groups * splits,
        counters=blocks,  # one per row block
        HAS_WEIGHT=weight is not None,
        HAS_DW=dw is not None,
        HAS_DB=db is not None,
        ROWS=cfg.rows,
    )
    _sum_partials(dw_partial, dw, db_partial, db)


def _partial_rows(rows: int, x: torch.Tensor, dw, db, *, zeroed: bool = False):
    """fp32 partial dW and dB rows, [rows, N] each (None for a gradient not wanted); zeroed
    where a kernel adds into them."""
    alloc = torch.zeros if zeroed else empty
    return tuple(
        alloc((rows, x.shape[1]), dtype=torch.float32, device=x.device) if g is not None else None
        for g in (dw, db)
    )


def _bwd_tensors(dy, x, weight, mean, rstd, dx, dw_partial, db_partial) -> tuple:
    """The backward kernels' first eight arguments; an absent tensor passes a pointer the
    kernel never reads (its HAS_* flag is off)."""
    absent = rstd
    return (
        dy,
        x,
        weight if weight is not None else x,
        mean,
        rstd,
        dx,
        dw_partial if dw_partial is not None else absent,
        db_partial if db_partial is not None else absent,
    )


def _sum_partials(dw_partial, dw, db_partial, db) -> None:
    """fp32 sums over the partial rows, one cast to the parameter's dtype, dW and dB in one
    launch (either may be None)."""
    if dw is not None:
        sum_partials(dw_partial, dw, db_partial, db)
    elif db is not None:
        sum_partials(db_partial, db)


def layer_norm_dwdb_launch(
    dy: torch.Tensor,  # [M, N], stride(1) == 1
    x: torch.Tensor,  # [M, N], stride(1) == 1
    mean: torch.Tensor,  # [M] fp32
    rstd: torch.Tensor,  # [M] fp32
    dw: torch.Tensor | None,  # [N]
    db: torch.Tensor | None,  # [N]
    config: LaunchConfig | None = None,
) -> None:
    """dW and dB alone (the column kernel, ops/_norm_reduce.py): one program per column block
    of block_n, through every row; no partial rows."""
    M, N = x.shape
    if dw is None and db is None:
        return
    cfg = _config("bwd_dwdb", x, config)
    norm_dw_launch(dy, x, mean, rstd, dw, db, cfg)


# --------------------------------------------------------------------------- custom ops
# Registered so torch.compile(fullgraph=True) treats each launch as one opaque node. Eager calls
# skip the dispatcher and go straight to the launcher.


@torch.library.custom_op("kernelwright::layer_norm_fwd", mutates_args=("y", "mean", "rstd"))
def _layer_norm_fwd_op(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    y: torch.Tensor,
    mean: torch.Tensor,
    rstd: torch.Tensor,
    eps: float,
) -> None:
    layer_norm_fwd_launch(x, weight, bias, y, mean, rstd, eps)


@_layer_norm_fwd_op.register_fake
def _(x, weight, bias, y, mean, rstd, eps) -> None:
    return None


@torch.library.custom_op("kernelwright::layer_norm_bwd", mutates_args=("dx", "dw", "db"))
def _layer_norm_bwd_op(
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor | None,
    mean: torch.Tensor,
    rstd: torch.Tensor,
    dx: torch.Tensor,
    dw: torch.Tensor | None,
    db: torch.Tensor | None,
) -> None:
    layer_norm_bwd_launch(dy, x, weight, mean, rstd, dx, dw, db)


@_layer_norm_bwd_op.register_fake
def _(dy, x, weight, mean, rstd, dx, dw, db) -> None:
    return None


# --------------------------------------------------------------------------- autograd


class _LayerNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        x2 = rows_view("layer_norm", "x", x)
        # y in x's shape and dtype (as F.layer_norm), returned as allocated: a view made inside
        # a custom Function could not be modified in place by the caller.
        y = empty(x.shape, dtype=x.dtype, device=x.device)
        y2 = y.view(x2.shape)
        mean = empty(x2.shape[:1], dtype=torch.float32, device=x.device)
        rstd = empty(x2.shape[:1], dtype=torch.float32, device=x.device)
        if traced(x):
            _layer_norm_fwd_op(x2, weight, bias, y2, mean, rstd, eps)
        else:
            layer_norm_fwd_launch(x2, weight, bias, y2, mean, rstd, eps)
        ctx.save_for_backward(x2, weight, mean, rstd)
        ctx.shape = x.shape
        ctx.x_dtype = x.dtype
        # the bias itself is not needed for the gradients, only its dtype and device
        ctx.bias_meta = (bias.dtype, bias.device) if bias is not None else None
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x2, weight, mean, rstd = ctx.saved_tensors
        dy2 = rows_view("layer_norm", "dy", dy)  # copies an expanded (stride-0) gradient
        dx = empty(x2.shape, dtype=ctx.x_dtype, device=x2.device)
        dw = db = None
        if weight is not None and ctx.needs_input_grad[1]:
            dw = empty(weight.shape, dtype=weight.dtype, device=weight.device)
        if ctx.bias_meta is not None and ctx.needs_input_grad[2]:
            dtype, device = ctx.bias_meta
            db = empty(x2.shape[-1:], dtype=dtype, device=device)
        if traced(dy):
            _layer_norm_bwd_op(dy2, x2, weight, mean, rstd, dx, dw, db)
        else:
            layer_norm_bwd_launch(dy2, x2, weight, mean, rstd, dx, dw, db)
        return dx.view(ctx.shape), dw, db, None


# --------------------------------------------------------------------------- public API


def layer_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """LayerNorm over the last dimension of `x` (any leading dims), forward and backward in Triton.

    Same result as `torch.nn.functional.layer_norm(x, (x.shape[-1],), weight, bias, eps)`.

    Args:
        x: [..., N] float32/float16/bfloat16, on a CUDA GPU (CPU under TRITON_INTERPRET=1).
        weight: [N] or None (no scale). Its gradient is reduced in fp32.
        bias: [N] or None (no shift). Its gradient is reduced in fp32.
        eps: added to the (biased) variance before the reciprocal square root.

    Returns y in x's shape and dtype; statistics and the affine transform are computed in fp32.
    """
    check_tensor("layer_norm", "x", x)
    if x.shape[-1] == 0:
        raise ValueError(
            f"layer_norm: argument 'x' has an empty last dimension, shape {tuple(x.shape)}"
        )
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None:
            check_tensor("layer_norm", name, p)
            check_shape("layer_norm", name, p, (x.shape[-1],), "the last dimension of x")
    check_same_device("layer_norm", x=x, weight=weight, bias=bias)
    # the kernels read them at unit stride (a slice, an expand)
    weight = weight.contiguous() if weight is not None else None
    bias = bias.contiguous() if bias is not None else None
    return _LayerNormFunction.apply(x, weight, bias, float(eps))


class LayerNorm(torch.nn.Module):
    """Drop-in for `torch.nn.LayerNorm` over the last dimension (normalized_shape an int)."""

    def __init__(
        self,
        normalized_shape: int | tuple[int],
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__()
        if isinstance(normalized_shape, (tuple, list)):
            if len(normalized_shape) != 1:
                raise ValueError(
                    "LayerNorm: kernelwright normalizes over the last dimension only; "
                    f"normalized_shape must be an int or a 1-tuple, got {tuple(normalized_shape)}"
                )
            normalized_shape = normalized_shape[0]
        self.normalized_shape = (int(normalized_shape),)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        n = self.normalized_shape[0]
        if elementwise_affine:
            self.weight = torch.nn.Parameter(torch.ones(n, device=device, dtype=dtype))
            if bias:
                self.bias = torch.nn.Parameter(torch.zeros(n, device=device, dtype=dtype))
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1:] != self.normalized_shape:
            raise ValueError(
                f"LayerNorm: expected input with last dimension {self.normalized_shape[0]}, "
                f"got shape {tuple(x.shape)}"
            )
        return layer_norm(x, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return (
            f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"
        )


# --------------------------------------------------------------------------- references


def layer_norm_ref(
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """fp32 reference (differentiable; fp64 when given fp64), two-pass variance."""
    dtype = torch.promote_types(x.dtype, torch.float32)
    x32 = x.to(dtype)
    xc = x32 - x32.mean(-1, keepdim=True)
    y = xc * torch.rsqrt(xc.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.to(dtype)
    if bias is not None:
        y = y + bias.to(dtype)
    return y


def layer_norm_eager(
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """`torch.nn.functional.layer_norm` over the last dimension (the `torch` provider)."""
    return torch.nn.functional.layer_norm(x, x.shape[-1:], weight, bias, eps)
