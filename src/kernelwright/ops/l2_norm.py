"""L2 normalization over the last dim: y = x / sqrt(sum(x^2) + eps), for x [..., N].

The q/k normalization of linear-attention layers (Gated DeltaNet, Qwen3-Next: `l2norm(q)`),
without a weight. Sums and the rsqrt in fp32, the output rounded once to x's dtype. The
backward saves x and rstd = (sum(x^2) + eps)^-1/2 [M] fp32, and recomputes y:
    dx = rstd * (dy - y * sum(dy * y))
Whole rows in registers, N up to 16384 (head dims are 64-256), several rows per program.

Layer order: kernels → launcher → custom ops → autograd Function → `l2_norm` → `L2Norm` →
references.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from kernelwright.runtime import device_info
from kernelwright.runtime.alloc import empty
from kernelwright.runtime.checks import check_tensor, rows_view
from kernelwright.runtime.fastlaunch import fast
from kernelwright.runtime.launch import cdiv, next_pow2, traced

MAX_N = 16384  # one program holds a whole row of x and dy in registers (16 warps)


@fast
@triton.jit
def _l2_norm_fwd_kernel(
    x_ptr, y_ptr, rstd_ptr,  # x, y [M, N] with row strides, last dim contiguous; rstd [M] fp32
    M, N, stride_x, stride_y, eps,
    BLOCK_N: tl.constexpr, ROWS: tl.constexpr,
):  # fmt: skip
    row_ids = tl.program_id(0) * ROWS + tl.arange(0, ROWS)  # [ROWS]
    rows, cols = row_ids[:, None], tl.arange(0, BLOCK_N)[None, :]  # [ROWS, 1], [1, BLOCK_N]
    mask = (rows < M) & (cols < N)
    r64 = rows.to(tl.int64)  # M * stride can pass 2^31
    x = tl.load(x_ptr + r64 * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) + eps)  # [ROWS]
    y = x * rstd[:, None]
    tl.store(y_ptr + r64 * stride_y + cols, y.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(rstd_ptr + row_ids, rstd, mask=row_ids < M)


@fast
@triton.jit
def _l2_norm_bwd_kernel(
    dy_ptr, x_ptr, rstd_ptr, dx_ptr,  # [M, N] with row strides (rstd [M] fp32)
    M, N, stride_dy, stride_x, stride_dx,
    BLOCK_N: tl.constexpr, ROWS: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]
    cols = tl.arange(0, BLOCK_N)[None, :]
    mask = (rows < M) & (cols < N)
    r64 = rows.to(tl.int64)
    dy = tl.load(dy_ptr + r64 * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + r64 * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.load(rstd_ptr + rows, mask=rows < M, other=0.0)  # [ROWS, 1]
    y = x * rstd
    # dx = rstd * (dy - y * sum(dy * y))
    dx = rstd * (dy - y * tl.sum(dy * y, axis=1)[:, None])
    tl.store(dx_ptr + r64 * stride_dx + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)


Config = tuple[int, int, int]  # (BLOCK_N, ROWS, num_warps)


def launch_config(n: int, interpreter: bool = False) -> Config:
    """Whole rows, about 4K elements per program on a GPU; under the interpreter every program
    costs milliseconds, so 64K elements per program."""
    block_n = next_pow2(n)
    rows = max(1, min(64, (65536 if interpreter else 4096) // block_n))
    return block_n, rows, min(16, max(1, block_n * rows // 1024))


def _config(x: torch.Tensor, config: Config | None) -> Config:
    return config or launch_config(x.shape[1], device_info(x.device).arch == "interpreter")


def l2_norm_fwd_launch(x, y, rstd, eps: float, config: Config | None = None) -> None:
    # x, y [M, N] (row strides, last dim contiguous), rstd [M] fp32
    M, N = x.shape
    if M == 0 or N == 0:
        return
    block_n, rows, warps = _config(x, config)
    _l2_norm_fwd_kernel[(cdiv(M, rows),)](
        x, y, rstd, M, N, x.stride(0), y.stride(0), eps,
        BLOCK_N=block_n, ROWS=rows, num_warps=warps,
    )  # fmt: skip


def l2_norm_bwd_launch(dy, x, rstd, dx, config: Config | None = None) -> None:
    M, N = x.shape
    if M == 0 or N == 0:
        return
    block_n, rows, warps = _config(x, config)
    _l2_norm_bwd_kernel[(cdiv(M, rows),)](
        dy, x, rstd, dx, M, N, dy.stride(0), x.stride(0), dx.stride(0),
        BLOCK_N=block_n, ROWS=rows, num_warps=warps,
    )  # fmt: skip


# Custom ops, so torch.compile(fullgraph=True) sees each launch as one opaque node.
@torch.library.custom_op("kernelwright::l2_norm_fwd", mutates_args=("y", "rstd"))
def _l2_norm_fwd_op(x: torch.Tensor, y: torch.Tensor, rstd: torch.Tensor, eps: float) -> None:
    l2_norm_fwd_launch(x, y, rstd, eps)


@torch.library.custom_op("kernelwright::l2_norm_bwd", mutates_args=("dx",))
def _l2_norm_bwd_op(
    dy: torch.Tensor, x: torch.Tensor, rstd: torch.Tensor, dx: torch.Tensor
) -> None:
    l2_norm_bwd_launch(dy, x, rstd, dx)


_l2_norm_fwd_op.register_fake(lambda x, y, rstd, eps: None)
_l2_norm_bwd_op.register_fake(lambda dy, x, rstd, dx: None)


class _L2NormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, eps):
        x2 = rows_view("l2_norm", "x", x)  # [M, N]
        out = empty(x.shape, dtype=x.dtype, device=x.device)
        rstd = empty((x2.shape[0],), dtype=torch.float32, device=x.device)
        launch = _l2_norm_fwd_op if traced(x) else l2_norm_fwd_launch
        launch(x2, out.view(x2.shape), rstd, eps)
        ctx.save_for_backward(x2, rstd)
        ctx.shape = x.shape
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x2, rstd = ctx.saved_tensors
        dy2 = rows_view("l2_norm", "dy", dy)
        dx = empty(x2.shape, dtype=x2.dtype, device=x2.device)
        launch = _l2_norm_bwd_op if traced(dy) else l2_norm_bwd_launch
        launch(dy2, x2, rstd, dx)
        return dx.view(ctx.shape), None


def l2_norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(sum(x^2, -1) + eps), forward and backward in Triton.

    Args:
        x: [..., N] float32/float16/bfloat16, N <= 16384, any layout, on a CUDA GPU (CPU
            under TRITON_INTERPRET=1).
        eps: added to the sum of squares (1e-6, as FLA's `l2norm`).
    Returns:
        [..., N] in x's dtype.
    """
    check_tensor("l2_norm", "x", x)
    if x.shape[-1] > MAX_N:
        raise ValueError(f"l2_norm: the last dim is {x.shape[-1]}; at most {MAX_N} is supported")
    return _L2NormFunction.apply(x, float(eps))


class L2Norm(torch.nn.Module):
    """`forward(x) = l2_norm(x, eps)` over the last dim; no parameters."""

    def __init__(self, eps: float = 1e-6):
        super().__init__()
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return l2_norm(x, self.eps)


def l2_norm_ref(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """fp32 reference (differentiable)."""
    x = x.float()
    return x * torch.rsqrt(x.square().sum(-1, keepdim=True) + eps)


def l2_norm_eager(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Eager PyTorch as linear-attention layers write it (the `torch` provider)."""
    return x * torch.rsqrt(x.square().sum(-1, keepdim=True) + eps)
