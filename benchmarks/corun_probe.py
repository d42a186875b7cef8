"""Norm backwards at 16384 columns: the row gradient and the parameter gradients co-running in
one launch against the table's form (prints, CSV to $OUT). Kernels alone, one process.
`--op layer_norm` (NOTES 48) or `--op fused_add_rms_norm` (NOTES 49).

The table's form reads x and dy twice from memory (dx, then the column kernel: 65% of copy for
fwd+bwd at 8192 x 16384, NOTES 21, 38, 39). `_layer_norm_bwd_corun_kernel` gives some programs
dx and the others dW/dB column blocks, all walking the rows top to bottom at once, so that the
second reader of a row may find it in L2. Variants: the number of column programs, the rows
per column step and the steps in flight; correctness against the table's form (dx, dW, dB
to 1e-2 relative).

    python benchmarks/corun_probe.py [--op layer_norm | fused_add_rms_norm]
"""

from __future__ import annotations

import argparse
import os
from functools import partial
from pathlib import Path

import torch
from _probe import gpu_setup, write_csv

from kernelwright.ops import fused_add_rms_norm as far
from kernelwright.ops import layer_norm as ln
from kernelwright.runtime import LaunchConfig

SHAPES = [(8192, 16384), (4096, 16384), (16384, 16384)]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def time_all(op: str, m: int, n: int, variants: dict, ref, outs, gb: float, timer, copy: float):
    """Check (outputs against `ref`, 1e-2 relative; "alone" variants unchecked) then time each
    variant; a row per variant that runs and is right."""
    rows = []
    for name, fn in variants.items():
        try:
            outs[0].fill_(float("nan"))
            fn()
            torch.cuda.synchronize()
            if "alone" not in name:
                errs = [rel(a, r) for a, r in zip(outs, ref, strict=True)]
                if not max(errs) < 1e-2:
                    print(f"{op} {m}x{n} {name:42s} WRONG {errs}", flush=True)
                    continue
            p50 = timer(fn, lambda: None)[1]
        except Exception as e:  # a variant that fails to compile or run is a result
            print(f"{op} {m}x{n} {name:42s} FAILED {type(e).__name__}: {str(e)[:160]}", flush=True)
            continue
        pct = gb / (p50 * 1e-3) / copy * 100
        rows.append(dict(op=op, shape=f"{m}x{n}", variant=name, ms=p50, pct_copy=pct))
        print(f"{op} {m}x{n} {name:42s} {p50 * 1e3:8.1f} us  {pct:5.1f}% of copy (minimal bytes)",
              flush=True)  # fmt: skip
    return rows


def layer_norm_probe(m: int, n: int, sweep, timer, copy: float) -> list[dict]:
    gen = torch.Generator(device="cuda").manual_seed(m)
    x, dy = (torch.randn(m, n, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in "ab")
    w, b = (torch.randn(n, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in "ab")
    xf = x.float()
    mean, rstd = xf.mean(-1), torch.rsqrt(xf.var(-1, unbiased=False) + 1e-5)
    del xf
    dx, dw, db = torch.empty_like(x), torch.empty_like(w), torch.empty_like(b)
    ln.layer_norm_bwd_launch(dy, x, w, mean, rstd, dx, dw, db)
    ref = (dx.clone(), dw.clone(), db.clone())
    args = (dy, x, w, mean, rstd, dx)
    with_table = partial(setattr, ln, "CORUN_MIN_ROWS", 2**62)
    variants = {
        "table (dx, then dwdb)": lambda: (with_table(), ln.layer_norm_bwd_launch(*args, dw, db)),
        "dx alone": partial(ln.layer_norm_bwd_launch, *args, None, None),
    }
    cfg = LaunchConfig(block_n=triton_pow2(n), rows=1, num_warps=16, programs_per_sm=1)
    for cols, col_rows, stages in sweep:
        variants[f"corun cols={cols} col_rows={col_rows} stages={stages}"] = partial(
            ln.layer_norm_bwd_corun_launch,
            *args,
            dw,
            db,
            cfg,
            cols,
            col_rows=col_rows,
            col_stages=stages,
        )
    saved = ln.CORUN_MIN_ROWS
    try:
        return time_all("layer_norm", m, n, variants, ref, (dx, dw, db), 3 * m * n * 2 / 1e9,
                        timer, copy)  # fmt: skip
    finally:
        ln.CORUN_MIN_ROWS = saved


def fused_add_probe(m: int, n: int, sweep, timer, copy: float) -> list[dict]:
    gen = torch.Generator(device="cuda").manual_seed(m)
    x, r, dy, dres = (
        torch.randn(m, n, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(4)
    )
    w = (1 + 0.5 * torch.randn(n, device="cuda", generator=gen)).to(torch.bfloat16)
    y, s, rstd = torch.empty_like(x), torch.empty_like(x), torch.empty(m, device="cuda")
    far.fused_add_rms_norm_fwd_launch(x, r, w, y, s, rstd, 1e-6, 0.0, "llama")
    del x, r, y
    ds, dw = torch.empty_like(s), torch.empty_like(w)
    args = (dy, dres, s, w, rstd, ds, dw, 0.0, "llama")
    far.fused_add_rms_norm_bwd_launch(*args)
    ref = (ds.clone(), dw.clone())
    variants = {"table": partial(far.fused_add_rms_norm_bwd_launch, *args)}
    cfg = LaunchConfig(block_n=triton_pow2(n), rows=1, num_warps=16, programs_per_sm=1)
    for cols, col_rows, stages in sweep:
        variants[f"corun cols={cols} col_rows={col_rows} stages={stages}"] = partial(
            far.fused_add_rms_norm_bwd_corun_launch,
            *args,
            cfg,
            cols,
            col_rows=col_rows,
            col_stages=stages,
        )
    return time_all("fused_add_rms_norm", m, n, variants, ref, (ds, dw), 4 * m * n * 2 / 1e9,
                    timer, copy)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--op", choices=("layer_norm", "fused_add_rms_norm"), default="layer_norm")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    args = ap.parse_args()
    timer, _, copy = gpu_setup()
    rows = []
    for m, n in SHAPES:
        if args.op == "layer_norm":
            sweep = [(16, r, s) for r in (4, 8, 16) for s in (3, 4, 5)]
            sweep += [(32, r, s) for r in (16, 32) for s in (4, 5, 6)]
            rows += layer_norm_probe(m, n, sweep, timer, copy)
        else:
            sweep = [(c, r, s) for c in (32, 64) for r in (8, 16, 32) for s in (3, 4)]
            rows += fused_add_probe(m, n, sweep, timer, copy)
    write_csv(args.out, f"corun_probe_{args.op}.csv", rows)


def triton_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


if __name__ == "__main__":
    main()
