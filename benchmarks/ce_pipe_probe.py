"""cross_entropy forward+gradient at 32K vocabularies: the persistent one-row form of NOTES 23?

Prints only (and a CSV to $OUT); the benchmark of record is `kernelwright bench cross_entropy`.

A 32K-vocabulary row (64 KB in bf16) is the softmax row of 32768 that gained 15% from a
persistent grid staging the next rows' loads (`tl.range(..., num_stages=3)`). The library's
cross-entropy walks such rows in 2048-wide chunks twice (0.377 ms at 8192 x 32000 on the
H200, 66% of copy for read logits + write gradient). The kernel here is plain cross-entropy
(mean-free per-row loss, lse, gradient; ignore_index without a branch) on that grid, to see
what the form is worth before the library's options are carried over. Kernels alone, bf16.

    python benchmarks/ce_pipe_probe.py [--shapes 8192x32000,8192x32768]
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

from kernelwright.ops.cross_entropy import cross_entropy_fwd_launch
from kernelwright.runtime.launch import LaunchConfig as C


@triton.jit
def _ce_pipelined(x_ptr, t_ptr, loss_ptr, lse_ptr, g_ptr, M, V, stride_x, stride_g,
                  ignore_index, BLOCK_V: tl.constexpr, STAGES: tl.constexpr):  # fmt: skip
    cols = tl.arange(0, BLOCK_V)
    mask = cols < V
    for row in tl.range(tl.program_id(0), M, tl.num_programs(0), num_stages=STAGES):
        r = row + tl.zeros([], tl.int64)
        t = tl.load(t_ptr + r).to(tl.int64)
        z = tl.load(x_ptr + r * stride_x + cols, mask=mask, other=-float("inf")).to(tl.float32)
        valid = t != ignore_index
        m = tl.max(z, axis=0)
        e = tl.exp(z - m)
        d = tl.sum(e, axis=0)
        log_d = tl.log(d)
        z_t = tl.sum(tl.where(cols == t, z, 0.0), axis=0)
        tl.store(loss_ptr + r, tl.where(valid, (m - z_t) + log_d, 0.0))
        tl.store(lse_ptr + r, tl.where(valid, m + log_d, 0.0))
        g = e * (1.0 / d)
        g = tl.where(cols == t, g - 1.0, g)
        g = tl.where(valid, g, 0.0)
        tl.store(g_ptr + r * stride_g + cols, g.to(g_ptr.dtype.element_ty), mask=mask)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="8192x32000,8192x32768")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    args = ap.parse_args()
    timer, sms, copy = gpu_setup()
    out_rows = []
    for shape in args.shapes.split(","):
        m, v = (int(s) for s in shape.split("x"))
        x = torch.randn(m, v, device="cuda", dtype=torch.bfloat16) * 2
        t = torch.randint(0, v, (m,), device="cuda")
        t[::7] = -100
        loss = torch.empty(m, device="cuda", dtype=torch.float32)
        lse = torch.empty_like(loss)
        g = torch.empty_like(x)
        xf = x.float()
        ref_loss = torch.nn.functional.cross_entropy(xf, t, reduction="none")
        ref_g = torch.softmax(xf, -1)
        keep = t != -100
        ref_g[keep, t[keep]] -= 1.0
        ref_g[~keep] = 0.0
        block = triton.next_power_of_2(v)
        variants = {
            "lib": functools.partial(cross_entropy_fwd_launch, x, t, loss, lse, grad=g),
            "lib_one_block": functools.partial(
                cross_entropy_fwd_launch, x, t, loss, lse, grad=g,
                config=C(block_n=block, num_warps=16),
            ),
        }  # fmt: skip
        for warps, pps, stages in itertools.product((16, 32), (1, 2), (1, 3)):
            if block * 2 * (stages - 1) * pps > 200 * 1024:
                continue
            variants[f"pipe_w{warps}_p{pps}_s{stages}"] = functools.partial(
                _ce_pipelined[(min(m, sms * pps),)], x, t, loss, lse, g, m, v, x.stride(0),
                g.stride(0), -100, BLOCK_V=block, STAGES=stages, num_warps=warps,
            )  # fmt: skip
        gb = 2 * m * v * 2 / 1e9
        for name, fn in variants.items():
            try:
                g.fill_(float("nan"))
                loss.fill_(float("nan"))
                fn()
                torch.cuda.synchronize()
                e_g = (g.float() - ref_g).abs().max().item()
                e_l = (loss - ref_loss).abs().max().item()
                if not (e_g < 1e-2 and e_l < 1e-3):
                    print(f"{shape} {name:20s} WRONG grad err {e_g:.3g} loss err {e_l:.3g}")
                    continue
                p50 = timer(fn, lambda: None)[1]
            except Exception as e:  # a variant that does not compile is a result
                print(f"{shape} {name:20s} FAILED {type(e).__name__}: {str(e)[:120]}")
                continue
            pct = gb / (p50 * 1e-3) / copy * 100
            out_rows.append(dict(shape=shape, variant=name, ms=p50, pct_copy=pct))
            print(f"{shape} {name:20s} {p50 * 1e3:7.1f} us {pct:5.1f}%", flush=True)
    write_csv(args.out, "ce_pipe_probe.csv", out_rows)


if __name__ == "__main__":
    main()
