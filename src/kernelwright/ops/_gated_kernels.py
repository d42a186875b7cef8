"""The gated family's two kernels (forward, backward), switched by `ACTIVATION`; ops/_gated.py
has their numerics, launchers, custom ops and autograd Functions."""

from __future__ import annotations

import triton
import triton.language as tl

from kernelwright.ops._activations import (
    _activation,
    _activation_grad,
    _chain,
    _clamp_gate_up,
    _clamp_grads,
)
from kernelwright.ops._elementwise import elementwise_tile
from kernelwright.runtime.fastlaunch import fast


@fast
@triton.jit
def _gated_fwd_kernel(
    a_ptr, b_ptr, c_ptr,  # gate, up, out: [M, N] views with row strides
    M, N, stride_a, stride_b, stride_c,  # b_ptr and stride_b are None for a single input
    alpha, limit, offset,  # silu_clamped's scalars; None for the other activations
    ACTIVATION: tl.constexpr,
    COLS: tl.constexpr,  # column stride of a and b (1, or 2 for interleaved); c's is 1
    BLOCK_N: tl.constexpr,
    ROWS: tl.constexpr,
):  # fmt: skip
    # Program (i, j) covers rows [i*ROWS, (i+1)*ROWS) and columns [j*BLOCK_N, (j+1)*BLOCK_N).
    rows, cols, mask = elementwise_tile(M, N, BLOCK_N, ROWS)
    dtype = a_ptr.dtype.element_ty
    a = tl.load(a_ptr + rows * stride_a + cols * COLS, mask=mask, other=0.0).to(tl.float32)
    if b_ptr is not None:
        b = tl.load(b_ptr + rows * stride_b + cols * COLS, mask=mask, other=0.0).to(tl.float32)
        if ACTIVATION == "silu_clamped":
            a, b = _clamp_gate_up(a, b, limit, offset, dtype)
        h = _activation(a, alpha, ACTIVATION).to(dtype).to(tl.float32)  # rounded
        c = h * b
    else:
        c = _activation(a, alpha, ACTIVATION)
    tl.store(c_ptr + rows * stride_c + cols, c.to(c_ptr.dtype.element_ty), mask=mask)


@fast
@triton.jit
def _gated_bwd_kernel(
    dc_ptr, a_ptr, b_ptr, da_ptr, db_ptr,  # [M, N] views with row strides
    M, N, stride_dc, stride_a, stride_b, stride_da, stride_db,  # b, db: None for a single input
    alpha, limit, offset,  # silu_clamped's scalars; None for the other activations
    ACTIVATION: tl.constexpr,
    COLS: tl.constexpr,  # column stride of a, b, da and db (1, or 2 for interleaved); dc's is 1
    BLOCK_N: tl.constexpr,
    ROWS: tl.constexpr,
):  # fmt: skip
    # da/db may be a/b themselves (in-place backward): each element is loaded, then stored, by
    # the one program that owns it, so overwriting the inputs is race-free.
    rows, cols, mask = elementwise_tile(M, N, BLOCK_N, ROWS)
    dc = tl.load(dc_ptr + rows * stride_dc + cols, mask=mask, other=0.0).to(tl.float32)
    a = tl.load(a_ptr + rows * stride_a + cols * COLS, mask=mask, other=0.0).to(tl.float32)
    if b_ptr is not None:
        b = tl.load(b_ptr + rows * stride_b + cols * COLS, mask=mask, other=0.0).to(tl.float32)
    dtype = a_ptr.dtype.element_ty
    if ACTIVATION == "silu_clamped":
        g_in, u = _clamp_gate_up(a, b, limit, offset, dtype)
    else:
        g_in = a
        if b_ptr is not None:
            u = b
    g, d = _activation_grad(g_in, alpha, ACTIVATION)
    if b_ptr is not None:
        # c = h * u with h = round(act(a)): db = dc * h, and eager autograd rounds dh = dc * u
        # to the input dtype before act's backward.
        db = dc * g.to(dtype).to(tl.float32)
        dh = (dc * u).to(dtype).to(tl.float32)
    else:
        dh = dc
    da = _chain(g_in, d, dh, alpha, ACTIVATION)
    if ACTIVATION == "silu_clamped":
        da, db = _clamp_grads(a, b, da, db, limit)
    tl.store(da_ptr + rows * stride_da + cols * COLS, da.to(da_ptr.dtype.element_ty), mask=mask)
    if b_ptr is not None:
        tl.store(db_ptr + rows * stride_db + cols * COLS, db.to(db_ptr.dtype.element_ty), mask=mask)
