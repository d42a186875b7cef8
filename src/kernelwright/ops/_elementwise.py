"""Shared plumbing of the elementwise kernels (the gated family in ops/_gated.py): the tile a
program owns on a 1-D grid, the grid, the re-viewing of dense inputs into full tiles, and the
views of interleaved columns (a column stride of 2: GPT-OSS's [gate0, up0, gate1, up1, ...])."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernelwright.runtime.alloc import empty
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


def _cols(*ts) -> int:
    """The column stride shared by `ts` (None entries skipped): 1, or 2 for interleaved
    views; a one-column tensor fits either."""
    strides = {t.stride(1) for t in ts if t is not None and t.shape[1] > 1}
    if not strides:
        return 1
    if len(strides) != 1 or not strides <= {1, 2}:
        raise ValueError(
            f"gated kernels: column strides {sorted(strides)}; gate, up and their gradients "
            "need one column stride, 1 or 2"
        )
    return strides.pop()


def _halves(x: torch.Tensor, interleaved: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(gate, up) views of x [M, 2N]: its halves [gate | up], or its even and odd columns
    (interleaved, GPT-OSS's layout); each keeps x's row stride."""
    if interleaved:
        return x[:, 0::2], x[:, 1::2]
    n = x.shape[1] // 2
    return x[:, :n], x[:, n:]


def _every_other(t: torch.Tensor) -> torch.Tensor | None:
    """t as [M, N] keeping its column stride of 2 (an interleaved half), or None."""
    n = t.shape[-1]
    if n < 2 or t.stride(-1) != 2:
        return None
    try:
        return t if t.dim() == 2 else t.view(-1, n)
    except RuntimeError:  # leading dims that do not fold into one row stride
        return None


def _empty_as(t: torch.Tensor) -> torch.Tensor:
    """An uninitialised [M, N] tensor with t's column stride (1, or 2: half of a [M, 2N])."""
    m, n = t.shape
    if n > 1 and t.stride(1) == 2:
        return empty((m, 2 * n), dtype=t.dtype, device=t.device)[:, 0::2]
    return empty(t.shape, dtype=t.dtype, device=t.device)
