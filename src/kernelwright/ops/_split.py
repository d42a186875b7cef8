"""Rows split across programs that share their statistics (softmax's rows past 32768 columns).

A row too wide to hold in one program's registers is read twice by a looped kernel: once for
its statistics, once to write the output, and rows of 128K-256K values do not stay in L2
between the two. Split instead: the row's `splits` chunks go to `splits` programs; each holds
its chunk, reduces it to its statistics (softmax: max and sum of exp; its backward: one sum),
publishes them in the row's word for that chunk, reads the row's other words, merges and writes
its own chunk. One read and one write of the row.

A word is the statistics packed in 64 bits (`pack2`, `pack1`), written in one store: its own
flag (a published word is never 0), so a reader needs no ordering between a flag and the data.
Waiting on another program is safe only if that program runs. Nothing guarantees that the
programs of one row are resident together (CUDA does not promise to start programs in order,
and under the interpreter they run one after another), so a program that still finds a word
of 0 after `spins` polls computes that chunk's statistics itself, with the owner's code — the
same values bit for bit — and goes on: progress never depends on scheduling. On a GPU a row's
programs have consecutive ids and start together, so the fallback is for the worst case only;
under the interpreter (`spins` 0) the first program of each row always takes it, which puts it
under the CPU tests. H200 numbers: benchmarks/NOTES.md 31.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernelwright.runtime.device import DeviceInfo

# At most this many programs share a row (a row's fallback reads at most this many chunks).
MAX_SPLITS = 32

# Polls of the row's words before a program computes the missing chunks itself: ~1 us each on
# an H100/H200 (an L2 round trip), a row's other programs need a few us.
SPINS = 4096


@triton.jit
def pack2(hi, lo):
    """Two fp32 values as one int64 word (hi's bits above lo's)."""
    hi_bits = hi.to(tl.int32, bitcast=True).to(tl.int64)
    lo_bits = lo.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF
    return (hi_bits << 32) | lo_bits


@triton.jit
def unpack_hi(word):
    return (word >> 32).to(tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def unpack_lo(word):
    return word.to(tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def pack1(value):
    """One fp32 value as a word that is never 0 (a set bit above it)."""
    return (value.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF) | (1 << 32)


@triton.jit
def unpublished(words):
    """How many of `words` are still 0 (a packed word may be negative: test for 0, not < 1)."""
    return tl.sum((words == 0).to(tl.int32), axis=0)


@triton.jit
def poll(words_ptr, SPLITS: tl.constexpr, SPLITS_P2: tl.constexpr, spins):
    """The row's `SPLITS` words, re-read until none is 0 or `spins` polls have passed (padding
    lanes past SPLITS read as 1)."""
    k = tl.arange(0, SPLITS_P2)
    words = tl.load(words_ptr + k, mask=k < SPLITS, other=1, volatile=True)
    n = 0
    while (unpublished(words) > 0) & (n < spins):
        words = tl.load(words_ptr + k, mask=k < SPLITS, other=1, volatile=True)
        n += 1
    return words


def split_count(n: int, block_n: int, m: int) -> int:
    """How many programs share each of `m` rows of `n` values at `block_n` per program, or 0
    where the split form must not be used: a single chunk (nothing to split), more than
    `MAX_SPLITS`, or more programs than an int32 program id."""
    splits = triton.cdiv(n, block_n)
    if splits < 2 or splits > MAX_SPLITS or m * splits >= 2**31:
        return 0
    return splits


def spins(device: DeviceInfo) -> int:
    """Polls before the fallback: `SPINS` on a GPU, none under the interpreter (its programs
    run one after another: a word still 0 is one whose program has not run)."""
    return SPINS if device.backend == "cuda" else 0


def zeroed_words(m: int, splits: int, device: torch.device) -> torch.Tensor:
    """The split kernels' scratch: one int64 word per chunk, [m, splits], zeroed (unpublished)."""
    return torch.zeros((m, splits), dtype=torch.int64, device=device)
