"""A few launches of one kernel for Nsight Compute to read (`ncu ... python3 ncu_target.py OP`).

    jagged_mean D [ROWS WARPS STAGES]   the forward at 4096 segments of 1..512 rows
    rms_norm M N                        ours, then Liger's, forward (bf16)

Prints nothing of its own; ncu's report is the output. The bench of record is `kernelwright
bench`; this only places where a kernel's time goes (occupancy, stalls, bytes).
"""

from __future__ import annotations

import sys

import torch

from kernelwright.runtime import LaunchConfig


def jagged(d: int, cfg: LaunchConfig | None) -> None:
    from kernelwright.ops.jagged_mean import jagged_mean_fwd_launch

    gen = torch.Generator().manual_seed(77)
    lengths = torch.randint(1, 513, (4096,), generator=gen)
    offsets = torch.zeros(4097, dtype=torch.int64)
    offsets[1:] = lengths.cumsum(0)
    v = torch.randn(int(offsets[-1]), d, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(4096, d, device="cuda", dtype=torch.bfloat16)
    offsets = offsets.cuda()
    for _ in range(3):
        jagged_mean_fwd_launch(v, offsets, out, config=cfg)
    torch.cuda.synchronize()


def rms(m: int, n: int) -> None:
    from liger_kernel.ops.rms_norm import rms_norm_forward

    from kernelwright.ops.rms_norm import rms_norm

    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        rms_norm(x, w)
    for _ in range(3):
        rms_norm_forward(x, w, 1e-6, 0.0, "llama", False)
    torch.cuda.synchronize()


if __name__ == "__main__":
    op, *args = sys.argv[1:]
    if op == "jagged_mean":
        d = int(args[0])
        cfg = None
        if len(args) == 4:
            rows, warps, stages = map(int, args[1:])
            cfg = LaunchConfig(block_n=64 if d == 64 else 128, rows=rows, num_warps=warps,
                               num_stages=stages)  # fmt: skip
        jagged(d, cfg)
    elif op == "rms_norm":
        rms(int(args[0]), int(args[1]))
    else:
        raise SystemExit(f"unknown op {op!r}")
