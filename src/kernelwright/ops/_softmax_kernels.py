"""Softmax's one-row and looped kernels (ops/softmax.py launches them; its split rows are in
ops/_softmax_split.py).

`_softmax_fwd_kernel` / `_softmax_bwd_kernel`: ROWS whole rows per program, held in registers
(BLOCK_N >= N). `_softmax_fwd_looped_kernel` / `_softmax_bwd_looped_kernel`: one row per
program walked in BLOCK_N chunks, twice, under the table's L2 flags.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernelwright.ops._held import HOLD_FROM, again
from kernelwright.runtime.fastlaunch import fast


@fast
@triton.jit
def _softmax_fwd_kernel(
    x_ptr,
    y_ptr,  # x, y: [M, N] with row strides
    M,
    N,
    stride_x,
    stride_y,
    IS_LOG: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ROWS: tl.constexpr,
):
    # One program handles ROWS whole rows held in registers (BLOCK_N >= N). The row's sum is
    # inverted once and multiplied in: an IEEE division per element costs more ALU time than a
    # memory-bound kernel can hide at 32K-wide rows (<= 1 ulp of fp32 apart from e / d).
    cols = tl.arange(0, BLOCK_N)
    if ROWS == 1:
        # One row: a 1-D block (as in rms_norm), no row mask (the grid has exactly M programs).
        row = tl.program_id(0).to(tl.int64)  # int64: row * stride may pass 2^31
        col_mask = cols < N
        # Padding columns are -inf: they add exp(-inf) = 0 to the sum and never win the max.
        # From HOLD_FROM columns the row stays in its own dtype, converted at each pass (_held):
        # held as fp32, a bf16 row of 32768 fills half an SM's registers and 65536 spills.
        hold: tl.constexpr = BLOCK_N >= HOLD_FROM
        x = tl.load(x_ptr + row * stride_x + cols, mask=col_mask, other=-float("inf"))
        m = tl.max(x.to(tl.float32), axis=0)  # -inf for a row of all -inf -> NaN, as in torch
        d = tl.sum(tl.exp(again(x, m, hold).to(tl.float32) - m), axis=0)
        x = again(x, d, hold).to(tl.float32)
        y = x - m - tl.log(d) if IS_LOG else tl.exp(x - m) * (1.0 / d)
        tl.store(y_ptr + row * stride_y + cols, y.to(y_ptr.dtype.element_ty), mask=col_mask)
    else:
        rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)  # int64 offsets
        col_mask = (cols < N)[None, :]
        mask = (rows < M)[:, None] & col_mask
        x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
        # Padding columns are -inf, as above. (Rows past M stay finite, so they compute no NaN
        # that nobody stores.)
        x = tl.where(col_mask, x.to(tl.float32), -float("inf"))
        m = tl.max(x, axis=1)[:, None]  # [ROWS, 1]
        e = tl.exp(x - m)
        d = tl.sum(e, axis=1)[:, None]
        y = x - m - tl.log(d) if IS_LOG else e * (1.0 / d)
        y_ptrs = y_ptr + rows[:, None] * stride_y + cols[None, :]
        tl.store(y_ptrs, y.to(y_ptr.dtype.element_ty), mask)


@fast
@triton.jit
def _softmax_fwd_looped_kernel(
    x_ptr,
    y_ptr,
    M,
    N,
    stride_x,
    stride_y,
    IS_LOG: tl.constexpr,
    BLOCK_N: tl.constexpr,
    EVICT_1ST: tl.constexpr,  # eviction policy of pass 1's reads ("" or "evict_last")
    EVICT_2ND: tl.constexpr,  # of pass 2's reads and stores ("" or "evict_first")
    REVERSE: tl.constexpr,  # pass 2 walks the row from its end
):
    # Long rows. Pass 1, online: every lane keeps its own running max m and sum d of
    # exp(x - m), rescaled when m grows (d' = d * exp(m - m') + exp(x - m')), so the row is
    # read once for both. The lanes merge at the end; pass 2 writes y. The L2 flags (see
    # LaunchConfig) aim pass 2's read at the chunks pass 1 left in L2.
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x
    y_row = y_ptr + row * stride_y
    n_chunks = tl.cdiv(N, BLOCK_N)
    m = tl.full([BLOCK_N], -float("inf"), dtype=tl.float32)
    d = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        x = tl.load(x_row + cols, mask=cols < N, other=-float("inf"), eviction_policy=EVICT_1ST)
        x = x.to(tl.float32)
        m_new = tl.maximum(m, x)
        # A lane that has seen only -inf shifts by 0 instead (exp(-inf - -inf) would be NaN),
        # so its d stays exp(-inf) = 0.
        shift = tl.where(m_new == -float("inf"), 0.0, m_new)
        d = d * tl.exp(m - shift) + tl.exp(x - shift)
        m = m_new
    m_row = tl.max(m, axis=0)  # -inf for a row of all -inf: the sum below is NaN, as in torch
    d_row = tl.sum(d * tl.exp(m - m_row), axis=0)
    log_d = tl.log(d_row)
    inv_d = 1.0 / d_row
    for c in range(0, n_chunks):
        cols = (n_chunks - 1 - c if REVERSE else c) * BLOCK_N + tl.arange(0, BLOCK_N)
        col_mask = cols < N
        x = tl.load(x_row + cols, mask=col_mask, other=-float("inf"), eviction_policy=EVICT_2ND)
        x = x.to(tl.float32)
        y = x - m_row - log_d if IS_LOG else tl.exp(x - m_row) * inv_d
        y_ptrs = y_row + cols
        tl.store(y_ptrs, y.to(y_ptr.dtype.element_ty), mask=col_mask, eviction_policy=EVICT_2ND)


@fast
@triton.jit
def _softmax_bwd_kernel(
    dy_ptr,
    y_ptr,
    dx_ptr,  # dy, y, dx: [M, N] with row strides (dy's may be 0: an expanded gradient)
    M,
    N,
    stride_dy,
    stride_y,
    stride_dx,
    IS_LOG: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ROWS: tl.constexpr,
):
    cols = tl.arange(0, BLOCK_N)
    if ROWS == 1:
        # One row: a 1-D block, as in the forward. 16-bit rows from HOLD_FROM columns stay in
        # their dtype, converted again after the sum (_held); fp32 rows gain nothing from it and
        # would pay the extra adds.
        row = tl.program_id(0).to(tl.int64)
        col_mask = cols < N
        hold: tl.constexpr = BLOCK_N >= HOLD_FROM and y_ptr.dtype.element_ty.primitive_bitwidth < 32
        dy = tl.load(dy_ptr + row * stride_dy + cols, mask=col_mask, other=0.0)
        y = tl.load(y_ptr + row * stride_y + cols, mask=col_mask, other=0.0)
        # log_softmax: dx = dy - softmax * sum(dy); softmax: dx = y * (dy - sum(dy * y))
        if IS_LOG:
            s = tl.sum(dy.to(tl.float32), axis=0)
        else:
            s = tl.sum(dy.to(tl.float32) * y.to(tl.float32), axis=0)
        dy = again(dy, s, hold).to(tl.float32)
        y = again(y, s, hold).to(tl.float32)
        dx = dy - tl.exp(y) * s if IS_LOG else y * (dy - s)
        tl.store(dx_ptr + row * stride_dx + cols, dx.to(dx_ptr.dtype.element_ty), mask=col_mask)
    else:
        rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
        mask = (rows < M)[:, None] & (cols < N)[None, :]
        dy = tl.load(dy_ptr + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0)
        y = tl.load(y_ptr + rows[:, None] * stride_y + cols[None, :], mask=mask, other=0.0)
        dy = dy.to(tl.float32)
        y = y.to(tl.float32)
        if IS_LOG:
            dx = dy - tl.exp(y) * tl.sum(dy, axis=1)[:, None]
        else:
            dx = y * (dy - tl.sum(dy * y, axis=1)[:, None])
        dx_ptrs = dx_ptr + rows[:, None] * stride_dx + cols[None, :]
        tl.store(dx_ptrs, dx.to(dx_ptr.dtype.element_ty), mask)


@fast
@triton.jit
def _softmax_bwd_looped_kernel(
    dy_ptr,
    y_ptr,
    dx_ptr,
    M,
    N: tl.constexpr,  # a constant: the chunk count is known, the loops unroll (see below)
    stride_dy,
    stride_y,
    stride_dx,
    IS_LOG: tl.constexpr,
    BLOCK_N: tl.constexpr,
    EVICT_1ST: tl.constexpr,  # the L2 flags, as in the forward
    EVICT_2ND: tl.constexpr,
    REVERSE: tl.constexpr,
):
    # Rows walked in BLOCK_N chunks: pass 1 reduces sum(dy * y) (softmax) or sum(dy)
    # (log_softmax), pass 2 re-reads dy and y — from L2 with the table's flags — and writes dx,
    # so the DRAM reads and writes fall in separate passes. N is a constexpr, as in layer_norm's
    # looped forward: compiled per row length, its loops unroll, which this two-pass form needs
    # to keep up with the one-row kernel.
    row = tl.program_id(0).to(tl.int64)
    dy_row = dy_ptr + row * stride_dy
    y_row = y_ptr + row * stride_y
    n_chunks = tl.cdiv(N, BLOCK_N)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        col_mask = cols < N
        dy = tl.load(dy_row + cols, mask=col_mask, other=0.0, eviction_policy=EVICT_1ST)
        if IS_LOG:
            acc += dy.to(tl.float32)
        else:
            y = tl.load(y_row + cols, mask=col_mask, other=0.0, eviction_policy=EVICT_1ST)
            acc += dy.to(tl.float32) * y.to(tl.float32)
    s = tl.sum(acc, axis=0)
    for c in range(0, n_chunks):
        cols = (n_chunks - 1 - c if REVERSE else c) * BLOCK_N + tl.arange(0, BLOCK_N)
        col_mask = cols < N
        dy = tl.load(dy_row + cols, mask=col_mask, other=0.0, eviction_policy=EVICT_2ND)
        y = tl.load(y_row + cols, mask=col_mask, other=0.0, eviction_policy=EVICT_2ND)
        dy = dy.to(tl.float32)
        y = y.to(tl.float32)
        dx = dy - tl.exp(y) * s if IS_LOG else y * (dy - s)
        dx_ptrs = dx_ptr + row * stride_dx + cols
        tl.store(dx_ptrs, dx.to(dx_ptr.dtype.element_ty), mask=col_mask, eviction_policy=EVICT_2ND)
