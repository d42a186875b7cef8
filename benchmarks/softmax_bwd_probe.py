"""softmax backward at 4096-32768 columns: the looped two-read kernel compiled per row length,
against the library's one-row kernel and torch.compile's backward (prints, CSV to $OUT).

NOTES 56. torch.compile's softmax backward is a looped reduction (pass 1 reads dy and y with
evict_last, pass 2 reads them again with evict_first and writes dx) and runs 2-4% ahead of our
one-row kernel at 8192-32768 columns. NOTES 23 found our looped backward slower with a runtime
row length; NOTES 42 then found a constexpr row length nearly all of layer_norm's looped gain.
This probe: a copy of the library's looped backward (softmax, not log) with `NC` (row length
constexpr), the L2 flags and `REVERSE` as switches, over chunk widths and warp counts; the
library (`lib`) and torch.compile (`torch_compile`, aten._softmax_backward_data compiled) in the
same process, `--rounds` alternating rounds, medians. Kernels alone, `--dtype` (bf16). At the
end, the config inductor's autotuner kept for its backward kernel at each shape.

    python benchmarks/softmax_bwd_probe.py [--shapes 4096x4096,...] [--rounds 2] [--sweep focus]

`--sweep wide` (default): chunk widths 2048 to the whole row x 8-32 warps, and the switches one at
a time. `--sweep focus`: the wide sweep's candidates with 32- and 64-bit row offsets, and Liger.
`--sweep held`: the one-row kernel with dy and y held in their own dtype (NOTES 58).
"""

from __future__ import annotations

import argparse
import functools
import gc
import itertools
import os
import statistics
from pathlib import Path

import torch
import triton
import triton.language as tl
from _probe import gpu_setup, time_variants, write_csv

from kernelwright.ops._held import again
from kernelwright.ops.softmax import softmax_bwd_launch
from kernelwright.runtime.launch import LaunchConfig


@triton.jit
def _softmax_bwd_looped(dy_ptr, y_ptr, dx_ptr, N_RT, stride, N_CONST: tl.constexpr,
                        NC: tl.constexpr, BLOCK_N: tl.constexpr, EVICT_1ST: tl.constexpr,
                        EVICT_2ND: tl.constexpr, REVERSE: tl.constexpr,
                        I64: tl.constexpr):  # fmt: skip
    # the library's _softmax_bwd_looped_kernel (softmax, not log) with the switches; dy, y and
    # dx contiguous with one row stride
    N = N_CONST if NC else N_RT
    row = tl.program_id(0).to(tl.int64) if I64 else tl.program_id(0)
    dy_row = dy_ptr + row * stride
    y_row = y_ptr + row * stride
    n_chunks = tl.cdiv(N, BLOCK_N)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        col_mask = cols < N
        dy = tl.load(dy_row + cols, mask=col_mask, other=0.0, eviction_policy=EVICT_1ST)
        y = tl.load(y_row + cols, mask=col_mask, other=0.0, eviction_policy=EVICT_1ST)
        acc += dy.to(tl.float32) * y.to(tl.float32)
    s = tl.sum(acc, axis=0)
    for c in range(0, n_chunks):
        cols = (n_chunks - 1 - c if REVERSE else c) * BLOCK_N + tl.arange(0, BLOCK_N)
        col_mask = cols < N
        dy = tl.load(dy_row + cols, mask=col_mask, other=0.0, eviction_policy=EVICT_2ND)
        y = tl.load(y_row + cols, mask=col_mask, other=0.0, eviction_policy=EVICT_2ND)
        dx = y.to(tl.float32) * (dy.to(tl.float32) - s)
        tl.store(dx_ptr + row * stride + cols, dx.to(dx_ptr.dtype.element_ty), mask=col_mask,
                 eviction_policy=EVICT_2ND)  # fmt: skip


@triton.jit
def _softmax_bwd_onerow(dy_ptr, y_ptr, dx_ptr, N, stride, BLOCK_N: tl.constexpr,
                        HOLD: tl.constexpr):  # fmt: skip
    # the library's one-row backward (softmax, ROWS = 1) with dy and y held in their own dtype
    # (HOLD, ops/_held.py: converted afresh after the sum) instead of as fp32
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    dy = tl.load(dy_ptr + row * stride + cols, mask=mask, other=0.0)
    y = tl.load(y_ptr + row * stride + cols, mask=mask, other=0.0)
    if not HOLD:
        dy = dy.to(tl.float32)
        y = y.to(tl.float32)
    s = tl.sum(dy.to(tl.float32) * y.to(tl.float32), axis=0)
    dx = again(y, s, HOLD).to(tl.float32) * (again(dy, s, HOLD).to(tl.float32) - s)
    tl.store(dx_ptr + row * stride + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)


def _variants(dy, y, dx, compiled, sweep: str) -> dict:
    m, n = y.shape
    variants = {
        "torch_compile": functools.partial(compiled, dy, y),
        "lib": functools.partial(softmax_bwd_launch, dy, y, dx, False),
    }
    try:  # Liger's backward as its autograd Function calls it
        from liger_kernel.ops.softmax import _softmax_backward
        from liger_kernel.ops.utils import calculate_settings

        block, warps = calculate_settings(n)
        variants["liger"] = functools.partial(_softmax_backward, dy, y, block, warps, block < n)
    except ImportError:
        print("liger_kernel not installed: no liger row")

    def looped(block, warps, nc, flags, rev, i64=1):
        return functools.partial(
            _softmax_bwd_looped[(m,)], dy, y, dx, n, y.stride(0), N_CONST=n, NC=bool(nc),
            BLOCK_N=block, EVICT_1ST="evict_last" if flags else "",
            EVICT_2ND="evict_first" if flags else "", REVERSE=bool(rev), I64=bool(i64),
            num_warps=warps,
        )  # fmt: skip

    def onerow(warps):
        cfg = LaunchConfig(block_n=triton.next_power_of_2(n), rows=1, num_warps=warps)
        return functools.partial(softmax_bwd_launch, dy, y, dx, False, cfg)

    if sweep == "held":
        # NOTES 58: the one-row kernel with dy and y held in their dtype, at 16 and 32 warps
        for warps, hold in itertools.product((16, 32), (0, 1)):
            variants[f"onerow_w{warps}_hold{hold}"] = functools.partial(
                _softmax_bwd_onerow[(m,)], dy, y, dx, n, y.stride(0),
                BLOCK_N=triton.next_power_of_2(n), HOLD=bool(hold), num_warps=warps,
            )  # fmt: skip
        return variants
    if sweep == "focus":
        # the candidates of the wide sweep (H100 and H200), 32- and 64-bit row offsets
        for block, warps, i64 in itertools.product((4096, 8192, 16384), (16, 32), (0, 1)):
            if block <= n:
                variants[f"looped_b{block}_w{warps}_i64{i64}"] = looped(block, warps, 1, 1, 0, i64)
        for warps in (8, 16):
            variants[f"onerow_w{warps}"] = onerow(warps)
        return variants
    # wide: the row length a constexpr, the L2 flags on: every chunk width up to the whole row
    # (one trip of each loop, pass 2 reading from L2: what inductor keeps at 16384-32768)
    for block, warps in itertools.product((2048, 4096, 8192, 16384, 32768), (8, 16, 32)):
        if block <= n:
            variants[f"looped_b{block}_w{warps}_nc1_l2_rev0"] = looped(block, warps, 1, 1, 0)
    # the switches one at a time at 4096 x 16: runtime length (23's form), flags off, reversed
    variants["looped_b4096_w16_nc0_l2_rev0"] = looped(4096, 16, 0, 1, 0)
    variants["looped_b4096_w16_nc1_noflags_rev0"] = looped(4096, 16, 1, 0, 0)
    variants["looped_b4096_w16_nc1_l2_rev1"] = looped(4096, 16, 1, 1, 1)
    # the library's one-row kernel (dy and y held in registers) at every warp count
    for warps in (4, 8, 16, 32):
        variants[f"onerow_w{warps}"] = onerow(warps)
    return variants


def _inductor_kept() -> list[str]:
    """The config each inductor autotuner alive now kept, one line each."""
    lines = []
    for t in (o for o in gc.get_objects() if type(o).__name__ == "CachingAutotuner"):
        name = getattr(getattr(t, "fn", None), "__name__", "?")
        name += f" {getattr(t, 'size_hints', '')}"
        for launcher in getattr(t, "launchers", []):
            lines.append(f"{name}: {launcher.config}  regs {getattr(launcher, 'n_regs', '?')}"
                         f" spills {getattr(launcher, 'n_spills', '?')}")  # fmt: skip
    return lines


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="4096x4096,4096x8192,4096x16384,4096x32768")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--sweep", choices=("wide", "focus", "held"), default="wide")
    ap.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    args = ap.parse_args()
    timer, _, copy = gpu_setup()
    out_rows, kept = [], []
    for shape in args.shapes.split(","):
        m, n = (int(v) for v in shape.split("x"))
        x = torch.randn(m, n, device="cuda", dtype=torch.float32)
        dtype = getattr(torch, args.dtype)
        y = torch.softmax(x, dim=-1).to(dtype)
        dy = torch.randn(m, n, device="cuda", dtype=dtype)
        dx = torch.empty_like(y)
        yf, dyf = y.float(), dy.float()
        ref = yf * (dyf - (dyf * yf).sum(-1, keepdim=True))
        tol = 0.02 * ref.abs().max().item()  # bf16 rounding of dx is ~0.4% of its magnitude
        compiled = torch.compile(
            lambda dy, y: torch.ops.aten._softmax_backward_data(dy, y, -1, dy.dtype),
            dynamic=False,
        )
        variants = _variants(dy, y, dx, compiled, args.sweep)
        gb = 3 * m * n * y.element_size() / 1e9  # read dy and y, write dx
        per_round = [time_variants(shape, variants, dx, ref, tol, timer, gb, copy)
                     for _ in range(args.rounds)]  # fmt: skip
        times: dict[str, list[float]] = {}
        regs: dict[str, tuple] = {}
        for rows in per_round:
            for r in rows:
                times.setdefault(r["variant"], []).append(r["ms"])
                regs[r["variant"]] = (r["regs"], r["spills"])
        rows = []
        for name, ts in times.items():
            med = statistics.median(ts)
            rows.append(dict(shape=shape, variant=name, ms=med, spread=max(ts) - min(ts),
                             pct_copy=gb / (med * 1e-3) / copy * 100, regs=regs[name][0],
                             spills=regs[name][1]))  # fmt: skip
        rows.sort(key=lambda r: r["ms"])
        ref_ms = {r["variant"]: r["ms"] for r in rows}
        for r in rows:
            vs = ref_ms.get("torch_compile", float("nan")) / r["ms"]
            print(f"{shape} {r['variant']:34s} {r['ms'] * 1e3:8.2f} us (spread "
                  f"{r['spread'] * 1e3:.2f}) {r['pct_copy']:5.1f}%  {vs:.3f}x compile"
                  f"  regs {r['regs']} spills {r['spills']}", flush=True)  # fmt: skip
        out_rows += rows
        kept += [f"{shape} {line}" for line in _inductor_kept()]
        del x, y, dy, dx, yf, dyf, ref, compiled, variants
        gc.collect()
    print("\ninductor's kept configs:")
    for line in dict.fromkeys(kept):
        print("  " + line)
    write_csv(args.out, f"softmax_bwd_probe_{args.sweep}_{args.dtype}.csv", out_rows)


if __name__ == "__main__":
    main()
