"""Where the parking backward's extra time goes (NOTES 47): fused_add_rms_norm's backward
launcher with dW parked in ds, the same with its barrier counter zeroed outside the timed
region, the same launched without the cooperative attribute, and with fp32 partial rows; in
one process, alternating over rounds (prints, CSV to $OUT). Written for b2d8ad3, whose
launcher zeroed a fresh counter per call; since 41d56b8 the counter is never reset, so the
"prezeroed" variant times the same launch as "park".

    python benchmarks/park_parts_probe.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import types
from pathlib import Path

import torch
from _probe import gpu_setup, write_csv

from kernelwright.ops import fused_add_rms_norm as far

SHAPES = [(2048, 4096), (4096, 4096), (8192, 4096), (8192, 3584)]


def probe(m: int, n: int, timer, rounds: int) -> list[dict]:
    gen = torch.Generator(device="cuda").manual_seed(m + n)
    x, r, dy, dres = (
        torch.randn(m, n, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(4)
    )
    w = (1 + 0.5 * torch.randn(n, device="cuda", generator=gen)).to(torch.bfloat16)
    y, s, rstd = torch.empty_like(x), torch.empty_like(x), torch.empty(m, device="cuda")
    far.fused_add_rms_norm_fwd_launch(x, r, w, y, s, rstd, 1e-6, 0.0, "llama")
    ds, dw = torch.empty_like(x), torch.empty_like(w)
    sync = torch.zeros(1, dtype=torch.int32, device="cuda")
    # far's torch with zeros() answering the counter zeroed in the untimed setup
    prezeroed = types.SimpleNamespace(**{k: getattr(torch, k) for k in ("int32", "float32")})
    prezeroed.zeros = lambda *a, **k: sync

    def call(park):
        far.fused_add_rms_norm_bwd_launch(dy, dres, s, w, rstd, ds, dw, 0.0, "llama", park=park)

    def park():
        call(True)

    def park_prezeroed():
        far.torch = prezeroed
        try:
            call(True)
        finally:
            far.torch = torch

    def park_not_cooperative():
        far.COOPERATIVE = False
        try:
            call(True)
        finally:
            far.COOPERATIVE = True

    def partials():
        call(False)

    variants = {f.__name__: f for f in (park, park_prezeroed, park_not_cooperative, partials)}
    ref = None
    for name, fn in variants.items():
        ds.fill_(float("nan"))
        sync.zero_()
        fn()
        torch.cuda.synchronize()
        if ref is None:
            ref = ds.clone()
        print(f"{m}x{n} {name}: ds bit-identical {torch.equal(ds, ref)}", flush=True)
    times: dict[str, list[float]] = {}
    for _ in range(rounds):
        for name, fn in variants.items():
            times.setdefault(name, []).append(timer(fn, sync.zero_)[1])
    rows = []
    for name, ts in times.items():
        med = statistics.median(ts)
        rows.append(dict(shape=f"{m}x{n}", variant=name, ms=med, spread=max(ts) - min(ts)))
        print(f"{m}x{n} {name:22s} {med * 1e3:7.2f} us "
              f"(rounds {', '.join(f'{t * 1e3:.2f}' for t in ts)})", flush=True)  # fmt: skip
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    args = ap.parse_args()
    timer, _, _ = gpu_setup()
    rows = []
    for m, n in SHAPES:
        rows += probe(m, n, timer, args.rounds)
    write_csv(args.out, "park_parts_probe.csv", rows)


if __name__ == "__main__":
    main()
