"""Which launch config torch.compile's generated Triton kernels settled on (prints only).

    python benchmarks/inductor_configs.py layer_norm 8192 16384

Compiles the op's torch reference (as the benchmark's torch_compile provider does), runs it,
then lists every inductor autotuner that ran: its kernel, the configs it chose among, the
one it kept, and the kernel's time. Used to read what a faster torch.compile kernel does.
Its runs (H200, torch 2.11, `results/h200-norm-fwd/inductor_configs_*.log`): layer_norm at
8192 x 16384 (0.135 ms for the whole call) and rms_norm at 1024 x 4096 are each one looped
reduction kernel, one row per program, 2048-wide chunks, 16 warps, one stage (NOTES 42).
"""

from __future__ import annotations

import gc
import sys

import torch
import triton


def _layer_norm(m: int, n: int):
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    w, b = (torch.randn(n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    fn = torch.compile(lambda x: torch.nn.functional.layer_norm(x, (n,), w, b, 1e-5))
    return lambda: fn(x)


def _rms_norm(m: int, n: int):
    from kernelwright.ops.rms_norm import rms_norm_eager

    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    fn = torch.compile(lambda x: rms_norm_eager(x, w, 1e-6))
    return lambda: fn(x)


OPS = {"layer_norm": _layer_norm, "rms_norm": _rms_norm}


def main() -> None:
    op, m, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    run = OPS[op](m, n)
    run()
    torch.cuda.synchronize()
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, op, m, n)
    print(f"whole call: {triton.testing.do_bench(run, warmup=25, rep=200):.4f} ms")
    tuners = [o for o in gc.get_objects() if type(o).__name__ == "CachingAutotuner"]
    for t in tuners:
        name = getattr(getattr(t, "fn", None), "__name__", "?")
        configs = getattr(t, "configs", None) or []
        print(f"\n{name}: {len(configs)} candidate configs")
        for c in configs:
            print("   ", c)
        for launcher in getattr(t, "launchers", []):
            regs = getattr(launcher, "n_regs", "?")
            spills = getattr(launcher, "n_spills", "?")
            print(f"  kept: {launcher.config}  regs {regs} spills {spills}")
        src = getattr(getattr(t, "fn", None), "src", None)
        if src:
            print(src)


if __name__ == "__main__":
    main()
