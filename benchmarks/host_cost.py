"""Host cost per op: forward+backward timed as a user's eager training loop sees it.

    python3 benchmarks/host_cost.py --out DIR [--ops rms_norm,rope] [--rounds 5] [--calls 40]

Each provider (kernelwright, Liger, torch.compile by default) runs `--calls` forward+backward
calls back to back (gradients reset each call, no L2 flush, no synchronize between calls), and
the wall time of the loop, synchronized at its end, is divided by the call count. `--rounds`
such loops per provider, the provider order rotated each round so that no provider always runs
first. A round can only be slowed by noise on a shared host, so the figure compared is the
low end over rounds (`ms_p20`, with `ms_p50` and `ms_p80` beside it). `host_ms` is the median
CPU time to issue one call onto an idle GPU (20 calls): when it is close to the loop's time the
GPU waits on the CPU, and the host path is what is being compared.

Shapes: each op's first quick-sweep point at 4096 and 16384 rows (softmax 8192 and 32768 rows of
4096, cross-entropy a 32,768-word vocabulary), or `--rows`. Rows go to DIR/host_cost.csv (the
harness's CSV schema, `timing` "wall_loop") and to the results database; the printed table gives
the faster peer's time over kernelwright's (above 1: kernelwright faster).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch._dynamo

from kernelwright.bench import SPECS, make_context
from kernelwright.bench.db import new_run_id, record
from kernelwright.bench.harness import BenchRow, _as_tuple, _dynamo_limits, shape_dims
from kernelwright.bench.report import write_csv

PROVIDERS = ("kernelwright", "liger", "torch_compile")
OVERRIDE = {"softmax": {"n": 4096}, "cross_entropy": {"vocab": 32768}}
ROW_DIMS = ("tokens", "rows", "batch_tokens", "segments")


def shape_for(spec, rows: int) -> dict[str, int]:
    """The spec's first quick-sweep point with its row dim set to `rows`."""
    shape = dict(spec.quick_sweeps[0].shapes()[0][1])
    shape.update(OVERRIDE.get(spec.op, {}))
    for k in ROW_DIMS:
        if k in shape:
            shape[k] = rows
    return shape


def _call(spec, provider, base: dict[str, torch.Tensor], device: torch.device):
    """One forward+backward of `provider` on copies of `base`, gradients reset first."""
    inputs = {k: v.detach().clone().requires_grad_(k in spec.grad_inputs) for k, v in base.items()}
    leaves = [inputs[k] for k in spec.grad_inputs]
    if spec.grad_through_views:
        fwd = provider.build(
            {k: v.view_as(v) if k in spec.grad_inputs else v for k, v in inputs.items()}
        )
    else:
        fwd = provider.build(inputs)

    def through(out):
        outs = _as_tuple(out)
        return tuple(outs[i] for i in spec.backward_through)

    gen = torch.Generator(device=device).manual_seed(1)
    dys = [
        torch.ones_like(o)
        if spec.unit_grad
        else torch.randn(o.shape, dtype=o.dtype, device=device, generator=gen)
        for o in through(fwd())
    ]

    def call() -> None:
        for t in leaves:
            t.grad = None
        torch.autograd.backward(through(fwd()), dys)

    return call


def measure(op: str, rows: int, providers, rounds: int, calls: int, ctx) -> list[BenchRow]:
    spec = SPECS[op]
    shape = shape_for(spec, rows)
    device = ctx.device
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    base = spec.make_inputs(shape, torch.bfloat16, device)
    made, errors = {}, {}
    torch._dynamo.reset()
    with torch._dynamo.config.patch(_dynamo_limits()):
        for p in spec.providers:
            if p.name not in providers:
                continue
            try:
                c = _call(spec, p, base, device)
                for _ in range(3):  # compile, autotune, allocator warm-up: untimed
                    c()
                sync()
                made[p.name] = c
            except Exception as e:  # a failing provider is a result row, not the end
                errors[p.name] = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"[:300]
        loops: dict[str, list[float]] = {p: [] for p in made}
        for k in range(rounds):
            names = list(made)
            for name in names[k % len(names) :] + names[: k % len(names)] if names else []:
                c = made[name]
                c()
                sync()
                t0 = time.perf_counter()
                for _ in range(calls):
                    c()
                sync()
                loops[name].append((time.perf_counter() - t0) * 1e3 / calls)
        issue = {}
        for name, c in made.items():
            ts = []
            for _ in range(20):
                sync()
                t0 = time.perf_counter()
                c()
                ts.append((time.perf_counter() - t0) * 1e3)
            sync()
            issue[name] = statistics.median(ts)
    dims = shape_dims(spec, shape)
    out = []
    for name in list(made) + list(errors):
        row = BenchRow(
            op=op, mode="full", provider=name, x_name=next(k for k in ROW_DIMS if k in shape),
            x_value=rows, shape=spec.shape_label(shape), dtype="bfloat16", timing="wall_loop",
            gpu=ctx.gpu, torch=ctx.torch, triton=ctx.triton, commit=ctx.commit,
            timestamp=ctx.timestamp, dims=dims, arch=ctx.arch,
        )  # fmt: skip
        if name in made:
            row.ms_p20, row.ms_p50, row.ms_p80 = (
                float(v) for v in np.percentile(loops[name], [20, 50, 80])
            )
            row.host_ms = issue[name]
        else:
            row.error = errors[name]
        out.append(row)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("host-cost"))
    ap.add_argument("--ops", default="", help="comma-separated (default: every op but jagged_mean)")
    ap.add_argument("--providers", default=",".join(PROVIDERS))
    ap.add_argument("--rows", default="", help="comma-separated row counts (default: see above)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=40)
    args = ap.parse_args(argv)
    ops = [o for o in args.ops.split(",") if o] or [o for o in SPECS if o != "jagged_mean"]
    unknown = [o for o in ops if o not in SPECS]
    if unknown:
        ap.error(f"unknown op(s) {', '.join(unknown)}; ops: {', '.join(SPECS)}")
    if args.rounds < 1 or args.calls < 1:
        ap.error("--rounds and --calls must be at least 1")
    providers = tuple(p for p in args.providers.split(",") if p)
    ctx = make_context()
    print(f"{ctx.gpu} · torch {ctx.torch} · triton {ctx.triton} · commit {ctx.commit}", flush=True)
    csv_path, run_id, t0 = args.out / "host_cost.csv", new_run_id(), time.time()
    for op in ops:
        counts = [int(r) for r in args.rows.split(",") if r] or (
            [8192, 32768] if op == "softmax" else [4096, 16384]
        )
        for rows in counts:
            got = measure(op, rows, providers, args.rounds, args.calls, ctx)
            write_csv(got, csv_path, append=csv_path.exists())
            record(got, source="bench", run_id=run_id)
            ok = {r.provider: r for r in got if r.ok}
            kw = ok.get("kernelwright")
            peers = [r.ms_p20 for p, r in ok.items() if p != "kernelwright"]
            ratio = f"{min(peers) / kw.ms_p20:5.3f}" if kw and peers else "  -  "
            cells = "  ".join(
                f"{r.provider} {r.ms_p20:.4f} ms (issue {r.host_ms:.4f})"
                if r.ok
                else f"{r.provider} ERROR {r.error[:60]}"
                for r in got
            )
            took = f"[{time.time() - t0:5.0f}s]"
            print(f"{took} {op:26s} {got[0].shape:20s} peer/kw {ratio}  {cells}", flush=True)
    print(f"rows: {csv_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
