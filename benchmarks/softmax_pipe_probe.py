"""Softmax forward probe: can a persistent, pipelined one-row kernel pass the fused one?

Prints only (and a CSV to $OUT); the benchmark of record is `kernelwright bench softmax`.

At 16384-32768 columns the library's fused forward holds one whole row in registers: one or
two programs per SM, and while a program reduces and writes its row no load is in flight
(85% of copy at 16384, 73% at 32768 on the H200). Two stand-alone kernels here try to keep
the next row's load going during this row's math:

- `pers`: a persistent grid, `tl.range(..., num_stages=S)` over its rows (pointer loads; the
  PTX is checked for cp.async to see whether Triton pipelined them at all);
- `tma`: the same with tensor-descriptor (TMA) loads of the row viewed as [N / 256, 256],
  which Triton's pipeliner stages through shared memory; stores by pointer or by TMA.

Each variant's output is compared with torch.softmax in fp32 before it is timed.

    python benchmarks/softmax_pipe_probe.py [--cols 8192,16384,32768] [--rows 4096]
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

from kernelwright.ops.softmax import softmax_bwd_launch, softmax_fwd_launch


@triton.jit
def _pers_kernel(x_ptr, y_ptr, M, N, stride_x, stride_y, BLOCK_N: tl.constexpr,
                 STAGES: tl.constexpr):  # fmt: skip
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    for row in tl.range(tl.program_id(0), M, tl.num_programs(0), num_stages=STAGES):
        r = row + tl.zeros([], tl.int64)  # int64 offsets (a plain int under the interpreter)
        x = tl.load(x_ptr + r * stride_x + cols, mask=mask, other=-float("inf")).to(tl.float32)
        m = tl.max(x, axis=0)
        e = tl.exp(x - m)
        d = tl.sum(e, axis=0)
        tl.store(y_ptr + r * stride_y + cols, (e * (1.0 / d)).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _pers_bwd_kernel(dy_ptr, y_ptr, dx_ptr, M, N, stride_dy, stride_y, stride_dx,
                     BLOCK_N: tl.constexpr, STAGES: tl.constexpr):  # fmt: skip
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    for row in tl.range(tl.program_id(0), M, tl.num_programs(0), num_stages=STAGES):
        r = row + tl.zeros([], tl.int64)
        dy = tl.load(dy_ptr + r * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
        y = tl.load(y_ptr + r * stride_y + cols, mask=mask, other=0.0).to(tl.float32)
        dx = y * (dy - tl.sum(dy * y, axis=0))
        tl.store(dx_ptr + r * stride_dx + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _tma_kernel(x_desc, y_desc, y_ptr, M, R: tl.constexpr, C: tl.constexpr,
                STAGES: tl.constexpr, TMA_STORE: tl.constexpr):  # fmt: skip
    # The row is [R, C] (R * C = N): one descriptor load brings all of it.
    offs = tl.arange(0, R)[:, None] * C + tl.arange(0, C)[None, :]
    for row in tl.range(tl.program_id(0), M, tl.num_programs(0), num_stages=STAGES):
        x = x_desc.load([row * R, 0]).to(tl.float32)
        m = tl.max(tl.max(x, axis=1), axis=0)
        e = tl.exp(x - m)
        d = tl.sum(tl.sum(e, axis=1), axis=0)
        y = (e * (1.0 / d)).to(y_ptr.dtype.element_ty)
        if TMA_STORE:
            y_desc.store([row * R, 0], y)
        else:
            tl.store(y_ptr + (row + tl.zeros([], tl.int64)) * (R * C) + offs, y)


def _variants(x: torch.Tensor, y: torch.Tensor, sms: int, stages_opts, tma: bool) -> dict:
    from triton.tools.tensor_descriptor import TensorDescriptor

    m, n = x.shape
    variants = {"lib": functools.partial(softmax_fwd_launch, x, y, False)}
    try:
        from liger_kernel.ops.softmax import LigerSoftmaxFunction

        variants["liger"] = functools.partial(LigerSoftmaxFunction.apply, x)
    except ImportError:
        pass
    for warps, pps, stages in itertools.product((8, 16, 32), (1, 2), stages_opts):
        if n // (warps * 32) > 128 or n * 2 * stages * pps > 227 * 1024:
            continue
        launch = _pers_kernel[(min(m, sms * pps),)]
        variants[f"pers_w{warps}_p{pps}_s{stages}"] = functools.partial(
            launch, x, y, m, n, x.stride(0), y.stride(0), BLOCK_N=n, STAGES=stages, num_warps=warps
        )
    if not tma:
        return variants
    c = 256
    r = n // c
    xd = TensorDescriptor.from_tensor(x.view(m * r, c), [r, c])
    yd = TensorDescriptor.from_tensor(y.view(m * r, c), [r, c])
    for warps, stages, tma_store in itertools.product((8, 16, 32), (1, 2, 3), (False, True)):
        if r * c * 2 * (stages + tma_store) > 200 * 1024 or n // (warps * 32) > 128:
            continue  # shared memory: `stages` row buffers plus the store's
        variants[f"tma_w{warps}_s{stages}_st{int(tma_store)}"] = functools.partial(
            _tma_kernel[(min(m, sms),)], xd, yd, y, m, R=r, C=c, STAGES=stages,
            TMA_STORE=tma_store, num_warps=warps,
        )  # fmt: skip
    return variants


def _bwd_variants(dy, y, dx, sms: int, stages_opts) -> dict:
    m, n = y.shape
    variants = {"lib": functools.partial(softmax_bwd_launch, dy, y, dx, False)}
    for warps, pps, stages in itertools.product((4, 8, 16, 32), (1, 2), stages_opts):
        if n // (warps * 32) > 128 or n * 4 * stages * pps > 227 * 1024:
            continue
        variants[f"pers_w{warps}_p{pps}_s{stages}"] = functools.partial(
            _pers_bwd_kernel[(min(m, sms * pps),)], dy, y, dx, m, n, dy.stride(0), y.stride(0),
            dx.stride(0), BLOCK_N=n, STAGES=stages, num_warps=warps,
        )  # fmt: skip
    return variants


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cols", default="8192,16384,32768")
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--stages", default="1,2,3")
    ap.add_argument("--kind", choices=("fwd", "bwd"), default="fwd")
    ap.add_argument("--no-tma", action="store_true")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    args = ap.parse_args()
    timer, sms, copy = gpu_setup()
    rows = []
    m = args.rows
    for n in (int(v) for v in args.cols.split(",")):
        stages = tuple(int(v) for v in args.stages.split(","))
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16) * 3
        y = torch.empty_like(x)
        if args.kind == "fwd":
            ref = torch.softmax(x.float(), -1)
            gb = 2 * m * n * 2 / 1e9
            variants, out_buf = _variants(x, y, sms, stages, not args.no_tma), y
        else:  # y: a softmax output; dy random; dx = y * (dy - sum(dy * y))
            y.copy_(torch.softmax(x.float(), -1))
            dy = torch.randn_like(x)
            dx = torch.empty_like(x)
            yf = y.float()
            ref = yf * (dy.float() - (dy.float() * yf).sum(-1, keepdim=True))
            gb = 3 * m * n * 2 / 1e9
            variants, out_buf = _bwd_variants(dy, y, dx, sms, stages), dx
        for name, fn in variants.items():
            try:
                out_buf.fill_(float("nan"))
                out = fn()
                torch.cuda.synchronize()
                got = out if name == "liger" else out_buf
                err = (got.float() - ref).abs().max().item()
                note = ""
                if hasattr(out, "asm"):
                    ptx = out.asm["ptx"]
                    note = ("cp.async.bulk" if "cp.async.bulk" in ptx else
                            "cp.async" if "cp.async" in ptx else "no-async")  # fmt: skip
                    note += f" spills={out.n_spills} regs={out.n_regs}"
                if not err < 2e-2:
                    print(f"{n:6d} {name:22s} WRONG max err {err:.3g}")
                    continue
                p50 = timer(fn, lambda: None)[1]
            except Exception as e:  # a variant that does not compile is a result, not the end
                print(f"{n:6d} {name:22s} FAILED {type(e).__name__}: {str(e)[:160]}")
                continue
            pct = gb / (p50 * 1e-3) / copy * 100
            rows.append(
                dict(kind=args.kind, rows=m, cols=n, variant=name, ms=p50, pct_copy=pct, note=note)
            )
            print(f"{n:6d} {name:22s} {p50 * 1e3:8.1f} us {pct:5.1f}%  {note}", flush=True)
        best = min((r_ for r_ in rows if r_["cols"] == n), key=lambda r_: r_["ms"])
        print(f"{n:6d} best {best['variant']} {best['ms'] * 1e3:.1f} us", flush=True)
    write_csv(args.out, f"softmax_pipe_probe_{args.kind}.csv", rows)


if __name__ == "__main__":
    main()
