"""Sweep launch configs of an op's kernels on the GPU and print the best per shape.

A development aid until the optimize workflow exists: `python benchmarks/tune.py rms_norm`.
Prints, per (kernel, shape), the configs sorted by median time with GB/s against the copy
bandwidth measured in the same run, and writes a CSV to $OUT (or the current directory).
"""

from __future__ import annotations

import csv
import itertools
import os
import sys
from functools import partial

import torch
import triton

import kernelwright  # noqa: F401
from kernelwright.runtime import LaunchConfig as C

DT = torch.bfloat16


def copy_gbps() -> float:
    src = torch.randn(2**28, device="cuda", dtype=DT)  # 512 MB
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=25, rep=200)
    return 2 * src.numel() * src.element_size() / ms / 1e6


_TIMER = None


def bench(fn) -> float:
    # GPU time alone (host overhead hidden, see bench.harness.cuda_timer): small shapes run
    # for less time than the CPU takes to launch them.
    global _TIMER
    if _TIMER is None:
        from kernelwright.bench.harness import cuda_timer

        _TIMER = cuda_timer(warmup_ms=10, rep_ms=60, hide_host=True)
    return _TIMER(fn, lambda: None)[1]


def rms_norm_cases():
    from kernelwright.ops.rms_norm import rms_norm_bwd_launch, rms_norm_fwd_launch

    shapes = [(16384, 4096), (8192, 16384), (8192, 2048), (8192, 3584), (8192, 8192), (16384, 1024)]
    for m, n in shapes:
        x = torch.randn(m, n, device="cuda", dtype=DT)
        w = torch.randn(n, device="cuda", dtype=DT)
        y = torch.empty_like(x)
        rstd = torch.empty(m, device="cuda", dtype=torch.float32)
        dy = torch.randn_like(x)
        dx = torch.empty_like(x)
        dw = torch.empty_like(w)
        block = triton.next_power_of_2(n)
        rows_opts = [r for r in (1, 2, 4, 8) if r * block <= 16384]
        warps = [w_ for w_ in (4, 8, 16, 32) if w_ * 32 * 2 <= block * max(rows_opts)]
        for rows, nw in itertools.product(rows_opts, warps):
            cfg = C(block_n=block, rows=rows, num_warps=nw)
            fwd = partial(rms_norm_fwd_launch, x, w, y, rstd, 1e-6, 0.0, "llama", config=cfg)
            yield "fwd", (m, n), cfg, fwd, 2 * m * n * 2
            for pps in (1, 2, 4, 8):
                cfgb = cfg.with_(programs_per_sm=pps)
                bwd = partial(
                    rms_norm_bwd_launch, dy, x, w, rstd, dx, dw, 0.0, "llama", config=cfgb
                )
                yield "bwd", (m, n), cfgb, bwd, 3 * m * n * 2


def swiglu_cases():
    from kernelwright.ops import swiglu as sw

    for m, n in [(16384, 14336), (8192, 18944)]:
        a = torch.randn(m, n, device="cuda", dtype=DT)
        b = torch.randn_like(a)
        c = torch.empty_like(a)
        dc = torch.randn_like(a)
        da = torch.empty_like(a)
        db = torch.empty_like(a)
        for block, rows, nw in itertools.product((512, 1024, 2048, 4096), (1, 2, 4), (4, 8, 16)):
            if block * rows > 8192 or nw * 32 * 4 > block * rows:
                continue
            cfg = C(block_n=block, rows=rows, num_warps=nw)
            fwd = partial(sw.swiglu_fwd_launch, a, b, c, config=cfg)
            yield "fwd", (m, n), cfg, fwd, 3 * m * n * 2
            bwd = partial(sw.swiglu_bwd_launch, dc, a, b, da, db, config=cfg)
            yield "bwd", (m, n), cfg, bwd, 5 * m * n * 2


def rms_norm_fwd_cases():
    # The forward alone against Liger's, in the same process (Liger rows have block_n = 0).
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction

    from kernelwright.ops.rms_norm import rms_norm_fwd_launch

    shapes = [(1024, 4096), (2048, 4096), (4096, 4096), (8192, 2048), (8192, 4096)]
    shapes += [(8192, 8192), (16384, 4096), (32768, 4096), (8192, 16384)]
    for m, n in shapes:
        x = torch.randn(m, n, device="cuda", dtype=DT)
        w = torch.randn(n, device="cuda", dtype=DT)
        y = torch.empty_like(x)
        rstd = torch.empty(m, device="cuda", dtype=torch.float32)
        liger = partial(LigerRMSNormFunction.apply, x, w, 1e-6, 0.0, "llama", False)
        yield "fwd", (m, n), C(block_n=0), liger, 2 * m * n * 2
        block = triton.next_power_of_2(n)
        for rows, nw in itertools.product((1, 2), (4, 8, 16)):
            cfg = C(block_n=block, rows=rows, num_warps=nw)
            fwd = partial(rms_norm_fwd_launch, x, w, y, rstd, 1e-6, 0.0, "llama", config=cfg)
            yield "fwd", (m, n), cfg, fwd, 2 * m * n * 2


CASES = {"rms_norm": rms_norm_cases, "rms_norm_fwd": rms_norm_fwd_cases, "swiglu": swiglu_cases}


def main() -> None:
    ops = sys.argv[1:] or list(CASES)
    bw = copy_gbps()
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}")
    print(f"copy bandwidth {bw:.0f} GB/s")
    out = os.environ.get("OUT", ".")
    rows = []
    for op in ops:
        best: dict = {}
        for kernel, shape, cfg, fn, nbytes in CASES[op]():
            try:
                ms = bench(fn)
            except Exception as e:  # a config that does not compile or run: skip it, say why
                print(f"  skip {op} {kernel} {shape} {cfg}: {type(e).__name__}: {str(e)[:80]}")
                continue
            gbps = nbytes / ms / 1e6
            rows.append(
                [
                    op,
                    kernel,
                    *shape,
                    cfg.block_n,
                    cfg.rows,
                    cfg.num_warps,
                    cfg.programs_per_sm,
                    f"{ms:.5f}",
                    f"{gbps:.0f}",
                    f"{100 * gbps / bw:.1f}",
                ]
            )
            best.setdefault((kernel, shape), []).append((ms, gbps, cfg))
        for (kernel, shape), res in best.items():
            res.sort(key=lambda r: r[0])
            print(f"{op} {kernel} {shape}:")
            shown = res[:4] + [r for r in res[4:] if r[2].block_n == 0]  # peer rows always
            for ms, gbps, cfg in shown:
                print(f"   {ms:.4f} ms {gbps:6.0f} GB/s {100 * gbps / bw:5.1f}%  {cfg}")
    with open(os.path.join(out, "tune.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(
            [
                "op",
                "kernel",
                "m",
                "n",
                "block_n",
                "rows",
                "num_warps",
                "programs_per_sm",
                "ms",
                "gbps",
                "pct_copy_bw",
            ]
        )
        w.writerows(rows)


if __name__ == "__main__":
    main()
