"""The timer's L2 reset for `cuda_timer(flush="demote")`.

A plain read of a buffer larger than L2 leaves evict_last lines alone: torch.compile's kernels
load with evict_last, their lines survive the flush, and the next provider timed at the same
shape, whose copies of the inputs reuse that memory (the caching allocator hands freed blocks
back), reads them from L2 and times faster than DRAM allows. The reset: read the buffer with
evict_last loads (its lines take every evict_last place, whatever held them), then set each of
its lines back to normal priority (`applypriority.global.L2::evict_normal`); the timer's plain
read follows.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_BLOCK = 4096
_LINE_WORDS = 32  # fp32 words per 128-byte L2 line


@triton.jit
def _read_evict_last_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0, eviction_policy="evict_last")
    tl.atomic_add(out_ptr, tl.sum(x, axis=0))  # a use, so the loads stay


@triton.jit
def _demote_kernel(x_ptr, n, BLOCK: tl.constexpr, LINE_WORDS: tl.constexpr):
    # One address per 128-byte line: its L2 eviction priority back to normal (sm_80+).
    offs = (tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)) * LINE_WORDS
    ptrs = x_ptr + tl.where(offs < n, offs, 0)
    tl.inline_asm_elementwise(
        "applypriority.global.L2::evict_normal [$1], 128; mov.u32 $0, 0;",
        "=r,l",
        [ptrs],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


def demote_l2(buf: torch.Tensor, out: torch.Tensor) -> None:
    """Take every evict_last place in L2 with `buf`'s lines (fp32, contiguous, CUDA), then
    return them to normal priority. `out`: a 0-d fp32 scratch the read sums into."""
    n = buf.numel()
    _read_evict_last_kernel[(triton.cdiv(n, _BLOCK),)](buf, out, n, _BLOCK)
    lines = triton.cdiv(n, _LINE_WORDS)
    _demote_kernel[(triton.cdiv(lines, _BLOCK),)](buf, n, _BLOCK, _LINE_WORDS)
