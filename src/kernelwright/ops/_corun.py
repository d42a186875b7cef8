"""Co-running norm backwards: the row gradient and the parameter gradients in one launch, on
different programs reading the same rows at about the same time.

Row programs 0 .. ROW_PROGRAMS - 1 walk rows p, p + ROW_PROGRAMS, ... and write the row
gradient (as the fused backward without dW); column program c walks every row in order for its
COL_N columns (`_norm_reduce.column_tile`) and stores dW (dB) itself, with no partial rows.
Whichever reads a row first brings it from memory; the other, a moment later, finds it in L2,
where a row kernel and a column kernel one after the other would read x and dy twice from
memory. Nothing waits on anything: only the timing makes the second read cheap, never the
result.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernelwright.ops._ln import ln_dx, weight_fp32, x_hat_g
from kernelwright.ops._norm_reduce import column_tile
from kernelwright.ops._pdl import wait_for_inputs
from kernelwright.ops._rms import CASTING_MODES, ds_block, weight_row
from kernelwright.runtime import device_info
from kernelwright.runtime.fastlaunch import fast
from kernelwright.runtime.launch import LaunchConfig, cdiv, next_pow2, pdl_args


@triton.jit
def _column_programs(
    dy_ptr,
    x_ptr,
    mean_ptr,
    rstd_ptr,
    dw_ptr,
    db_ptr,
    c,  # this column program's index
    M,
    N,
    stride_dy,
    stride_x,
    CENTERED: tl.constexpr,
    CASTING: tl.constexpr,
    HAS_DW: tl.constexpr,
    HAS_DB: tl.constexpr,
    COL_N: tl.constexpr,
    COL_ROWS: tl.constexpr,
    COL_STAGES: tl.constexpr,
):
    # names of their own: a runtime branch's values must match in type across branches
    c_cols = c * COL_N + tl.arange(0, COL_N)
    c_mask = c_cols < N
    dw_acc = tl.zeros([COL_ROWS, COL_N], dtype=tl.float32)
    db_acc = tl.zeros([COL_ROWS, COL_N], dtype=tl.float32)
    for r0 in tl.range(0, M, COL_ROWS, num_stages=COL_STAGES):
        c_rows = tl.cast(r0, tl.int64) + tl.arange(0, COL_ROWS)
        c_row_mask = c_rows < M
        tile = c_row_mask[:, None] & c_mask[None, :]
        dw_acc, db_acc = column_tile(
            dy_ptr,
            x_ptr,
            mean_ptr,
            rstd_ptr,
            c_rows,
            c_cols,
            c_row_mask,
            tile,
            stride_dy,
            stride_x,
            dw_acc,
            db_acc,
            CENTERED,
            CASTING,
            HAS_DW,
            HAS_DB,
        )
    if HAS_DW:
        dw = tl.sum(dw_acc, axis=0)
        tl.store(dw_ptr + c_cols, dw.to(dw_ptr.dtype.element_ty), mask=c_mask)
    if HAS_DB:
        db = tl.sum(db_acc, axis=0)
        tl.store(db_ptr + c_cols, db.to(db_ptr.dtype.element_ty), mask=c_mask)


@fast
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
    HAS_DRES: tl.constexpr,
    BLOCK_N: tl.constexpr,  # >= N: a row of ds held by one program
    COL_N: tl.constexpr,  # columns per dW program
    COL_ROWS: tl.constexpr,  # rows per dW step
    COL_STAGES: tl.constexpr,  # dW steps in flight (tl.range's software pipeline)
    GDC_WAIT: tl.constexpr,  # launched with PDL (ops/_pdl.py)
):
    # ds on the row programs (_rms.ds_block), dW on the column programs.
    wait_for_inputs(GDC_WAIT)  # before any load or store
    pid = tl.program_id(0)
    if pid < ROW_PROGRAMS:
        cols, col_mask, w = weight_row(w_ptr, N, offset, CASTING, True, BLOCK_N)
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
            ds = ds_block(s.to(tl.float32), dy, dres, rstd, w, N, True, HAS_DRES)
            ds_ptrs = ds_ptr + rows[:, None] * stride_ds + cols[None, :]
            tl.store(ds_ptrs, ds.to(ds_ptr.dtype.element_ty), mask)
    else:
        _column_programs(
            dy_ptr,
            s_ptr,
            rstd_ptr,
            rstd_ptr,
            dw_ptr,
            dw_ptr,
            pid - ROW_PROGRAMS,
            M,
            N,
            stride_dy,
            stride_s,
            False,
            CASTING,
            True,
            False,
            COL_N,
            COL_ROWS,
            COL_STAGES,
        )


@fast
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
    # dx on the row programs: g = dy * w;  dx = rstd * (g - mean(g) - x_hat * mean(g * x_hat));
    # dW and dB on the column programs.
    wait_for_inputs(GDC_WAIT)  # before any load or store
    pid = tl.program_id(0)
    if pid < ROW_PROGRAMS:
        cols = tl.arange(0, BLOCK_N)
        col_mask = cols < N
        w = weight_fp32(w_ptr, cols, col_mask, HAS_WEIGHT)
        for row in range(pid, M, ROW_PROGRAMS):
            row64 = tl.cast(row, tl.int64)
            x = tl.load(x_ptr + row64 * stride_x + cols, mask=col_mask, other=0.0).to(tl.float32)
            dy = tl.load(dy_ptr + row64 * stride_dy + cols, mask=col_mask, other=0.0)
            dy = dy.to(tl.float32)  # 0 outside the mask
            mean = tl.load(mean_ptr + row64)
            rstd = tl.load(rstd_ptr + row64)
            x_hat, g = x_hat_g(x, dy, w, mean, rstd, HAS_WEIGHT)
            c1 = tl.sum(g, axis=0) / N
            c2 = tl.sum(g * x_hat, axis=0) / N
            dx = ln_dx(g, x_hat, c1, c2, rstd)
            tl.store(dx_ptr + row64 * stride_dx + cols, dx.to(dx_ptr.dtype.element_ty), col_mask)
    else:
        _column_programs(
            dy_ptr,
            x_ptr,
            mean_ptr,
            rstd_ptr,
            dw_ptr,
            db_ptr,
            pid - ROW_PROGRAMS,
            M,
            N,
            stride_dy,
            stride_x,
            True,
            0,
            HAS_DW,
            HAS_DB,
            COL_N,
            COL_ROWS,
            COL_STAGES,
        )


def corun_programs(m: int, n: int, col_programs: int, programs: int) -> tuple[int, int, int]:
    """The split of a co-running backward: (row programs, column programs, columns per column
    program). About `col_programs` column programs of a power-of-two width cover the n columns;
    the rest of `programs` (the GPU's, one per SM) take the m rows."""
    col_n = next_pow2(cdiv(n, col_programs))
    cols = cdiv(n, col_n)
    return max(1, min(m, programs - cols)), cols, col_n


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
        HAS_DRES=has_dres,
        BLOCK_N=config.block_n,
        COL_N=col_n,
        COL_ROWS=col_rows,
        COL_STAGES=col_stages,
        num_warps=config.num_warps,
        **pdl_args(dev),
    )


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
    absent = rstd  # a pointer never read or written (its HAS_* flag is off)
    _layer_norm_bwd_corun_kernel[(row_programs + col_programs,)](
        dy,
        x,
        weight if weight is not None else x,
        mean,
        rstd,
        dx,
        dw if dw is not None else absent,
        db if db is not None else absent,
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
