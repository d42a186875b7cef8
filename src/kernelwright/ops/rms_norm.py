"""RMSNorm: y = x / sqrt(mean(x^2) + eps) * (offset + w), over the last dimension.

Casting modes reproduce where Hugging Face models cast (the kernel always accumulates in fp32):
- "llama": normalize in fp32, cast to the input dtype, then multiply by (offset + w) in the
  weight's dtype (LlamaRMSNorm: `weight * hidden.to(input_dtype)`).
- "gemma": everything in fp32, the offset added to the weight in fp32, one cast at the end
  (GemmaRMSNorm: `(x.float() * rstd) * (1.0 + weight.float())`).
- "none": every intermediate rounded to the input dtype, as code without casts computes it.

The kernels are the RMSNorm family's (ops/_rms.py), shared with fused_add_rms_norm. The backward
keeps dW in one fp32 partial row per program, summed by ops/_partials.py; for few rows it leaves
dW to the column kernel (ops/_norm_reduce.py).

Layer order: launchers → custom ops → autograd Function → `rms_norm` → `RMSNorm`.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from kernelwright.ops._norm_reduce import norm_dw_launch
from kernelwright.ops._partials import few_rows, sum_partials
from kernelwright.ops._rms import (
    CASTING_MODES,
    _rms_norm_bwd_kernel,
    _rms_norm_bwd_looped_kernel,
    _rms_norm_fwd_kernel,
    _rms_norm_fwd_looped_kernel,
)
from kernelwright.runtime import device_info, lookup
from kernelwright.runtime.alloc import empty
from kernelwright.runtime.checks import check_same_device, check_shape, check_tensor, rows_view
from kernelwright.runtime.launch import LaunchConfig, cdiv, pdl_args, traced
from kernelwright.runtime.tables import rms_norm as _table
from kernelwright.runtime.tables.rms_norm import DW_TABLE, FEW_ROWS, TABLE

__all__ = ["CASTING_MODES", "RMSNorm", "rms_norm", "rms_norm_eager", "rms_norm_ref"]

# --------------------------------------------------------------------------- launchers


def _config(kernel: str, x: torch.Tensor, config: LaunchConfig | None) -> LaunchConfig:
    m, n = x.shape  # [M, N]: the few-rows overrides key on M
    return config or lookup(TABLE, "rms_norm", kernel, device_info(x.device), n, m, FEW_ROWS)


def rms_norm_fwd_launch(
    x: torch.Tensor,  # [M, N], stride(1) == 1
    weight: torch.Tensor | None,
    y: torch.Tensor,  # [M, N], stride(1) == 1
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
        HAS_RESIDUAL=False,
        BLOCK_N=cfg.block_n,
    )
    w = weight if weight is not None else x
    # no residual: r and s are pointers never read or written
    args = (x, x, w, y, x, rstd, M, N, x.stride(0), 0, y.stride(0), 0, eps, offset)
    if cfg.block_n >= N:
        grid = (cdiv(M, cfg.rows),)
        _rms_norm_fwd_kernel[grid](*args, ROWS=cfg.rows, num_warps=cfg.num_warps, **common)
    else:
        _rms_norm_fwd_looped_kernel[(M,)](*args, num_warps=cfg.num_warps, **common)


def rms_norm_bwd_launch(
    dy: torch.Tensor,  # [M, N], stride(1) == 1
    x: torch.Tensor,  # [M, N], stride(1) == 1
    weight: torch.Tensor | None,
    rstd: torch.Tensor,  # [M] fp32
    dx: torch.Tensor,  # [M, N], stride(1) == 1; may be dy itself (in-place backward)
    dw: torch.Tensor | None,  # [N], weight's dtype; None when dW is not wanted
    offset: float,
    casting_mode: str,
    config: LaunchConfig | None = None,
) -> None:
    M, N = x.shape
    if M == 0:
        if dw is not None:
            dw.zero_()
        return
    cfg = _config("bwd", x, config)
    fits = cfg.block_n >= N
    row_blocks = cdiv(M, cfg.rows) if fits else M
    programs = max(1, min(row_blocks, device_info(x.device).sm_count * cfg.programs_per_sm))
    has_dw = weight is not None and dw is not None
    block = _dw_config(x).block_n
    share = _table.PARTIALS_SHARE
    if has_dw and fits and few_rows(M, N, programs, dx.element_size(), block, share, x.device):
        # dW first: dx may be dy itself (in-place backward), and the dw kernel reads dy
        rms_norm_dw_launch(dy, x, rstd, dw, casting_mode)
        has_dw = False
    partial = None
    if has_dw:
        # One fp32 dW row per program, summed below: deterministic, no bf16 atomics.
        partial = empty((programs, N), dtype=torch.float32, device=x.device)
        if not fits:
            partial.zero_()  # the looped kernel accumulates into it row by row
    args = (
        dy,
        dy,  # no residual gradient: a pointer never read
        x,
        weight if weight is not None else x,
        rstd,
        dx,
        partial if partial is not None else rstd,
    )
    args += (M, N, dy.stride(0), 0, x.stride(0), dx.stride(0), offset)
    common = dict(
        CASTING=CASTING_MODES[casting_mode],
        HAS_WEIGHT=weight is not None,
        HAS_DW=has_dw,
        HAS_DRES=False,
        BLOCK_N=cfg.block_n,
        **pdl_args(device_info(x.device)),  # its launch overlaps the kernel before it
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
    if has_dw:
        sum_partials(partial, dw)  # fp32 sum over programs, one cast to the weight's dtype


def _dw_config(x: torch.Tensor, config: LaunchConfig | None = None) -> LaunchConfig:
    return config or lookup(DW_TABLE, "rms_norm", "bwd_dw", device_info(x.device), x.shape[-1])


def rms_norm_dw_launch(
    dy: torch.Tensor,  # [M, N], stride(1) == 1
    x: torch.Tensor,  # [M, N], stride(1) == 1 (fused_add_rms_norm: s)
    rstd: torch.Tensor,  # [M] fp32
    dw: torch.Tensor,  # [N], the weight's dtype
    casting_mode: str,
    config: LaunchConfig | None = None,
) -> None:
    """dW alone (the column kernel, ops/_norm_reduce.py): one program per column block of
    block_n, through every row; no partial rows."""
    norm_dw_launch(dy, x, None, rstd, dw, None, _dw_config(x, config), casting_mode)


# --------------------------------------------------------------------------- custom ops
# Registered so torch.compile(fullgraph=True) treats each launch as one opaque node. Eager calls
# skip the dispatcher and go straight to the launcher (less Python per call).


@torch.library.custom_op("kernelwright::rms_norm_fwd", mutates_args=("y", "rstd"))
def _rms_norm_fwd_op(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    y: torch.Tensor,
    rstd: torch.Tensor,
    eps: float,
    offset: float,
    casting_mode: str,
) -> None:
    rms_norm_fwd_launch(x, weight, y, rstd, eps, offset, casting_mode)


@_rms_norm_fwd_op.register_fake
def _(x, weight, y, rstd, eps, offset, casting_mode) -> None:
    return None


@torch.library.custom_op("kernelwright::rms_norm_bwd", mutates_args=("dx", "dw"))
def _rms_norm_bwd_op(
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor | None,
    rstd: torch.Tensor,
    dx: torch.Tensor,
    dw: torch.Tensor | None,
    offset: float,
    casting_mode: str,
) -> None:
    rms_norm_bwd_launch(dy, x, weight, rstd, dx, dw, offset, casting_mode)


@_rms_norm_bwd_op.register_fake
def _(dy, x, weight, rstd, dx, dw, offset, casting_mode) -> None:
    return None


# --------------------------------------------------------------------------- autograd


def _output_dtype(x: torch.Tensor, weight: torch.Tensor | None, casting_mode: str) -> torch.dtype:
    # As the HF modules return: gemma casts back to x's dtype, llama/none promote with the weight.
    if weight is None or casting_mode == "gemma":
        return x.dtype
    return torch.promote_types(x.dtype, weight.dtype)


class _RMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps, offset, casting_mode, in_place_backward):
        x2 = rows_view("rms_norm", "x", x)
        # y in x's shape, returned as allocated: a view made inside a custom Function could
        # not be modified in place by the caller. The kernel writes it through a 2-D view.
        y = empty(x.shape, dtype=_output_dtype(x, weight, casting_mode), device=x.device)
        y2 = y.view(x2.shape)
        rstd = empty(x2.shape[:1], dtype=torch.float32, device=x.device)
        if traced(x):
            _rms_norm_fwd_op(x2, weight, y2, rstd, eps, offset, casting_mode)
        else:
            rms_norm_fwd_launch(x2, weight, y2, rstd, eps, offset, casting_mode)
        ctx.save_for_backward(x2, weight, rstd)
        ctx.shape = x.shape
        ctx.x_dtype = x.dtype
        ctx.offset = offset
        ctx.casting_mode = casting_mode
        ctx.in_place_backward = in_place_backward
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x2, weight, rstd = ctx.saved_tensors
        dy2 = rows_view("rms_norm", "dy", dy)
        compiling = traced(dy)
        # In place writes dx over dy: only valid when nothing else reads dy (see rms_norm).
        in_place = (
            ctx.in_place_backward
            and not compiling
            and dy2.dtype == ctx.x_dtype
            and dy2.is_contiguous()  # never over an expanded (stride-0) gradient
        )
        dx = dy2 if in_place else empty(x2.shape, dtype=ctx.x_dtype, device=x2.device)
        dw = None
        if weight is not None and ctx.needs_input_grad[1]:
            dw = empty(weight.shape, dtype=weight.dtype, device=weight.device)
        if compiling:
            _rms_norm_bwd_op(dy2, x2, weight, rstd, dx, dw, ctx.offset, ctx.casting_mode)
        else:
            rms_norm_bwd_launch(dy2, x2, weight, rstd, dx, dw, ctx.offset, ctx.casting_mode)
        return dx.view(ctx.shape), dw, None, None, None, None


# --------------------------------------------------------------------------- public API


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    *,
    offset: float = 0.0,
    casting_mode: str = "llama",
    in_place_backward: bool = False,
) -> torch.Tensor:
    """RMSNorm over the last dimension of `x` (any leading dims), forward and backward in Triton.

    Args:
        x: [..., N] float32/float16/bfloat16, on a CUDA GPU (CPU under TRITON_INTERPRET=1).
        weight: [N] or None (no affine scale). Its gradient is reduced in fp32.
        eps: added to mean(x^2) before the reciprocal square root.
        offset: the scale is (offset + weight); Gemma uses 1.0 with zero-initialised weights.
        casting_mode: "llama", "gemma" or "none" — where the model casts (module docstring).
        in_place_backward: write dx over the incoming gradient dy to save one [M, N] buffer.
            UNSAFE when dy is also used elsewhere — e.g. `h = x + norm(x)` hands the same
            gradient tensor to both branches and would corrupt the residual gradient. Ignored
            under torch.compile.
    """
    check_tensor("rms_norm", "x", x)
    if x.shape[-1] == 0:
        raise ValueError(
            f"rms_norm: argument 'x' has an empty last dimension, shape {tuple(x.shape)}"
        )
    if weight is not None:
        check_tensor("rms_norm", "weight", weight)
        check_shape("rms_norm", "weight", weight, (x.shape[-1],), "the last dimension of x")
        check_same_device("rms_norm", x=x, weight=weight)
        weight = weight.contiguous()  # the kernels read it at unit stride (a slice, an expand)
    if casting_mode not in CASTING_MODES:
        raise ValueError(
            f"rms_norm: casting_mode must be one of {sorted(CASTING_MODES)}, got {casting_mode!r}"
        )
    return _RMSNormFunction.apply(
        x, weight, float(eps), float(offset), casting_mode, bool(in_place_backward)
    )


class RMSNorm(torch.nn.Module):
    """Drop-in for LlamaRMSNorm (casting_mode="llama") and GemmaRMSNorm (offset=1, "gemma")."""

    def __init__(
        self,
        hidden_size: int,
        eps: float = 1e-6,
        *,
        offset: float = 0.0,
        casting_mode: str = "llama",
        elementwise_affine: bool = True,
        in_place_backward: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__()
        self.hidden_size = hidden_size
        self.eps = eps
        self.offset = offset
        self.casting_mode = casting_mode
        self.in_place_backward = in_place_backward
        if elementwise_affine:
            # With an offset the effective scale is offset + w: start at w = 0 (Gemma), else 1.
            init = torch.zeros if offset else torch.ones
            self.weight = torch.nn.Parameter(init(hidden_size, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(
            x,
            self.weight,
            self.eps,
            offset=self.offset,
            casting_mode=self.casting_mode,
            in_place_backward=self.in_place_backward,
        )

    def extra_repr(self) -> str:
        return (
            f"{self.hidden_size}, eps={self.eps}, offset={self.offset}, "
            f"casting_mode={self.casting_mode!r}"
        )


# --------------------------------------------------------------------------- references


def rms_norm_ref(
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    *,
    offset: float = 0.0,
    casting_mode: str = "llama",
    in_place_backward: bool = False,
) -> torch.Tensor:
    """fp32 reference (differentiable): what every casting mode computes without rounding."""
    del casting_mode, in_place_backward  # they change roundings only, covered by the tolerances
    x32 = x.float()
    y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * (offset + weight.float())
    return y


def rms_norm_eager(
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    *,
    offset: float = 0.0,
    casting_mode: str = "llama",
) -> torch.Tensor:
    """Eager PyTorch as Hugging Face models write it, per casting mode (the `torch` provider)."""
    if casting_mode == "gemma":
        x32 = x.float()
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
        if weight is not None:
            y = y * (offset + weight.float())
        return y.type_as(x)
    if casting_mode == "llama":
        x32 = x.to(torch.float32)
        y = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    else:
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    if weight is None:
        return y
    return (offset + weight) * y if offset else weight * y
