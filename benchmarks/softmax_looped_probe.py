"""softmax forward past 32768 columns: the looped two-read kernel compiled per row length,
against the split rows of record (prints, CSV to $OUT).

NOTES 42 found layer_norm's looped forward 23% faster with its row length a constexpr (the
chunk count known, the loop unrolls and several chunks' loads issue at once): 87.9% of copy at
4096 x 32768. softmax's forward past 32768 is the split form (ops/_split.py, 76-81% of copy;
its exchange costs ~18 points, NOTES 34); its looped kernel, same structure as layer_norm's,
was 68% at 65536 with a runtime row length (22). This probe: a copy of the library's looped
kernel with `NC` (row length constexpr) and `I64` (64-bit row offsets) switches, the L2 flags
on, against the library (`lib`, split) and torch.compile in one process. Kernels alone, bf16.

    python benchmarks/softmax_looped_probe.py [--shapes 4096x65536,4096x131072,4096x262144]
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

from kernelwright.ops.softmax import softmax_fwd_launch


@triton.jit
def _softmax_looped(x_ptr, y_ptr, N_RT, stride_x, stride_y, N_CONST: tl.constexpr,
                    NC: tl.constexpr, I64: tl.constexpr, BLOCK_N: tl.constexpr,
                    EVICT_1ST: tl.constexpr, EVICT_2ND: tl.constexpr,
                    REVERSE: tl.constexpr):  # fmt: skip
    # the library's _softmax_fwd_looped_kernel (softmax, not log) with the switches
    N = N_CONST if NC else N_RT
    row = tl.program_id(0).to(tl.int64) if I64 else tl.program_id(0)
    x_row = x_ptr + row * stride_x
    y_row = y_ptr + row * stride_y
    n_chunks = tl.cdiv(N, BLOCK_N)
    m = tl.full([BLOCK_N], -float("inf"), dtype=tl.float32)
    d = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        x = tl.load(x_row + cols, mask=cols < N, other=-float("inf"), eviction_policy=EVICT_1ST)
        x = x.to(tl.float32)
        m_new = tl.maximum(m, x)
        shift = tl.where(m_new == -float("inf"), 0.0, m_new)
        d = d * tl.exp(m - shift) + tl.exp(x - shift)
        m = m_new
    m_row = tl.max(m, axis=0)
    d_row = tl.sum(d * tl.exp(m - m_row), axis=0)
    inv_d = 1.0 / d_row
    for c in range(0, n_chunks):
        cols = (n_chunks - 1 - c if REVERSE else c) * BLOCK_N + tl.arange(0, BLOCK_N)
        col_mask = cols < N
        x = tl.load(x_row + cols, mask=col_mask, other=-float("inf"), eviction_policy=EVICT_2ND)
        y = tl.exp(x.to(tl.float32) - m_row) * inv_d
        tl.store(y_row + cols, y.to(y_ptr.dtype.element_ty), mask=col_mask,
                 eviction_policy=EVICT_2ND)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="4096x65536,4096x131072,4096x262144")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    args = ap.parse_args()
    timer, _, copy = gpu_setup()
    out_rows = []
    for shape in args.shapes.split(","):
        m, n = (int(v) for v in shape.split("x"))
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        y = torch.empty_like(x)
        ref = torch.softmax(x.float(), dim=-1)
        compiled = torch.compile(functools.partial(torch.softmax, dim=-1), dynamic=False)
        variants = {
            "torch_compile": functools.partial(compiled, x),
            "lib": functools.partial(softmax_fwd_launch, x, y, False),
        }
        for block, warps, nc, i64, rev in itertools.product(
            (2048, 4096, 8192), (8, 16), (0, 1), (0, 1), (0, 1)
        ):
            if i64 and not nc:
                continue
            name = f"looped_b{block}_w{warps}_nc{nc}_i64{i64}_rev{rev}"
            variants[name] = functools.partial(
                _softmax_looped[(m,)], x, y, n, x.stride(0), y.stride(0), N_CONST=n,
                NC=bool(nc), I64=bool(i64), BLOCK_N=block, EVICT_1ST="evict_last",
                EVICT_2ND="evict_first", REVERSE=bool(rev), num_warps=warps,
            )  # fmt: skip
        gb = 2 * m * n * 2 / 1e9
        out_rows += time_variants(shape, variants, y, ref, 1e-3, timer, gb, copy)
        best = sorted((r for r in out_rows if r["shape"] == shape), key=lambda r: r["ms"])
        shown = best[:8] + [r for r in best[8:] if r["variant"] in ("lib", "torch_compile")]
        for r in shown:
            print(f"{shape} {r['variant']:32s} {r['ms'] * 1e3:7.1f} us {r['pct_copy']:5.1f}%"
                  f"  regs {r['regs']} spills {r['spills']}", flush=True)  # fmt: skip
        del x, y, ref
    write_csv(args.out, "softmax_looped_probe.csv", out_rows)


if __name__ == "__main__":
    main()
