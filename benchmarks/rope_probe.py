"""Rope forward probe (prints only; the benchmark of record is `kernelwright bench rope`).

Times the library kernel at explicit launch configs against Liger's forward, at Llama-3-8B heads
(32 q + 8 kv, head_dim 128), bf16, HF's transposed q/k views. GPU time alone. (The committed
results/h200-issue3-rope/rope_probe.csv came from a version that also timed a `halves_equal`
kernel flag, reading one half of cos/sin as Liger does: ~1% faster, not kept.)

Each config is timed in each of `--rounds` rounds; the summary takes each config's median and
prints Liger, the table's config and our best config at each token count. (NOTES 55's
`--split` mode timed a split form of the kernel, each head tile of a token on its own program,
which was slower everywhere and went with it: see 42a694a.)

    python benchmarks/rope_probe.py [--tokens 1024,8192] [--rounds 3] [--out DIR]
"""

from __future__ import annotations

import argparse
import functools
import itertools
import os
import statistics
from pathlib import Path

import torch
import triton
from _probe import write_csv

from kernelwright.bench.harness import cuda_timer
from kernelwright.ops.rope import _launch, rope_tables
from kernelwright.runtime import device_info, lookup
from kernelwright.runtime.launch import LaunchConfig
from kernelwright.runtime.tables.rope import TABLE

CONFIGS = [
    (LaunchConfig(block_n=bn, rows=1, num_warps=w), place)
    for bn, w, place in itertools.product((1024, 4096, 8192), (2, 4, 8), ("out", "in"))
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="1024,2048,4096,8192,16384,32768")
    ap.add_argument("--heads", default="32,8,128")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    args = ap.parse_args()
    hq, hk, d = (int(v) for v in args.heads.split(","))
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
    timer = cuda_timer(hide_host=True)
    rows = []
    try:
        from liger_kernel.ops.rope import rope_forward
    except ImportError:
        rope_forward = None
    for rnd, s in itertools.product(range(args.rounds), (int(v) for v in args.tokens.split(","))):
        q = torch.randn(1, s, hq, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
        k = torch.randn(1, s, hk, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
        cos, sin = rope_tables(s, d, base=500000.0, dtype=torch.bfloat16, device="cuda")
        qo, ko = torch.empty_like(q), torch.empty_like(k)
        gb = (2 * (hq + hk) * d * s * 2) / 1e9
        ref = None
        qi, ki = q.clone(), k.clone()  # rotated in place, over and over (as Liger's below)
        for cfg, place in CONFIGS:
            outs = (qo, ko) if place == "out" else (qi, ki)
            ins = (q, k) if place == "out" else (qi, ki)
            fn = functools.partial(_launch, "fwd", *ins, cos, sin, *outs, 1, False, cfg)
            if place == "out":
                fn()
                # every config writes the same bits (the GPU tests check them against rope_ref)
                if ref is None:
                    ref = (qo.clone(), ko.clone())
                assert torch.equal(qo, ref[0]) and torch.equal(ko, ref[1]), cfg
            p20, p50, p80 = timer(fn, lambda: None)
            rows.append(dict(round=rnd, tokens=s, provider=f"kw_{place}", block_n=cfg.block_n,
                             warps=cfg.num_warps, rows=1, ms=p50,
                             gbps=gb / (p50 / 1e3)))  # fmt: skip
        if rope_forward is not None:
            liger = functools.partial(rope_forward, q.clone(), k.clone(), cos, sin)
            p20, p50, p80 = timer(liger, lambda: None)
            rows.append(dict(round=rnd, tokens=s, provider="liger", block_n=0, warps=0, rows=0,
                             ms=p50, gbps=gb / (p50 / 1e3)))  # fmt: skip
        print(f"round {rnd} tokens {s} done", flush=True)
    write_csv(args.out, "rope_probe.csv", rows)
    times: dict[tuple, list[float]] = {}
    for row in rows:
        key = (row["tokens"], row["provider"], row["block_n"], row["warps"])
        times.setdefault(key, []).append(row["ms"] * 1e3)
    med = {key: statistics.median(v) for key, v in times.items()}
    table = lookup(TABLE, "rope", "fwd", device_info(torch.device("cuda")), (hq + hk) * d)
    for s in sorted({key[0] for key in med}):
        ours = {key: v for key, v in med.items() if key[0] == s and key[1] != "liger"}
        best = min(ours, key=ours.get)
        mine = ours.get((s, "kw_out", table.block_n, table.num_warps), float("nan"))
        liger = med.get((s, "liger", 0, 0), float("nan"))
        print(f"{s:6d} tokens  liger {liger:7.2f} us  table {mine:7.2f} ({liger / mine:.3f}x)  "
              f"best {ours[best]:7.2f} ({best[1]} bn={best[2]} w={best[3]})")  # fmt: skip


if __name__ == "__main__":
    main()
