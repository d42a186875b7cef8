"""LayerNorm's row kernels (ops/layer_norm.py launches them): the forward with the row in
registers or looped, the backward with the row in registers (fp32 partial dW/dB rows per
program), looped, or split over a group of programs that exchange their chunk sums.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernelwright.ops._pdl import wait_for_inputs
from kernelwright.ops._row_block import load_rows, row_block, row_chunk
from kernelwright.ops._split import arrive_and_wait, ticket
from kernelwright.runtime.fastlaunch import fast


@triton.jit
def weight_fp32(w_ptr, cols, col_mask, HAS_WEIGHT: tl.constexpr):
    # w over cols in fp32; without a weight zeros, never read (the backward's g is dy).
    if HAS_WEIGHT:
        w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    else:
        w = tl.zeros(cols.shape, dtype=tl.float32)
    return w


@triton.jit
def x_hat_g(x, dy, w, mean, rstd, HAS_WEIGHT: tl.constexpr):
    # The backward's inputs per element (fp32): x_hat = (x - mean) * rstd and g = dy * w.
    x_hat = (x - mean) * rstd
    g = dy
    if HAS_WEIGHT:
        g = dy * w
    return x_hat, g


@triton.jit
def ln_dx(g, x_hat, c1, c2, rstd):
    # dx = rstd * (g - c1 - x_hat * c2), c1 = mean(g) and c2 = mean(g * x_hat) over the row.
    return (g - c1 - x_hat * c2) * rstd


@fast
@triton.jit
def _layer_norm_fwd_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    y_ptr,
    mean_ptr,
    rstd_ptr,  # x, y: [M, N] with row strides; w, b: [N]; mean, rstd: [M] fp32
    M,
    N,
    stride_x,
    stride_y,
    eps,
    HAS_WEIGHT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ROWS: tl.constexpr,
    EARLY_AFFINE: tl.constexpr,  # w and b loaded before x (tables/layer_norm.EARLY_AFFINE_MAX_N)
):
    # One program normalizes ROWS whole rows held in registers (BLOCK_N >= N).
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    if HAS_WEIGHT and EARLY_AFFINE:
        w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    if HAS_BIAS and EARLY_AFFINE:
        b = tl.load(b_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    if ROWS == 1:
        # One row: a 1-D block, no row mask (the grid has exactly M programs).
        row = tl.program_id(0).to(tl.int64)  # int64: row * stride may pass 2^31
        x = tl.load(x_ptr + row * stride_x + cols, mask=col_mask, other=0.0).to(tl.float32)
        mean = tl.sum(x, axis=0) / N
        xc = tl.where(col_mask, x - mean, 0.0)  # padding must not add mean^2 to the variance
        rstd = tl.rsqrt(tl.sum(xc * xc, axis=0) / N + eps)
        if HAS_WEIGHT and not EARLY_AFFINE:
            w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
        if HAS_BIAS and not EARLY_AFFINE:
            b = tl.load(b_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
        y = xc * rstd
        if HAS_WEIGHT:
            y = y * w
        if HAS_BIAS:
            y = y + b
        tl.store(y_ptr + row * stride_y + cols, y.to(y_ptr.dtype.element_ty), mask=col_mask)
        tl.store(mean_ptr + row, mean)
        tl.store(rstd_ptr + row, rstd)
    else:
        rows, row_mask, mask = row_block(tl.program_id(0), M, col_mask, ROWS)
        x = load_rows(x_ptr, rows, stride_x, cols, mask).to(tl.float32)
        mean = tl.sum(x, axis=1) / N  # [ROWS]
        xc = tl.where(mask, x - mean[:, None], 0.0)
        rstd = tl.rsqrt(tl.sum(xc * xc, axis=1) / N + eps)  # [ROWS]
        if HAS_WEIGHT and not EARLY_AFFINE:
            w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
        if HAS_BIAS and not EARLY_AFFINE:
            b = tl.load(b_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
        y = xc * rstd[:, None]
        if HAS_WEIGHT:
            y = y * w[None, :]
        if HAS_BIAS:
            y = y + b[None, :]
        y_ptrs = y_ptr + rows[:, None] * stride_y + cols[None, :]
        tl.store(y_ptrs, y.to(y_ptr.dtype.element_ty), mask=mask)
        tl.store(mean_ptr + rows, mean, mask=row_mask)
        tl.store(rstd_ptr + rows, rstd, mask=row_mask)


@fast
@triton.jit
def _layer_norm_fwd_looped_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    y_ptr,
    mean_ptr,
    rstd_ptr,
    M,
    N: tl.constexpr,  # a constant: the chunk count is known, the loops unroll (see below)
    stride_x,
    stride_y,
    eps,
    HAS_WEIGHT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    EVICT_1ST: tl.constexpr,  # the L2 flags (LaunchConfig.evict_hints / reverse_pass)
    EVICT_2ND: tl.constexpr,
    REVERSE: tl.constexpr,
    OFFSETS_64: tl.constexpr,  # some row's offset passes 2^31: 64-bit offsets
):
    # Rows walked in BLOCK_N chunks, two reads. Pass 1: every lane keeps a running (count,
    # mean, M2) of the values it sees (Welford: no E[x^2] - E[x]^2 cancellation), and the lanes
    # merge exactly at the end (Chan et al.): mean = sum(c_j m_j) / N, M2 = sum(M2_j) +
    # sum(c_j (m_j - mean)^2). Pass 2 re-reads the row — from L2 with the table's flags — and
    # writes y. N is a constexpr: with the chunk count known the compiler unrolls the loops and
    # issues several chunks' loads at once. 32-bit offsets where every row's offset fits (fewer
    # address instructions).
    row = tl.program_id(0)
    if OFFSETS_64:
        row = row.to(tl.int64)
    x_row = x_ptr + row * stride_x
    y_row = y_ptr + row * stride_y
    lanes = tl.arange(0, BLOCK_N)
    n_chunks = tl.cdiv(N, BLOCK_N)
    m_l = tl.zeros([BLOCK_N], dtype=tl.float32)
    m2_l = tl.zeros([BLOCK_N], dtype=tl.float32)
    c_l = tl.zeros([BLOCK_N], dtype=tl.float32)
    for k in range(0, n_chunks):
        cols = k * BLOCK_N + lanes
        col_mask = cols < N
        x = tl.load(x_row + cols, mask=col_mask, other=0.0, eviction_policy=EVICT_1ST)
        x = x.to(tl.float32)
        count = (k + 1) * 1.0  # every lane with a value here has seen k + 1 of them
        delta = x - m_l
        m_new = m_l + delta * (1.0 / count)
        m2_l = tl.where(col_mask, m2_l + delta * (x - m_new), m2_l)
        m_l = tl.where(col_mask, m_new, m_l)
        c_l = tl.where(col_mask, count, c_l)
    mean = tl.sum(c_l * m_l, axis=0) / N
    d = m_l - mean
    rstd = tl.rsqrt((tl.sum(m2_l, axis=0) + tl.sum(c_l * d * d, axis=0)) / N + eps)
    for c in range(0, n_chunks):
        cols = (n_chunks - 1 - c if REVERSE else c) * BLOCK_N + lanes
        col_mask = cols < N
        x = tl.load(x_row + cols, mask=col_mask, other=0.0, eviction_policy=EVICT_2ND)
        y = (x.to(tl.float32) - mean) * rstd
        if HAS_WEIGHT:
            y = y * tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
        if HAS_BIAS:
            y = y + tl.load(b_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
        tl.store(
            y_row + cols, y.to(y_ptr.dtype.element_ty), mask=col_mask, eviction_policy=EVICT_2ND
        )
    tl.store(mean_ptr + row, mean)
    tl.store(rstd_ptr + row, rstd)


@fast
@triton.jit
def _layer_norm_bwd_kernel(
    dy_ptr,
    x_ptr,
    w_ptr,
    mean_ptr,
    rstd_ptr,
    dx_ptr,
    dw_partial_ptr,
    db_partial_ptr,  # dw_partial, db_partial: [programs, N] fp32
    M,
    N,
    stride_dy,
    stride_x,
    stride_dx,
    HAS_WEIGHT: tl.constexpr,
    HAS_DW: tl.constexpr,
    HAS_DB: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ROWS: tl.constexpr,
    PREFETCH: tl.constexpr,
    GDC_WAIT: tl.constexpr,  # launched with PDL (ops/_pdl.py)
):
    # Persistent: program p takes row blocks p, p + P, ... and keeps its dW/dB sums in registers.
    # g = dy * w;  dx = rstd * (g - mean(g) - x_hat * mean(g * x_hat))
    # dW = sum_rows(dy * x_hat);  dB = sum_rows(dy)
    # PREFETCH: the next block's x, dy, mean and rstd are loaded (in their own dtype) before
    # this block's reductions, so one block's memory latency hides behind the previous one's math.
    wait_for_inputs(GDC_WAIT)  # before any load or store
    pid = tl.program_id(0)
    step = tl.num_programs(0) * ROWS
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    w = weight_fp32(w_ptr, cols, col_mask, HAS_WEIGHT)
    dw_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    db_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    if PREFETCH:
        first, first_mask, mask0 = row_block(pid, M, col_mask, ROWS)
        x_next = load_rows(x_ptr, first, stride_x, cols, mask0)
        dy_next = load_rows(dy_ptr, first, stride_dy, cols, mask0)
        mean_next = tl.load(mean_ptr + first, mask=first_mask, other=0.0)
        rstd_next = tl.load(rstd_ptr + first, mask=first_mask, other=0.0)
    for block in range(pid, tl.cdiv(M, ROWS), tl.num_programs(0)):
        rows, row_mask, mask = row_block(block, M, col_mask, ROWS)
        if PREFETCH:
            x, dy, mean, rstd = x_next, dy_next, mean_next, rstd_next
            nxt = rows + step
            nmask = (nxt < M)[:, None] & col_mask[None, :]
            x_next = load_rows(x_ptr, nxt, stride_x, cols, nmask)
            dy_next = load_rows(dy_ptr, nxt, stride_dy, cols, nmask)
            mean_next = tl.load(mean_ptr + nxt, mask=nxt < M, other=0.0)
            rstd_next = tl.load(rstd_ptr + nxt, mask=nxt < M, other=0.0)
        else:
            x = load_rows(x_ptr, rows, stride_x, cols, mask)
            dy = load_rows(dy_ptr, rows, stride_dy, cols, mask)
            mean = tl.load(mean_ptr + rows, mask=row_mask, other=0.0)
            rstd = tl.load(rstd_ptr + rows, mask=row_mask, other=0.0)
        x = x.to(tl.float32)
        dy = dy.to(tl.float32)  # 0 outside the mask, so every product with dy below is too
        mean = mean[:, None]
        rstd = rstd[:, None]
        x_hat, g = x_hat_g(x, dy, w[None, :], mean, rstd, HAS_WEIGHT)
        c1 = tl.sum(g, axis=1)[:, None] / N
        c2 = tl.sum(g * x_hat, axis=1)[:, None] / N
        dx = ln_dx(g, x_hat, c1, c2, rstd)
        tl.store(
            dx_ptr + rows[:, None] * stride_dx + cols[None, :], dx.to(dx_ptr.dtype.element_ty), mask
        )
        if HAS_DW:
            dw_acc += tl.sum(dy * x_hat, axis=0)
        if HAS_DB:
            db_acc += tl.sum(dy, axis=0)
    if HAS_DW:
        tl.store(dw_partial_ptr + pid.to(tl.int64) * N + cols, dw_acc, mask=col_mask)
    if HAS_DB:
        tl.store(db_partial_ptr + pid.to(tl.int64) * N + cols, db_acc, mask=col_mask)


@fast
@triton.jit
def _layer_norm_bwd_looped_kernel(
    dy_ptr,
    x_ptr,
    w_ptr,
    mean_ptr,
    rstd_ptr,
    dx_ptr,
    dw_partial_ptr,
    db_partial_ptr,
    M,
    N,
    stride_dy,
    stride_x,
    stride_dx,
    HAS_WEIGHT: tl.constexpr,
    HAS_DW: tl.constexpr,
    HAS_DB: tl.constexpr,
    BLOCK_N: tl.constexpr,
    GDC_WAIT: tl.constexpr,  # launched with PDL (ops/_pdl.py)
):
    # Long rows: pass 1 reduces sum(g) and sum(g * x_hat) over the row, pass 2 writes dx and adds
    # this row's dW/dB contributions into the program's own fp32 partial rows (no atomics).
    wait_for_inputs(GDC_WAIT)  # before any load or store
    pid = tl.program_id(0)
    dw_row = dw_partial_ptr + pid.to(tl.int64) * N
    db_row = db_partial_ptr + pid.to(tl.int64) * N
    for row in range(pid, M, tl.num_programs(0)):
        row64 = tl.cast(row, tl.int64)
        x_row = x_ptr + row64 * stride_x
        dy_row = dy_ptr + row64 * stride_dy
        mean = tl.load(mean_ptr + row64)
        rstd = tl.load(rstd_ptr + row64)
        acc_g = tl.zeros([BLOCK_N], dtype=tl.float32)
        acc_gx = tl.zeros([BLOCK_N], dtype=tl.float32)
        for start in range(0, N, BLOCK_N):
            cols, col_mask, x, g = row_chunk(x_row, dy_row, start, N, BLOCK_N)
            if HAS_WEIGHT:
                g = g * tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
            acc_g += g
            acc_gx += g * (x - mean) * rstd
        c1 = tl.sum(acc_g, axis=0) / N
        c2 = tl.sum(acc_gx, axis=0) / N
        for start in range(0, N, BLOCK_N):
            cols, col_mask, x, dy = row_chunk(x_row, dy_row, start, N, BLOCK_N)
            x_hat = (x - mean) * rstd  # before w's load (x_hat_g would load it first)
            g = dy
            if HAS_WEIGHT:
                g = dy * tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
            dx = ln_dx(g, x_hat, c1, c2, rstd)
            tl.store(dx_ptr + row64 * stride_dx + cols, dx.to(dx_ptr.dtype.element_ty), col_mask)
            if HAS_DW:
                dw = tl.load(dw_row + cols, mask=col_mask, other=0.0)
                tl.store(dw_row + cols, dw + dy * x_hat, mask=col_mask)
            if HAS_DB:
                db = tl.load(db_row + cols, mask=col_mask, other=0.0)
                tl.store(db_row + cols, db + dy, mask=col_mask)


@fast
@triton.jit
def _layer_norm_bwd_split_kernel(
    dy_ptr,
    x_ptr,
    w_ptr,
    mean_ptr,
    rstd_ptr,
    dx_ptr,
    dw_partial_ptr,
    db_partial_ptr,  # dw_partial, db_partial: [groups, N] fp32
    part_ptr,  # [M, SPLITS, 2] fp32: each chunk's sum(g) and sum(g * x_hat) per row
    sync_ptr,  # [1 + cdiv(M, ROWS)] int32, zeroed: the ticket, then one counter per row block
    M,
    N,
    stride_dy,
    stride_x,
    stride_dx,
    GROUPS,
    HAS_WEIGHT: tl.constexpr,
    HAS_DW: tl.constexpr,
    HAS_DB: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ROWS: tl.constexpr,
    SPLITS: tl.constexpr,
    SPLITS_P2: tl.constexpr,
    PHASE: tl.constexpr,  # 0: one launch that waits; 1 / 2: statistics, then the rest (ops/_split)
):
    # Rows too wide for one program to hold w, dW and dB (three fp32 rows) are split in SPLITS
    # column chunks (ops/_split.py). A group of SPLITS programs, one per chunk, walks row blocks
    # g, g + GROUPS, ...: each holds its chunk of w and its fp32 dW/dB sums, reduces its chunk of
    # every row of the block, publishes the two sums, waits for the block's other chunks, then
    # writes its chunk of dx and adds to dW/dB. One read of x and dy, one write of dx (the
    # two-kernel form, dx then dW/dB, reads x and dy twice).
    t = ticket(sync_ptr) if PHASE == 0 else tl.program_id(0)
    group = t // SPLITS
    j = t % SPLITS
    cols = j * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    w = weight_fp32(w_ptr, cols, col_mask, HAS_WEIGHT)
    dw_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    db_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    k = tl.arange(0, SPLITS_P2)
    for block in range(group, tl.cdiv(M, ROWS), GROUPS):
        rows, row_mask, mask = row_block(block, M, col_mask, ROWS)
        x = load_rows(x_ptr, rows, stride_x, cols, mask)
        dy = load_rows(dy_ptr, rows, stride_dy, cols, mask)
        x = x.to(tl.float32)
        dy = dy.to(tl.float32)  # 0 outside the mask, so every product with dy below is too
        mean = tl.load(mean_ptr + rows, mask=row_mask, other=0.0)[:, None]
        rstd = tl.load(rstd_ptr + rows, mask=row_mask, other=0.0)[:, None]
        x_hat, g = x_hat_g(x, dy, w[None, :], mean, rstd, HAS_WEIGHT)
        part = part_ptr + rows * (SPLITS * 2)  # [ROWS] row bases
        if PHASE != 2:
            tl.store(part + j * 2, tl.sum(g, axis=1), mask=row_mask)
            tl.store(part + j * 2 + 1, tl.sum(g * x_hat, axis=1), mask=row_mask)
        if PHASE == 0:
            arrive_and_wait(sync_ptr + 1 + block, SPLITS)
        if PHASE != 1:
            slots = part[:, None] + k[None, :] * 2  # [ROWS, SPLITS_P2]
            smask = row_mask[:, None] & (k < SPLITS)[None, :]
            c1 = tl.sum(tl.load(slots, mask=smask, other=0.0, volatile=True), axis=1) / N
            c2 = tl.sum(tl.load(slots + 1, mask=smask, other=0.0, volatile=True), axis=1) / N
            dx = ln_dx(g, x_hat, c1[:, None], c2[:, None], rstd)
            dx_ptrs = dx_ptr + rows[:, None] * stride_dx + cols[None, :]
            tl.store(dx_ptrs, dx.to(dx_ptr.dtype.element_ty), mask=mask)
            if HAS_DW:
                dw_acc += tl.sum(dy * x_hat, axis=0)
            if HAS_DB:
                db_acc += tl.sum(dy, axis=0)
    if PHASE != 1:
        out = group.to(tl.int64) * N + cols
        if HAS_DW:
            tl.store(dw_partial_ptr + out, dw_acc, mask=col_mask)
        if HAS_DB:
            tl.store(db_partial_ptr + out, db_acc, mask=col_mask)
