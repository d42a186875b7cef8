"""What the compiler and the profiler say about an op's kernels: registers, spills, shared
memory, the occupancy they imply, and Nsight Compute metrics when `ncu` is installed.

Triton keeps every compiled specialization of a `@triton.jit` function in
`fn.device_caches[device][0]` (key -> `CompiledKernel`, triton 3.x); a launched kernel has
`n_regs`, `n_spills` and `metadata.shared`. So the report is read after the baseline benchmark
has launched the op at every point — no extra compilation.
"""

from __future__ import annotations

import csv
import io
import math
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from kernelwright import registry
from kernelwright.profiles.optimization import KernelResources
from kernelwright.runtime.fastlaunch import jit_function


@dataclass(frozen=True)
class SMLimits:
    registers: int = 65536
    max_warps: int = 64
    max_blocks: int = 32
    shared_bytes: int = 227 * 1024


# per-SM limits of the architectures the tables are keyed by (CUDA occupancy calculator data)
SM_LIMITS = {
    "ampere": SMLimits(shared_bytes=163 * 1024),
    "ada": SMLimits(max_warps=48, max_blocks=24, shared_bytes=99 * 1024),
    "hopper": SMLimits(),
    "blackwell": SMLimits(),
}


def occupancy(n_regs: int, num_warps: int, shared: int, limits: SMLimits) -> tuple[float, str]:
    """Resident warps per SM / the maximum, and the resource that limits it."""
    # registers are allocated per warp in units of 256
    per_warp = max(1, math.ceil(max(n_regs, 1) * 32 / 256) * 256)
    by = {
        "registers": limits.registers // (per_warp * num_warps),
        "threads": limits.max_warps // num_warps,
        "blocks": limits.max_blocks,
    }
    if shared > 0:
        by["shared memory"] = limits.shared_bytes // shared
    limited_by = min(by, key=by.get)
    blocks = by[limited_by]
    return min(1.0, blocks * num_warps / limits.max_warps), limited_by


def _constants(kernel) -> dict[str, int]:
    # ASTSource.constants maps an argument's path (a tuple of indices) or name to its value
    src = getattr(kernel, "src", None)
    consts = getattr(src, "constants", None)
    names = getattr(getattr(src, "fn", None), "arg_names", None)
    if not isinstance(consts, dict) or names is None:
        return {}
    out = {}
    for key, value in consts.items():
        idx = key[0] if isinstance(key, tuple) and len(key) == 1 else key
        name = names[idx] if isinstance(idx, int) and idx < len(names) else str(idx)
        if isinstance(value, bool) or not isinstance(value, int):
            continue
        if name.isupper():  # BLOCK_N, ROWS, CASTING...: the compile-time switches
            out[name] = int(value)
    return out


def compiled_kernels(op: str, arch: str) -> list[KernelResources]:
    """Every specialization of the op module's Triton kernels compiled in this process."""
    import triton

    mod = registry.get(op).load()
    limits = SM_LIMITS.get(arch, SMLimits())
    out = []
    for name in sorted(vars(mod)):
        fn = jit_function(getattr(mod, name))
        if not isinstance(fn, triton.runtime.JITFunction):
            continue
        for entry in getattr(fn, "device_caches", {}).values():
            for kernel in entry[0].values():
                n_regs = getattr(kernel, "n_regs", None)
                if n_regs is None:  # compiled but never loaded: no ptxas report yet
                    continue
                warps = int(kernel.metadata.num_warps)
                shared = int(kernel.metadata.shared)
                occ, limited_by = occupancy(int(n_regs), warps, shared, limits)
                out.append(
                    KernelResources(
                        kernel=name,
                        constants=_constants(kernel),
                        num_warps=warps,
                        registers_per_thread=int(n_regs),
                        spills=int(kernel.n_spills),
                        shared_bytes=shared,
                        occupancy=round(occ, 3),
                        limited_by=limited_by,
                    )
                )
    return out


# --------------------------------------------------------------------------- Nsight Compute

NCU_METRICS = {
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "DRAM throughput, % of peak",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "achieved occupancy, %",
    "smsp__average_warp_latency_issue_stalled_long_scoreboard": "stall: long scoreboard",
    "smsp__average_warp_latency_issue_stalled_barrier": "stall: barrier",
}

_NCU_SCRIPT = """
import torch, kernelwright
from kernelwright.bench.specs import get_spec
spec = get_spec({op!r})
inputs = spec.make_inputs({shape!r}, torch.bfloat16, torch.device("cuda"))
inputs = {{k: v.requires_grad_(k in spec.grad_inputs) for k, v in inputs.items()}}
out = spec.provider("kernelwright").build(inputs)()
out = out[0] if isinstance(out, (tuple, list)) else out
out.backward(torch.randn_like(out))
torch.cuda.synchronize()
"""


def env_with_src() -> dict[str, str]:
    """This environment with kernelwright's own source tree first on PYTHONPATH, so a child
    process imports the same kernelwright (and the same, possibly rewritten, tables)."""
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[3])  # .../src
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    return env


def ncu_available() -> bool:
    return shutil.which("ncu") is not None


def ncu_metrics(op: str, shape: dict[str, int], timeout_s: int = 180) -> tuple[dict, str]:
    """Nsight Compute metrics of the op's kernels (averaged over them) at one shape.

    Returns (metrics, note); the note says why there are none (not installed, no permission
    to read the GPU's counters, a timeout) — ncu is optional, its absence is recorded.
    """
    if not ncu_available():
        return {}, "not available: ncu is not on PATH"
    cmd = [
        "ncu",
        "--csv",
        "--metrics",
        ",".join(NCU_METRICS),
        "--kernel-name",
        f"regex:_{op}_",
        sys.executable,
        "-c",
        _NCU_SCRIPT.format(op=op, shape=dict(shape)),
    ]
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout_s, env=env_with_src()
        )
    except subprocess.TimeoutExpired:
        return {}, f"ncu timed out after {timeout_s} s"
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return {}, f"ncu failed (exit {proc.returncode}): {tail[0][:300]}"
    values: dict[str, list[float]] = {}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith('"')]
    for rec in csv.DictReader(io.StringIO("\n".join(lines))):
        name, value = rec.get("Metric Name"), rec.get("Metric Value", "")
        if name in NCU_METRICS:
            text = value.replace(",", "")
            if text.replace(".", "", 1).isdigit():
                values.setdefault(name, []).append(float(text))
    metrics = {NCU_METRICS[k]: round(sum(v) / len(v), 2) for k, v in values.items()}
    if not metrics:
        return {}, "ncu ran but reported none of the metrics asked for"
    return metrics, f"ncu at {shape}, averaged over the op's kernels"
