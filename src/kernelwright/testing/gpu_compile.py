"""Compile kernels for a GPU target on a machine without a GPU.

The interpreter accepts code the GPU compiler rejects (a plain Python global read inside a
kernel, say), so interpreter tests alone let such kernels reach the GPU machine. This module
records every launch a piece of code makes under the interpreter — the kernel, its argument
types, its compile-time constants and `num_warps` — and compiles each distinct one for an
NVIDIA target (sm_90 by default) in subprocesses with the interpreter off, one per core. No
GPU is needed: Triton's wheel carries ptxas. `check_compiles` records the launches without
running them, so a compile check costs the compiles, not the interpreter's run of wide rows.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

_TYPE_CODES = {
    torch.float32: "fp32",
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
    torch.int32: "i32",
    torch.int64: "i64",
    torch.int8: "i8",
    torch.uint8: "u8",
    torch.bool: "i1",
}


@dataclass(frozen=True)
class Launch:
    module: str
    name: str
    signature: tuple[tuple[str, str], ...]  # (arg name, type code or "constexpr")
    constexprs: tuple[tuple[str, object], ...]
    num_warps: int
    num_stages: int


def _type_code(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return "*" + _TYPE_CODES[value.dtype]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -(2**31) <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"cannot type kernel argument {value!r}")


@contextlib.contextmanager
def capture_launches(execute: bool = True) -> Iterator[list[Launch]]:
    """Record every interpreted kernel launch made inside the block. With `execute=False` the
    launches are recorded only, not run: outputs stay as they were (a compile check does not
    read them, and the interpreter's run of a wide row is what takes its time)."""
    from triton.runtime.interpreter import InterpretedFunction

    launches: list[Launch] = []
    original = InterpretedFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        fn = self.fn
        names = list(self.arg_names)
        params = inspect.signature(fn).parameters.values()
        # annotations may be strings (`from __future__ import annotations`), as Triton allows
        constexpr_names = {p.name for p in params if "constexpr" in str(p.annotation)}
        defaults = {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}
        values = defaults | dict(zip(names, args, strict=False))
        values.update({k: v for k, v in kwargs.items() if k in names})
        sig, consts = [], []
        for name in names:
            value = values[name]
            if name in constexpr_names or value is None:
                sig.append((name, "constexpr"))
                consts.append((name, value))
            else:
                sig.append((name, _type_code(value)))
        launches.append(
            Launch(
                fn.__module__,
                fn.__name__,
                tuple(sig),
                tuple(consts),
                int(kwargs.get("num_warps", 4)),
                int(kwargs.get("num_stages", 3)),
            )
        )
        if not execute:
            return None
        return original(self, *args, grid=grid, warmup=warmup, **kwargs)

    InterpretedFunction.run = run
    try:
        yield launches
    finally:
        InterpretedFunction.run = original


@dataclass
class CompileResult:
    launch: Launch
    ok: bool
    error: str
    shared: int = 0  # bytes of shared memory per program (0 when it did not compile)


def _workers(launches: int) -> int:
    # One compile process per core (the tests themselves run on one), at most 4: each holds
    # its own torch and triton.
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(launches, cores or 1, 4))


def _compile_batch(launches: list[Launch], arch: int) -> list[list]:
    # [error or "", shared bytes] per launch, from one subprocess with the interpreter off.
    payload = json.dumps(
        [
            {
                "module": launch.module,
                "name": launch.name,
                "signature": dict(launch.signature),
                "constexprs": dict(launch.constexprs),
                "num_warps": launch.num_warps,
                "num_stages": launch.num_stages,
            }
            for launch in launches
        ]
    )
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_DEFAULT_FP_FUSION="1")
    proc = subprocess.run(
        [sys.executable, "-m", "kernelwright.testing.gpu_compile", str(arch)],
        input=payload,
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"compile subprocess failed:\n{proc.stderr[-4000:]}")
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    if len(results) != len(launches):
        raise RuntimeError(f"compile subprocess answered {len(results)} of {len(launches)}")
    return results


def compile_launches(launches: list[Launch], arch: int = 90) -> list[CompileResult]:
    """Compile each distinct launch for sm_`arch` in subprocesses without the interpreter,
    one per core (up to 4), the launches dealt out in turn."""
    unique = list(dict.fromkeys(launches))
    n = _workers(len(unique))
    batches = [unique[i::n] for i in range(n)]
    with ThreadPoolExecutor(n) as pool:
        answers = list(pool.map(lambda batch: _compile_batch(batch, arch), batches))
    results: list[list] = [[]] * len(unique)
    for i, answer in enumerate(answers):
        results[i::n] = answer
    return [
        CompileResult(launch, not err, err, shared)
        for launch, (err, shared) in zip(unique, results, strict=True)
    ]


def check_compiles(run: Callable[[], object], arch: int = 90) -> list[CompileResult]:
    """Run `run()` with the interpreter on and its kernel launches recorded but not executed
    (their outputs are the interpreter tests' business), then compile every distinct launch
    it made for sm_`arch`."""
    with capture_launches(execute=False) as launches:
        run()
    if not launches:
        raise AssertionError("no kernel launches were captured")
    return compile_launches(launches, arch)


def _compile_main(arch: int) -> None:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from kernelwright.registry import resolve
    from kernelwright.runtime.fastlaunch import jit_function

    results = []  # [error or "", shared memory bytes] per launch
    for item in json.loads(sys.stdin.read()):
        try:
            kernel = jit_function(resolve(item["module"], item["name"]))
            names = list(kernel.arg_names)
            consts = {(names.index(k),): v for k, v in item["constexprs"].items()}
            src = ASTSource(kernel, item["signature"], constexprs=consts)
            options = {"num_warps": item["num_warps"], "num_stages": item["num_stages"]}
            compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)
            results.append(["", int(compiled.metadata.shared)])
        except Exception as e:  # reported per launch to the caller, which fails the test
            results.append([f"{type(e).__name__}: {e}"[-2000:], 0])
    print(json.dumps(results))


if __name__ == "__main__":
    _compile_main(int(sys.argv[1]))
