"""One-program kernels for the small work around a kernel: an index tensor's range check (with
the count of its entries other than an ignore index: a mean's denominator), a vector's sum, and
the assert on a flag that a kernel reading an index sets at an index outside its range.

The losses (ops/_loss.py) and the index checks of generated ops (runtime/checks.py) run them.
Each is one program that walks its vector in fixed blocks, so the result does not depend on the
launch (deterministic), and one launch does the work of several small torch ops: in an eager
training loop at moderate sizes launches, not the GPU, set the time. One program reads 8 bytes
an index, against the row of V values the kernel that uses the index reads at least.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernelwright.runtime.fastlaunch import fast

# elements a step of the one program: each step waits out one memory latency, so a large block
# keeps tens of thousands of rows to a few steps
BLOCK = 8192


@fast
@triton.jit
def _targets_kernel(
    t_ptr,  # indices [M], int32 or int64, contiguous
    ok_ptr,  # [1] int32 out: 1 when every index is in [0, V) (or ignore_index), else 0
    inv_ptr,  # [1] fp32 out (DENOM > 0): 1 / the "mean" denominator
    M,
    V,
    ignore_index,  # HAS_IGNORE: an index that is skipped (neither checked nor counted)
    n_items,  # DENOM == 2: the denominator given by the caller
    HAS_IGNORE: tl.constexpr,
    DENOM: tl.constexpr,  # 0: none; 1: the count of entries not ignored; 2: n_items
    BLOCK: tl.constexpr,
):
    bad = tl.zeros([BLOCK], dtype=tl.int32)
    kept = tl.zeros([BLOCK], dtype=tl.int32)
    for start in range(0, M, BLOCK):
        idx = start + tl.arange(0, BLOCK)
        inside = idx < M
        t = tl.load(t_ptr + idx, mask=inside, other=0).to(tl.int64)
        counted = inside
        if HAS_IGNORE:
            counted = counted & (t != ignore_index)
        bad += (counted & ((t < 0) | (t >= V))).to(tl.int32)
        kept += counted.to(tl.int32)
    tl.store(ok_ptr, (tl.sum(bad, axis=0) == 0).to(tl.int32))
    if DENOM == 1:
        # no row counted: 1 / 0 = inf and the loss 0 * inf = NaN, as torch's mean of nothing
        tl.store(inv_ptr, 1.0 / tl.sum(kept, axis=0).to(tl.float32))
    elif DENOM == 2:
        tl.store(inv_ptr, 1.0 / n_items)


@fast
@triton.jit
def _sum_rows_kernel(
    rows_ptr,  # [M] fp32 per-row losses
    inv_ptr,  # [1] fp32 (HAS_INV): multiplies the sum
    out_ptr,  # [] fp32 out
    M,
    HAS_INV: tl.constexpr,
    BLOCK: tl.constexpr,
):
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, M, BLOCK):
        idx = start + tl.arange(0, BLOCK)
        acc += tl.load(rows_ptr + idx, mask=idx < M, other=0.0)
    total = tl.sum(acc, axis=0)
    if HAS_INV:
        total = total * tl.load(inv_ptr)
    tl.store(out_ptr, total)


@fast
@triton.jit(debug=True)  # debug: the device-side assert is compiled in
def _flag_kernel(flag_ptr, MSG: tl.constexpr):
    # [1] int32: read, reset for the next launch, and stop the run when it was set
    bad = tl.load(flag_ptr)
    tl.store(flag_ptr, 0)
    tl.device_assert(bad == 0, MSG)


def flag_launch(flag, msg: str) -> None:
    """One program: a device-side assert with `msg` when `flag` ([1] int32) is set; it is reset
    either way (no host sync: the run stops at its next sync)."""
    _flag_kernel[(1,)](flag, MSG=msg)


def targets_launch(
    t, ok, inv, V: int, ignore_index: int | None, n_items: float | None, count: bool
) -> None:
    """ok[0] = every index of `t` (contiguous) in [0, V) or equal to `ignore_index`; inv[0] =
    1 / the denominator (`n_items`, else the count of entries not ignored where `count`); inv
    may be a dummy when neither is asked."""
    denom = 2 if n_items is not None else (1 if count else 0)
    _targets_kernel[(1,)](
        t, ok, inv, t.numel(), V, 0 if ignore_index is None else ignore_index,
        float(n_items or 1.0), HAS_IGNORE=ignore_index is not None, DENOM=denom, BLOCK=BLOCK,
        num_warps=8,
    )  # fmt: skip


def sum_rows_launch(rows, inv, out) -> None:
    """out[()] = sum(rows) (times inv[0] when given)."""
    _sum_rows_kernel[(1,)](
        rows, inv if inv is not None else rows, out, rows.numel(),
        HAS_INV=inv is not None, BLOCK=BLOCK, num_warps=8,
    )  # fmt: skip
