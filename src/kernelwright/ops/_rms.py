"""The RMSNorm family's row kernels, shared by `rms_norm` and `fused_add_rms_norm`.

One kernel per form, with a switch for the residual: the forward's `HAS_RESIDUAL` adds x and
the residual (s = round(x + r) to the input dtype, stored, then normalized, as the unfused
model computes it); the backward's `HAS_DRES` adds the residual gradient to the row gradient
(ds = dres + the norm's dx). Both ops therefore round identically by construction.

Casting modes (see `rms_norm`): where (offset + w) and x_hat are rounded to the input dtype.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernelwright.ops._pdl import wait_for_inputs
from kernelwright.ops._row_block import load_rows, row_block, row_chunk
from kernelwright.runtime.fastlaunch import fast

CASTING_MODES = {"none": 0, "llama": 1, "gemma": 2}
# tl.constexpr globals: compiled kernels may read only constexpr globals.
_NONE, _LLAMA, _GEMMA = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)


@triton.jit
def weight_eff(w_ptr, cols, col_mask, offset, CASTING: tl.constexpr):
    # (offset + w) in the weight's dtype for llama/none, in fp32 for gemma.
    w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32) + offset
    if CASTING != _GEMMA:
        w = w.to(w_ptr.dtype.element_ty).to(tl.float32)
    return w


@triton.jit
def weight_row(
    w_ptr, N, offset, CASTING: tl.constexpr, HAS_WEIGHT: tl.constexpr, BLOCK_N: tl.constexpr
):
    # A row held by one program: its columns, their mask and (offset + w) over them (zeros,
    # unused, without a weight).
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    if HAS_WEIGHT:
        w = weight_eff(w_ptr, cols, col_mask, offset, CASTING)
    else:
        w = tl.zeros([BLOCK_N], dtype=tl.float32)
    return cols, col_mask, w


@triton.jit
def normalize(x, rstd, x_dtype: tl.constexpr, CASTING: tl.constexpr):
    # x_hat as the model computes it: rounded to the input dtype unless the mode is gemma.
    if CASTING == _NONE:
        rstd = rstd.to(x_dtype).to(tl.float32)
    x_hat = x * rstd
    if CASTING != _GEMMA:
        x_hat = x_hat.to(x_dtype).to(tl.float32)
    return x_hat


@triton.jit
def rms_dx(g, s_hat, c, rstd):
    # The norm's dx = rstd * (g - s_hat * c), c = mean(g * s_hat) over the row.
    return (g - s_hat * c) * rstd


@triton.jit
def ds_block(s, dy, dres, rstd, w, N, HAS_WEIGHT: tl.constexpr, HAS_DRES: tl.constexpr):
    # The row gradient of a [ROWS, BLOCK_N] block (fp32 s, dy, dres; rstd [ROWS, 1]):
    # g = dy * (offset + w);  ds = dres + rstd * (g - s_hat * mean(g * s_hat)).
    s_hat = s * rstd
    g = dy
    if HAS_WEIGHT:
        g = dy * w[None, :]
    c = tl.sum(g * s_hat, axis=1)[:, None] / N
    ds = rms_dx(g, s_hat, c, rstd)
    if HAS_DRES:
        ds += dres
    return ds


@fast
@triton.jit
def _rms_norm_fwd_kernel(
    x_ptr,
    r_ptr,
    w_ptr,
    y_ptr,
    s_ptr,
    rstd_ptr,  # x, r, y, s: [M, N] with row strides; w: [N]; rstd: [M] fp32
    M,
    N,
    stride_x,
    stride_r,
    stride_y,
    stride_s,
    eps,
    offset,
    CASTING: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,  # normalize s = x + r (stored) instead of x
    BLOCK_N: tl.constexpr,
    ROWS: tl.constexpr,
):
    # One program normalizes ROWS whole rows held in registers (BLOCK_N >= N). w is loaded
    # first, so that its latency overlaps x's.
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    if HAS_WEIGHT:
        w = weight_eff(w_ptr, cols, col_mask, offset, CASTING)
    if ROWS == 1:
        # One row: a 1-D block, no row mask (the grid has exactly M programs).
        row = tl.program_id(0).to(tl.int64)  # int64: row * stride may pass 2^31
        x = tl.load(x_ptr + row * stride_x + cols, mask=col_mask, other=0.0).to(tl.float32)
        if HAS_RESIDUAL:
            # s = round(x + r) (fp32 add, one rounding: torch's add); the norm reads that s
            r = tl.load(r_ptr + row * stride_r + cols, mask=col_mask, other=0.0).to(tl.float32)
            s = (x + r).to(s_ptr.dtype.element_ty)
            tl.store(s_ptr + row * stride_s + cols, s, mask=col_mask)
            x = s.to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, axis=0) / N + eps)
        y = normalize(x, rstd, x_ptr.dtype.element_ty, CASTING)
        if HAS_WEIGHT:
            y = y * w
        tl.store(y_ptr + row * stride_y + cols, y.to(y_ptr.dtype.element_ty), mask=col_mask)
        tl.store(rstd_ptr + row, rstd)
    else:
        rows, row_mask, mask = row_block(tl.program_id(0), M, col_mask, ROWS)
        x = load_rows(x_ptr, rows, stride_x, cols, mask)
        if HAS_RESIDUAL:
            r = load_rows(r_ptr, rows, stride_r, cols, mask)
            x = (x.to(tl.float32) + r.to(tl.float32)).to(s_ptr.dtype.element_ty)
            tl.store(s_ptr + rows[:, None] * stride_s + cols[None, :], x, mask=mask)
        x = x.to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, axis=1) / N + eps)  # [ROWS]
        y = normalize(x, rstd[:, None], x_ptr.dtype.element_ty, CASTING)
        if HAS_WEIGHT:
            y = y * w[None, :]
        y_ptrs = y_ptr + rows[:, None] * stride_y + cols[None, :]
        tl.store(y_ptrs, y.to(y_ptr.dtype.element_ty), mask=mask)
        tl.store(rstd_ptr + rows, rstd, mask=row_mask)


@fast
@triton.jit
def _rms_norm_fwd_looped_kernel(
    x_ptr,
    r_ptr,
    w_ptr,
    y_ptr,
    s_ptr,
    rstd_ptr,
    M,
    N,
    stride_x,
    stride_r,
    stride_y,
    stride_s,
    eps,
    offset,
    CASTING: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # Rows too long for registers: one pass for sum(x^2), a second (mostly from L2) to write y.
    # With the residual, pass 2 recomputes the same rounded s and writes it: each output is
    # written once, and nothing the program stored is read back.
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x
    if HAS_RESIDUAL:
        r_row = r_ptr + row * stride_r
    y_row = y_ptr + row * stride_y
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        col_mask = cols < N
        x = tl.load(x_row + cols, mask=col_mask, other=0.0).to(tl.float32)
        if HAS_RESIDUAL:
            r = tl.load(r_row + cols, mask=col_mask, other=0.0).to(tl.float32)
            x = (x + r).to(s_ptr.dtype.element_ty).to(tl.float32)
        acc += x * x
    rstd = tl.rsqrt(tl.sum(acc, axis=0) / N + eps)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        col_mask = cols < N
        x = tl.load(x_row + cols, mask=col_mask, other=0.0).to(tl.float32)
        if HAS_RESIDUAL:
            r = tl.load(r_row + cols, mask=col_mask, other=0.0).to(tl.float32)
            s = (x + r).to(s_ptr.dtype.element_ty)
            tl.store(s_ptr + row * stride_s + cols, s, mask=col_mask)
            x = s.to(tl.float32)
        y = normalize(x, rstd, x_ptr.dtype.element_ty, CASTING)
        if HAS_WEIGHT:
            y = y * weight_eff(w_ptr, cols, col_mask, offset, CASTING)
        tl.store(y_row + cols, y.to(y_ptr.dtype.element_ty), mask=col_mask)
    tl.store(rstd_ptr + row, rstd)


@triton.jit
def bwd_rows(
    dy_ptr,
    dres_ptr,
    x_ptr,
    rstd_ptr,
    dx_ptr,
    w,  # [BLOCK_N] fp32, offset + w (unused without HAS_WEIGHT)
    pid,  # this program
    step,  # rows from one of its blocks to the next: programs * ROWS
    M,
    N,
    stride_dy,
    stride_dres,
    stride_x,
    stride_dx,
    CASTING: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    HAS_DW: tl.constexpr,
    HAS_DRES: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ROWS: tl.constexpr,
    PREFETCH: tl.constexpr,
    SKIP_LAST: tl.constexpr,  # leave each program's last row block unwritten (parking kernel)
):
    # Persistent: program p takes row blocks p, p + P, ... writes their dx and returns its fp32
    # dW sum over them. g = dy * (offset + w);  dx = dres + rstd * (g - x_hat * mean(g * x_hat));
    # dW = sum_rows(dy * x_hat). PREFETCH: the next block's x, dy, dres and rstd are loaded (in
    # their own dtype) before this block's reductions, so one block's memory latency hides
    # behind the previous block's math.
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    dw_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    if PREFETCH:
        first, first_mask, mask0 = row_block(pid, M, col_mask, ROWS)
        x_next = load_rows(x_ptr, first, stride_x, cols, mask0)
        dy_next = load_rows(dy_ptr, first, stride_dy, cols, mask0)
        if HAS_DRES:
            dres_next = load_rows(dres_ptr, first, stride_dres, cols, mask0)
        rstd_next = tl.load(rstd_ptr + first, mask=first_mask, other=0.0)
    for block in range(pid, tl.cdiv(M, ROWS), tl.num_programs(0)):
        rows, row_mask, mask = row_block(block, M, col_mask, ROWS)
        if PREFETCH:
            x, dy, rstd = x_next, dy_next, rstd_next
            nxt = rows + step
            nmask = (nxt < M)[:, None] & col_mask[None, :]
            x_next = load_rows(x_ptr, nxt, stride_x, cols, nmask)
            dy_next = load_rows(dy_ptr, nxt, stride_dy, cols, nmask)
            if HAS_DRES:
                dres = dres_next.to(tl.float32)
                dres_next = load_rows(dres_ptr, nxt, stride_dres, cols, nmask)
            rstd_next = tl.load(rstd_ptr + nxt, mask=nxt < M, other=0.0)
        else:
            x = load_rows(x_ptr, rows, stride_x, cols, mask)
            dy = load_rows(dy_ptr, rows, stride_dy, cols, mask)
            if HAS_DRES:
                dres = load_rows(dres_ptr, rows, stride_dres, cols, mask).to(tl.float32)
            rstd = tl.load(rstd_ptr + rows, mask=row_mask, other=0.0)
        x = x.to(tl.float32)
        dy = dy.to(tl.float32)
        rstd = rstd[:, None]
        if HAS_DW:
            # dW sees x_hat as the forward multiplied it: rounded unless gemma.
            dw_acc += tl.sum(dy * normalize(x, rstd, x_ptr.dtype.element_ty, CASTING), axis=0)
        if HAS_DRES:
            dx = ds_block(x, dy, dres, rstd, w, N, HAS_WEIGHT, HAS_DRES)
        else:
            dx = ds_block(x, dy, dy, rstd, w, N, HAS_WEIGHT, HAS_DRES)
        if SKIP_LAST:
            # the last block waits for the parking kernel's phase 2 (the rows divide in blocks)
            mask = mask & (rows + step < M)[:, None]
        tl.store(
            dx_ptr + rows[:, None] * stride_dx + cols[None, :], dx.to(dx_ptr.dtype.element_ty), mask
        )
    return dw_acc


@fast
@triton.jit
def _rms_norm_bwd_kernel(
    dy_ptr,
    dres_ptr,
    x_ptr,
    w_ptr,
    rstd_ptr,
    dx_ptr,
    dw_partial_ptr,  # dy, dres, x, dx: [M, N] with row strides; dw_partial: [programs, N] fp32
    M,
    N,
    stride_dy,
    stride_dres,
    stride_x,
    stride_dx,
    offset,
    CASTING: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    HAS_DW: tl.constexpr,  # off: dW left to the column kernel (few rows, _partials.few_rows)
    HAS_DRES: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ROWS: tl.constexpr,
    PREFETCH: tl.constexpr,
    GDC_WAIT: tl.constexpr,  # launched with PDL (ops/_pdl.py)
):
    # Persistent (bwd_rows); each program keeps its dW sum in registers and stores it as its
    # own fp32 partial row, summed afterwards (_partials.sum_partials).
    wait_for_inputs(GDC_WAIT)  # before any load or store
    pid = tl.program_id(0)
    step = tl.num_programs(0) * ROWS
    cols, col_mask, w = weight_row(w_ptr, N, offset, CASTING, HAS_WEIGHT, BLOCK_N)
    dw_acc = bwd_rows(
        dy_ptr,
        dres_ptr,
        x_ptr,
        rstd_ptr,
        dx_ptr,
        w,
        pid,
        step,
        M,
        N,
        stride_dy,
        stride_dres,
        stride_x,
        stride_dx,
        CASTING,
        HAS_WEIGHT,
        HAS_DW,
        HAS_DRES,
        BLOCK_N,
        ROWS,
        PREFETCH,
        False,
    )
    if HAS_DW:
        tl.store(dw_partial_ptr + pid.to(tl.int64) * N + cols, dw_acc, mask=col_mask)


@fast
@triton.jit
def _rms_norm_bwd_looped_kernel(
    dy_ptr,
    dres_ptr,
    x_ptr,
    w_ptr,
    rstd_ptr,
    dx_ptr,
    dw_partial_ptr,
    M,
    N,
    stride_dy,
    stride_dres,
    stride_x,
    stride_dx,
    offset,
    CASTING: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    HAS_DW: tl.constexpr,
    HAS_DRES: tl.constexpr,
    BLOCK_N: tl.constexpr,
    GDC_WAIT: tl.constexpr,  # launched with PDL (ops/_pdl.py)
):
    # Long rows: pass 1 reduces sum(g * x_hat) over the row, pass 2 writes dx (adding dres, read
    # only here) and adds this row's dW contribution into the program's own fp32 partial row
    # (no atomics).
    wait_for_inputs(GDC_WAIT)  # before any load or store
    pid = tl.program_id(0)
    dw_row = dw_partial_ptr + pid.to(tl.int64) * N
    for row in range(pid, M, tl.num_programs(0)):
        row64 = tl.cast(row, tl.int64)  # a plain int under the interpreter: cast, not .to()
        x_row = x_ptr + row64 * stride_x
        dy_row = dy_ptr + row64 * stride_dy
        rstd = tl.load(rstd_ptr + row64)
        acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        for start in range(0, N, BLOCK_N):
            cols, col_mask, x, g = row_chunk(x_row, dy_row, start, N, BLOCK_N)
            if HAS_WEIGHT:
                g = g * weight_eff(w_ptr, cols, col_mask, offset, CASTING)
            acc += g * x * rstd
        c = tl.sum(acc, axis=0) / N
        for start in range(0, N, BLOCK_N):
            cols, col_mask, x, dy = row_chunk(x_row, dy_row, start, N, BLOCK_N)
            g = dy
            if HAS_WEIGHT:
                g = dy * weight_eff(w_ptr, cols, col_mask, offset, CASTING)
            if HAS_DW:
                x_cast = normalize(x, rstd, x_ptr.dtype.element_ty, CASTING)
                dw = tl.load(dw_row + cols, mask=col_mask, other=0.0)
                tl.store(dw_row + cols, dw + dy * x_cast, mask=col_mask)
            dx = rms_dx(g, x * rstd, c, rstd)
            if HAS_DRES:
                dres_row = dres_ptr + row64 * stride_dres
                dx += tl.load(dres_row + cols, mask=col_mask, other=0.0).to(tl.float32)
            tl.store(dx_ptr + row64 * stride_dx + cols, dx.to(dx_ptr.dtype.element_ty), col_mask)
