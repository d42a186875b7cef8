"""Placeholder timings for dry runs and the CPU suite: a deterministic model of launch configs.

NOT a performance model to trust — a stand-in clock so the variant loop can be exercised without
a GPU, and so that a de-tuned table really measures slower and a good one faster. Time per
kernel = bytes moved / (a Hopper-like bandwidth x an efficiency from the config) + launch cost,
where the efficiency falls with:
- too few warps in flight (small grids, 1-warp programs): HBM needs many outstanding loads;
- too few values per thread (< 4: short loads, no ILP), too many (> 128: register spills);
- padded lanes when block_n is far above the row length;
- the looped (row-too-long) kernels, which read each row twice;
- persistent backward kernels: fp32 partial dW rows, one per program, are extra traffic.
Every row these timings produce is marked "placeholder".
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kernelwright.runtime.launch import LaunchConfig, Table


@dataclass(frozen=True)
class ModelGPU:
    name: str
    sm_count: int
    gbps: float  # the copy bandwidth the model saturates at
    max_warps_per_sm: int = 64
    launch_us: float = 4.0


MODEL_GPUS = {
    "ampere": ModelGPU("model of an A100", 108, 1500.0),
    "ada": ModelGPU("model of an L40S", 142, 800.0, max_warps_per_sm=48),
    "hopper": ModelGPU("model of an H100", 132, 3000.0),
    "blackwell": ModelGPU("model of a B200", 148, 6000.0),
}


def model_gpu(arch: str) -> ModelGPU:
    # the interpreter and unknown archs get the Hopper model: dry runs tune "as if on an H100"
    return MODEL_GPUS.get(arch, MODEL_GPUS["hopper"])


def is_backward_kernel(kernel: str) -> bool:
    return "bwd" in kernel or "backward" in kernel


def kernel_ms(kernel: str, cfg: LaunchConfig, m: int, n: int, itemsize: int, gpu: ModelGPU):
    """Modelled time of one launch of `kernel` with `cfg` over an [m, n] problem, in ms."""
    bwd = is_backward_kernel(kernel)
    fits = cfg.block_n >= n
    rows = cfg.rows if fits else 1
    nbytes = (3 if bwd else 2) * m * n * itemsize  # fwd: x in, y out; bwd: x, dy in, dx out
    if not fits and cfg.split_row:
        nbytes *= 1.05  # one read, a row's programs waiting for each other's statistics
    elif not fits:
        # the second pass over each row, partly served from L2 (more with the L2 flags)
        nbytes *= 1.3 - 0.05 * cfg.evict_hints - 0.05 * cfg.reverse_pass
    programs = math.ceil(m / rows)
    if bwd:
        programs = max(1, min(programs, gpu.sm_count * cfg.programs_per_sm))
        nbytes += 2 * programs * n * 4  # fp32 partial dW rows: written, then summed
    per_thread = cfg.block_n * rows / (cfg.num_warps * 32)  # values one thread holds per step
    regs = min(255.0, 32.0 + per_thread)
    resident = min(gpu.max_warps_per_sm, 65536 // (int(regs) * 32))
    resident = max(cfg.num_warps, resident // cfg.num_warps * cfg.num_warps)
    in_flight = min(programs * cfg.num_warps, gpu.sm_count * resident)
    fill = min(1.0, in_flight / (gpu.sm_count * 24.0))  # ~24 warps/SM keep HBM busy
    vec = min(1.0, per_thread / 4.0)
    spill = 1.0 if per_thread <= 128 else (128.0 / per_thread) ** 0.7
    lanes = min(1.0, n / cfg.block_n) if fits else 1.0
    eff = fill * vec * spill * (0.5 + 0.5 * lanes)
    return nbytes / (gpu.gbps * 1e9 * max(eff, 1e-4)) * 1e3 + gpu.launch_us * 1e-3


def mode_kernels(kernels: list[str], mode: str) -> list[str]:
    """The table kernels a benchmark mode runs (full: all of them)."""
    if mode == "full":
        return list(kernels)
    want_bwd = mode == "backward"
    return [k for k in kernels if is_backward_kernel(k) == want_bwd]


class FakeClock:
    """A harness `Timer` whose times come from the configs the op would use right now.

    The workflow calls `at(m, n, mode)` before each measurement; the clock looks up, in the
    live (possibly patched) table, the config of each kernel the mode runs at row length `n`
    for `arch`, and returns the modelled time. It never calls the function it is asked to time:
    the harness's untimed first call has already run it (correctness, under the interpreter).
    """

    def __init__(self, table: Table, arch: str, itemsize: int = 2):
        self.table = table
        self.arch = arch
        self.gpu = model_gpu(arch)
        self.itemsize = itemsize
        self.point: tuple[int, int, str, str, int] | None = None

    def at(self, m: int, n: int, mode: str, *, provider: str = "kernelwright", nbytes: int = 0):
        self.point = (m, n, mode, provider, nbytes)
        return self

    def configs(self, n: int, kernels: list[str]) -> dict[str, LaunchConfig]:
        out = {}
        for k in kernels:
            per_arch = self.table[k]
            for max_n, cfg in per_arch.get(self.arch) or per_arch["default"]:
                if n <= max_n:
                    out[k] = cfg
                    break
        return out

    def ms(self, m: int, n: int, mode: str) -> float:
        kernels = mode_kernels(list(self.table), mode)
        cfgs = self.configs(n, kernels)
        return sum(kernel_ms(k, c, m, n, self.itemsize, self.gpu) for k, c in cfgs.items())

    def provider_ms(self, m: int, n: int, mode: str, provider: str, nbytes: int) -> float:
        if provider.startswith("kernelwright"):
            return self.ms(m, n, mode)
        # a peer (PyTorch eager) moves its intermediates through memory: ~3x the bytes
        return 3 * nbytes / (self.gpu.gbps * 1e9) * 1e3 + 3 * self.gpu.launch_us * 1e-3

    def peak_mb(self, m: int, n: int, mode: str, provider: str, nbytes: int) -> float:
        """Modelled peak memory: the outputs and gradients (half the bytes moved), plus the
        persistent backward's fp32 partial dW rows, one per program."""
        out = nbytes / 2 / 2**20
        if mode == "forward" or not provider.startswith("kernelwright"):
            return out
        for k, c in self.configs(n, mode_kernels(list(self.table), mode)).items():
            if is_backward_kernel(k):
                rows = c.rows if c.block_n >= n else 1
                programs = min(math.ceil(m / rows), self.gpu.sm_count * c.programs_per_sm)
                out += programs * n * 4 / 2**20
        return out

    def __call__(self, fn: Callable[[], Any], setup: Callable[[], None]):
        if self.point is None:
            raise RuntimeError("FakeClock: call .at(m, n, mode) before timing a measurement")
        t = self.provider_ms(*self.point)
        # a fixed +-1% band: the noise estimate of a placeholder run is the guardrails' floor
        return 0.99 * t, t, 1.01 * t
