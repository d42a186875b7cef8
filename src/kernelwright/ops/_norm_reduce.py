"""The norms' parameter gradients by columns: dW (and LayerNorm's dB) summed over every row of
a column block, with no fp32 partial rows.

One tile step (`column_tile`) serves both norm families: LayerNorm's x_hat = (x - mean) * rstd
(`CENTERED`) and RMSNorm's x_hat = x * rstd rounded as its casting mode has it. The column
kernel (`_norm_dw_kernel`) walks every row of its column block with it, where a backward
leaves dW (dB) to a kernel of its own (few rows, `_partials.few_rows`; LayerNorm's widest
rows); the co-running backwards' column programs (ops/_corun.py) walk the rows with it too.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernelwright.ops._pdl import wait_for_inputs
from kernelwright.ops._rms import CASTING_MODES, normalize
from kernelwright.runtime import device_info
from kernelwright.runtime.fastlaunch import fast
from kernelwright.runtime.launch import LaunchConfig, cdiv, pdl_args


@triton.jit
def column_tile(
    dy_ptr,
    x_ptr,
    mean_ptr,
    rstd_ptr,
    rows,  # [R] int64
    cols,  # [C]
    row_mask,
    tile,  # [R, C] mask
    stride_dy,
    stride_x,
    dw_acc,
    db_acc,  # [R, C] fp32 sums, returned with this tile added
    CENTERED: tl.constexpr,  # LayerNorm: x_hat = (x - mean) * rstd; else RMSNorm's
    CASTING: tl.constexpr,  # RMSNorm's casting mode (ops/_rms.py)
    HAS_DW: tl.constexpr,
    HAS_DB: tl.constexpr,
):
    # dW += dy * x_hat (x_hat as the forward multiplied it), dB += dy; dy is 0 outside the mask.
    # The sums stay [R, C] until the end: a sum over rows per tile would cross warps every step.
    dy = tl.load(dy_ptr + rows[:, None] * stride_dy + cols[None, :], mask=tile, other=0.0)
    if CENTERED:
        dy = dy.to(tl.float32)
        if HAS_DW:
            x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=tile, other=0.0)
            mean = tl.load(mean_ptr + rows, mask=row_mask, other=0.0)[:, None]
            rstd = tl.load(rstd_ptr + rows, mask=row_mask, other=0.0)[:, None]
            dw_acc += dy * ((x.to(tl.float32) - mean) * rstd)
        if HAS_DB:
            db_acc += dy
    else:
        x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=tile, other=0.0)
        rstd = tl.load(rstd_ptr + rows, mask=row_mask, other=0.0)[:, None]
        x_hat = normalize(x.to(tl.float32), rstd, x_ptr.dtype.element_ty, CASTING)
        dw_acc += dy.to(tl.float32) * x_hat
    return dw_acc, db_acc


@fast
@triton.jit
def _norm_dw_kernel(
    dy_ptr,
    x_ptr,
    mean_ptr,
    rstd_ptr,
    dw_ptr,
    db_ptr,  # dy, x: [M, N] with row strides; mean, rstd: [M] fp32; dw, db: [N]
    M,
    N,
    stride_dy,
    stride_x,
    CENTERED: tl.constexpr,
    CASTING: tl.constexpr,
    HAS_DW: tl.constexpr,
    HAS_DB: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ROWS: tl.constexpr,
    STAGES: tl.constexpr,  # row blocks in flight (tl.range's software pipeline)
    GDC_WAIT: tl.constexpr,  # launched with PDL (ops/_pdl.py)
):
    # Program c sums every [ROWS, BLOCK_N] tile of column block c in fp32 and stores dW and dB
    # itself.
    wait_for_inputs(GDC_WAIT)  # before any load or store
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    dw_acc = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
    db_acc = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
    for block in tl.range(0, tl.cdiv(M, ROWS), num_stages=STAGES):
        rows = tl.cast(block, tl.int64) * ROWS + tl.arange(0, ROWS)
        row_mask = rows < M
        mask = row_mask[:, None] & col_mask[None, :]
        dw_acc, db_acc = column_tile(
            dy_ptr,
            x_ptr,
            mean_ptr,
            rstd_ptr,
            rows,
            cols,
            row_mask,
            mask,
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
        tl.store(dw_ptr + cols, tl.sum(dw_acc, axis=0).to(dw_ptr.dtype.element_ty), mask=col_mask)
    if HAS_DB:
        tl.store(db_ptr + cols, tl.sum(db_acc, axis=0).to(db_ptr.dtype.element_ty), mask=col_mask)


def norm_dw_launch(
    dy: torch.Tensor,  # [M, N], stride(1) == 1
    x: torch.Tensor,  # [M, N], stride(1) == 1 (fused_add_rms_norm: s)
    mean: torch.Tensor | None,  # [M] fp32 for LayerNorm; None for RMSNorm
    rstd: torch.Tensor,  # [M] fp32
    dw: torch.Tensor | None,  # [N]
    db: torch.Tensor | None,  # [N], LayerNorm only
    cfg: LaunchConfig,
    casting_mode: str = "none",  # RMSNorm's; ignored for LayerNorm (mean given)
) -> None:
    """dW (dB) alone: one program per column block of cfg.block_n, through every row; no
    partial rows."""
    M, N = x.shape
    _norm_dw_kernel[(cdiv(N, cfg.block_n),)](
        dy,
        x,
        mean if mean is not None else rstd,
        rstd,
        dw if dw is not None else rstd,  # an absent gradient: a pointer never written
        db if db is not None else rstd,
        M,
        N,
        dy.stride(0),
        x.stride(0),
        CENTERED=mean is not None,
        CASTING=CASTING_MODES[casting_mode],
        HAS_DW=dw is not None,
        HAS_DB=db is not None,
        BLOCK_N=cfg.block_n,
        ROWS=cfg.rows,
        STAGES=cfg.num_stages,
        num_warps=cfg.num_warps,
        **pdl_args(device_info(x.device)),
    )
