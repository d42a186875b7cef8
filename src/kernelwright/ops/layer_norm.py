"""LayerNorm: y = (x - mean(x)) / sqrt(var(x) + eps) * w + b, over the last dimension.

Matches `torch.nn.functional.layer_norm(x, (N,), w, b, eps)`: the statistics are computed in
fp32 (mean and rstd saved as [M] fp32 for the backward), the affine transform too, and y is
rounded once, to x's dtype. The variance is the mean of squared deviations from the mean, never
E[x^2] - E[x]^2, which cancels catastrophically when |mean| >> std (a second pass over the row
held in registers; in the looped kernel, per-lane Welford sums merged exactly).

The backward, by row length (the launch table): a row held by one program, which also keeps its
fp32 dW/dB sums (from 16384 columns, and for few rows where those partial sums would be a large
share of the memory, `_partials.few_rows`: dx alone, then the `dwdb` kernel reads x and dy
again; at 16384 columns from CORUN_MIN_ROWS rows, dx programs and dW/dB column programs in one
launch, reading each row at about the same time);
past 16384 columns, up to 32 chunks, the row split over a group of programs that exchange their
chunk sums (ops/_split.py), one read of x and dy; past that a looped kernel.

Layer order: kernels → launchers → custom ops → autograd Function → `layer_norm` → `LayerNorm`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernelwright.ops._partials import corun_programs, few_rows, sum_partials
from kernelwright.ops._pdl import wait_for_inputs
from kernelwright.ops._split import arrive_and_wait, split_count, ticket
from kernelwright.ops._split import launch as launch_split
from kernelwright.runtime import device_info, lookup
from kernelwright.runtime.alloc import empty
from kernelwright.runtime.checks import check_same_device, check_shape, check_tensor, rows_view
from kernelwright.runtime.launch import LaunchConfig, pdl_args, two_pass_flags
from kernelwright.runtime.tables.layer_norm import TABLE

# From this row length up (where a row fits one program), the backward leaves dW and dB to the
# `dwdb` kernel: the fused one would hold w, dW and dB as three fp32 rows, most of the register
# file, one program per SM. H200, 8192 x 16384: fused 0.409 ms; dx alone 0.218 + dW/dB 0.134
# (reading x and dy again) = 0.35 ms (benchmarks/NOTES, issue 3, 21).
SPLIT_DWDB_FROM = 16384
# There, from this many rows, dx and dW/dB run in one launch on different programs walking the
# rows at once (`_layer_norm_bwd_corun_kernel`): 32 programs for dW/dB (512 columns each, 16-row
# steps, 4 in flight), the rest of the SMs for dx. H200 at 16384 columns, 4096-16384 rows:
# 0.293 ms against 0.340 at 8192 rows, -12 to -14% (benchmarks/corun_probe.py; NOTES 48).
CORUN_MIN_ROWS = 4096
CORUN = {"col_programs": 32, "col_rows": 16, "col_stages": 4}
# Swept on 132-SM GPUs (H200, H100 SXM): with fewer SMs the column programs would take too large
# a share of them from dx, so the two kernels one after the other stay.
CORUN_MIN_SMS = 120

# The one-row forward loads w and b before x for rows of up to this many columns (block_n), so
# their latency overlaps x's (as in rms_norm); for longer rows after the statistics, so that
# their registers are not live across x's loads and the reductions: at 16384 columns x, its
# centred copy, w and b live at once spilled (72% of copy at 8192 x 16384 on an H200, NOTES 9);
# at 8192 columns, one row of 8 warps per program, late is 66.8 us against 72.5 early (NOTES 42).
EARLY_AFFINE_MAX_N = 4096

# --------------------------------------------------------------------------- kernels


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
    EARLY_AFFINE: tl.constexpr,  # w and b loaded before x (see EARLY_AFFINE_MAX_N)
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
        rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)  # int64 offsets
        row_mask = rows < M
        mask = row_mask[:, None] & col_mask[None, :]
        x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
        x = x.to(tl.float32)
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
    # issues several chunks' loads at once (H200, 8192 x 16384: 177 -> 136 us with runtime N
    # against constant; benchmarks/ln_looped_probe.py, NOTES 42). 32-bit offsets where every row's
    # offset fits (-2% there).
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
    if HAS_WEIGHT:
        w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    dw_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    db_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    if PREFETCH:
        first = tl.cast(pid, tl.int64) * ROWS + tl.arange(0, ROWS)
        mask0 = (first < M)[:, None] & col_mask[None, :]
        x_next = tl.load(x_ptr + first[:, None] * stride_x + cols[None, :], mask=mask0, other=0.0)
        dy_next = tl.load(
            dy_ptr + first[:, None] * stride_dy + cols[None, :], mask=mask0, other=0.0
        )
        mean_next = tl.load(mean_ptr + first, mask=first < M, other=0.0)
        rstd_next = tl.load(rstd_ptr + first, mask=first < M, other=0.0)
    for block in range(pid, tl.cdiv(M, ROWS), tl.num_programs(0)):
        rows = tl.cast(block, tl.int64) * ROWS + tl.arange(0, ROWS)
        row_mask = rows < M
        mask = row_mask[:, None] & col_mask[None, :]
        if PREFETCH:
            x, dy, mean, rstd = x_next, dy_next, mean_next, rstd_next
            nxt = rows + step
            nmask = (nxt < M)[:, None] & col_mask[None, :]
            x_next = tl.load(x_ptr + nxt[:, None] * stride_x + cols[None, :], mask=nmask, other=0.0)
            dy_ptrs = dy_ptr + nxt[:, None] * stride_dy + cols[None, :]
            dy_next = tl.load(dy_ptrs, mask=nmask, other=0.0)
            mean_next = tl.load(mean_ptr + nxt, mask=nxt < M, other=0.0)
            rstd_next = tl.load(rstd_ptr + nxt, mask=nxt < M, other=0.0)
        else:
            x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
            dy_ptrs = dy_ptr + rows[:, None] * stride_dy + cols[None, :]
            dy = tl.load(dy_ptrs, mask=mask, other=0.0)
            mean = tl.load(mean_ptr + rows, mask=row_mask, other=0.0)
            rstd = tl.load(rstd_ptr + rows, mask=row_mask, other=0.0)
        x = x.to(tl.float32)
        dy = dy.to(tl.float32)  # 0 outside the mask, so every product with dy below is too
        mean = mean[:, None]
        rstd = rstd[:, None]
        x_hat = (x - mean) * rstd
        g = dy
        if HAS_WEIGHT:
            g = dy * w[None, :]
        c1 = tl.sum(g, axis=1)[:, None] / N
        c2 = tl.sum(g * x_hat, axis=1)[:, None] / N
        dx = (g - c1 - x_hat * c2) * rstd
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
            cols = start + tl.arange(0, BLOCK_N)
            col_mask = cols < N
            x = tl.load(x_row + cols, mask=col_mask, other=0.0).to(tl.float32)
            g = tl.load(dy_row + cols, mask=col_mask, other=0.0).to(tl.float32)
            if HAS_WEIGHT:
                g = g * tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
            acc_g += g
            acc_gx += g * (x - mean) * rstd
        c1 = tl.sum(acc_g, axis=0) / N
        c2 = tl.sum(acc_gx, axis=0) / N
        for start in range(0, N, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            col_mask = cols < N
            x = tl.load(x_row + cols, mask=col_mask, other=0.0).to(tl.float32)
            dy = tl.load(dy_row + cols, mask=col_mask, other=0.0).to(tl.float32)
            x_hat = (x - mean) * rstd
            g = dy
            if HAS_WEIGHT:
                g = dy * tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
            dx = (g - c1 - x_hat * c2) * rstd
            tl.store(dx_ptr + row64 * stride_dx + cols, dx.to(dx_ptr.dtype.element_ty), col_mask)
            if HAS_DW:
                dw = tl.load(dw_row + cols, mask=col_mask, other=0.0)
                tl.store(dw_row + cols, dw + dy * x_hat, mask=col_mask)
            if HAS_DB:
                db = tl.load(db_row + cols, mask=col_mask, other=0.0)
                tl.store(db_row + cols, db + dy, mask=col_mask)


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
    if HAS_WEIGHT:
        w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    dw_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    db_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    k = tl.arange(0, SPLITS_P2)
    for block in range(group, tl.cdiv(M, ROWS), GROUPS):
        rows = tl.cast(block, tl.int64) * ROWS + tl.arange(0, ROWS)
        row_mask = rows < M
        mask = row_mask[:, None] & col_mask[None, :]
        x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
        dy = tl.load(dy_ptr + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0)
        x = x.to(tl.float32)
        dy = dy.to(tl.float32)  # 0 outside the mask, so every product with dy below is too
        mean = tl.load(mean_ptr + rows, mask=row_mask, other=0.0)[:, None]
        rstd = tl.load(rstd_ptr + rows, mask=row_mask, other=0.0)[:, None]
        x_hat = (x - mean) * rstd
        g = dy
        if HAS_WEIGHT:
            g = dy * w[None, :]
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
            dx = (g - c1[:, None] - x_hat * c2[:, None]) * rstd
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


@triton.jit
def _layer_norm_dwdb_kernel(
    dy_ptr,
    x_ptr,
    mean_ptr,
    rstd_ptr,
    dw_ptr,
    db_ptr,  # [N], the parameters' dtypes
    M,
    N,
    stride_dy,
    stride_x,
    HAS_DW: tl.constexpr,
    HAS_DB: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ROWS: tl.constexpr,
    STAGES: tl.constexpr,  # row blocks in flight (tl.range's software pipeline)
    GDC_WAIT: tl.constexpr,  # launched with PDL (ops/_pdl.py)
):
    # dW and dB alone, for rows too wide for the fused backward to hold them (SPLIT_DWDB_FROM)
    # and for few rows (ops/_partials.few_rows): program c sums dy * x_hat and dy over every
    # [ROWS, BLOCK_N] tile of column block c, in fp32, and stores dW and dB itself (no partial
    # rows). The sums stay [ROWS, BLOCK_N] until the end: a sum over rows per tile would cross
    # warps every step.
    wait_for_inputs(GDC_WAIT)  # before any load or store
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    dw_acc = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
    db_acc = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
    for block in tl.range(0, tl.cdiv(M, ROWS), num_stages=STAGES):
        rows = tl.cast(block, tl.int64) * ROWS + tl.arange(0, ROWS)
        row_mask = rows < M
        mask = row_mask[:, None] & col_mask[None, :]
        dy = tl.load(dy_ptr + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0)
        dy = dy.to(tl.float32)  # 0 outside the mask
        if HAS_DW:
            x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
            mean = tl.load(mean_ptr + rows, mask=row_mask, other=0.0)[:, None]
            rstd = tl.load(rstd_ptr + rows, mask=row_mask, other=0.0)[:, None]
            dw_acc += dy * ((x.to(tl.float32) - mean) * rstd)
        if HAS_DB:
            db_acc += dy
    if HAS_DW:
        tl.store(dw_ptr + cols, tl.sum(dw_acc, axis=0).to(dw_ptr.dtype.element_ty), mask=col_mask)
    if HAS_DB:
        tl.store(db_ptr + cols, tl.sum(db_acc, axis=0).to(db_ptr.dtype.element_ty), mask=col_mask)


@triton.jit
def _layer_norm_bwd_corun_kernel(
    dy_ptr,
    x_ptr,
    w_ptr,
    mean_ptr,
    rstd_ptr,
    dx_ptr,
    dw_ptr,
    db_ptr,  # dW, dB: [N], the parameters' dtypes
    M,
    N,
    stride_dy,
    stride_x,
    stride_dx,
    ROW_PROGRAMS,  # programs 0 .. ROW_PROGRAMS - 1 write dx; the others dW and dB
    HAS_WEIGHT: tl.constexpr,
    HAS_DW: tl.constexpr,
    HAS_DB: tl.constexpr,
    BLOCK_N: tl.constexpr,  # >= N: a row of dx held by one program
    COL_N: tl.constexpr,  # columns per dW/dB program
    COL_ROWS: tl.constexpr,  # rows per dW/dB step
    COL_STAGES: tl.constexpr,  # dW/dB steps in flight (tl.range's software pipeline)
    GDC_WAIT: tl.constexpr,  # launched with PDL (ops/_pdl.py)
):
    # dx and dW/dB in one launch, on different programs reading the same rows at about the same
    # time: row programs walk rows p, p + ROW_PROGRAMS, ... (dx, as the fused kernel without
    # dW/dB); column program c walks every row in order for columns [c * COL_N, (c + 1) * COL_N)
    # and stores dW and dB itself (no partial rows). Whichever reads a row first brings it from
    # memory; the other, a moment later, finds it in L2 - where the dx and dwdb kernels one after
    # the other read x and dy twice from memory. Nothing waits on anything: only the timing
    # makes the second read cheap, never the result.
    wait_for_inputs(GDC_WAIT)  # before any load or store
    pid = tl.program_id(0)
    if pid < ROW_PROGRAMS:
        cols = tl.arange(0, BLOCK_N)
        col_mask = cols < N
        if HAS_WEIGHT:
            w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
        for row in range(pid, M, ROW_PROGRAMS):
            row64 = tl.cast(row, tl.int64)
            x = tl.load(x_ptr + row64 * stride_x + cols, mask=col_mask, other=0.0).to(tl.float32)
            dy = tl.load(dy_ptr + row64 * stride_dy + cols, mask=col_mask, other=0.0)
            dy = dy.to(tl.float32)  # 0 outside the mask
            mean = tl.load(mean_ptr + row64)
            rstd = tl.load(rstd_ptr + row64)
            x_hat = (x - mean) * rstd
            g = dy
            if HAS_WEIGHT:
                g = dy * w
            c1 = tl.sum(g, axis=0) / N
            c2 = tl.sum(g * x_hat, axis=0) / N
            dx = (g - c1 - x_hat * c2) * rstd
            tl.store(dx_ptr + row64 * stride_dx + cols, dx.to(dx_ptr.dtype.element_ty), col_mask)
    else:  # names of their own: a runtime branch's values must match in type across branches
        c_cols = (pid - ROW_PROGRAMS) * COL_N + tl.arange(0, COL_N)
        c_mask = c_cols < N
        dw_acc = tl.zeros([COL_ROWS, COL_N], dtype=tl.float32)
        db_acc = tl.zeros([COL_ROWS, COL_N], dtype=tl.float32)
        for r0 in tl.range(0, M, COL_ROWS, num_stages=COL_STAGES):
            c_rows = tl.cast(r0, tl.int64) + tl.arange(0, COL_ROWS)
            c_row_mask = c_rows < M
            tile = c_row_mask[:, None] & c_mask[None, :]
            c_dy = tl.load(
                dy_ptr + c_rows[:, None] * stride_dy + c_cols[None, :], mask=tile, other=0.0
            )
            c_dy = c_dy.to(tl.float32)  # 0 outside the mask
            if HAS_DW:
                c_x = tl.load(
                    x_ptr + c_rows[:, None] * stride_x + c_cols[None, :], mask=tile, other=0.0
                )
                c_mean = tl.load(mean_ptr + c_rows, mask=c_row_mask, other=0.0)[:, None]
                c_rstd = tl.load(rstd_ptr + c_rows, mask=c_row_mask, other=0.0)[:, None]
                dw_acc += c_dy * ((c_x.to(tl.float32) - c_mean) * c_rstd)
            if HAS_DB:
                db_acc += c_dy
        if HAS_DW:
            dw = tl.sum(dw_acc, axis=0)
            tl.store(dw_ptr + c_cols, dw.to(dw_ptr.dtype.element_ty), mask=c_mask)
        if HAS_DB:
            db = tl.sum(db_acc, axis=0)
            tl.store(db_ptr + c_cols, db.to(db_ptr.dtype.element_ty), mask=c_mask)


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
        grid = (triton.cdiv(M, cfg.rows),)
        early = cfg.block_n <= EARLY_AFFINE_MAX_N
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
    row_blocks = triton.cdiv(M, cfg.rows) if fits else M
    programs = max(1, min(row_blocks, device_info(x.device).sm_count * cfg.programs_per_sm))
    grads = (dw is not None) + (db is not None)
    dwdb_block = _config("bwd_dwdb", x, None).block_n
    few = few_rows(M, N, programs * grads, dx.element_size(), dwdb_block, x.device)
    corun = N >= SPLIT_DWDB_FROM and M >= CORUN_MIN_ROWS
    if fits and grads and corun and device_info(x.device).sm_count >= CORUN_MIN_SMS:
        layer_norm_bwd_corun_launch(dy, x, weight, mean, rstd, dx, dw, db, cfg, **CORUN)
        return
    if fits and grads and (N >= SPLIT_DWDB_FROM or few):
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
    blocks = triton.cdiv(M, cfg.rows)
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


def layer_norm_bwd_corun_launch(
    dy: torch.Tensor,  # [M, N], stride(1) == 1
    x: torch.Tensor,  # [M, N], stride(1) == 1
    weight: torch.Tensor | None,
    mean: torch.Tensor,  # [M] fp32
    rstd: torch.Tensor,  # [M] fp32
    dx: torch.Tensor,  # [M, N], stride(1) == 1
    dw: torch.Tensor | None,
    db: torch.Tensor | None,
    config: LaunchConfig,  # block_n >= N; num_warps for both kinds of program
    col_programs: int,  # programs for dW and dB; the rest of the SMs' programs write dx
    *,
    col_rows: int,  # rows per column step
    col_stages: int,  # column steps in flight
) -> None:
    """dx and dW/dB in one launch on different programs (`_layer_norm_bwd_corun_kernel`)."""
    M, N = x.shape
    dev = device_info(x.device)
    programs = dev.sm_count * config.programs_per_sm
    row_programs, col_programs, col_n = corun_programs(M, N, col_programs, programs)
    _layer_norm_bwd_corun_kernel[(row_programs + col_programs,)](
        *_bwd_tensors(dy, x, weight, mean, rstd, dx, dw, db),  # dW, dB in the partials' places
        M,
        N,
        dy.stride(0),
        x.stride(0),
        dx.stride(0),
        row_programs,
        HAS_WEIGHT=weight is not None,
        HAS_DW=dw is not None,
        HAS_DB=db is not None,
        BLOCK_N=config.block_n,
        COL_N=col_n,
        COL_ROWS=col_rows,
        COL_STAGES=col_stages,
        num_warps=config.num_warps,
        **pdl_args(dev),
    )


def layer_norm_dwdb_launch(
    dy: torch.Tensor,  # [M, N], stride(1) == 1
    x: torch.Tensor,  # [M, N], stride(1) == 1
    mean: torch.Tensor,  # [M] fp32
    rstd: torch.Tensor,  # [M] fp32
    dw: torch.Tensor | None,  # [N]
    db: torch.Tensor | None,  # [N]
    config: LaunchConfig | None = None,
) -> None:
    """dW and dB alone (the `dwdb` kernel): one program per column block of block_n, through
    every row; no partial rows."""
    M, N = x.shape
    if dw is None and db is None:
        return
    cfg = _config("bwd_dwdb", x, config)
    _layer_norm_dwdb_kernel[(triton.cdiv(N, cfg.block_n),)](
        dy,
        x,
        mean,
        rstd,
        dw if dw is not None else rstd,  # an absent gradient: a pointer never written
        db if db is not None else rstd,
        M,
        N,
        dy.stride(0),
        x.stride(0),
        HAS_DW=dw is not None,
        HAS_DB=db is not None,
        BLOCK_N=cfg.block_n,
        ROWS=cfg.rows,
        STAGES=cfg.num_stages,
        num_warps=cfg.num_warps,
        **pdl_args(device_info(x.device)),
    )


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
        if torch.compiler.is_compiling():
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
        if torch.compiler.is_compiling():
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
