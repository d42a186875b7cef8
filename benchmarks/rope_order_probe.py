"""Rope forward against Liger's before and after torch.compile runs in the process (prints only).

In the bench of record (every provider in one process, torch.compile among them) Liger's rope
forward times 43-44 us at 8192 tokens; run with only Liger and us it times 46.9, as in
`rope_probe.py` (NOTES 15). This probe times both forwards, alternating, three rounds; then
compiles HF's eager rope with torch.compile and runs it once; then times both again.

    python benchmarks/rope_order_probe.py [--tokens 1024,8192]
"""

from __future__ import annotations

import argparse
import functools

import torch

from kernelwright.bench.harness import cuda_timer
from kernelwright.ops.rope import rope, rope_eager, rope_tables


def _inputs(s: int, hq: int = 32, hk: int = 8, d: int = 128):
    q = torch.randn(1, s, hq, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    k = torch.randn(1, s, hk, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    cos, sin = rope_tables(s, d, base=500000.0, dtype=torch.bfloat16, device="cuda")
    return q, k, cos, sin


def _rounds(timer, tokens, label: str) -> None:
    from liger_kernel.transformers.rope import liger_rotary_pos_emb

    for s in tokens:
        q, k, cos, sin = _inputs(s)
        ours = functools.partial(rope, q, k, cos, sin)
        # Liger rotates in place: over clones, whose values drift rep to rep (same cost).
        liger = functools.partial(liger_rotary_pos_emb, q.clone(), k.clone(), cos, sin)
        for r in range(3):
            t_ours = timer(ours, lambda: None)[1] * 1e3
            t_liger = timer(liger, lambda: None)[1] * 1e3
            print(f"{label:16s} {s:6d} round {r}: ours {t_ours:6.1f} us  liger {t_liger:6.1f} us"
                  f"  ours/liger {t_ours / t_liger:.3f}", flush=True)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="1024,8192")
    args = ap.parse_args()
    tokens = [int(v) for v in args.tokens.split(",")]
    timer = cuda_timer(hide_host=True)
    print(torch.cuda.get_device_name(), torch.__version__)
    _rounds(timer, tokens, "before compile")
    compiled = torch.compile(rope_eager)
    for s in tokens:
        compiled(*_inputs(s))
    torch.cuda.synchronize()
    _rounds(timer, tokens, "after compile")


if __name__ == "__main__":
    main()
