"""layer_norm's looped forward against torch.compile's at 8192 x 16384 (prints, CSV to $OUT).

At 8192 x 16384 our forward (the one-row kernel, 0.141 ms) is 0.94-0.96x torch.compile (0.135).
Inductor's kernel there (`inductor_configs.py layer_norm 8192 16384`, H200, torch 2.11) is a
looped two-read kernel: one row per program, 2048-wide chunks, 16 warps, one stage, 31
registers; a Welford pass with evict_last loads, then a write pass whose x loads are
evict_first, w and b evict_last and the store without a hint; the row length a constant. Our
looped kernel of the same shape of work ran at 0.18 ms at best (NOTES 27). This probe walks
the differences one at a time, on a copy of our kernel with each as a switch:

- `NC`: the row length a constexpr (masks and the chunk count known to the compiler);
- `WB`: w and b loaded evict_last (default policy in the library);
- `ST`: the store's hint, evict_first (library) or none (inductor);
- `X1`/`X2`: the first read evict_last, the second evict_first (the library's L2 flags);
- `I64`: 64-bit row offsets (library) or 32-bit (inductor, whose offsets are known to fit);
- `STATS`: mean and rstd stored (the library's forward saves them for the backward);
- the launch's `num_stages` (Triton's default, 3 on sm_90; inductor launches with 1).

- `CHAN`: the lanes' statistics merged in one tuple reduction (inductor) instead of two;
- `onerow_*`: the library's one-row kernel, with `NC` and `I64`;
- `maxnreg`: a cap on registers per thread (more programs per SM; inductor's has 31).

The runs (H200, logs and CSVs in results/h200-norm-fwd/): `NC` alone took the kernel from 177
to 140 us (the one-row kernel's time), 32-bit offsets -2%, the hints 1-3%, stages, stats and
`CHAN` nothing or worse; at 16 warps the kernel already has inductor's 32 registers (4
programs per SM) and `maxnreg` moved nothing past noise. Best ~135 us; torch.compile 131.

    python benchmarks/ln_looped_probe.py [--shapes 8192x16384,4096x32768]
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
from _probe import gpu_setup, time_variants, write_csv

from kernelwright.ops.layer_norm import layer_norm_fwd_launch
from kernelwright.runtime import LaunchConfig


@triton.jit
def _chan(m_a, m2_a, c_a, m_b, m2_b, c_b):
    c = c_a + c_b
    f = tl.where(c == 0, 0.0, c_b / tl.where(c == 0, 1.0, c))
    delta = m_b - m_a
    return m_a + delta * f, m2_a + m2_b + delta * delta * c_a * f, c


@triton.jit
def _ln_fwd_onerow(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, N_RT, stride_x, stride_y,
                   eps, N_CONST: tl.constexpr, NC: tl.constexpr, BLOCK_N: tl.constexpr,
                   I64: tl.constexpr):  # fmt: skip
    # the library's one-row kernel (ROWS = 1, w and b after the statistics), with the switches
    N = N_CONST if NC else N_RT
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    row = tl.program_id(0).to(tl.int64) if I64 else tl.program_id(0)
    x = tl.load(x_ptr + row * stride_x + cols, mask=col_mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / N
    xc = tl.where(col_mask, x - mean, 0.0)
    rstd = tl.rsqrt(tl.sum(xc * xc, axis=0) / N + eps)
    w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    y = xc * rstd * w + b
    tl.store(y_ptr + row * stride_y + cols, y.to(y_ptr.dtype.element_ty), mask=col_mask)
    tl.store(mean_ptr + row, mean)
    tl.store(rstd_ptr + row, rstd)


@triton.jit
def _ln_fwd_looped(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, N_RT, stride_x, stride_y,
                   eps, N_CONST: tl.constexpr, NC: tl.constexpr, BLOCK_N: tl.constexpr,
                   X1: tl.constexpr, X2: tl.constexpr, WB: tl.constexpr,
                   ST: tl.constexpr, I64: tl.constexpr, STATS: tl.constexpr,
                   CHAN: tl.constexpr):  # fmt: skip
    N = N_CONST if NC else N_RT
    row = tl.program_id(0).to(tl.int64) if I64 else tl.program_id(0)
    x_row = x_ptr + row * stride_x
    y_row = y_ptr + row * stride_y
    lanes = tl.arange(0, BLOCK_N)
    m_l = tl.zeros([BLOCK_N], dtype=tl.float32)
    m2_l = tl.zeros([BLOCK_N], dtype=tl.float32)
    c_l = tl.zeros([BLOCK_N], dtype=tl.float32)
    for k in range(0, tl.cdiv(N, BLOCK_N)):
        cols = k * BLOCK_N + lanes
        col_mask = cols < N
        x = tl.load(x_row + cols, mask=col_mask, other=0.0, eviction_policy=X1).to(tl.float32)
        count = (k + 1) * 1.0
        delta = x - m_l
        m_new = m_l + delta * (1.0 / count)
        m2_l = tl.where(col_mask, m2_l + delta * (x - m_new), m2_l)
        m_l = tl.where(col_mask, m_new, m_l)
        c_l = tl.where(col_mask, count, c_l)
    if CHAN:  # one tuple reduction, the lanes merged pairwise (as inductor's welford)
        mean, m2, _ = tl.reduce((m_l, m2_l, c_l), 0, _chan)
        rstd = tl.rsqrt(m2 / N + eps)
    else:  # the library's: the mean first, then the lanes' spread around it
        mean = tl.sum(c_l * m_l, axis=0) / N
        d = m_l - mean
        rstd = tl.rsqrt((tl.sum(m2_l, axis=0) + tl.sum(c_l * d * d, axis=0)) / N + eps)
    for k in range(0, tl.cdiv(N, BLOCK_N)):
        cols = k * BLOCK_N + lanes
        col_mask = cols < N
        x = tl.load(x_row + cols, mask=col_mask, other=0.0, eviction_policy=X2)
        w = tl.load(w_ptr + cols, mask=col_mask, other=0.0, eviction_policy=WB)
        b = tl.load(b_ptr + cols, mask=col_mask, other=0.0, eviction_policy=WB)
        y = (x.to(tl.float32) - mean) * rstd * w.to(tl.float32) + b.to(tl.float32)
        tl.store(y_row + cols, y.to(y_ptr.dtype.element_ty), mask=col_mask, eviction_policy=ST)
    if STATS:
        tl.store(mean_ptr + row, mean)
        tl.store(rstd_ptr + row, rstd)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="8192x16384,4096x32768")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    args = ap.parse_args()
    timer, _, copy = gpu_setup()
    out_rows = []
    for shape in args.shapes.split(","):
        m, n = (int(v) for v in shape.split("x"))
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        y = torch.empty_like(x)
        mean = torch.empty(m, device="cuda", dtype=torch.float32)
        rstd = torch.empty_like(mean)
        ref = torch.nn.functional.layer_norm(x.float(), (n,), w.float(), b.float(), 1e-5)
        compiled = torch.compile(
            functools.partial(
                torch.nn.functional.layer_norm, normalized_shape=(n,), weight=w, bias=b, eps=1e-5
            ),
            dynamic=False,
        )
        lib = functools.partial(layer_norm_fwd_launch, x, w, b, y, mean, rstd, 1e-5)
        variants = {"torch_compile": functools.partial(compiled, x), "lib": lib}
        variants["lib_looped_2048_w16"] = functools.partial(
            lib, config=LaunchConfig(block_n=2048, num_warps=16, evict_hints=True)
        )
        # 761e0ae: NC 1 took 177 -> 140 us; wb, st and the flags moved 1-3%. f7d3d21: 32-bit
        # offsets -2%, the launch's stages and the stats stores nothing. 6bfb1f5: Chan slower.
        # Now: registers. Inductor's kernel has 31 at 16 warps (4 programs per SM); the unrolled
        # loop may hold more, so fewer programs per SM: maxnreg caps them.
        x1, x2, wb, st = "evict_last", "evict_first", "", "evict_first"
        for block, warps, maxnreg in itertools.product(
            (1024, 2048, 4096), (8, 16), (None, 32, 40, 48, 64)
        ):
            if block // (warps * 32) < 1:
                continue
            name = f"looped_b{block}_w{warps}_maxnreg{maxnreg}"
            variants[name] = functools.partial(
                _ln_fwd_looped[(m,)], x, w, b, y, mean, rstd, n, x.stride(0), y.stride(0),
                1e-5, N_CONST=n, NC=True, BLOCK_N=block, X1=x1, X2=x2, WB=wb, ST=st,
                I64=False, STATS=True, CHAN=False, num_warps=warps, maxnreg=maxnreg,
            )  # fmt: skip
        gb = 2 * m * n * 2 / 1e9
        out_rows += time_variants(shape, variants, y, ref, 0.1, timer, gb, copy)
        best = sorted((r for r in out_rows if r["shape"] == shape), key=lambda r: r["ms"])
        for r in best:
            print(f"{shape} {r['variant']:32s} {r['ms'] * 1e3:7.1f} us {r['pct_copy']:5.1f}%"
                  f"  regs {r['regs']} spills {r['spills']}", flush=True)  # fmt: skip
    write_csv(args.out, "ln_looped_probe.csv", out_rows)


if __name__ == "__main__":
    main()
