"""Does autograd copy a gradient that one backward hands to two leaf inputs? (prints only)

fused_add_rms_norm's backward returns one tensor, ds, as the gradient of both x and residual.
When both are leaves (as in `kernelwright bench`), AccumulateGrad sees a tensor referenced
twice and clones it for one of them: one more read and write of [M, N]. In a decoder layer
x and residual come from other ops and nothing is copied. This times the same backward both
ways, for ours and Liger's, and the launcher alone, GPU time (benchmarks/NOTES 17).

    python benchmarks/leaf_grad_probe.py
"""

from __future__ import annotations

from functools import partial

import torch

from kernelwright.bench.harness import cuda_timer
from kernelwright.ops.fused_add_rms_norm import fused_add_rms_norm, fused_add_rms_norm_bwd_launch

DT = torch.bfloat16


def probe(m: int, n: int, timer, liger) -> None:
    x0, r0 = (torch.randn(m, n, device="cuda", dtype=DT, requires_grad=True) for _ in "ab")
    w = torch.randn(n, device="cuda", dtype=DT, requires_grad=True)
    dy, dres = (torch.randn(m, n, device="cuda", dtype=DT) for _ in "ab")
    providers = {"kernelwright": lambda x, r: fused_add_rms_norm(x, r, w, 1e-6)}
    if liger is not None:
        providers["liger"] = lambda x, r: liger.apply(x, r, w, 1e-6, 0.0, "llama", False)

    def setup():
        x0.grad = r0.grad = w.grad = None

    for name, f in providers.items():
        times = []
        for views in (False, True):
            outs = f(x0.view(m, n), r0.view(m, n)) if views else f(x0, r0)
            run = partial(torch.autograd.backward, outs, (dy, dres), retain_graph=True)
            times.append(timer(run, setup)[1])
        line = f"{m}x{n:<6} {name:12s} {times[0]:9.4f} {times[1]:9.4f}"
        if name == "kernelwright":
            _, s = fused_add_rms_norm(x0.detach(), r0.detach(), w.detach(), 1e-6)
            rstd = torch.rand(m, device="cuda")
            ds, dw = torch.empty_like(s), torch.empty_like(w)
            args = (dy, dres, s, w, rstd, ds, dw, 0.0, "llama")
            line += f" {timer(partial(fused_add_rms_norm_bwd_launch, *args), _nothing)[1]:12.4f}"
            line += f" {timer(partial(ds.copy_, torch.empty_like(s)), _nothing)[1]:14.4f}"
        print(line, flush=True)


def _nothing() -> None:
    pass


def main() -> None:
    timer = cuda_timer(warmup_ms=10, rep_ms=60, hide_host=True)
    try:
        from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction as liger
    except ImportError:
        liger = None
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}")
    print("shape        provider      leaves_ms  views_ms  launcher_ms  clone_floor_ms")
    for m, n in [(8192, 4096), (16384, 4096), (32768, 4096), (8192, 8192), (8192, 16384)]:
        probe(m, n, timer, liger)


if __name__ == "__main__":
    main()
