"""Shared set-up of the stand-alone GPU probes in this folder (they print; the benchmark of
record is `kernelwright bench`): the device line every log starts with, the copy figure the
percentages are taken against, and the CSV they leave in $OUT."""

from __future__ import annotations

import argparse
import csv
import os
import statistics
from pathlib import Path

import torch
import triton

from kernelwright.bench.harness import cuda_timer, measure_copy_bandwidth


def gpu_setup() -> tuple:
    """(timer, SM count, copy GB/s) on the current GPU; prints the GPU, versions and copy."""
    timer = cuda_timer(hide_host=True)
    copy = measure_copy_bandwidth(torch.device("cuda"), timer=timer)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}"
          f"  copy {copy:.0f} GB/s", flush=True)  # fmt: skip
    return timer, sms, copy


def rounds_args() -> argparse.Namespace:
    """The alternating-rounds probes' options: --rounds (default 5) and --out ($OUT or .)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    return ap.parse_args()


def write_csv(out: Path, name: str, rows: list[dict]) -> None:
    """`rows` (dicts with the same keys) as out/name; nothing when there are none."""
    if not rows:
        return
    out.mkdir(parents=True, exist_ok=True)
    with open(out / name, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def time_variants(shape: str, variants: dict, y, ref, tol: float, timer, gb: float, copy: float):
    """Check then time each variant of a probe: a callable that writes `y` (or, for
    "torch_compile" and "liger", returns its output). A variant whose output is off `ref` by
    `tol` or more, or that fails to compile or run, is printed and skipped; the others give a
    row each (p50 ms, % of copy for `gb` GB moved, and the registers and spills of a Triton
    launch's kernel)."""
    rows = []
    for name, fn in variants.items():
        try:
            y.fill_(float("nan"))
            out = fn()
            torch.cuda.synchronize()
            got = out if name in ("torch_compile", "liger") else y
            err = (got.float() - ref).abs().max().item()
            if not err < tol:
                print(f"{shape} {name:32s} WRONG max err {err:.3g}")
                continue
            p50 = timer(fn, lambda: None)[1]
        except Exception as e:  # a variant that does not compile is a result
            print(f"{shape} {name:32s} FAILED {type(e).__name__}: {str(e)[:120]}")
            continue
        regs, spills = getattr(out, "n_regs", ""), getattr(out, "n_spills", "")
        pct = gb / (p50 * 1e-3) / copy * 100
        rows.append(dict(shape=shape, variant=name, ms=p50, pct_copy=pct, regs=regs, spills=spills))
    return rows


def rounds_summary(label: str, ts: list[float]) -> dict:
    """Median and spread (ms) of one variant's per-round times; prints `label` with them."""
    med = statistics.median(ts)
    print(f"{label} {med * 1e3:7.2f} us (rounds {', '.join(f'{t * 1e3:.2f}' for t in ts)})",
          flush=True)  # fmt: skip
    return dict(ms=med, spread=max(ts) - min(ts))
