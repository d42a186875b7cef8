"""Fused residual add + RMSNorm: s = x + residual;  y = s / sqrt(mean(s^2) + eps) * (offset + w).

Returns (y, s): s is the new residual stream (`residual_out`), rounded to the input dtype as a
Hugging Face decoder layer computes `hidden_states = residual + hidden_states`, and the norm
reads that rounded value. Casting modes and offset are those of `rms_norm` (see its module
docstring); both ops run the RMSNorm family's kernels (ops/_rms.py), with the residual switched
on here, so they round identically.

Memory traffic, the reason to fuse: the forward reads x and residual once and writes y and s
once (unfused: the add reads 2 and writes 1, then the norm reads 1 and writes 1). The backward
reads s, dy and d_residual_out and writes ds once; ds is the gradient of both x and residual.
dW is summed in fp32 per program, then over programs: through fp32 partial rows; where those
rows would be a noticeable share of the memory, through ds's own storage before its last row
blocks are written (ops/_park.py); for few rows by the column kernel; for long rows with many of
them, by column programs co-running with the ds programs (ops/_corun.py). The thresholds are in
the op's table (runtime/tables/fused_add_rms_norm.py).

Layer order: launchers → custom ops → autograd Function → `fused_add_rms_norm` →
`FusedAddRMSNorm`.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from kernelwright.ops._corun import fused_add_rms_norm_bwd_corun_launch
from kernelwright.ops._park import park_launch, park_phases, park_programs
from kernelwright.ops._partials import few_rows, sum_partials
from kernelwright.ops._rms import (
    CASTING_MODES,
    _rms_norm_bwd_kernel,
    _rms_norm_bwd_looped_kernel,
    _rms_norm_fwd_kernel,
    _rms_norm_fwd_looped_kernel,
)
from kernelwright.ops.rms_norm import (
    _dw_config,
    _output_dtype,
    rms_norm_dw_launch,
    rms_norm_eager,
    rms_norm_ref,
)
from kernelwright.runtime import device_info, lookup
from kernelwright.runtime.alloc import empty
from kernelwright.runtime.checks import check_same_device, check_shape, check_tensor, rows_view
from kernelwright.runtime.launch import LaunchConfig, cdiv, pdl_args, traced
from kernelwright.runtime.tables import fused_add_rms_norm as _table
from kernelwright.runtime.tables.fused_add_rms_norm import TABLE

__all__ = [
    "FusedAddRMSNorm",
    "fused_add_rms_norm",
    "fused_add_rms_norm_eager",
    "fused_add_rms_norm_ref",
]

_OP = "fused_add_rms_norm"

# --------------------------------------------------------------------------- launchers


def _config(kernel: str, x: torch.Tensor, config: LaunchConfig | None) -> LaunchConfig:
    return config or lookup(TABLE, _OP, kernel, device_info(x.device), x.shape[-1])


def fused_add_rms_norm_fwd_launch(
    x: torch.Tensor,  # [M, N], stride(1) == 1
    residual: torch.Tensor,  # [M, N], stride(1) == 1, x's dtype
    weight: torch.Tensor | None,
    y: torch.Tensor,  # [M, N], stride(1) == 1
    residual_out: torch.Tensor,  # [M, N], stride(1) == 1, x's dtype
    rstd: torch.Tensor,  # [M] fp32
    eps: float,
    offset: float,
    casting_mode: str,
    config: LaunchConfig | None = None,
) -> None:
    M, N = x.shape
    if M == 0:
        return
    cfg = _config("fwd", x, config)
    common = dict(
        CASTING=CASTING_MODES[casting_mode],
        HAS_WEIGHT=weight is not None,
        HAS_RESIDUAL=True,
        BLOCK_N=cfg.block_n,
    )
    args = (x, residual, weight if weight is not None else x, y, residual_out, rstd, M, N)
    args += (x.stride(0), residual.stride(0), y.stride(0), residual_out.stride(0), eps, offset)
    if cfg.block_n >= N:
        grid = (cdiv(M, cfg.rows),)
        _rms_norm_fwd_kernel[grid](*args, ROWS=cfg.rows, num_warps=cfg.num_warps, **common)
    else:
        _rms_norm_fwd_looped_kernel[(M,)](*args, num_warps=cfg.num_warps, **common)


def fused_add_rms_norm_bwd_launch(
    dy: torch.Tensor,  # [M, N], stride(1) == 1: gradient of y
    d_residual_out: torch.Tensor | None,  # [M, N], stride(1) == 1; None when s is unused
    residual_out: torch.Tensor,  # [M, N], stride(1) == 1: s saved by the forward
    weight: torch.Tensor | None,
    rstd: torch.Tensor,  # [M] fp32
    ds: torch.Tensor,  # [M, N], stride(1) == 1, s's dtype: gradient of x and of residual
    dw: torch.Tensor | None,  # [N], weight's dtype; None when dW is not wanted
    offset: float,
    casting_mode: str,
    config: LaunchConfig | None = None,
    park: bool | None = None,  # dW parked in ds: None where PARK_SHARE says, True where it can
) -> None:
    M, N = residual_out.shape
    if M == 0:
        if dw is not None:
            dw.zero_()
        return
    cfg = _config("bwd", residual_out, config)
    fits = cfg.block_n >= N
    row_blocks = cdiv(M, cfg.rows) if fits else M
    device = device_info(ds.device)
    programs = max(1, min(row_blocks, device.sm_count * cfg.programs_per_sm))
    has_dw = weight is not None and dw is not None
    corun = (
        N >= _table.CORUN_FROM
        and M >= _table.CORUN_MIN_ROWS
        and device.sm_count >= _table.CORUN_MIN_SMS
    )
    if has_dw and fits and corun and park is not True:
        args = (dy, d_residual_out, residual_out, weight, rstd, ds, dw, offset, casting_mode)
        fused_add_rms_norm_bwd_corun_launch(*args, cfg, **_table.CORUN)
        return
    block = _dw_config(residual_out).block_n
    share = _table.PARTIALS_SHARE
    few = has_dw and fits and few_rows(M, N, programs, ds.element_size(), block, share, ds.device)
    parked = 0
    large = programs * N * 4 > _table.PARK_SHARE * M * N * ds.element_size()  # partial rows
    if has_dw and fits and (park or (park is None and large and not few)):
        inputs = (dy, d_residual_out, residual_out, rstd)
        parked = park_programs(M, N, cfg, ds, inputs, device)
    if park and not parked:
        raise ValueError(f"{_OP}: park=True, but this call cannot park dW in ds (park_programs)")
    if parked:
        args = (dy, d_residual_out, residual_out, weight, rstd, ds, dw, offset, casting_mode)
        park_launch(*args, cfg, parked, device, park_phases(device))
        return
    if few:
        # dW first, should ds share dy's storage: the dw kernel reads dy
        rms_norm_dw_launch(dy, residual_out, rstd, dw, casting_mode)
        has_dw = False
    has_dres = d_residual_out is not None
    partial = None
    if has_dw:
        # One fp32 dW row per program, summed below: deterministic, no bf16 atomics.
        partial = empty((programs, N), dtype=torch.float32, device=ds.device)
        if not fits:
            partial.zero_()  # the looped kernel accumulates into it row by row
    args = (
        dy,
        d_residual_out if has_dres else dy,
        residual_out,
        weight if weight is not None else residual_out,
        rstd,
        ds,
        partial if partial is not None else rstd,
        M,
        N,
        dy.stride(0),
        d_residual_out.stride(0) if has_dres else 0,
        residual_out.stride(0),
        ds.stride(0),
        offset,
    )
    common = dict(
        CASTING=CASTING_MODES[casting_mode],
        HAS_WEIGHT=weight is not None,
        HAS_DW=has_dw,
        HAS_DRES=has_dres,
        BLOCK_N=cfg.block_n,
        **pdl_args(device),  # its launch overlaps the kernel before it
    )
    if fits:
        _rms_norm_bwd_kernel[(programs,)](
            *args,
            ROWS=cfg.rows,
            PREFETCH=cfg.num_stages > 1,
            num_warps=cfg.num_warps,
            **common,
        )
    else:
        _rms_norm_bwd_looped_kernel[(programs,)](*args, num_warps=cfg.num_warps, **common)
    if partial is not None:
        sum_partials(partial, dw)  # fp32 sum over programs, one cast to the weight's dtype


# --------------------------------------------------------------------------- custom ops
# Registered so torch.compile(fullgraph=True) treats each launch as one opaque node. Eager calls
# skip the dispatcher and go straight to the launcher.


@torch.library.custom_op(
    "kernelwright::fused_add_rms_norm_fwd", mutates_args=("y", "residual_out", "rstd")
)
def _fused_add_rms_norm_fwd_op(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None,
    y: torch.Tensor,
    residual_out: torch.Tensor,
    rstd: torch.Tensor,
    eps: float,
    offset: float,
    casting_mode: str,
) -> None:
    fused_add_rms_norm_fwd_launch(
        x, residual, weight, y, residual_out, rstd, eps, offset, casting_mode
    )


@_fused_add_rms_norm_fwd_op.register_fake
def _(x, residual, weight, y, residual_out, rstd, eps, offset, casting_mode) -> None:
    return None


@torch.library.custom_op("kernelwright::fused_add_rms_norm_bwd", mutates_args=("ds", "dw"))
def _fused_add_rms_norm_bwd_op(
    dy: torch.Tensor,
    d_residual_out: torch.Tensor | None,
    residual_out: torch.Tensor,
    weight: torch.Tensor | None,
    rstd: torch.Tensor,
    ds: torch.Tensor,
    dw: torch.Tensor | None,
    offset: float,
    casting_mode: str,
) -> None:
    fused_add_rms_norm_bwd_launch(
        dy, d_residual_out, residual_out, weight, rstd, ds, dw, offset, casting_mode
    )


@_fused_add_rms_norm_bwd_op.register_fake
def _(dy, d_residual_out, residual_out, weight, rstd, ds, dw, offset, casting_mode) -> None:
    return None


# --------------------------------------------------------------------------- autograd


class _FusedAddRMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, residual, weight, eps, offset, casting_mode):
        x2 = rows_view(_OP, "x", x)
        r2 = rows_view(_OP, "residual", residual)
        # Outputs are allocated in x's shape and the kernels write through 2-D views of them,
        # so the returned tensors are not views: callers may update them in place
        # (`residual_out += ...`), which autograd forbids on views made inside a Function.
        s = empty(x.shape, dtype=x.dtype, device=x.device)
        y = empty(x.shape, dtype=_output_dtype(x, weight, casting_mode), device=x.device)
        s2, y2 = s.view(x2.shape), y.view(x2.shape)
        rstd = empty(x2.shape[:1], dtype=torch.float32, device=x.device)
        if traced(x):
            _fused_add_rms_norm_fwd_op(x2, r2, weight, y2, s2, rstd, eps, offset, casting_mode)
        else:
            fused_add_rms_norm_fwd_launch(x2, r2, weight, y2, s2, rstd, eps, offset, casting_mode)
        # The backward needs s (not x and residual): one tensor saved instead of two. Saving the
        # output itself means an in-place update of residual_out before backward is caught by
        # autograd's version check.
        ctx.save_for_backward(s, weight, rstd)
        ctx.set_materialize_grads(False)  # an unused output's gradient arrives as None
        ctx.offset = offset
        ctx.casting_mode = casting_mode
        return y, s

    @staticmethod
    @once_differentiable
    def backward(ctx, dy, d_residual_out):
        s, weight, rstd = ctx.saved_tensors
        want_dw = weight is not None and ctx.needs_input_grad[2]
        if dy is None:
            # y unused downstream: the norm contributes nothing, ds is the residual gradient, and
            # the weight gets no gradient (None, as if the norm were not in the graph).
            ds, dw = d_residual_out, None
        else:
            s2 = s.view(rstd.shape[0], s.shape[-1])
            dy2 = rows_view(_OP, "dy", dy)  # expanded (stride-0) gradients are copied here
            dres2 = None
            if d_residual_out is not None:
                dres2 = rows_view(_OP, "d_residual_out", d_residual_out)
            ds = empty(s.shape, dtype=s.dtype, device=s.device)
            ds2 = ds.view(s2.shape)
            dw = empty(weight.shape, dtype=weight.dtype, device=weight.device) if want_dw else None
            args = (dy2, dres2, s2, weight, rstd, ds2, dw, ctx.offset, ctx.casting_mode)
            if traced(dy):
                _fused_add_rms_norm_bwd_op(*args)
            else:
                fused_add_rms_norm_bwd_launch(*args)
        # x and residual enter only through s = x + residual: both get ds, the same tensor
        # (written once; autograd treats incoming gradients as read-only).
        dx = ds if ctx.needs_input_grad[0] else None
        d_residual = ds if ctx.needs_input_grad[1] else None
        return dx, d_residual, dw, None, None, None


# --------------------------------------------------------------------------- public API


def fused_add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    *,
    offset: float = 0.0,
    casting_mode: str = "llama",
) -> tuple[torch.Tensor, torch.Tensor]:
    """`s = x + residual; return rms_norm(s, weight, eps, ...), s` in one kernel each way.

    Args:
        x: [..., N] float32/float16/bfloat16 (the sublayer output), on a CUDA GPU (CPU under
            TRITON_INTERPRET=1).
        residual: the residual stream, x's shape and dtype.
        weight: [N] or None (no affine scale). Its gradient is reduced in fp32.
        eps: added to mean(s^2) before the reciprocal square root.
        offset: the scale is (offset + weight); Gemma uses 1.0 with zero-initialised weights.
        casting_mode: "llama", "gemma" or "none", as in `rms_norm`.

    Returns:
        (y, residual_out): the normalized sum (dtype as `rms_norm` returns it) and the sum
        itself in x's dtype, the residual stream for the next layer. Both are differentiable;
        x and residual receive the same gradient.
    """
    check_tensor(_OP, "x", x)
    check_tensor(_OP, "residual", residual)
    if x.shape[-1] == 0:
        raise ValueError(f"{_OP}: argument 'x' has an empty last dimension, shape {tuple(x.shape)}")
    check_shape(_OP, "residual", residual, x.shape, "the shape of x")
    if residual.dtype != x.dtype:
        raise TypeError(
            f"{_OP}: argument 'residual' must have x's dtype {x.dtype}, got {residual.dtype}; "
            "cast one of them (residual_out is written in that one dtype)"
        )
    if weight is not None:
        check_tensor(_OP, "weight", weight)
        check_shape(_OP, "weight", weight, (x.shape[-1],), "the last dimension of x")
        weight = weight.contiguous()  # the kernels read it at unit stride (a slice, an expand)
    check_same_device(_OP, x=x, residual=residual, weight=weight)
    if casting_mode not in CASTING_MODES:
        raise ValueError(
            f"{_OP}: casting_mode must be one of {sorted(CASTING_MODES)}, got {casting_mode!r}"
        )
    return _FusedAddRMSNormFunction.apply(
        x, residual, weight, float(eps), float(offset), casting_mode
    )


class FusedAddRMSNorm(torch.nn.Module):
    """`forward(x, residual) -> (norm(x + residual), x + residual)`: a pre-norm block's
    residual add and the next RMSNorm in one kernel (Llama: casting_mode="llama"; Gemma:
    offset=1, "gemma")."""

    def __init__(
        self,
        hidden_size: int,
        eps: float = 1e-6,
        *,
        offset: float = 0.0,
        casting_mode: str = "llama",
        elementwise_affine: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__()
        self.hidden_size = hidden_size
        self.eps = eps
        self.offset = offset
        self.casting_mode = casting_mode
        if elementwise_affine:
            # With an offset the effective scale is offset + w: start at w = 0 (Gemma), else 1.
            init = torch.zeros if offset else torch.ones
            self.weight = torch.nn.Parameter(init(hidden_size, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return fused_add_rms_norm(
            x, residual, self.weight, self.eps, offset=self.offset, casting_mode=self.casting_mode
        )

    def extra_repr(self) -> str:
        return (
            f"{self.hidden_size}, eps={self.eps}, offset={self.offset}, "
            f"casting_mode={self.casting_mode!r}"
        )


# --------------------------------------------------------------------------- references


def fused_add_rms_norm_ref(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    *,
    offset: float = 0.0,
    casting_mode: str = "llama",
) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 reference (differentiable): the sum unrounded, then `rms_norm_ref` of it."""
    s = x.float() + residual.float()
    return rms_norm_ref(s, weight, eps, offset=offset, casting_mode=casting_mode), s


def fused_add_rms_norm_eager(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    *,
    offset: float = 0.0,
    casting_mode: str = "llama",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eager PyTorch as Hugging Face decoder layers write it: the add in the input dtype, then
    the model's RMSNorm (`rms_norm_eager`). The `torch` provider for benchmarks."""
    s = residual + x
    return rms_norm_eager(s, weight, eps, offset=offset, casting_mode=casting_mode), s
