"""jagged_mean forward at narrow rows: a persistent grid that loads the next segment ahead.

Prints only (and a CSV to $OUT); the benchmark of record is `kernelwright bench jagged_mean`.

At D = 64 the library's forward (one program per segment) runs at 67-70% of copy, and segments
of equal length do no better (NOTES 25): each program pays its own latency — two dependent
offset loads, then one or two 16 KB chunks. Here each program walks segments pid, pid + P, ...
and loads the next segment's offsets (`ahead=1`) and also its first row chunk (`ahead=2`)
before this segment's sum, so those latencies overlap this segment's work.

    python benchmarks/jagged_persistent_probe.py [--d 64,256]
"""

from __future__ import annotations

import argparse
import functools
import itertools
import os
from pathlib import Path

import torch
import triton
import triton.language as tl
from _probe import gpu_setup, write_csv

from kernelwright.ops.jagged_mean import jagged_mean_fwd_launch, jagged_mean_ref


@triton.jit
def _persistent_kernel(v_ptr, offsets_ptr, out_ptr, B, D, stride_v, stride_out,
                       BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr,
                       AHEAD: tl.constexpr):  # fmt: skip
    # One column tile (D <= BLOCK_D). Segments pid, pid + P, ...
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_D)
    col_mask = cols < D
    r_idx = tl.arange(0, BLOCK_R)
    ok = pid < B
    start = tl.load(offsets_ptr + pid, mask=ok, other=0).to(tl.int64)
    end = tl.load(offsets_ptr + pid + 1, mask=ok, other=0).to(tl.int64)
    if AHEAD >= 2:
        rows = start + r_idx
        m = (rows < end)[:, None] & col_mask[None, :]
        first = tl.load(v_ptr + rows[:, None] * stride_v + cols[None, :], mask=m, other=0.0)
    for seg in range(pid, B, nprog):
        nseg = seg + nprog
        has_next = nseg < B
        if AHEAD >= 1:
            nstart = tl.load(offsets_ptr + nseg, mask=has_next, other=0).to(tl.int64)
            nend = tl.load(offsets_ptr + nseg + 1, mask=has_next, other=0).to(tl.int64)
        if AHEAD >= 2:
            acc = first.to(tl.float32)
            nrows = nstart + r_idx
            nm = (nrows < nend)[:, None] & col_mask[None, :]
            first = tl.load(v_ptr + nrows[:, None] * stride_v + cols[None, :], mask=nm, other=0.0)
            lo = start + BLOCK_R
        else:
            acc = tl.zeros([BLOCK_R, BLOCK_D], dtype=tl.float32)
            lo = start
        for r in range(lo, end, BLOCK_R):
            rows = r + r_idx
            m = (rows < end)[:, None] & col_mask[None, :]
            x = tl.load(v_ptr + rows[:, None] * stride_v + cols[None, :], mask=m, other=0.0)
            acc += x.to(tl.float32)
        n = end - start
        mean = tl.math.div_rn(tl.sum(acc, axis=0), tl.maximum(n, 1).to(tl.float32))
        y = mean.to(out_ptr.dtype.element_ty)
        tl.store(out_ptr + seg * stride_out + cols, y, mask=col_mask)
        if AHEAD >= 1:
            start, end = nstart, nend
        else:
            start = tl.load(offsets_ptr + nseg, mask=has_next, other=0).to(tl.int64)
            end = tl.load(offsets_ptr + nseg + 1, mask=has_next, other=0).to(tl.int64)


def _launch(v, offsets, out, pps, rows, warps, ahead, sms):
    b, d = out.shape
    grid = (min(b, sms * pps),)
    _persistent_kernel[grid](v, offsets, out, b, d, v.stride(0), out.stride(0),
                             BLOCK_D=triton.next_power_of_2(d), BLOCK_R=rows, AHEAD=ahead,
                             num_warps=warps)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--d", default="64,256")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    args = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    # On the CPU (the interpreter) only the correctness checks run.
    timer, sms, _ = gpu_setup() if dev == "cuda" else (None, 4, 0.0)
    gen = torch.Generator().manual_seed(77)  # the bench's lengths: 4096 segments of 1..512
    lengths = (
        torch.randint(1, 513, (4096,), generator=gen)
        if dev == "cuda"
        else torch.tensor([3, 0, 70, 1, 33, 5, 0, 64, 65, 2])
    )
    offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    offsets[1:] = lengths.cumsum(0)
    total, b = int(offsets[-1]), len(lengths)
    offsets = offsets.to(dev)
    rows_out = []
    for d in (int(v) for v in args.d.split(",")):
        v = torch.randn(total, d, device=dev, dtype=torch.bfloat16)
        out = torch.empty(b, d, device=dev, dtype=torch.bfloat16)
        ref = jagged_mean_ref(v, offsets).float()
        variants = {"lib": functools.partial(jagged_mean_fwd_launch, v, offsets, out)}
        if dev == "cuda":
            grid_opts = itertools.product((2, 4, 8, 16), (32, 64, 128), (2, 4, 8), (0, 1, 2))
        else:
            grid_opts = [(1, 32, 4, a) for a in (0, 1, 2)]
        for pps, rows, warps, ahead in grid_opts:
            if warps * 32 * 2 > rows * triton.next_power_of_2(d) or rows * d > 16384:
                continue
            variants[f"pers_p{pps}_r{rows}_w{warps}_a{ahead}"] = functools.partial(
                _launch, v, offsets, out, pps, rows, warps, ahead, sms
            )
        gb = (total * d * 2 + b * d * 2) / 1e9
        for name, fn in variants.items():
            out.fill_(float("nan"))
            fn()
            err = (out.float() - ref).abs().max().item()
            if not err < 2e-2:
                print(f"d={d} {name:24s} WRONG max err {err:.3g}")
                continue
            if timer is None:
                print(f"d={d} {name:24s} ok (err {err:.2g})")
                continue
            p50 = timer(fn, lambda: None)[1]
            rows_out.append(dict(d=d, variant=name, ms=p50, gbps=gb / (p50 * 1e-3)))
        if timer is not None:
            best = sorted((r for r in rows_out if r["d"] == d), key=lambda r: r["ms"])
            lib = next(r for r in best if r["variant"] == "lib")
            for r in best[:6] + [lib]:
                print(f"d={d} {r['variant']:24s} {r['ms'] * 1e3:7.1f} us {r['gbps']:6.0f} GB/s")
    write_csv(args.out, "jagged_persistent_probe.csv", rows_out)


if __name__ == "__main__":
    main()
