"""Rope forward, compiled for sm_90 on a machine without a GPU: registers, spills, load order.

Prints only (NOTES issue 3, 54). Captures the launches of our forward (the table's config and
other warp counts) and of Liger's under the interpreter, then compiles each for sm_90 with the
specialization the JIT gives on a GPU (16-divisible pointers and ints, ints equal to 1 as
constants) and reads the cubin with the wheel's cuobjdump: registers per thread, spill stack,
SASS instructions, fp32 and packed 16-bit math instructions, programs per SM, and waves over 132
SMs at a few token counts. (kernelwright.testing.gpu_compile records argument types only and
compiles without that specialization, which is enough to catch compile errors but not to count
registers as the GPU would: hence the capture here keeps the argument values.)

    python benchmarks/rope_regs_probe.py [--heads 32,8,128] [--warps 4,8] [--liger-src DIR]

Needs Liger Kernel importable (or its unpacked wheel at --liger-src) and Triton with ptxas.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import re
import subprocess
import sys
from dataclasses import replace

SMS = 132
TOKENS = (1024, 2048, 4096, 8192)


def _capture(hq: int, hk: int, d: int, warps: list[int]) -> list[dict]:
    os.environ["TRITON_INTERPRET"] = "1"
    import torch
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend
    from triton.runtime.interpreter import InterpretedFunction

    from kernelwright.ops import rope as rp
    from kernelwright.runtime.tables.rope import TABLE

    launches: list[dict] = []
    original = InterpretedFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        params = list(inspect.signature(self.fn).parameters.values())
        constexprs = {p.name for p in params if "constexpr" in str(p.annotation)}
        values = {p.name: p.default for p in params}
        values.update(zip(self.arg_names, args, strict=False))
        values.update({k: v for k, v in kwargs.items() if k in values})
        sig, consts, attrs = {}, {}, {}
        for name in self.arg_names:
            value = values[name]
            kind = "constexpr"
            if name not in constexprs and value is not None:
                kind, key = native_specialize_impl(BaseBackend, value, False, True, True)
            if kind == "constexpr":
                consts[name] = value
            else:
                attrs[name] = key
            sig[name] = kind
        launches.append(
            {"module": self.fn.__module__, "name": self.fn.__name__, "sig": sig,
             "consts": consts, "attrs": attrs, "num_warps": int(kwargs.get("num_warps", 4)),
             "num_stages": int(kwargs.get("num_stages", 3))}
        )  # fmt: skip
        return original(self, *args, grid=grid, warmup=warmup, **kwargs)

    InterpretedFunction.run = run
    from liger_kernel.ops.rope import rope_forward

    s = 64  # any multiple of 16: the token count only enters as a 16-divisible int
    q = torch.randn(1, s, hq, d, dtype=torch.bfloat16).transpose(1, 2)
    k = torch.randn(1, s, hk, d, dtype=torch.bfloat16).transpose(1, 2)
    cos = torch.randn(1, s, d, dtype=torch.bfloat16)
    table_cfg = next(c for n, c in TABLE["fwd"]["default"] if (hq + hk) * d <= n)
    labels = []
    for nw in dict.fromkeys([table_cfg.num_warps, *warps]):
        cfg = replace(table_cfg, num_warps=nw)
        rp.rope_fwd_launch(q, k, cos, cos, torch.empty_like(q), torch.empty_like(k), 1, False,
                           config=cfg)  # fmt: skip
        labels.append(f"ours, {nw} warps" + (" (table)" if nw == table_cfg.num_warps else ""))
    rope_forward(q.clone(), k.clone(), cos, cos)
    labels.append("liger")
    InterpretedFunction.run = original
    for launch, label in zip(launches, labels, strict=True):
        launch["label"] = label
    return launches


def _compile(launches: list[dict]) -> None:
    import importlib

    import triton
    from triton.backends.compiler import BaseBackend, GPUTarget
    from triton.compiler import ASTSource

    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
    cubin = "/tmp/rope_regs_probe.cubin"
    print(f"triton {triton.__version__}, sm_90; waves over {SMS} SMs at tokens {TOKENS}")
    for c in launches:
        kernel = getattr(importlib.import_module(c["module"]), c["name"])
        names = list(kernel.arg_names)
        src = ASTSource(
            kernel, c["sig"],
            constexprs={(names.index(n),): v for n, v in c["consts"].items()},
            attrs={(names.index(n),): BaseBackend.parse_attr(v) for n, v in c["attrs"].items()},
        )  # fmt: skip
        options = {"num_warps": c["num_warps"], "num_stages": c["num_stages"]}
        compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
        with open(cubin, "wb") as f:
            f.write(compiled.asm["cubin"])
        usage = subprocess.run([cuobjdump, "-res-usage", cubin], capture_output=True, text=True)
        sass = subprocess.run([cuobjdump, "-sass", cubin], capture_output=True, text=True).stdout
        regs = int(re.search(r"REG:(\d+)", usage.stdout).group(1))
        stack = int(re.search(r"STACK:(\d+)", usage.stdout).group(1))
        ops = re.findall(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)(\.\S+)?", sass)
        # HFMA2.MMA with zero operands is how ptxas moves a constant into a register: not math
        fp32 = sum(op in ("FMUL", "FFMA", "FADD") for op, _ in ops)
        packed = sum(op in ("HMUL2", "HFMA2", "HADD2") and sfx != ".MMA" for op, sfx in ops)
        threads = 32 * c["num_warps"]
        per_sm = min(2048 // threads, 65536 // (threads * -(-regs // 8) * 8), 32)
        waves = "/".join(f"{t / (per_sm * SMS):.2f}" for t in TOKENS)
        print(
            f"{c['label']:22s} regs {regs:3d}  spill stack {stack:4d} B  SASS {len(ops):4d}  "
            f"fp32 math {fp32:3d}  packed 16-bit math {packed:3d}  programs/SM {per_sm:2d}  "
            f"waves {waves}"
        )  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--heads", default="32,8,128", help="q heads, kv heads, head_dim")
    ap.add_argument("--warps", default="4,8")
    ap.add_argument("--liger-src", default="", help="folder holding liger_kernel, if not installed")
    ap.add_argument("--compile", action="store_true", help=argparse.SUPPRESS)  # the child
    args = ap.parse_args()
    if args.liger_src:
        sys.path.insert(0, args.liger_src)
    if args.compile:
        _compile(json.loads(sys.stdin.read()))
        return
    hq, hk, d = (int(v) for v in args.heads.split(","))
    launches = _capture(hq, hk, d, [int(w) for w in args.warps.split(",")])
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_DEFAULT_FP_FUSION="1")
    child = [sys.executable, __file__, "--compile"]
    if args.liger_src:
        child += ["--liger-src", args.liger_src]
    subprocess.run(child, input=json.dumps(launches, default=str), text=True, env=env, check=True)


if __name__ == "__main__":
    main()
