"""Rope forward probe (prints only; the benchmark of record is `kernelwright bench rope`).

Times the library kernel at explicit launch configs against Liger's forward, at Llama-3-8B heads
(32 q + 8 kv, head_dim 128), bf16, HF's transposed q/k views. GPU time alone. (The committed
results/h200-issue3-rope/rope_probe.csv came from a version that also timed a `halves_equal`
kernel flag, reading one half of cos/sin as Liger does: ~1% faster, not kept.)

`--split` (NOTES 55) times instead the table's config against the split form (`split_row`:
each head tile of a token on its own program) at 1..16 heads a tile and 1..8 warps, forward
and backward, out of place, over `--rounds` rounds (the summary takes each config's median).

    python benchmarks/rope_probe.py [--tokens 1024,8192] [--split] [--rounds 3] [--out DIR]
"""

from __future__ import annotations

import argparse
import csv
import functools
import itertools
import os
import statistics
from pathlib import Path

import torch
import triton

from kernelwright.bench.harness import cuda_timer
from kernelwright.ops.rope import _launch, rope_tables
from kernelwright.runtime import device_info, lookup
from kernelwright.runtime.launch import LaunchConfig
from kernelwright.runtime.tables.rope import TABLE


def _configs(split: bool, kernel: str, n: int) -> list[tuple[LaunchConfig, str]]:
    if not split:
        return [
            (LaunchConfig(block_n=bn, rows=1, num_warps=w), place)
            for bn, w, place in itertools.product((1024, 4096, 8192), (2, 4, 8), ("out", "in"))
        ]
    table = lookup(TABLE, "rope", kernel, device_info(torch.device("cuda")), n)
    tiles = [
        LaunchConfig(block_n=bn, rows=1, num_warps=w, split_row=True)
        for bn, w in itertools.product((128, 256, 512, 1024, 2048), (1, 2, 4, 8))
        if bn >= w * 32  # at least one element a thread
    ]
    return [(table, "out")] + [(cfg, "out") for cfg in tiles]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="1024,2048,4096,8192,16384,32768")
    ap.add_argument("--heads", default="32,8,128")
    ap.add_argument("--split", action="store_true")
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
    kernels = ("fwd", "bwd") if args.split else ("fwd",)
    for rnd, s in itertools.product(range(args.rounds), (int(v) for v in args.tokens.split(","))):
        q = torch.randn(1, s, hq, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
        k = torch.randn(1, s, hk, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
        cos, sin = rope_tables(s, d, base=500000.0, dtype=torch.bfloat16, device="cuda")
        qo, ko = torch.empty_like(q), torch.empty_like(k)
        gb = (2 * (hq + hk) * d * s * 2) / 1e9
        qi, ki = q.clone(), k.clone()  # rotated in place, over and over (as Liger's below)
        for kernel in kernels:
            ref = None
            for cfg, place in _configs(args.split, kernel, (hq + hk) * d):
                outs = (qo, ko) if place == "out" else (qi, ki)
                ins = (q, k) if place == "out" else (qi, ki)
                fn = functools.partial(_launch, kernel, *ins, cos, sin, *outs, 1, False, cfg)
                if place == "out":
                    fn()
                    # every config writes the same bits (the GPU tests check them against rope_ref)
                    if ref is None:
                        ref = (qo.clone(), ko.clone())
                    assert torch.equal(qo, ref[0]) and torch.equal(ko, ref[1]), cfg
                p20, p50, p80 = timer(fn, lambda: None)
                rows.append(dict(round=rnd, tokens=s, kernel=kernel, provider=f"kw_{place}",
                                 block_n=cfg.block_n, warps=cfg.num_warps, rows=cfg.rows,
                                 split=int(cfg.split_row), ms=p50,
                                 gbps=gb / (p50 / 1e3)))  # fmt: skip
        if rope_forward is not None:
            liger = functools.partial(rope_forward, q.clone(), k.clone(), cos, sin)
            p20, p50, p80 = timer(liger, lambda: None)
            rows.append(dict(round=rnd, tokens=s, kernel="fwd", provider="liger", block_n=0,
                             warps=0, rows=0, split=0, ms=p50, gbps=gb / (p50 / 1e3)))  # fmt: skip
        print(f"round {rnd} tokens {s} done", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / ("rope_split_probe.csv" if args.split else "rope_probe.csv"), "w",
              newline="") as f:  # fmt: skip
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    # Summary: per (tokens, kernel), the median over rounds of each config; the table's config
    # (first non-split ours), the best split config and Liger.
    groups: dict[tuple, list[float]] = {}
    for row in rows:
        key = (row["tokens"], row["kernel"], row["provider"], row["block_n"], row["warps"],
               row["split"])  # fmt: skip
        groups.setdefault(key, []).append(row["ms"])
    med = {key: statistics.median(v) for key, v in groups.items()}
    for s, kernel in sorted({(key[0], key[1]) for key in med}):
        mine = {key: v for key, v in med.items() if key[:2] == (s, kernel)}
        picks = {
            "whole": lambda key: key[2] != "liger" and not key[5],
            "split": lambda key: key[5],
            "liger": lambda key: key[2] == "liger",
        }
        for label, pick in picks.items():
            cands = {key: v for key, v in mine.items() if pick(key)}
            if not cands:
                continue
            key = min(cands, key=cands.get)
            print(f"{s:6d} {kernel} {label:6s} best {cands[key] * 1e3:7.2f} us "
                  f"bn={key[3]} w={key[4]} {key[2]}")  # fmt: skip
        split = sorted((v, key) for key, v in mine.items() if key[5])
        print("        split configs: " + ", ".join(
            f"{key[3]}/{key[4]}w {v * 1e3:.2f}" for v, key in split[:8]))  # fmt: skip


if __name__ == "__main__":
    main()
