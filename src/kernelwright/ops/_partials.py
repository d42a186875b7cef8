"""The last step of the norms' backward: per-program fp32 partial rows summed into the
parameter gradients, in one launch.

The persistent backward kernels leave one fp32 partial row of dW (and of dB) per program.
`partial.sum(0)` then `grad.copy_(...)` would cost two launches per gradient (four for
layer_norm). One kernel sums every partial row of one column tile in a fixed order
(deterministic) and casts once to the gradient's dtype; dW and dB go in the same launch.

On sm_90+ it is launched with programmatic dependent launch (ops/_pdl.py): its launch is
processed while the backward kernel before it runs, and it waits in `griddepcontrol.wait`
until that kernel has finished and its partial rows are visible. The backward kernels do not
signal early (`griddepcontrol.launch_dependents`): the sum waits for their last writes anyway.

`few_rows` is the other side of it: where those partial rows would be a large share of the
backward's memory (few rows), the norm backwards skip them and leave dW (dB) to the column
kernel (ops/_norm_reduce.py), which stores the gradient itself.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernelwright.ops._pdl import wait_for_inputs
from kernelwright.runtime import device_info
from kernelwright.runtime.fastlaunch import fast
from kernelwright.runtime.launch import cdiv, next_pow2, pdl_args

_BLOCK_N = 32  # columns per program: N / 32 programs, enough to spread 4096 columns over SMs
_MAX_BLOCK_P = 256  # partial rows per load step (sm_count * programs_per_sm, usually <= 264)


@fast
@triton.jit
def _sum_partials_kernel(
    a_ptr,
    out_a_ptr,
    b_ptr,
    out_b_ptr,  # a, b: [P, N] fp32, contiguous; out_a, out_b: [N] in the gradient's dtype
    P,
    N,
    HAS_B: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_P: tl.constexpr,
    GDC_WAIT: tl.constexpr,  # launched with PDL: wait for the kernel that wrote a and b
):
    wait_for_inputs(GDC_WAIT)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    acc_a = tl.zeros([BLOCK_N], dtype=tl.float32)
    acc_b = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, P, BLOCK_P):
        rows = start + tl.arange(0, BLOCK_P)
        mask = (rows < P)[:, None] & col_mask[None, :]
        offs = rows.to(tl.int64)[:, None] * N + cols[None, :]
        acc_a += tl.sum(tl.load(a_ptr + offs, mask=mask, other=0.0), axis=0)
        if HAS_B:
            acc_b += tl.sum(tl.load(b_ptr + offs, mask=mask, other=0.0), axis=0)
    tl.store(out_a_ptr + cols, acc_a.to(out_a_ptr.dtype.element_ty), mask=col_mask)
    if HAS_B:
        tl.store(out_b_ptr + cols, acc_b.to(out_b_ptr.dtype.element_ty), mask=col_mask)


def sum_partials(
    a: torch.Tensor,  # [P, N] fp32, contiguous
    out_a: torch.Tensor,  # [N], contiguous
    b: torch.Tensor | None = None,  # [P, N] fp32, contiguous, or None
    out_b: torch.Tensor | None = None,  # [N], contiguous, when b is given
) -> None:
    """out_a = a.sum(0) (and out_b = b.sum(0)), fp32 sums cast once, in one launch."""
    P, N = a.shape
    grid = (cdiv(N, _BLOCK_N),)
    block_p = min(next_pow2(P), _MAX_BLOCK_P)
    has_b = b is not None
    _sum_partials_kernel[grid](
        a,
        out_a,
        b if has_b else a,
        out_b if has_b else out_a,
        P,
        N,
        HAS_B=has_b,
        BLOCK_N=_BLOCK_N,
        BLOCK_P=block_p,
        num_warps=4,
        **pdl_args(device_info(a.device)),
    )


def few_rows(
    rows: int, n: int, partial_rows: int, out_elem: int, block_n: int, share: float, device
) -> bool:
    """Whether a norm backward should leave its parameter gradients to the column kernel: the
    fp32 partial rows (`partial_rows` of them, all gradients together) would exceed `share`
    (the op table's PARTIALS_SHARE) of the row gradient (`rows` rows of `n` elements of
    `out_elem` bytes), and the column kernel's blocks of `block_n` (one program each) fill at
    least half the GPU."""
    wide = cdiv(n, block_n) >= device_info(device).sm_count // 2
    return wide and partial_rows * 4 > share * rows * out_elem
