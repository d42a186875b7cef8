"""Softmax's split rows: a row past the one-row widths over programs that share its statistics.

Each of a row's `splits` programs holds one chunk in registers, stores its partial statistics
to an fp32 slot and waits for its siblings' (ops/_split.py), then writes its chunk: one read
and one write of the row. Forward slots: each chunk's max and sum of exp(x - max); backward:
each chunk's sum(dy * y) (softmax) or sum(dy) (log_softmax). With the exchange in the output
(`OUT_WORDS`) a second, small kernel writes the values over the exchange's words.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernelwright.ops._held import HOLD_FROM, again
from kernelwright.ops._split import arrive_and_wait, exchange, out_slots, out_words, ticket
from kernelwright.ops._split import launch as launch_split
from kernelwright.runtime.fastlaunch import fast
from kernelwright.runtime.launch import LaunchConfig, next_pow2
from kernelwright.runtime.tables.softmax import WORDS_WARPS

# --------------------------------------------------------------------------- kernels


@triton.jit
def _chunk(out_ptr, sync_ptr, M, N, stride_out, BLOCK_N: tl.constexpr, SPLITS: tl.constexpr,
           PHASE: tl.constexpr, OUT_WORDS: tl.constexpr):  # fmt: skip
    """This program's row, its chunk j of the row, the chunk's columns and their mask. (row,
    chunk) by ticket, in start order: nobody waits on a program that has not started; the
    ticket is in the output's last row with the exchange there (OUT_WORDS), else in sync_ptr.
    The interpreter's phases take them from the program id."""
    if PHASE == 0:
        t = ticket(out_words(out_ptr, M - 1, stride_out) if OUT_WORDS > 0 else sync_ptr)
    else:
        t = tl.program_id(0)
    row = (t // SPLITS).to(tl.int64)
    j = t % SPLITS
    cols = j * BLOCK_N + tl.arange(0, BLOCK_N)
    return row, j, cols, cols < N


@fast
@triton.jit
def _softmax_fwd_split_kernel(
    x_ptr,
    y_ptr,
    part_ptr,  # [M, SPLITS, 2] fp32: each chunk's max and sum of exp(x - max) (workspace)
    sync_ptr,  # [1 + M] int32, zeroed: the ticket, then each row's counter (workspace)
    M,
    N,
    stride_x,
    stride_y,
    IS_LOG: tl.constexpr,
    BLOCK_N: tl.constexpr,  # one chunk: BLOCK_N < N <= SPLITS * BLOCK_N
    SPLITS: tl.constexpr,
    SPLITS_P2: tl.constexpr,  # SPLITS rounded up to a power of two
    PHASE: tl.constexpr,  # 0: statistics, wait, write (GPU); 1: statistics; 2: write (_split)
    OUT_WORDS: tl.constexpr,  # values of each y row holding the exchange (0: workspace; _split)
    PREFETCH: tl.constexpr = False,  # the row's counter line prefetched into L2 (_split)
):
    # A row split over SPLITS programs (ops/_split.py): each holds its chunk in registers, so
    # the row is read once. Chunks of HOLD_FROM and more are held in their own dtype (_held).
    # With the exchange in y (OUT_WORDS) the values over its words are left to
    # _softmax_fwd_words_kernel.
    row, j, cols, col_mask = _chunk(y_ptr, sync_ptr, M, N, stride_y, BLOCK_N, SPLITS, PHASE,
                                    OUT_WORDS)  # fmt: skip
    hold: tl.constexpr = BLOCK_N >= HOLD_FROM
    x = tl.load(x_ptr + row * stride_x + cols, mask=col_mask, other=-float("inf"))
    part, arrivals = exchange(
        y_ptr, part_ptr, sync_ptr, row, stride_y, SPLITS * 2, OUT_WORDS, PREFETCH
    )
    if PHASE != 2:
        m = tl.max(x.to(tl.float32), axis=0)
        # A chunk of only -inf sums exp(x - 0) = 0 instead of exp(-inf - -inf) = NaN (and
        # `again` waits on the finite shift: |0 * -inf| would be NaN).
        shift = tl.where(m == -float("inf"), 0.0, m)
        d = tl.sum(tl.exp(again(x, shift, hold).to(tl.float32) - shift), axis=0)
        tl.store(part + j * 2, m)
        tl.store(part + j * 2 + 1, d)
    if PHASE == 0:
        arrive_and_wait(arrivals, SPLITS)
    if PHASE != 1:
        m_row, d_row = _merge_fwd(part, SPLITS, SPLITS_P2)
        x = again(x, d_row, hold).to(tl.float32)
        y = x - m_row - tl.log(d_row) if IS_LOG else tl.exp(x - m_row) * (1.0 / d_row)
        # with the exchange in y, its words' values are not written here (a mask at a multiple
        # of 16: the stores stay vectorized)
        mask = col_mask & (cols >= OUT_WORDS) if OUT_WORDS > 0 else col_mask
        tl.store(y_ptr + row * stride_y + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _merge_fwd(part, SPLITS: tl.constexpr, SPLITS_P2: tl.constexpr):
    """A row's max, and every chunk's sum rescaled to it (exp(-inf - m_row) = 0 for an all -inf
    chunk; a row of only -inf gives NaN, as in torch), from its chunks' slots."""
    k = tl.arange(0, SPLITS_P2)
    ms = tl.load(part + k * 2, mask=k < SPLITS, other=-float("inf"), volatile=True)
    ds = tl.load(part + k * 2 + 1, mask=k < SPLITS, other=0.0, volatile=True)
    m_row = tl.max(ms, axis=0)
    return m_row, tl.sum(ds * tl.exp(ms - m_row), axis=0)


@fast
@triton.jit
def _softmax_fwd_words_kernel(
    x_ptr,
    y_ptr,
    stride_x,
    stride_y,
    IS_LOG: tl.constexpr,
    SPLITS: tl.constexpr,
    SPLITS_P2: tl.constexpr,
    OUT_WORDS: tl.constexpr,  # values at the start of each y row over the split kernel's words
    WORDS_P2: tl.constexpr,
):
    # After _softmax_fwd_split_kernel with its exchange in y: each row's values over the words,
    # from the slots merged as there (the same code: the same result, WORDS_WARPS) and the
    # row's first values.
    row = tl.program_id(0).to(tl.int64)
    m_row, d_row = _merge_fwd(out_slots(y_ptr, row, stride_y), SPLITS, SPLITS_P2)
    cols = tl.arange(0, WORDS_P2)
    mask = cols < OUT_WORDS
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    y = x - m_row - tl.log(d_row) if IS_LOG else tl.exp(x - m_row) * (1.0 / d_row)
    tl.store(y_ptr + row * stride_y + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@fast
@triton.jit
def _softmax_bwd_split_kernel(
    dy_ptr,
    y_ptr,
    dx_ptr,
    part_ptr,  # [M, SPLITS] fp32: each chunk's sum(dy * y) (softmax) or sum(dy) (log_softmax)
    sync_ptr,  # [1 + M] int32, zeroed, as in the forward
    M,
    N,
    stride_dy,
    stride_y,
    stride_dx,
    IS_LOG: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLITS: tl.constexpr,
    SPLITS_P2: tl.constexpr,
    PHASE: tl.constexpr,
    OUT_WORDS: tl.constexpr,  # values of each dx row holding the exchange, as in the forward
    PREFETCH: tl.constexpr = False,  # the row's counter line prefetched into L2 (_split)
):
    # The backward's row split as the forward's: dy and y of a chunk held (fp32), one read each.
    row, j, cols, col_mask = _chunk(dx_ptr, sync_ptr, M, N, stride_dx, BLOCK_N, SPLITS, PHASE,
                                    OUT_WORDS)  # fmt: skip
    dy = tl.load(dy_ptr + row * stride_dy + cols, mask=col_mask, other=0.0).to(tl.float32)
    y = tl.load(y_ptr + row * stride_y + cols, mask=col_mask, other=0.0).to(tl.float32)
    part, arrivals = exchange(
        dx_ptr, part_ptr, sync_ptr, row, stride_dx, SPLITS, OUT_WORDS, PREFETCH
    )
    if PHASE != 2:
        tl.store(part + j, tl.sum(dy, axis=0) if IS_LOG else tl.sum(dy * y, axis=0))
    if PHASE == 0:
        arrive_and_wait(arrivals, SPLITS)
    if PHASE != 1:
        s = _merge_bwd(part, SPLITS, SPLITS_P2)
        dx = dy - tl.exp(y) * s if IS_LOG else y * (dy - s)
        mask = col_mask & (cols >= OUT_WORDS) if OUT_WORDS > 0 else col_mask  # as the forward
        tl.store(dx_ptr + row * stride_dx + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _merge_bwd(part, SPLITS: tl.constexpr, SPLITS_P2: tl.constexpr):
    """A row's sum(dy * y) (softmax) or sum(dy) (log_softmax) from its chunks' slots."""
    k = tl.arange(0, SPLITS_P2)
    return tl.sum(tl.load(part + k, mask=k < SPLITS, other=0.0, volatile=True), axis=0)


@fast
@triton.jit
def _softmax_bwd_words_kernel(
    dy_ptr,
    y_ptr,
    dx_ptr,
    stride_dy,
    stride_y,
    stride_dx,
    IS_LOG: tl.constexpr,
    SPLITS: tl.constexpr,
    SPLITS_P2: tl.constexpr,
    OUT_WORDS: tl.constexpr,
    WORDS_P2: tl.constexpr,
):
    # dx's values over the backward split kernel's words, as _softmax_fwd_words_kernel.
    row = tl.program_id(0).to(tl.int64)
    s = _merge_bwd(out_slots(dx_ptr, row, stride_dx), SPLITS, SPLITS_P2)
    cols = tl.arange(0, WORDS_P2)
    mask = cols < OUT_WORDS
    dy = tl.load(dy_ptr + row * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
    y = tl.load(y_ptr + row * stride_y + cols, mask=mask, other=0.0).to(tl.float32)
    dx = dy - tl.exp(y) * s if IS_LOG else y * (dy - s)
    tl.store(dx_ptr + row * stride_dx + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)


# --------------------------------------------------------------------------- launchers


def split_fwd_launch(
    x: torch.Tensor, y: torch.Tensor, is_log: bool, cfg: LaunchConfig, splits: int
) -> None:
    """The forward over `splits` programs per row of `x` ([M, N]) into `y`, then the values
    over the exchange's words where it lives in `y`."""
    M, N = x.shape
    words = launch_split(
        _softmax_fwd_split_kernel, (x, y), (M, N, x.stride(0), y.stride(0)), cfg, splits, 2,
        programs=M * splits, out=y, IS_LOG=is_log,
    )  # fmt: skip
    if words:
        _softmax_fwd_words_kernel[(M,)](
            x, y, x.stride(0), y.stride(0), IS_LOG=is_log, SPLITS=splits,
            SPLITS_P2=next_pow2(splits), OUT_WORDS=words,
            WORDS_P2=next_pow2(words), num_warps=WORDS_WARPS,
        )  # fmt: skip


def split_bwd_launch(
    dy: torch.Tensor,
    y: torch.Tensor,
    dx: torch.Tensor,
    is_log: bool,
    cfg: LaunchConfig,
    splits: int,
) -> None:
    """The backward over `splits` programs per row, as `split_fwd_launch`."""
    M, N = y.shape
    strides = (dy.stride(0), y.stride(0), dx.stride(0))
    words = launch_split(
        _softmax_bwd_split_kernel, (dy, y, dx), (M, N, *strides), cfg, splits, 1,
        programs=M * splits, out=dx, IS_LOG=is_log,
    )  # fmt: skip
    if words:
        _softmax_bwd_words_kernel[(M,)](
            dy, y, dx, *strides, IS_LOG=is_log, SPLITS=splits,
            SPLITS_P2=next_pow2(splits), OUT_WORDS=words,
            WORDS_P2=next_pow2(words), num_warps=WORDS_WARPS,
        )  # fmt: skip
