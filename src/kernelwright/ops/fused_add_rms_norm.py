"""Fused residual add + RMSNorm: s = x + residual;  y = s / sqrt(mean(s^2) + eps) * (offset + w).

Returns (y, s): s is the new residual stream (`residual_out`), rounded to the input dtype as a
Hugging Face decoder layer computes `hidden_states = residual + hidden_states`, and the norm
reads that rounded value. Casting modes and offset are those of `rms_norm` (see its module
docstring); the kernels reuse its `@triton.jit` helpers so both ops round identically.

Memory traffic, the reason to fuse: the forward reads x and residual once and writes y and s
once (unfused: the add reads 2 and writes 1, then the norm reads 1 and writes 1). The backward
reads s, dy and d_residual_out and writes ds once; ds is the gradient of both x and residual.
dW is summed in fp32 per program, then over programs: through fp32 partial rows, or, where those
rows would be a noticeable share of the memory (`PARK_SHARE`), through ds's own storage before
its last row blocks are written (the kernel's PARK; benchmarks/NOTES.md, issue 3, 47). At 16384
columns from CORUN_MIN_ROWS rows, ds and dW run in one launch on different programs reading the
same rows at about the same time (the corun kernel; NOTES 49).

Layer order: kernels → launchers → custom ops → autograd Function → `fused_add_rms_norm` →
`FusedAddRMSNorm`.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kernelwright.ops._partials import corun_programs, few_rows, sum_partials
from kernelwright.ops._pdl import wait_for_inputs
from kernelwright.ops._split import GENERATION, arrive, grid_counter, wait_until

# The jit helpers resolve their constexpr globals (_NONE/_LLAMA/_GEMMA) in rms_norm's module,
# so sharing them keeps the two ops' roundings identical by construction.
from kernelwright.ops.rms_norm import (
    CASTING_MODES,
    _dw_block,
    _normalize,
    _output_dtype,
    _weight_eff,
    rms_norm_dw_launch,
    rms_norm_eager,
    rms_norm_ref,
)
from kernelwright.runtime import device_info, lookup
from kernelwright.runtime.alloc import empty
from kernelwright.runtime.checks import check_same_device, check_shape, check_tensor, rows_view
from kernelwright.runtime.launch import LaunchConfig, pdl_args
from kernelwright.runtime.tables.fused_add_rms_norm import TABLE

_OP = "fused_add_rms_norm"

# As rms_norm's EARLY_WEIGHT_MAX_N: w before x for rows of up to this many columns.
EARLY_WEIGHT_MAX_N = 2**31 - 1

# --------------------------------------------------------------------------- kernels


@triton.jit
def _fused_add_rms_norm_fwd_kernel(
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
    BLOCK_N: tl.constexpr,
    ROWS: tl.constexpr,
    EARLY_WEIGHT: tl.constexpr,  # w loaded before x (see EARLY_WEIGHT_MAX_N)
):
    # One program adds and normalizes ROWS whole rows held in registers (BLOCK_N >= N).
    # s = round(x + r) to the input dtype (fp32 add, one rounding: what torch's add does);
    # the norm then reads the rounded s, exactly as the unfused model code does.
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    if HAS_WEIGHT and EARLY_WEIGHT:
        w = _weight_eff(w_ptr, cols, col_mask, offset, CASTING)  # first: overlaps x's latency
    if ROWS == 1:
        # One row: a 1-D block, no row mask (the grid has exactly M programs).
        row = tl.program_id(0).to(tl.int64)  # int64: row * stride may pass 2^31
        x = tl.load(x_ptr + row * stride_x + cols, mask=col_mask, other=0.0).to(tl.float32)
        r = tl.load(r_ptr + row * stride_r + cols, mask=col_mask, other=0.0).to(tl.float32)
        s = (x + r).to(s_ptr.dtype.element_ty)
        tl.store(s_ptr + row * stride_s + cols, s, mask=col_mask)
        s = s.to(tl.float32)
        rstd = tl.rsqrt(tl.sum(s * s, axis=0) / N + eps)
        if HAS_WEIGHT and not EARLY_WEIGHT:
            w = _weight_eff(w_ptr, cols, col_mask, offset, CASTING)
        y = _normalize(s, rstd, s_ptr.dtype.element_ty, CASTING)
        if HAS_WEIGHT:
            y = y * w
        tl.store(y_ptr + row * stride_y + cols, y.to(y_ptr.dtype.element_ty), mask=col_mask)
        tl.store(rstd_ptr + row, rstd)
    else:
        rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)  # int64 offsets
        row_mask = rows < M
        mask = row_mask[:, None] & col_mask[None, :]
        x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
        r = tl.load(r_ptr + rows[:, None] * stride_r + cols[None, :], mask=mask, other=0.0)
        s = (x.to(tl.float32) + r.to(tl.float32)).to(s_ptr.dtype.element_ty)
        tl.store(s_ptr + rows[:, None] * stride_s + cols[None, :], s, mask=mask)
        s = s.to(tl.float32)
        rstd = tl.rsqrt(tl.sum(s * s, axis=1) / N + eps)  # [ROWS]
        if HAS_WEIGHT and not EARLY_WEIGHT:
            w = _weight_eff(w_ptr, cols, col_mask, offset, CASTING)
        y = _normalize(s, rstd[:, None], s_ptr.dtype.element_ty, CASTING)
        if HAS_WEIGHT:
            y = y * w[None, :]
        y_ptrs = y_ptr + rows[:, None] * stride_y + cols[None, :]
        tl.store(y_ptrs, y.to(y_ptr.dtype.element_ty), mask=mask)
        tl.store(rstd_ptr + rows, rstd, mask=row_mask)


@triton.jit
def _fused_add_rms_norm_fwd_looped_kernel(
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
    BLOCK_N: tl.constexpr,
):
    # Rows too long for registers: pass 1 reduces sum(s^2); pass 2 re-reads x and r (mostly
    # from L2), recomputes the same rounded s and writes s and y. Writing s in pass 2, not
    # pass 1, keeps each output written once and never reads back what the program stored.
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x
    r_row = r_ptr + row * stride_r
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        col_mask = cols < N
        x = tl.load(x_row + cols, mask=col_mask, other=0.0).to(tl.float32)
        r = tl.load(r_row + cols, mask=col_mask, other=0.0).to(tl.float32)
        s = (x + r).to(s_ptr.dtype.element_ty).to(tl.float32)
        acc += s * s
    rstd = tl.rsqrt(tl.sum(acc, axis=0) / N + eps)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        col_mask = cols < N
        x = tl.load(x_row + cols, mask=col_mask, other=0.0).to(tl.float32)
        r = tl.load(r_row + cols, mask=col_mask, other=0.0).to(tl.float32)
        s = (x + r).to(s_ptr.dtype.element_ty)
        tl.store(s_ptr + row * stride_s + cols, s, mask=col_mask)
        y = _normalize(s.to(tl.float32), rstd, s_ptr.dtype.element_ty, CASTING)
        if HAS_WEIGHT:
            y = y * _weight_eff(w_ptr, cols, col_mask, offset, CASTING)
        tl.store(y_ptr + row * stride_y + cols, y.to(y_ptr.dtype.element_ty), mask=col_mask)
    tl.store(rstd_ptr + row, rstd)


@triton.jit
def _ds_block(s, dy, dres, rstd, w, N, HAS_WEIGHT: tl.constexpr, HAS_DRES: tl.constexpr):
    # ds of a [ROWS, BLOCK_N] block (fp32 s, dy, dres; rstd [ROWS, 1]):
    # g = dy * (offset + w);  ds = dres + rstd * (g - s_hat * mean(g * s_hat)).
    s_hat = s * rstd
    g = dy
    if HAS_WEIGHT:
        g = dy * w[None, :]
    c = tl.sum(g * s_hat, axis=1)[:, None] / N
    ds = (g - s_hat * c) * rstd
    if HAS_DRES:
        ds += dres
    return ds


@triton.jit
def _last_block(pid, programs, blocks):
    """The last of row blocks pid, pid + programs, ... below `blocks` (program pid's last)."""
    return pid + programs * ((blocks - 1 - pid) // programs)


@triton.jit
def _fused_add_rms_norm_bwd_kernel(
    dy_ptr,
    dres_ptr,
    s_ptr,
    w_ptr,
    rstd_ptr,
    ds_ptr,
    dw_partial_ptr,  # dy, dres, s, ds: [M, N] with row strides; dw_partial: [programs, N] fp32
    park_ptr,  # PARK: ds's storage as fp32 words (contiguous ds); dw_partial unused
    dw_ptr,  # PARK: [N], the weight's dtype
    sync_ptr,  # PARK: int64 [1], the barrier's generation counter (_split.grid_counter)
    M,
    N,
    stride_dy,
    stride_dres,
    stride_s,
    stride_ds,
    park_step,  # PARK: fp32 words per row block of ds
    SLICE,  # PARK: N / programs, the dW columns each program sums
    offset,
    CASTING: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    HAS_DW: tl.constexpr,  # off: dW left to rms_norm's dw kernel (few rows, _partials.few_rows)
    HAS_DRES: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ROWS: tl.constexpr,
    PREFETCH: tl.constexpr,
    PARK: tl.constexpr,  # dW parked in ds, no partial rows (see below and the launcher)
    PHASE: tl.constexpr,  # PARK: 0 in one launch (waits), 1 then 2 in two launches (no waits)
    BLOCK_P: tl.constexpr,  # PARK: programs, to a power of two
    BLOCK_S: tl.constexpr,  # PARK: SLICE, to a power of two
    GDC_WAIT: tl.constexpr,  # launched with PDL (ops/_pdl.py)
):
    # Persistent: program p takes row blocks p, p + P, ... and keeps its dW sum in registers.
    # s feeds both outputs, so its gradient is the residual gradient plus the norm's (_ds_block);
    # dW = sum_rows(dy * s_hat);  dx = d_residual = ds.
    # PREFETCH: the next block's s, dy, dres and rstd are loaded (in their own dtype) before
    # this block's reductions, so one block's memory latency hides behind the previous one's math.
    # PARK: no fp32 partial rows. Program j leaves its last row block of ds unwritten until the
    # end: its storage takes the dW columns [j * SLICE, (j + 1) * SLICE) of every program's sum
    # (program q's at word q * SLICE; P * SLICE = N words fit, since rows x element size >= 4
    # bytes). Phase 1: the rows, then this program's dW sum scattered to its P owners. Phase 2,
    # once every program has arrived (a grid barrier): this program sums its slice in a fixed
    # order, stores it to dW, then recomputes its last block's ds and stores it over the slice.
    # No other program reads that storage, so one barrier is enough.
    wait_for_inputs(GDC_WAIT)  # before any load or store
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    blocks = tl.cdiv(M, ROWS)
    step = programs * ROWS
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    if HAS_WEIGHT:
        w = _weight_eff(w_ptr, cols, col_mask, offset, CASTING)
    else:
        w = tl.zeros([BLOCK_N], dtype=tl.float32)  # unused
    if PHASE <= 1:
        dw_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        if PREFETCH:
            first = tl.cast(pid, tl.int64) * ROWS + tl.arange(0, ROWS)
            mask0 = (first < M)[:, None] & col_mask[None, :]
            s_ptrs = s_ptr + first[:, None] * stride_s + cols[None, :]
            s_next = tl.load(s_ptrs, mask=mask0, other=0.0)
            dy_ptrs = dy_ptr + first[:, None] * stride_dy + cols[None, :]
            dy_next = tl.load(dy_ptrs, mask=mask0, other=0.0)
            if HAS_DRES:
                dres_ptrs = dres_ptr + first[:, None] * stride_dres + cols[None, :]
                dres_next = tl.load(dres_ptrs, mask=mask0, other=0.0)
            rstd_next = tl.load(rstd_ptr + first, mask=first < M, other=0.0)
        for block in range(pid, blocks, programs):
            rows = tl.cast(block, tl.int64) * ROWS + tl.arange(0, ROWS)  # int64 offsets
            row_mask = rows < M
            mask = row_mask[:, None] & col_mask[None, :]
            dres = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)  # unused without HAS_DRES
            if PREFETCH:
                s, dy, rstd = s_next, dy_next, rstd_next
                nxt = rows + step
                nmask = (nxt < M)[:, None] & col_mask[None, :]
                s_ptrs = s_ptr + nxt[:, None] * stride_s + cols[None, :]
                s_next = tl.load(s_ptrs, mask=nmask, other=0.0)
                dy_ptrs = dy_ptr + nxt[:, None] * stride_dy + cols[None, :]
                dy_next = tl.load(dy_ptrs, mask=nmask, other=0.0)
                if HAS_DRES:
                    dres = dres_next.to(tl.float32)
                    dres_ptrs = dres_ptr + nxt[:, None] * stride_dres + cols[None, :]
                    dres_next = tl.load(dres_ptrs, mask=nmask, other=0.0)
                rstd_next = tl.load(rstd_ptr + nxt, mask=nxt < M, other=0.0)
            else:
                s = tl.load(s_ptr + rows[:, None] * stride_s + cols[None, :], mask=mask, other=0.0)
                dy_ptrs = dy_ptr + rows[:, None] * stride_dy + cols[None, :]
                dy = tl.load(dy_ptrs, mask=mask, other=0.0)
                if HAS_DRES:
                    dres_ptrs = dres_ptr + rows[:, None] * stride_dres + cols[None, :]
                    dres = tl.load(dres_ptrs, mask=mask, other=0.0).to(tl.float32)
                rstd = tl.load(rstd_ptr + rows, mask=row_mask, other=0.0)
            s = s.to(tl.float32)
            dy = dy.to(tl.float32)
            rstd = rstd[:, None]
            if HAS_DW:
                # dW sees s_hat as the forward multiplied it: rounded unless gemma.
                dw_acc += tl.sum(dy * _normalize(s, rstd, s_ptr.dtype.element_ty, CASTING), axis=0)
            ds = _ds_block(s, dy, dres, rstd, w, N, HAS_WEIGHT, HAS_DRES)
            if PARK:
                # the last block waits for phase 2 (the rows divide into full blocks)
                mask = mask & (rows + step < M)[:, None]
            ds_ptrs = ds_ptr + rows[:, None] * stride_ds + cols[None, :]
            tl.store(ds_ptrs, ds.to(ds_ptr.dtype.element_ty), mask)
        if PARK:
            # column c of this program's sum: to program c // SLICE, word pid * SLICE + c % SLICE
            owner = cols // SLICE
            own = tl.cast(_last_block(owner, programs, blocks), tl.int64) * park_step
            tl.store(park_ptr + own + pid * SLICE + cols % SLICE, dw_acc, mask=col_mask)
        elif HAS_DW:
            tl.store(dw_partial_ptr + pid.to(tl.int64) * N + cols, dw_acc, mask=col_mask)
    if PARK and PHASE == 0:
        target = arrive(sync_ptr, programs, GENERATION)  # this program's sum is parked
    if PARK and PHASE != 1:
        # the last block's ds, recomputed (its inputs were read a moment ago: L2) while the
        # other programs arrive; stored once this program's slice has been summed
        rows = tl.cast(_last_block(pid, programs, blocks), tl.int64) * ROWS
        rows += tl.arange(0, ROWS)
        row_mask = rows < M
        mask = row_mask[:, None] & col_mask[None, :]
        s = tl.load(s_ptr + rows[:, None] * stride_s + cols[None, :], mask=mask, other=0.0)
        dy_ptrs = dy_ptr + rows[:, None] * stride_dy + cols[None, :]
        dy = tl.load(dy_ptrs, mask=mask, other=0.0).to(tl.float32)
        dres = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
        if HAS_DRES:
            dres_ptrs = dres_ptr + rows[:, None] * stride_dres + cols[None, :]
            dres = tl.load(dres_ptrs, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(rstd_ptr + rows, mask=row_mask, other=0.0)[:, None]
        ds = _ds_block(s.to(tl.float32), dy, dres, rstd, w, N, HAS_WEIGHT, HAS_DRES)
        if PHASE == 0:
            wait_until(sync_ptr, target)  # every program's sum parked
        own = tl.cast(_last_block(pid, programs, blocks), tl.int64) * park_step
        q = tl.arange(0, BLOCK_P)
        j = tl.arange(0, BLOCK_S)
        m = (q < programs)[:, None] & (j < SLICE)[None, :]
        parked = tl.load(park_ptr + own + q[:, None] * SLICE + j[None, :], mask=m, other=0.0)
        dw_cols = pid * SLICE + j
        dw = tl.sum(parked, axis=0)  # a fixed order, whatever the timing
        tl.store(dw_ptr + dw_cols, dw.to(dw_ptr.dtype.element_ty), mask=j < SLICE)
        tl.debug_barrier()  # every thread's loads of the slice done before ds goes over it
        ds_ptrs = ds_ptr + rows[:, None] * stride_ds + cols[None, :]
        tl.store(ds_ptrs, ds.to(ds_ptr.dtype.element_ty), mask)


@triton.jit
def _fused_add_rms_norm_bwd_corun_kernel(
    dy_ptr,
    dres_ptr,
    s_ptr,
    w_ptr,
    rstd_ptr,
    ds_ptr,
    dw_ptr,  # dy, dres, s, ds: [M, N] with row strides; dw: [N], the weight's dtype
    M,
    N,
    stride_dy,
    stride_dres,
    stride_s,
    stride_ds,
    offset,
    ROW_PROGRAMS,  # programs 0 .. ROW_PROGRAMS - 1 write ds; the others dW
    CASTING: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    HAS_DRES: tl.constexpr,
    BLOCK_N: tl.constexpr,  # >= N: a row of ds held by one program
    COL_N: tl.constexpr,  # columns per dW program
    COL_ROWS: tl.constexpr,  # rows per dW step
    COL_STAGES: tl.constexpr,  # dW steps in flight (tl.range's software pipeline)
    GDC_WAIT: tl.constexpr,  # launched with PDL (ops/_pdl.py)
):
    # ds and dW in one launch, on different programs reading the same rows at about the same
    # time (as layer_norm's `_layer_norm_bwd_corun_kernel`): row programs walk rows p, p +
    # ROW_PROGRAMS, ... (ds, as the fused kernel without dW); column program c walks every row in
    # order for its COL_N columns and stores dW itself. Whichever reads a row of s and dy first
    # brings it from memory, the other finds it in L2. Nothing waits.
    wait_for_inputs(GDC_WAIT)  # before any load or store
    pid = tl.program_id(0)
    if pid < ROW_PROGRAMS:
        cols = tl.arange(0, BLOCK_N)
        col_mask = cols < N
        if HAS_WEIGHT:
            w = _weight_eff(w_ptr, cols, col_mask, offset, CASTING)
        else:
            w = tl.zeros([BLOCK_N], dtype=tl.float32)  # unused
        for row in range(pid, M, ROW_PROGRAMS):
            rows = tl.cast(row, tl.int64) + tl.arange(0, 1)
            mask = (rows < M)[:, None] & col_mask[None, :]
            s = tl.load(s_ptr + rows[:, None] * stride_s + cols[None, :], mask=mask, other=0.0)
            dy_ptrs = dy_ptr + rows[:, None] * stride_dy + cols[None, :]
            dy = tl.load(dy_ptrs, mask=mask, other=0.0).to(tl.float32)
            dres = tl.zeros([1, BLOCK_N], dtype=tl.float32)
            if HAS_DRES:
                dres_ptrs = dres_ptr + rows[:, None] * stride_dres + cols[None, :]
                dres = tl.load(dres_ptrs, mask=mask, other=0.0).to(tl.float32)
            rstd = tl.load(rstd_ptr + rows)[:, None]
            ds = _ds_block(s.to(tl.float32), dy, dres, rstd, w, N, HAS_WEIGHT, HAS_DRES)
            ds_ptrs = ds_ptr + rows[:, None] * stride_ds + cols[None, :]
            tl.store(ds_ptrs, ds.to(ds_ptr.dtype.element_ty), mask)
    else:  # names of their own: a runtime branch's values must match in type across branches
        c_cols = (pid - ROW_PROGRAMS) * COL_N + tl.arange(0, COL_N)
        c_mask = c_cols < N
        dw_acc = tl.zeros([COL_ROWS, COL_N], dtype=tl.float32)
        for r0 in tl.range(0, M, COL_ROWS, num_stages=COL_STAGES):
            c_rows = tl.cast(r0, tl.int64) + tl.arange(0, COL_ROWS)
            c_row_mask = c_rows < M
            tile = c_row_mask[:, None] & c_mask[None, :]
            c_s_ptrs = s_ptr + c_rows[:, None] * stride_s + c_cols[None, :]
            c_s = tl.load(c_s_ptrs, mask=tile, other=0.0).to(tl.float32)
            c_dy_ptrs = dy_ptr + c_rows[:, None] * stride_dy + c_cols[None, :]
            c_dy = tl.load(c_dy_ptrs, mask=tile, other=0.0).to(tl.float32)  # 0 outside
            c_rstd = tl.load(rstd_ptr + c_rows, mask=c_row_mask, other=0.0)[:, None]
            # dW sees s_hat as the forward multiplied it: rounded unless gemma.
            dw_acc += c_dy * _normalize(c_s, c_rstd, s_ptr.dtype.element_ty, CASTING)
        dw = tl.sum(dw_acc, axis=0)
        tl.store(dw_ptr + c_cols, dw.to(dw_ptr.dtype.element_ty), mask=c_mask)


@triton.jit
def _fused_add_rms_norm_bwd_looped_kernel(
    dy_ptr,
    dres_ptr,
    s_ptr,
    w_ptr,
    rstd_ptr,
    ds_ptr,
    dw_partial_ptr,
    M,
    N,
    stride_dy,
    stride_dres,
    stride_s,
    stride_ds,
    offset,
    CASTING: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    HAS_DW: tl.constexpr,
    HAS_DRES: tl.constexpr,
    BLOCK_N: tl.constexpr,
    GDC_WAIT: tl.constexpr,  # launched with PDL (ops/_pdl.py)
):
    # Long rows: pass 1 reduces sum(g * s_hat) over the row; pass 2 writes ds (adding dres,
    # read only here) and adds this row's dW contribution into the program's own fp32 partial
    # row (no atomics).
    wait_for_inputs(GDC_WAIT)  # before any load or store
    pid = tl.program_id(0)
    dw_row = dw_partial_ptr + pid.to(tl.int64) * N
    for row in range(pid, M, tl.num_programs(0)):
        row64 = tl.cast(row, tl.int64)  # a plain int under the interpreter: cast, not .to()
        s_row = s_ptr + row64 * stride_s
        dy_row = dy_ptr + row64 * stride_dy
        rstd = tl.load(rstd_ptr + row64)
        acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        for start in range(0, N, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            col_mask = cols < N
            s = tl.load(s_row + cols, mask=col_mask, other=0.0).to(tl.float32)
            g = tl.load(dy_row + cols, mask=col_mask, other=0.0).to(tl.float32)
            if HAS_WEIGHT:
                g = g * _weight_eff(w_ptr, cols, col_mask, offset, CASTING)
            acc += g * s * rstd
        c = tl.sum(acc, axis=0) / N
        for start in range(0, N, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            col_mask = cols < N
            s = tl.load(s_row + cols, mask=col_mask, other=0.0).to(tl.float32)
            dy = tl.load(dy_row + cols, mask=col_mask, other=0.0).to(tl.float32)
            g = dy
            if HAS_WEIGHT:
                g = dy * _weight_eff(w_ptr, cols, col_mask, offset, CASTING)
            if HAS_DW:
                s_cast = _normalize(s, rstd, s_ptr.dtype.element_ty, CASTING)
                dw = tl.load(dw_row + cols, mask=col_mask, other=0.0)
                tl.store(dw_row + cols, dw + dy * s_cast, mask=col_mask)
            ds = (g - s * rstd * c) * rstd
            if HAS_DRES:
                dres_row = dres_ptr + row64 * stride_dres
                ds += tl.load(dres_row + cols, mask=col_mask, other=0.0).to(tl.float32)
            tl.store(ds_ptr + row64 * stride_ds + cols, ds.to(ds_ptr.dtype.element_ty), col_mask)


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
        CASTING=CASTING_MODES[casting_mode], HAS_WEIGHT=weight is not None, BLOCK_N=cfg.block_n
    )
    args = (x, residual, weight if weight is not None else x, y, residual_out, rstd, M, N)
    args += (x.stride(0), residual.stride(0), y.stride(0), residual_out.stride(0), eps, offset)
    if cfg.block_n >= N:
        grid = (triton.cdiv(M, cfg.rows),)
        early = cfg.block_n <= EARLY_WEIGHT_MAX_N
        _fused_add_rms_norm_fwd_kernel[grid](
            *args, ROWS=cfg.rows, EARLY_WEIGHT=early, num_warps=cfg.num_warps, **common
        )
    else:
        _fused_add_rms_norm_fwd_looped_kernel[(M,)](*args, num_warps=cfg.num_warps, **common)


# Where the fp32 partial rows (one per program) would pass this share of ds's bytes, the
# backward parks dW in ds instead (`_park_programs`): at 2048-4096 tokens of 4096 they are 2 MB,
# 6-13% of ds and all the memory torch.compile's backward does not take; parking costs ~2 us of
# fwd+bwd there (the cooperative launch), nothing alone (H200, NOTES 47). Past a quarter
# (_partials.PARTIALS_SHARE) the few-rows column kernel takes dW instead.
PARK_SHARE = 1 / 20
# The parking backward runs P programs, P dividing N into slices of whole 128-byte lines (32 fp32
# words), but not fewer than this share of the SMs (4096 columns: 128 programs of 32 columns on
# a 132-SM GPU). Fewer programs than SMs read less (64 programs: 1.6x the time), and at 3584
# columns 128 programs of 28 columns ran 17-20% slower than partial rows where 112 of 32 ran 7%
# slower (not understood; NOTES 47).
PARK_MIN_SHARE = 0.9
PARK_SLICE_WORDS = 32
COOPERATIVE = True  # launched cooperatively (off only to time what that costs)

# From this row length (where a row still fits one program) and CORUN_MIN_ROWS rows, ds and dW
# run in one launch on different programs walking the rows at once (as layer_norm's CORUN): 64
# programs for dW (256 columns each, 16-row steps, 3 in flight), the rest of the SMs for ds.
# H200 at 16384 columns, 4096-16384 rows: 0.316 ms against the fused kernel's 0.338 at 8192
# rows, -6 to -8%; 4 in flight was up to 1.5x slower (benchmarks/corun_probe.py; NOTES 49).
CORUN_FROM = 16384
CORUN_MIN_ROWS = 4096
CORUN = {"col_programs": 64, "col_rows": 16, "col_stages": 3}
CORUN_MIN_SMS = 120  # swept on 132-SM GPUs; with fewer, ds would lose too many SMs to dW


def _park_programs(M: int, N: int, cfg: LaunchConfig, ds: torch.Tensor, inputs, device) -> int:
    """How many programs the fused backward runs to park dW in ds instead of fp32 partial rows
    (the kernel's PARK), or 0 where it cannot: each program on an SM of its own
    (programs_per_sm = 1, so a cooperative launch holds them all and the grid barrier cannot
    wait on a program without an SM), a row block of ds wide enough for an fp32 row (rows x
    element size >= 4 bytes), full blocks (rows divide M), a program count P that divides N
    into slices of PARK_SLICE_WORDS columns or a multiple (each program sums one slice of every
    program's dW) within PARK_MIN_SHARE of the SMs and at most the row blocks, ds one contiguous
    piece of memory, and no input sharing its storage (the last block's ds is recomputed from
    them)."""
    storage = ds.untyped_storage().data_ptr()
    if not (
        cfg.programs_per_sm == 1
        and cfg.rows * ds.element_size() >= 4
        and M % cfg.rows == 0
        and ds.is_contiguous()
        and all(t is None or t.untyped_storage().data_ptr() != storage for t in inputs)
    ):
        return 0
    most = min(M // cfg.rows, device.sm_count)
    for programs in range(most, max(1, math.ceil(PARK_MIN_SHARE * device.sm_count)) - 1, -1):
        if N % programs == 0 and (N // programs) % PARK_SLICE_WORDS == 0:
            return programs
    return 0


def fused_add_rms_norm_bwd_corun_launch(
    dy: torch.Tensor,  # [M, N], stride(1) == 1
    d_residual_out: torch.Tensor | None,
    residual_out: torch.Tensor,  # [M, N], stride(1) == 1
    weight: torch.Tensor,
    rstd: torch.Tensor,  # [M] fp32
    ds: torch.Tensor,  # [M, N], stride(1) == 1
    dw: torch.Tensor,  # [N]
    offset: float,
    casting_mode: str,
    config: LaunchConfig,  # block_n >= N; num_warps for both kinds of program
    col_programs: int,  # programs for dW; the rest of the SMs' programs write ds
    *,
    col_rows: int,  # rows per column step
    col_stages: int,  # column steps in flight
) -> None:
    """ds and dW in one launch on different programs (`_fused_add_rms_norm_bwd_corun_kernel`)."""
    M, N = residual_out.shape
    dev = device_info(ds.device)
    programs = dev.sm_count * config.programs_per_sm
    row_programs, col_programs, col_n = corun_programs(M, N, col_programs, programs)
    has_dres = d_residual_out is not None
    _fused_add_rms_norm_bwd_corun_kernel[(row_programs + col_programs,)](
        dy,
        d_residual_out if has_dres else dy,
        residual_out,
        weight,
        rstd,
        ds,
        dw,
        M,
        N,
        dy.stride(0),
        d_residual_out.stride(0) if has_dres else 0,
        residual_out.stride(0),
        ds.stride(0),
        offset,
        row_programs,
        CASTING=CASTING_MODES[casting_mode],
        HAS_WEIGHT=True,
        HAS_DRES=has_dres,
        BLOCK_N=config.block_n,
        COL_N=col_n,
        COL_ROWS=col_rows,
        COL_STAGES=col_stages,
        num_warps=config.num_warps,
        **pdl_args(dev),
    )


def _park_phases(device) -> tuple[int, ...]:
    """The parking kernel's PHASE per launch: (0,) in one launch that waits at its barrier (a
    GPU); (1, 2) without waiting (the interpreter runs programs one after another)."""
    return (0,) if device.backend == "cuda" else (1, 2)


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
    row_blocks = triton.cdiv(M, cfg.rows) if fits else M
    device = device_info(ds.device)
    programs = max(1, min(row_blocks, device.sm_count * cfg.programs_per_sm))
    has_dw = weight is not None and dw is not None
    corun = N >= CORUN_FROM and M >= CORUN_MIN_ROWS and device.sm_count >= CORUN_MIN_SMS
    if has_dw and fits and corun and park is not True:
        args = (dy, d_residual_out, residual_out, weight, rstd, ds, dw, offset, casting_mode)
        fused_add_rms_norm_bwd_corun_launch(*args, cfg, **CORUN)
        return
    block = _dw_block(residual_out)
    few = has_dw and fits and few_rows(M, N, programs, ds.element_size(), block, ds.device)
    parked = 0
    large = programs * N * 4 > PARK_SHARE * M * N * ds.element_size()  # the partial rows
    if has_dw and fits and (park or (park is None and large and not few)):
        inputs = (dy, d_residual_out, residual_out, rstd)
        parked = _park_programs(M, N, cfg, ds, inputs, device)
    if park and not parked:
        raise ValueError(f"{_OP}: park=True, but this call cannot park dW in ds (_park_programs)")
    if few and not parked:
        # dW first, should ds share dy's storage: the dw kernel reads dy
        rms_norm_dw_launch(dy, residual_out, rstd, dw, casting_mode)
        has_dw = False
    has_dres = d_residual_out is not None
    partial = None
    if has_dw and not parked:
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
    )
    tail = (M, N, dy.stride(0), d_residual_out.stride(0) if has_dres else 0)
    tail += (residual_out.stride(0), ds.stride(0))
    common = dict(
        CASTING=CASTING_MODES[casting_mode],
        HAS_WEIGHT=weight is not None,
        HAS_DW=has_dw,
        HAS_DRES=has_dres,
        BLOCK_N=cfg.block_n,
        **pdl_args(device),  # its launch overlaps the kernel before it
    )
    if not fits:
        args += (partial if partial is not None else rstd,)
        _fused_add_rms_norm_bwd_looped_kernel[(programs,)](
            *args, *tail, offset, num_warps=cfg.num_warps, **common
        )
    elif parked:
        # ds as fp32 words: program j's last row block takes column slice j of every dW sum
        park_step = cfg.rows * N * ds.element_size() // 4
        if device.backend == "cuda":
            sync = grid_counter(ds.device)
        else:  # the interpreter: a counter for a PHASE 0 launch of one program (tests)
            sync = torch.zeros(1, dtype=torch.int64, device=ds.device)
        args += (rstd, ds.view(-1).view(torch.float32), dw, sync)
        coop = COOPERATIVE and device.backend == "cuda"
        cooperative = {"launch_cooperative_grid": True} if coop else {}
        for phase in _park_phases(device):
            _fused_add_rms_norm_bwd_kernel[(parked,)](
                *args,
                *tail,
                park_step,
                N // parked,
                offset,
                ROWS=cfg.rows,
                PREFETCH=cfg.num_stages > 1,
                PARK=True,
                PHASE=phase,
                BLOCK_P=triton.next_power_of_2(parked),
                BLOCK_S=triton.next_power_of_2(N // parked),
                num_warps=cfg.num_warps,
                **cooperative,
                **common,
            )
    else:
        args += (partial if partial is not None else rstd, rstd, rstd, rstd)
        _fused_add_rms_norm_bwd_kernel[(programs,)](
            *args,
            *tail,
            0,
            1,
            offset,
            ROWS=cfg.rows,
            PREFETCH=cfg.num_stages > 1,
            PARK=False,
            PHASE=0,
            BLOCK_P=1,
            BLOCK_S=1,
            num_warps=cfg.num_warps,
            **common,
        )
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
        if torch.compiler.is_compiling():
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
            if torch.compiler.is_compiling():
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
