"""Squared ReLU: y = relu(x)^2, elementwise over a tensor [..., N].

The activation of Primer and Nemotron MLPs, written there as `torch.square(torch.relu(x))`.
Numerics as eager: relu is exact, the square is computed in fp32 and rounded once (the product
of two fp16/bf16 values is exact in fp32, so the result is the correctly rounded square, bit
for bit eager's). The backward saves x only and recomputes relu from it:
    dx = 2 * relu(x) * dy    (in fp32, rounded once; 0 where x <= 0)
Eager rounds 2 * relu(x) to the input dtype first, which is exact except that in fp16 it
overflows to inf for x >= 2^15 (where y is already inf); the kernel keeps that product finite.

Layer order: kernels → launchers → custom ops → autograd Function → `relu_squared` →
`ReLUSquared` → references.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernelwright.ops._elementwise import elementwise_grid, elementwise_tile, retile
from kernelwright.runtime import device_info, lookup
from kernelwright.runtime.alloc import empty
from kernelwright.runtime.checks import check_tensor, rows_view
from kernelwright.runtime.launch import LaunchConfig
from kernelwright.runtime.tables.relu_squared import TABLE

# --------------------------------------------------------------------------- kernels


@triton.jit
def _relu_squared_fwd_kernel(
    x_ptr, y_ptr,  # [M, N] views with row strides, last dim contiguous
    M, N, stride_x, stride_y,
    BLOCK_N: tl.constexpr,
    ROWS: tl.constexpr,
):  # fmt: skip
    rows, cols, mask = elementwise_tile(M, N, BLOCK_N, ROWS)
    x = tl.load(x_ptr + rows * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    r = tl.maximum(x, 0.0, propagate_nan=tl.PropagateNan.ALL)  # relu(NaN) = NaN, as torch's
    tl.store(y_ptr + rows * stride_y + cols, (r * r).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _relu_squared_bwd_kernel(
    dy_ptr, x_ptr, dx_ptr,  # [M, N] views with row strides, last dim contiguous
    M, N, stride_dy, stride_x, stride_dx,
    BLOCK_N: tl.constexpr,
    ROWS: tl.constexpr,
):  # fmt: skip
    rows, cols, mask = elementwise_tile(M, N, BLOCK_N, ROWS)
    dy = tl.load(dy_ptr + rows * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + rows * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    # d/dx relu(x)^2 = 2 relu(x); +0 where x <= 0, as eager's relu backward (a select).
    dx = tl.where(x > 0, 2.0 * x * dy, 0.0)
    tl.store(dx_ptr + rows * stride_dx + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)


# --------------------------------------------------------------------------- launchers


def _config(kernel: str, t: torch.Tensor, n: int, config: LaunchConfig | None) -> LaunchConfig:
    return config or lookup(TABLE, "relu_squared", kernel, device_info(t.device), n)


def relu_squared_fwd_launch(
    x: torch.Tensor,  # [M, N], stride(1) == 1
    y: torch.Tensor,  # out [M, N], stride(1) == 1
    config: LaunchConfig | None = None,
) -> None:
    M, N = x.shape
    if M == 0 or N == 0:
        return
    cfg = _config("fwd", x, N, config)
    x, y = retile((x, y), cfg)
    M, N = x.shape
    _relu_squared_fwd_kernel[elementwise_grid("relu_squared", M, N, cfg)](
        x, y, M, N, x.stride(0), y.stride(0),
        BLOCK_N=cfg.block_n, ROWS=cfg.rows, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip


def relu_squared_bwd_launch(
    dy: torch.Tensor,  # [M, N], stride(1) == 1 (row stride may be 0: an expanded gradient)
    x: torch.Tensor,  # [M, N]
    dx: torch.Tensor,  # [M, N]
    config: LaunchConfig | None = None,
) -> None:
    M, N = x.shape
    if M == 0 or N == 0:
        return
    cfg = _config("bwd", x, N, config)
    dy, x, dx = retile((dy, x, dx), cfg)
    M, N = x.shape
    _relu_squared_bwd_kernel[elementwise_grid("relu_squared", M, N, cfg)](
        dy, x, dx, M, N, dy.stride(0), x.stride(0), dx.stride(0),
        BLOCK_N=cfg.block_n, ROWS=cfg.rows, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip


# --------------------------------------------------------------------------- custom ops
# Registered so torch.compile(fullgraph=True) treats each launch as one opaque node. Eager calls
# skip the dispatcher and go straight to the launcher.


@torch.library.custom_op("kernelwright::relu_squared_fwd", mutates_args=("y",))
def _relu_squared_fwd_op(x: torch.Tensor, y: torch.Tensor) -> None:
    relu_squared_fwd_launch(x, y)


@_relu_squared_fwd_op.register_fake
def _(x, y) -> None:
    return None


@torch.library.custom_op("kernelwright::relu_squared_bwd", mutates_args=("dx",))
def _relu_squared_bwd_op(dy: torch.Tensor, x: torch.Tensor, dx: torch.Tensor) -> None:
    relu_squared_bwd_launch(dy, x, dx)


@_relu_squared_bwd_op.register_fake
def _(dy, x, dx) -> None:
    return None


# --------------------------------------------------------------------------- autograd


class _ReLUSquaredFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x2 = rows_view("relu_squared", "x", x)  # [M, N]
        # y in x's shape, returned as allocated (see rms_norm); written via a 2-D view
        out = empty(x.shape, dtype=x.dtype, device=x.device)
        y = out.view(x2.shape)
        if torch.compiler.is_compiling():
            _relu_squared_fwd_op(x2, y)
        else:
            relu_squared_fwd_launch(x2, y)
        ctx.save_for_backward(x2)  # x only: relu(x) is recomputed, y is never kept
        ctx.shape = x.shape
        return out

    @staticmethod
    def backward(ctx, dy):
        (x2,) = ctx.saved_tensors
        dy2 = rows_view("relu_squared", "dy", dy)  # copies a gradient whose last stride is not 1
        dx = empty(x2.shape, dtype=x2.dtype, device=x2.device)
        if torch.compiler.is_compiling():
            _relu_squared_bwd_op(dy2, x2, dx)
        else:
            relu_squared_bwd_launch(dy2, x2, dx)
        return dx.view(ctx.shape)


# --------------------------------------------------------------------------- public API


def relu_squared(x: torch.Tensor) -> torch.Tensor:
    """relu(x)^2, forward and backward in Triton, rounded as eager `torch.square(torch.relu(x))`.

    Args:
        x: [..., N] float32/float16/bfloat16 (any leading dims, any layout), on a CUDA GPU
            (CPU under TRITON_INTERPRET=1).
    Returns:
        [..., N] in x's dtype. Only x is saved for the backward.
    """
    check_tensor("relu_squared", "x", x)
    return _ReLUSquaredFunction.apply(x)


class ReLUSquared(torch.nn.Module):
    """The activation of a Primer / Nemotron MLP: `forward(x) = relu(x)^2`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return relu_squared(x)


# --------------------------------------------------------------------------- references


def relu_squared_ref(x: torch.Tensor) -> torch.Tensor:
    """fp32 reference (differentiable)."""
    return torch.square(torch.relu(x.float()))


def relu_squared_eager(x: torch.Tensor) -> torch.Tensor:
    """Eager PyTorch as Nemotron writes it (the `torch` provider)."""
    return torch.square(torch.relu(x))
