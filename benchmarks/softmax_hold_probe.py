"""Softmax probe: a row held in registers in its own 16-bit dtype instead of as fp32.

Prints only (and a CSV to $OUT); the benchmark of record is `kernelwright bench softmax`.

The one-row kernels used to convert the loaded row to fp32 at once, so a program held 4 bytes
per value: one 32768-wide row filled half an SM's register file, and at 65536 the row no
longer fit (the table took the two-read looped kernel there, 68% of copy on the H200). Held
as bf16 the same row costs half the registers. Each use of the row converts it afresh; the
library's `_held.again` keeps the compiler from merging those conversions into one fp32
copy that lives across a reduction. Forward variants, one process, per row length:
`lib` (the table's row), `hold_wW` (the library's one-row kernel at W warps), `f32_wW` (the
former fp32-held form, a copy here), `looped` (the former 65536 row), `liger`. Backward: `lib`
and `hold_wW` (dy and y held in their dtype, a copy here).

The first run (`softmax_hold_probe_first.log`) was of an earlier form of this script: its
`hold` kernels made the dependence with a bf16 add of a zero, and its `holdpers` variants were
persistent grids staging rows ahead (slower than one program per row everywhere).

    python benchmarks/softmax_hold_probe.py [--cols 4096,8192,16384,32768,65536] [--rows 4096]
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

from kernelwright.ops._held import again
from kernelwright.ops.softmax import softmax_bwd_launch, softmax_fwd_launch
from kernelwright.runtime.launch import LaunchConfig


@triton.jit
def _f32_fwd_kernel(x_ptr, y_ptr, N, stride_x, stride_y, BLOCK_N: tl.constexpr):
    # The one-row forward as it was before: the row converted to fp32 once, at the load.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=-float("inf")).to(tl.float32)
    m = tl.max(x, axis=0)
    e = tl.exp(x - m)
    d = tl.sum(e, axis=0)
    tl.store(y_ptr + row * stride_y + cols, (e * (1.0 / d)).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _hold_bwd_kernel(dy_ptr, y_ptr, dx_ptr, N, stride_dy, stride_y, stride_dx,
                     BLOCK_N: tl.constexpr):  # fmt: skip
    # The backward with dy and y held in their own dtype (the library's `again` per use).
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    dy = tl.load(dy_ptr + row * stride_dy + cols, mask=mask, other=0.0)
    y = tl.load(y_ptr + row * stride_y + cols, mask=mask, other=0.0)
    s = tl.sum(dy.to(tl.float32) * y.to(tl.float32), axis=0)
    dx = again(y, s, True).to(tl.float32) * (again(dy, s, True).to(tl.float32) - s)
    tl.store(dx_ptr + row * stride_dx + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)


WARPS = (4, 8, 16, 32)


def _fits(n: int, warps: int) -> bool:
    return 8 <= n // (warps * 32) <= 128  # 16-byte loads, at most 128 values per thread


def _fwd_variants(x, y) -> dict:
    m, n = x.shape
    variants = {"lib": functools.partial(softmax_fwd_launch, x, y, False)}
    try:
        from liger_kernel.ops.softmax import LigerSoftmaxFunction

        if n <= 65536:
            variants["liger"] = functools.partial(LigerSoftmaxFunction.apply, x)
    except ImportError:
        pass
    for warps in (w for w in WARPS if _fits(n, w)):
        cfg = LaunchConfig(block_n=n, rows=1, num_warps=warps)
        variants[f"hold_w{warps}"] = functools.partial(softmax_fwd_launch, x, y, False, config=cfg)
        variants[f"f32_w{warps}"] = functools.partial(
            _f32_fwd_kernel[(m,)], x, y, n, x.stride(0), y.stride(0), BLOCK_N=n, num_warps=warps
        )
    looped = LaunchConfig(block_n=4096, num_warps=16, evict_hints=True, reverse_pass=True)
    variants["looped"] = functools.partial(softmax_fwd_launch, x, y, False, config=looped)
    return variants


def _bwd_variants(dy, y, dx) -> dict:
    m, n = y.shape
    variants = {"lib": functools.partial(softmax_bwd_launch, dy, y, dx, False)}
    for warps in (w for w in WARPS if _fits(n, w)):
        variants[f"hold_w{warps}"] = functools.partial(
            _hold_bwd_kernel[(m,)], dy, y, dx, n, dy.stride(0), y.stride(0), dx.stride(0),
            BLOCK_N=n, num_warps=warps,
        )  # fmt: skip
    return variants


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cols", default="4096,8192,16384,32768,65536")
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--kinds", default="fwd,bwd")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    args = ap.parse_args()
    timer, _, copy = gpu_setup()
    rows = []
    m = args.rows
    for kind, n in itertools.product(args.kinds.split(","), (int(v) for v in args.cols.split(","))):
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16) * 3
        y = torch.empty_like(x)
        if kind == "fwd":
            ref = torch.softmax(x.float(), -1)
            gb = 2 * m * n * 2 / 1e9
            variants, out_buf = _fwd_variants(x, y), y
        else:
            y.copy_(torch.softmax(x.float(), -1))
            dy = torch.randn_like(x)
            dx = torch.empty_like(x)
            yf = y.float()
            ref = yf * (dy.float() - (dy.float() * yf).sum(-1, keepdim=True))
            gb = 3 * m * n * 2 / 1e9
            variants, out_buf = _bwd_variants(dy, y, dx), dx
        for name, fn in variants.items():
            try:
                out_buf.fill_(float("nan"))
                out = fn()
                torch.cuda.synchronize()
                got = out if name == "liger" else out_buf
                err = ((got.float() - ref).abs() / (ref.abs() + 1e-6)).max().item()
                note = ""
                if hasattr(out, "n_spills"):
                    note = f"spills={out.n_spills} regs={out.n_regs}"
                if not err < 1e-2:
                    print(f"{kind} {n:6d} {name:22s} WRONG max rel err {err:.3g}  {note}")
                    continue
                p50 = timer(fn, lambda: None)[1]
            except Exception as e:  # a variant that does not compile is a result
                print(f"{kind} {n:6d} {name:22s} FAILED {type(e).__name__}: {str(e)[:160]}")
                continue
            pct = gb / (p50 * 1e-3) / copy * 100
            rows.append(dict(kind=kind, rows=m, cols=n, variant=name, ms=p50, pct_copy=pct,
                             max_rel_err=err, note=note))  # fmt: skip
            print(f"{kind} {n:6d} {name:22s} {p50 * 1e3:8.1f} us {pct:5.1f}%  err {err:.2g}  "
                  f"{note}", flush=True)  # fmt: skip
        best = min((r for r in rows if r["cols"] == n and r["kind"] == kind), key=lambda r: r["ms"])
        print(f"{kind} {n:6d} best {best['variant']} {best['ms'] * 1e3:.1f} us", flush=True)
    write_csv(args.out, "softmax_hold_probe.csv", rows)


if __name__ == "__main__":
    main()
