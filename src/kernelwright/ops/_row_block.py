"""Row-block helpers shared by the norms' row kernels (ops/_ln.py, ops/_rms.py): a block of ROWS
whole rows of an [M, N] tensor with row strides, held in registers as [ROWS, BLOCK_N]; and a
looped kernel's chunk of one row.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def row_block(block, M, col_mask, ROWS: tl.constexpr):
    # Rows block * ROWS .. + ROWS - 1 in int64 (row * stride may pass 2^31), their mask (rows
    # past M), and the [ROWS, BLOCK_N] mask of the block.
    rows = tl.cast(block, tl.int64) * ROWS + tl.arange(0, ROWS)
    row_mask = rows < M
    mask = row_mask[:, None] & col_mask[None, :]
    return rows, row_mask, mask


@triton.jit
def load_rows(ptr, rows, stride, cols, mask):
    # A [ROWS, BLOCK_N] block of a row-strided tensor in its own dtype, 0 outside the mask.
    return tl.load(ptr + rows[:, None] * stride + cols[None, :], mask=mask, other=0.0)


@triton.jit
def row_chunk(x_row, dy_row, start, N, BLOCK_N: tl.constexpr):
    # Columns start .. start + BLOCK_N - 1 of one row (a looped backward's chunk), their mask,
    # and x and dy there in fp32 (0 past N).
    cols = start + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    x = tl.load(x_row + cols, mask=col_mask, other=0.0).to(tl.float32)
    dy = tl.load(dy_row + cols, mask=col_mask, other=0.0).to(tl.float32)
    return cols, col_mask, x, dy
