"""Shared plumbing of the elementwise kernels (the gated family in ops/_gated.py): the tile a
program owns on a 1-D grid, the grid, and the re-viewing of dense inputs into full tiles."""

from __future__ import annotations

import triton
import triton.language as tl

from kernelwright.runtime.launch import LaunchConfig, cdiv


@triton.jit
def elementwise_tile(M, N, BLOCK_N: tl.constexpr, ROWS: tl.constexpr):
    # A 1-D grid walked row block by row block, the column tiles of one row block on
    # consecutive programs: neighbouring programs touch neighbouring memory (a 2-D grid with
    # rows on axis 0 sends them N elements apart, which costs bandwidth on wide rows).
    pid = tl.program_id(0)
    n_tiles = tl.cdiv(N, BLOCK_N)
    rows = (pid // n_tiles).to(tl.int64) * ROWS + tl.arange(0, ROWS)  # int64: M*stride > 2^31
    cols = (pid % n_tiles) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    return rows[:, None], cols[None, :], mask


def elementwise_grid(op: str, m: int, n: int, cfg: LaunchConfig) -> tuple[int]:
    # One program per (row block, column tile); see elementwise_tile. Axis 0 takes up to 2^31 - 1.
    programs = cdiv(m, cfg.rows) * cdiv(n, cfg.block_n)
    if programs >= 2**31:
        raise ValueError(f"{op}: {m} x {n} needs {programs} programs, over the grid limit")
    return (programs,)


def retiled_shape(m: int, n: int, cfg: LaunchConfig) -> tuple[int, int]:
    """The (M, N) to launch with over [m, n] tensors that are each one dense block
    (contiguous). Elementwise, any [M', block_n] view of them computes the same thing, and full
    tiles need no masked tail (N = 18944 fills a quarter of its last 2048 tile); the kernel needs
    the view's sizes and strides (row stride N), so no view is made. (m, n) itself where the
    elements do not fill whole tiles, or the rows already are one tile."""
    block = cfg.block_n
    if (m * n) % block or n == block:
        return m, n
    return (m * n) // block, block
