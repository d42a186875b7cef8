"""Norm backward probe: what the launch of the partial-sum kernel costs, and whether
programmatic dependent launch (PDL, sm_90+) takes it back.

Prints only (and a CSV to $OUT); the benchmark of record is `kernelwright bench`.

The norms' backward is two launches: the persistent kernel (dx, and one fp32 partial row of
dW/dB per program), then `sum_partials`. Variants, each timed as one call of the library's
backward launcher (GPU time, host hidden), in rounds (each variant once per round, the median
over rounds reported):
- `off`: `KERNELWRIGHT_PDL=0`, two plain launches;
- `wait`: the sum kernel launched with `launch_pdl=True`, waiting for the partial rows in
  `griddepcontrol.wait`; the backward kernel signals nothing, so the sum kernel is scheduled
  when it exits, its launch already processed;
- `nosum`: the second launch skipped (the wrong dW; the floor of what any fusion could reach).

Earlier runs: `pdl_probe_first.log` (before PDL was in the library) timed `wait` with a copy
of the sum kernel here, one variant after another; `pdl_probe.log` also has a `trigger` column:
the library's backward kernels then signalled at their start that the sum kernel could be
scheduled (`griddepcontrol.launch_dependents`). That was slower than `wait` for rms_norm at
every shape and no better for layer_norm, and was taken out again.

    python benchmarks/pdl_probe.py [--shapes 1024x4096,8192x4096]
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
from pathlib import Path

import torch
from _probe import gpu_setup, write_csv

from kernelwright.ops import _partials, layer_norm, rms_norm


def _nosum(*args) -> None:
    pass


# variant -> (KERNELWRIGHT_PDL, sum_partials skipped)
VARIANTS = {"off": ("0", False), "wait": ("1", False), "nosum": ("0", True)}


def _run(module, variant: str, fn):
    """fn() with the library set up as `variant` (see VARIANTS), restored afterwards."""
    pdl, skip_sum = VARIANTS[variant]
    os.environ["KERNELWRIGHT_PDL"] = pdl
    if skip_sum:
        module.sum_partials = _nosum
    try:
        return fn()
    finally:
        module.sum_partials = _partials.sum_partials


def main() -> None:
    ap = argparse.ArgumentParser()
    shapes = "1024x4096,2048x4096,4096x4096,8192x4096,8192x2048,8192x8192"
    ap.add_argument("--shapes", default=shapes)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    args = ap.parse_args()
    timer, _, copy = gpu_setup()
    rows = []
    for shape in args.shapes.split(","):
        m, n = (int(v) for v in shape.split("x"))
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        dy = torch.randn_like(x)
        w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        dx = torch.empty_like(x)
        dw, db = torch.empty_like(w), torch.empty_like(w)
        mean = x.float().mean(-1)
        rstd = torch.rsqrt(x.float().var(-1, unbiased=False) + 1e-5)
        rstd_rms = torch.rsqrt(x.float().pow(2).mean(-1) + 1e-6)
        calls = {
            "layer_norm": (layer_norm, functools.partial(
                layer_norm.layer_norm_bwd_launch, dy, x, w, mean, rstd, dx, dw, db)),
            "rms_norm": (rms_norm, functools.partial(
                rms_norm.rms_norm_bwd_launch, dy, x, w, rstd_rms, dx, dw, 0.0, "llama")),
        }  # fmt: skip
        gb = 3 * m * n * 2 / 1e9
        for op, (module, call) in calls.items():
            _run(module, "off", call)
            ref = dw.clone()
            dw.fill_(float("nan"))
            _run(module, "wait", call)
            if not torch.equal(dw, ref):
                raise SystemExit(f"{op} {shape}: dW with PDL differs from PDL off")
            # Rounds: every variant timed once per round, so drift hits them alike.
            times = {v: [] for v in VARIANTS}
            for _ in range(args.rounds):
                for variant in VARIANTS:
                    timed = functools.partial(timer, call, _none)
                    times[variant].append(_run(module, variant, timed)[1])
            for variant, ts in times.items():
                p50 = statistics.median(ts)
                pct = gb / (p50 * 1e-3) / copy * 100
                rows.append(dict(op=op, shape=shape, variant=variant, ms=p50, pct_copy=pct,
                                 spread_ms=max(ts) - min(ts)))  # fmt: skip
                print(f"{op:10s} {shape:10s} {variant:7s} {p50 * 1e3:7.2f} us {pct:5.1f}%  "
                      f"(rounds {min(ts) * 1e3:.2f}-{max(ts) * 1e3:.2f})", flush=True)  # fmt: skip
    write_csv(args.out, "pdl_probe.csv", rows)


def _none() -> None:
    pass


if __name__ == "__main__":
    main()
