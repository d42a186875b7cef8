"""A/B of layer_norm's looped forward: three reads (as of 4c30c02) against two (Welford, a15ded3).

Prints only. Loads the old module from git (`git show 4c30c02:...`, written next to this file
by the caller as `_ln_old.py`) and times both launchers at the same configs, kernels alone.

    git show 4c30c02:src/kernelwright/ops/layer_norm.py > benchmarks/_ln_old.py
    python benchmarks/ln_looped_ab.py
"""

from __future__ import annotations

import functools
import importlib.util
import itertools
from pathlib import Path

import torch
from _probe import gpu_setup

from kernelwright.ops import layer_norm as new
from kernelwright.runtime.launch import LaunchConfig as C


def main() -> None:
    spec = importlib.util.spec_from_file_location("_ln_old", Path(__file__).with_name("_ln_old.py"))
    old = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(old)
    timer, _, _ = gpu_setup()
    for m, n in [(2048, 65536), (1024, 131072), (4096, 32768)]:
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        w, b = (torch.randn(n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        y = torch.empty_like(x)
        mean, rstd = (torch.empty(m, device="cuda", dtype=torch.float32) for _ in range(2))
        gb = 2 * m * n * 2 / 1e9
        for bn, nw, flags in itertools.product((2048, 4096, 8192), (8, 16), (0, 1)):
            cfg = C(block_n=bn, num_warps=nw, evict_hints=bool(flags), reverse_pass=bool(flags))
            res = []
            for name, mod in (("old", old), ("new", new)):
                if name == "old" and flags:
                    continue  # the old looped forward ignored the flags
                fn = functools.partial(mod.layer_norm_fwd_launch, x, w, b, y, mean, rstd, 1e-5,
                                       config=cfg)  # fmt: skip
                ms = timer(fn, lambda: None)[1]
                res.append(f"{name} {ms * 1e3:7.1f} us {gb / ms * 1e3:5.0f} GB/s")
            print(f"{m}x{n} block {bn} warps {nw} flags {flags}: " + " | ".join(res), flush=True)


if __name__ == "__main__":
    main()
