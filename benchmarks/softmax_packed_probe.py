"""softmax's split forward (past 32768 columns): each chunk's statistics published as one 64-bit
word that is its own flag, against the library's store / count / spin / load (NOTES 62).

Prints only (and a CSV to $OUT); the benchmark of record is `kernelwright bench softmax`.

- `lib`: the library's launch (the table's split row, its exchange in the output);
- `protocol`: the library's split kernel with a workspace (store the max and sum, barrier,
  acq_rel count, spin, load the slots): `softmax_split_probe.py`'s `ticket_wait` copy;
- `packed`: the chunk's max and sum bits in one int64 (never 0), stored plainly into zeroed
  slots; the program polls its row's words with one volatile load until none is 0 and merges
  what it read. The zeroing of the slots is part of each call, as the library's fill is.

The poll is bounded (`SPIN_LIMIT` loads, seconds): a program that never sees its siblings
falls through and writes a wrong row, which the check before timing reports, instead of
hanging the device. Under the interpreter (`PHASE` 1 then 2, two launches, as the library's
split kernels there) the same kernel is checked on the CPU: `--cpu`.

    python benchmarks/softmax_packed_probe.py [--cols 65536,131072,152064,262144] [--cpu]
"""

from __future__ import annotations

import argparse
import functools
import os
from pathlib import Path

import torch
import triton
import triton.language as tl

from kernelwright.ops._held import HOLD_FROM, again
from kernelwright.ops._split import ticket

SPIN_LIMIT = 1 << 22


@triton.jit
def _stats(x, HOLD: tl.constexpr):
    """A chunk's max and sum of exp(x - max) (an all -inf chunk: -inf and 0), as the library's."""
    m = tl.max(x.to(tl.float32), axis=0)
    shift = tl.where(m == -float("inf"), 0.0, m)
    return m, tl.sum(tl.exp(again(x, shift, HOLD).to(tl.float32) - shift), axis=0)


@triton.jit
def _packed_fwd(
    x_ptr, y_ptr, word_ptr, sync_ptr, M, N, stride_x, stride_y,
    BLOCK_N: tl.constexpr, SPLITS: tl.constexpr, SPLITS_P2: tl.constexpr, PHASE: tl.constexpr,
    SPIN: tl.constexpr,
):  # fmt: skip
    t = ticket(sync_ptr) if PHASE == 0 else tl.program_id(0)
    row = (t // SPLITS).to(tl.int64)
    j = t % SPLITS
    cols = j * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    hold: tl.constexpr = BLOCK_N >= HOLD_FROM
    x = tl.load(x_ptr + row * stride_x + cols, mask=col_mask, other=-float("inf"))
    words = word_ptr + row * SPLITS
    if PHASE != 2:
        m, d = _stats(x, hold)
        m_bits = m.to(tl.uint32, bitcast=True).to(tl.uint64)
        d_bits = d.to(tl.uint32, bitcast=True).to(tl.uint64)
        tl.store(words + j, ((m_bits << 32) | d_bits).to(tl.int64, bitcast=True))
    if PHASE != 1:
        k = tl.arange(0, SPLITS_P2)
        w = tl.load(words + k, mask=k < SPLITS, other=1, volatile=True)
        spins = 0
        while (tl.sum((w == 0).to(tl.int32), axis=0) > 0) & (spins < SPIN):
            w = tl.load(words + k, mask=k < SPLITS, other=1, volatile=True)
            spins += 1
        u = w.to(tl.uint64, bitcast=True)
        ms = (u >> 32).to(tl.uint32).to(tl.float32, bitcast=True)
        ds = u.to(tl.uint32).to(tl.float32, bitcast=True)
        ms = tl.where(k < SPLITS, ms, -float("inf"))
        ds = tl.where(k < SPLITS, ds, 0.0)
        m_row = tl.max(ms, axis=0)
        d_row = tl.sum(ds * tl.exp(ms - m_row), axis=0)
        xf = again(x, d_row, hold).to(tl.float32)
        y = tl.exp(xf - m_row) * (1.0 / d_row)
        tl.store(y_ptr + row * stride_y + cols, y.to(y_ptr.dtype.element_ty), mask=col_mask)


def packed_launch(x, y, block_n, warps, phases=(0,)):
    m, n = x.shape
    splits = triton.cdiv(n, block_n)
    words = torch.zeros(m, splits, device=x.device, dtype=torch.int64)
    sync = torch.zeros(1, device=x.device, dtype=torch.int32)
    for phase in phases:
        _packed_fwd[(m * splits,)](
            x, y, words, sync, m, n, x.stride(0), y.stride(0),
            BLOCK_N=block_n, SPLITS=splits, SPLITS_P2=triton.next_power_of_2(splits),
            PHASE=phase, SPIN=SPIN_LIMIT, num_warps=warps,
        )  # fmt: skip


def _cpu_check() -> None:
    """The packed kernel's two-launch form under the interpreter: rows with -inf chunks, a
    row of only -inf (NaN, as torch), a partial last chunk; against torch in fp32."""
    x = torch.randn(5, 700) * 4
    x[1, :128] = float("-inf")
    x[2, 128:640] = float("-inf")
    x[3] = float("-inf")
    x[4, 5] = 90.0
    y = torch.full_like(x, float("nan"))
    packed_launch(x, y, 128, 4, phases=(1, 2))
    ref = torch.softmax(x, -1)
    assert torch.equal(torch.isnan(y), torch.isnan(ref))
    ok = ~torch.isnan(ref)
    err = (y[ok] - ref[ok]).abs().max().item()
    assert err < 1e-6, err
    print(f"cpu check: max err {err:.3g}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cols", default="65536,131072,152064,262144")
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    args = ap.parse_args()
    if args.cpu:
        _cpu_check()
        return
    from _probe import gpu_setup, rounds_summary, write_csv
    from softmax_split_probe import _probe_launch

    from kernelwright.ops.softmax import softmax_fwd_launch

    timer, _, copy = gpu_setup()
    rows = []
    m = args.rows
    for n in (int(v) for v in args.cols.split(",")):
        gen = torch.Generator(device="cuda").manual_seed(n)
        x = torch.randn(m, n, device="cuda", generator=gen).mul_(4).bfloat16()
        y = torch.empty_like(x)
        ref = torch.softmax(x.float(), -1)
        gb = 2 * m * n * 2 / 1e9
        variants = {
            "lib": functools.partial(softmax_fwd_launch, x, y, False),
            "protocol": functools.partial(_probe_launch, x, y, 16384, 16, True, True, True),
            "packed": functools.partial(packed_launch, x, y, 16384, 16),
        }
        errs, ts = {}, {name: [] for name in variants}
        for name, fn in variants.items():
            y.fill_(float("nan"))
            fn()
            torch.cuda.synchronize()
            errs[name] = (y.float() - ref).abs().max().item()
            if not errs[name] < 1e-2:
                print(f"{m}x{n} {name}: WRONG, max err {errs[name]:.3g}", flush=True)
        del ref
        for _ in range(args.rounds):
            for name, fn in variants.items():
                ts[name].append(timer(fn, lambda: None)[1])
        base = None
        for name in variants:
            summary = rounds_summary(f"{m}x{n} {name:9s}", ts[name])
            pct = gb / (summary["ms"] * 1e-3) / copy * 100
            base = base or summary["ms"]
            print(f"    {pct:5.1f}% of copy, {summary['ms'] / base - 1:+.1%} vs lib, "
                  f"max err {errs[name]:.3g}", flush=True)  # fmt: skip
            rows.append(dict(shape=f"{m}x{n}", variant=name, ms=summary["ms"],
                             spread_ms=summary["spread"], pct_copy=pct,
                             max_err=errs[name]))  # fmt: skip
        del x, y
        torch.cuda.empty_cache()
    write_csv(args.out, "softmax_packed_probe.csv", rows)


if __name__ == "__main__":
    main()
