"""layer_norm's backward past 16384 columns: dx and dW/dB co-running in one launch against the
dx and dwdb kernels one after the other (prints, CSV to $OUT). Kernels alone, one process.

The table's form reads x and dy twice from memory (dx, then the column kernel: 65% of copy for
fwd+bwd at 8192 x 16384, NOTES 21, 38, 39). `_layer_norm_bwd_corun_kernel` gives some programs
dx and the others dW/dB column blocks, all walking the rows top to bottom at once, so that the
second reader of a row may find it in L2. Variants: the number of column programs, the rows
per column step and the steps in flight; correctness against the table's form (dx, dW, dB
to 1e-2 relative).

    python benchmarks/ln_corun_probe.py
"""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path

import torch
from _probe import gpu_setup, write_csv

from kernelwright.ops import layer_norm as ln
from kernelwright.runtime import LaunchConfig

SHAPES = [(8192, 16384), (4096, 16384), (16384, 16384)]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def probe(m: int, n: int, timer, copy: float) -> list[dict]:
    gen = torch.Generator(device="cuda").manual_seed(m)
    x, dy = (torch.randn(m, n, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in "ab")
    w, b = (torch.randn(n, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in "ab")
    xf = x.float()
    mean, rstd = xf.mean(-1), torch.rsqrt(xf.var(-1, unbiased=False) + 1e-5)
    del xf
    dx, dw, db = torch.empty_like(x), torch.empty_like(w), torch.empty_like(b)
    ln.layer_norm_bwd_launch(dy, x, w, mean, rstd, dx, dw, db)
    ref = (dx.clone(), dw.clone(), db.clone())
    gb = 3 * m * n * 2 / 1e9
    args = (dy, x, w, mean, rstd, dx)
    variants = {
        "table (dx, then dwdb)": partial(ln.layer_norm_bwd_launch, *args, dw, db),
        "dx alone": partial(ln.layer_norm_bwd_launch, *args, None, None),
    }
    cfg = LaunchConfig(block_n=triton_pow2(n), rows=1, num_warps=16, programs_per_sm=1)
    sweep = [(16, r, s) for r in (4, 8, 16) for s in (3, 4, 5)]
    sweep += [(32, r, s) for r in (16, 32) for s in (4, 5, 6)]
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
    rows = []
    for name, fn in variants.items():
        try:
            dx.fill_(float("nan"))
            fn()
            torch.cuda.synchronize()
            if "alone" not in name:
                errs = [rel(a, r) for a, r in zip((dx, dw, db), ref, strict=True)]
                if not max(errs) < 1e-2:
                    print(f"{m}x{n} {name:42s} WRONG {errs}", flush=True)
                    continue
            p50 = timer(fn, lambda: None)[1]
        except Exception as e:  # a variant that fails to compile or run is a result
            print(f"{m}x{n} {name:42s} FAILED {type(e).__name__}: {str(e)[:160]}", flush=True)
            continue
        pct = gb / (p50 * 1e-3) / copy * 100
        rows.append(dict(shape=f"{m}x{n}", variant=name, ms=p50, pct_copy=pct))
        print(f"{m}x{n} {name:42s} {p50 * 1e3:8.1f} us  {pct:5.1f}% of copy (3 passes)",
              flush=True)  # fmt: skip
    return rows


def main() -> None:
    out = Path(os.environ.get("OUT", "."))
    timer, _, copy = gpu_setup()
    rows = []
    for m, n in SHAPES:
        rows += probe(m, n, timer, copy)
    write_csv(out, "ln_corun_probe.csv", rows)


def triton_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


if __name__ == "__main__":
    main()
