"""Shared plumbing of the elementwise kernels (the gated family in ops/_gated.py): the tile a
program owns on a 1-D grid, the grid, and the re-viewing of dense inputs into full tiles."""

from __future__ import annotations

import torch
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


def retile(
    tensors: tuple[torch.Tensor | None, ...], cfg: LaunchConfig
) -> tuple[int, int, tuple[int | None, ...]]:
    """The (M, N, row stride per tensor) to launch with. Elementwise: when every tensor is one
    dense block, any [M', block_n] view computes the same thing, and full tiles need no masked
    tail (N = 18944 leaves 1/4 of a 2048 tile idle); the kernel only needs the view's sizes
    and strides, so no view is made. None entries (an absent operand) get a None stride."""
    m, n = tensors[0].shape
    block = cfg.block_n
    if not ((m * n) % block or n == block):
        for t in tensors:
            if t is not None and not t.is_contiguous():
                break
        else:
            return (m * n) // block, block, tuple([None if t is None else block for t in tensors])
    return m, n, tuple([None if t is None else t.stride(0) for t in tensors])
