"""dW parked in the row gradient's own storage: fused_add_rms_norm's backward without fp32
partial rows.

Where one fp32 partial row of dW per program would be a noticeable share of the backward's
memory, each program leaves its last row block of ds unwritten until the end: that storage
takes the dW columns [j * SLICE, (j + 1) * SLICE) of every program's sum (program q's at word
q * SLICE; P * SLICE = N words fit, since rows x element size >= 4 bytes). Phase 1: the rows
(`_rms.bwd_rows`), then this program's dW sum scattered to its P owners. Phase 2, once every
program has arrived (a grid barrier, so the launch is cooperative): this program sums its slice
in a fixed order, stores it to dW, then recomputes its last block's ds and stores it over the
slice. No other program reads that storage, so one barrier is enough.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kernelwright.ops._pdl import wait_for_inputs
from kernelwright.ops._rms import CASTING_MODES, bwd_rows, ds_block, weight_row
from kernelwright.ops._split import GENERATION, arrive, grid_counter, wait_until
from kernelwright.runtime.fastlaunch import fast
from kernelwright.runtime.launch import LaunchConfig, next_pow2, pdl_args
from kernelwright.runtime.tables import fused_add_rms_norm as _table


@triton.jit
def _last_block(pid, programs, blocks):
    """The last of row blocks pid, pid + programs, ... below `blocks` (program pid's last)."""
    return pid + programs * ((blocks - 1 - pid) // programs)


@fast
@triton.jit
def _fused_add_rms_norm_bwd_park_kernel(
    dy_ptr,
    dres_ptr,
    s_ptr,
    w_ptr,
    rstd_ptr,
    ds_ptr,  # dy, dres, s, ds: [M, N] with row strides
    park_ptr,  # ds's storage as fp32 words (contiguous ds)
    dw_ptr,  # [N], the weight's dtype
    sync_ptr,  # int64 [1], the barrier's generation counter (_split.grid_counter)
    M,
    N,
    stride_dy,
    stride_dres,
    stride_s,
    stride_ds,
    park_step,  # fp32 words per row block of ds
    SLICE,  # N / programs, the dW columns each program sums
    offset,
    CASTING: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    HAS_DRES: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ROWS: tl.constexpr,
    PREFETCH: tl.constexpr,
    PHASE: tl.constexpr,  # 0 in one launch (waits), 1 then 2 in two launches (no waits)
    BLOCK_P: tl.constexpr,  # programs, to a power of two
    BLOCK_S: tl.constexpr,  # SLICE, to a power of two
    GDC_WAIT: tl.constexpr,  # launched with PDL (ops/_pdl.py)
):
    wait_for_inputs(GDC_WAIT)  # before any load or store
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    blocks = tl.cdiv(M, ROWS)
    step = programs * ROWS
    cols, col_mask, w = weight_row(w_ptr, N, offset, CASTING, HAS_WEIGHT, BLOCK_N)
    if PHASE <= 1:
        dw_acc = bwd_rows(
            dy_ptr,
            dres_ptr,
            s_ptr,
            rstd_ptr,
            ds_ptr,
            w,
            pid,
            step,
            M,
            N,
            stride_dy,
            stride_dres,
            stride_s,
            stride_ds,
            CASTING,
            HAS_WEIGHT,
            True,
            HAS_DRES,
            BLOCK_N,
            ROWS,
            PREFETCH,
            True,
        )
        # column c of this program's sum: to program c // SLICE, word pid * SLICE + c % SLICE
        owner = cols // SLICE
        own = tl.cast(_last_block(owner, programs, blocks), tl.int64) * park_step
        tl.store(park_ptr + own + pid * SLICE + cols % SLICE, dw_acc, mask=col_mask)
    if PHASE == 0:
        target = arrive(sync_ptr, programs, GENERATION)  # this program's sum is parked
    if PHASE != 1:
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
        ds = ds_block(s.to(tl.float32), dy, dres, rstd, w, N, HAS_WEIGHT, HAS_DRES)
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


def park_programs(M: int, N: int, cfg: LaunchConfig, ds: torch.Tensor, inputs, device) -> int:
    """How many programs the backward runs to park dW in ds instead of fp32 partial rows, or 0
    where it cannot: each program on an SM of its own (programs_per_sm = 1, so a cooperative
    launch holds them all and the grid barrier cannot wait on a program without an SM), a row
    block of ds wide enough for an fp32 row (rows x element size >= 4 bytes), full blocks (rows
    divide M), a program count P that divides N into slices of PARK_SLICE_WORDS columns or a
    multiple (each program sums one slice of every program's dW) within PARK_MIN_SHARE of the
    SMs and at most the row blocks, ds one contiguous piece of memory, and no input sharing its
    storage (the last block's ds is recomputed from them)."""
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
    least = max(1, math.ceil(_table.PARK_MIN_SHARE * device.sm_count))
    for programs in range(most, least - 1, -1):
        if N % programs == 0 and (N // programs) % _table.PARK_SLICE_WORDS == 0:
            return programs
    return 0


def park_phases(device) -> tuple[int, ...]:
    """The parking kernel's PHASE per launch: (0,) in one launch that waits at its barrier (a
    GPU); (1, 2) without waiting (the interpreter runs programs one after another)."""
    return (0,) if device.backend == "cuda" else (1, 2)


def park_launch(
    dy: torch.Tensor,  # [M, N], stride(1) == 1: gradient of y
    d_residual_out: torch.Tensor | None,  # [M, N], stride(1) == 1
    residual_out: torch.Tensor,  # [M, N], stride(1) == 1: s
    weight: torch.Tensor | None,
    rstd: torch.Tensor,  # [M] fp32
    ds: torch.Tensor,  # [M, N], contiguous
    dw: torch.Tensor,  # [N]
    offset: float,
    casting_mode: str,
    cfg: LaunchConfig,  # block_n >= N
    programs: int,  # from park_programs
    device,
    phases: tuple[int, ...],  # from park_phases
) -> None:
    """ds and dW with dW parked in ds (`_fused_add_rms_norm_bwd_park_kernel`)."""
    M, N = residual_out.shape
    has_dres = d_residual_out is not None
    # ds as fp32 words: program j's last row block takes column slice j of every dW sum
    park_step = cfg.rows * N * ds.element_size() // 4
    if device.backend == "cuda":
        sync = grid_counter(ds.device)
        cooperative = {"launch_cooperative_grid": True}
    else:  # the interpreter: a counter for a PHASE 0 launch of one program (tests)
        sync = torch.zeros(1, dtype=torch.int64, device=ds.device)
        cooperative = {}
    for phase in phases:
        _fused_add_rms_norm_bwd_park_kernel[(programs,)](
            dy,
            d_residual_out if has_dres else dy,
            residual_out,
            weight if weight is not None else residual_out,
            rstd,
            ds,
            ds.view(-1).view(torch.float32),
            dw,
            sync,
            M,
            N,
            dy.stride(0),
            d_residual_out.stride(0) if has_dres else 0,
            residual_out.stride(0),
            ds.stride(0),
            park_step,
            N // programs,
            offset,
            CASTING=CASTING_MODES[casting_mode],
            HAS_WEIGHT=weight is not None,
            HAS_DRES=has_dres,
            BLOCK_N=cfg.block_n,
            ROWS=cfg.rows,
            PREFETCH=cfg.num_stages > 1,
            PHASE=phase,
            BLOCK_P=next_pow2(programs),
            BLOCK_S=next_pow2(N // programs),
            num_warps=cfg.num_warps,
            **cooperative,
            **pdl_args(device),  # its launch overlaps the kernel before it
        )
