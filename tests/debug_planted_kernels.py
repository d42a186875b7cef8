"""Planted bugs written as Triton kernels of their own (tests/debug_planted.py re-exports
them, and lists them in its corpus): a missing tail tile, the wrong `other` on a masked load,
programs storing over each other's dW partial (a race), row offsets computed in int32 (inputs
past 2^31 elements, a GPU only). Never shipped: tests/ only."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

import kernelwright  # noqa: F401  (selects the interpreter before the kernels below exist)
from kernelwright.ops.relu_squared import relu_squared_bwd_launch
from kernelwright.ops.rms_norm import rms_norm, rms_norm_ref
from kernelwright.runtime.alloc import empty


@triton.jit
def _relu2_tiles_kernel(x_ptr, y_ptr, N, stride_x, stride_y, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    y = tl.maximum(x, 0.0)
    tl.store(y_ptr + row * stride_y + cols, (y * y).to(y_ptr.dtype.element_ty), mask=mask)


class _Relu2Tiles(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x2 = x.reshape(-1, x.shape[-1]).contiguous()
        y = empty(x2.shape, dtype=x.dtype, device=x.device)
        m, n = x2.shape
        block = 16
        # the bug: floor instead of ceil, the last partial tile of a row is never written
        _relu2_tiles_kernel[(m, n // block)](x2, y, n, x2.stride(0), y.stride(0), BLOCK=block)
        ctx.save_for_backward(x)
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        return (2 * torch.relu(x.float()) * dy.float()).to(x.dtype)


def relu_squared_tail_tiles(x):
    return _Relu2Tiles.apply(x)


@triton.jit
def _rms_fwd_other_kernel(x_ptr, w_ptr, y_ptr, N, stride_x, stride_y, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    # the bug: masked lanes read as 1.0, not 0.0, so they join the sum of squares
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=1.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / N + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * stride_y + cols, (x * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)


class _RmsOther(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps):
        x2 = x.reshape(-1, x.shape[-1]).contiguous()
        y = empty(x2.shape, dtype=x.dtype, device=x.device)
        m, n = x2.shape
        block = triton.next_power_of_2(n)
        _rms_fwd_other_kernel[(m,)](x2, weight, y, n, x2.stride(0), y.stride(0), eps, BLOCK=block)
        ctx.save_for_backward(x, weight)
        ctx.eps = eps
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        with torch.enable_grad():
            xr = x.detach().float().requires_grad_(True)
            wr = weight.detach().float().requires_grad_(True)
            y = rms_norm_ref(xr, wr, ctx.eps)
            dx, dw = torch.autograd.grad(y, [xr, wr], dy.float())
        return dx.to(x.dtype), dw.to(weight.dtype), None


def rms_norm_masked_other(x, weight=None, eps=1e-6, **kw):
    if weight is None or kw.get("offset", 0.0) or kw.get("casting_mode", "llama") == "gemma":
        return rms_norm(x, weight, eps, **kw)
    return _RmsOther.apply(x, weight, eps)


@triton.jit
def _dw_plain_store_kernel(p_ptr, dw_ptr, M, N, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    # p = dy * xhat [M, N] (fp32, packed); dW = the column sums of p, ROWS rows per program
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    p = tl.load(p_ptr + rows[:, None] * N + cols[None, :], mask=mask, other=0.0)
    # the bug: each program's partial stored with a plain store where an atomic add belongs,
    # so the programs race for dW and the last to store wins
    tl.store(dw_ptr + cols, tl.sum(p, axis=0), mask=cols < N)


class _RmsDwRace(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps):
        ctx.save_for_backward(x, weight)
        ctx.eps = eps
        return rms_norm(x, weight, eps)

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        n = weight.shape[-1]
        with torch.enable_grad():
            xr = x.detach().float().requires_grad_(True)
            (dx,) = torch.autograd.grad(rms_norm_ref(xr, weight.float(), ctx.eps), xr, dy.float())
        x32 = x.detach().float().reshape(-1, n)
        xhat = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + ctx.eps)
        p = (dy.float().reshape(-1, n) * xhat).contiguous()
        m = p.shape[0]
        dw = torch.zeros(n, dtype=torch.float32, device=p.device)
        rows = 16
        grid = (triton.cdiv(m, rows),)
        _dw_plain_store_kernel[grid](p, dw, m, n, ROWS=rows, BLOCK=triton.next_power_of_2(n))
        return dx.to(x.dtype), dw.to(weight.dtype), None


def rms_norm_dw_race(x, weight=None, eps=1e-6, **kw):
    """dW reduced by programs of 16 rows that store their partials over each other (a race
    between programs). Under the interpreter the programs run one after another, so the last
    one's partial is left; on a GPU whichever stores last. Either way dW is wrong once an input
    has more than 16 rows (many_rows); dx is the fp32 reference's, rounded once."""
    if weight is None or kw.get("offset", 0.0) or kw.get("casting_mode", "llama") == "gemma":
        return rms_norm(x, weight, eps, **kw)
    return _RmsDwRace.apply(x, weight, eps)


@triton.jit
def _relu2_int32_rows_kernel(x_ptr, y_ptr, N, stride_x, stride_y, BLOCK: tl.constexpr):
    row = tl.program_id(0)  # int32, as are the strides: row * stride wraps past 2^31 - 1
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    # the bug: the offsets computed in int32 (the library's kernels cast the row to int64
    # first). Wrapped, an offset is negative: a GPU would fault on it, and an illegal address
    # ends the CUDA context of the whole process. Keeping its low 31 bits lands it on an earlier
    # row instead (in bounds whenever the tensor has 2^31 elements or more, a no-op below).
    x_off = (row * stride_x + cols) & 0x7FFFFFFF
    y_off = (row * stride_y + cols) & 0x7FFFFFFF
    x = tl.load(x_ptr + x_off, mask=mask, other=0.0).to(tl.float32)
    y = tl.maximum(x, 0.0)
    tl.store(y_ptr + y_off, (y * y).to(y_ptr.dtype.element_ty), mask=mask)


class _Relu2Int32(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x2 = x.reshape(-1, x.shape[-1]).contiguous()
        y = empty(x2.shape, dtype=x.dtype, device=x.device)
        m, n = x2.shape
        block = triton.next_power_of_2(n)
        _relu2_int32_rows_kernel[(m,)](x2, y, n, x2.stride(0), y.stride(0), BLOCK=block)
        ctx.save_for_backward(x2)
        ctx.shape = x.shape
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy):
        (x2,) = ctx.saved_tensors
        dy2 = dy.reshape(x2.shape).contiguous()
        dx = empty(x2.shape, dtype=x2.dtype, device=x2.device)
        relu_squared_bwd_launch(dy2, x2, dx)  # the library's backward: int64 offsets
        return dx.view(ctx.shape)


def relu_squared_int32_offsets(x):
    """relu(x)^2 by a row kernel whose offsets are int32 (`pid * stride`): past 2^31
    elements the rows wrap onto earlier ones (their outputs never written: NaN under debug's
    poisoning). Only the huge regime reaches it, on a GPU; the backward is the library's."""
    return _Relu2Int32.apply(x)
