"""Timers for the bench harness: a CUDA-event timer with a per-rep setup and L2 flush, and a
perf_counter fallback for the CPU interpreter, plus the device's copy bandwidth.

A `Timer` maps (fn, setup) to the p20/p50/p80 of fn in ms; it calls setup() before every call
of fn, warm-up calls included, and keeps setup out of the timed region.

`cuda_timer` measures as `triton.testing.do_bench` does (CUDA events around each rep, L2
flushed before each rep so inputs need no rotation, warm-up and rep counts from time budgets,
p20/p50/p80) plus that per-rep setup, which do_bench cannot run outside its timed region. One
difference: the flush reads a buffer larger than L2 instead of zeroing one. Zeroed lines stay
in L2 dirty, and the timed kernel then pays to write them back to DRAM as it evicts them, a
tax that grows with the kernel's footprint and makes small kernels look slower than they are.
On sm_80+ the flush first demotes lines an earlier kernel loaded with evict_last (bench/_l2.py),
which a plain read cannot evict.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from kernelwright.bench._l2 import demote_l2
from kernelwright.runtime import device_info

QUANTILES = (0.2, 0.5, 0.8)

# (fn, setup) -> (p20, p50, p80) of fn in ms. A timer calls setup() before every call of fn,
# warm-up calls included, and keeps setup out of the timed region.
Timer = Callable[[Callable[[], Any], Callable[[], None]], tuple[float, float, float]]

FLUSHES = ("read", "demote")


def _quantiles(times_ms: Sequence[float]) -> tuple[float, float, float]:
    p20, p50, p80 = np.quantile(np.asarray(times_ms, dtype=np.float64), QUANTILES)
    return float(p20), float(p50), float(p80)


def cuda_timer(
    warmup_ms: float = 25,
    rep_ms: float = 100,
    *,
    hide_host: bool = False,
    flush_bytes: int = 2**28,
    flush: str | None = None,
) -> Timer:
    """CUDA-event timer, do_bench's method with a per-rep setup outside the timed region.

    Each rep: setup(), L2 flush, start event, fn(), end event. Rep counts come from a 5-rep
    estimate and the time budgets. The flush goes through a `flush_bytes` buffer, larger than
    any L2 so far: `flush="read"` sums it, leaving L2 full of clean lines; `"demote"` reads it
    as "read" does, after first taking every evict_last place in L2 with the buffer's lines
    and returning them to normal priority (bench/_l2.py): a plain read cannot evict lines an
    earlier kernel loaded with evict_last (torch.compile's kernels do), and a provider timed
    next on the same addresses would read them from L2. None (the default) picks
    `default_flush`: "demote" on sm_80 and later, which have the instruction, else "read".

    `hide_host`: before the start event, the GPU also sleeps for twice the CPU time fn takes
    to issue, so all of fn's kernels are queued before the clock starts: the times are GPU
    time alone, as in a training step where the CPU runs ahead. Without it (do_bench's way)
    a launch-bound call also times its Python and launch overhead, as a user's eager loop
    sees it.
    """
    if flush not in (None, *FLUSHES):
        raise ValueError(f"cuda_timer: flush must be 'read' or 'demote', got {flush!r}")
    buffers: list[torch.Tensor] = []  # the flush buffer, then the read's 0-d sum
    mode = flush

    def flush_l2() -> None:
        if mode == "demote":
            demote_l2(buffers[0], buffers[1])
        # an fp32 sum: several times faster than an int32 sum into int64
        torch.sum(buffers[0], dim=0, out=buffers[1])

    def time_fn(fn: Callable[[], Any], setup: Callable[[], None]):
        nonlocal mode
        if not buffers:
            device = torch.device("cuda", torch.cuda.current_device())
            mode = mode or default_flush(device)
            if mode == "demote" and not _has_applypriority(device):
                raise ValueError(
                    f"cuda_timer: flush='demote' needs sm_80 or later ({device_info(device).name} "
                    "is older); use flush='read'"
                )
            buffers.append(torch.ones(flush_bytes // 4, dtype=torch.float32, device="cuda"))
            buffers.append(torch.empty((), dtype=torch.float32, device="cuda"))
        sleep_cycles = 0

        def prepare() -> None:
            setup()
            flush_l2()
            if sleep_cycles:
                torch.cuda._sleep(sleep_cycles)

        prepare()
        fn()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        estimate = host = 0.0
        for _ in range(5):
            prepare()
            start.record()
            t0 = time.perf_counter()
            fn()
            host = max(host, (time.perf_counter() - t0) * 1e3)
            end.record()
            torch.cuda.synchronize()
            estimate += start.elapsed_time(end) / 5
        sleep_ms = 2 * host + 0.02 if hide_host else 0.0
        sleep_cycles = int(sleep_ms * _sleep_cycles_per_ms()) if hide_host else 0
        n_warmup = max(1, int(warmup_ms / max(estimate, 1e-3)))
        n_rep = max(5, min(10_000, int(rep_ms / max(estimate + sleep_ms, 1e-3))))
        for _ in range(n_warmup):
            setup()
            fn()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n_rep)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n_rep)]
        for i in range(n_rep):
            prepare()
            starts[i].record()
            fn()
            ends[i].record()
        torch.cuda.synchronize()
        return _quantiles([s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)])

    return time_fn


@functools.cache
def _sleep_cycles_per_ms() -> float:
    # torch.cuda._sleep spins for a number of GPU clock cycles: calibrate cycles per ms once.
    torch.cuda._sleep(1000)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    torch.cuda.synchronize()
    return 10_000_000 / max(start.elapsed_time(end), 1e-3)


def interpreter_timer(reps: int = 3) -> Timer:
    """perf_counter over a few reps: for the CPU interpreter, where one call takes ~ms-s."""

    def time_fn(fn: Callable[[], Any], setup: Callable[[], None]):
        times = []
        for _ in range(reps):
            setup()
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return _quantiles(times)

    return time_fn


def _has_applypriority(device: torch.device) -> bool:
    return device.type == "cuda" and device_info(device).capability >= (8, 0)


def default_flush(device: torch.device) -> str:
    """The timer's L2 flush unless one is asked for: "demote" where the GPU has
    `applypriority` (sm_80+), "read" elsewhere (bench/_l2.py; the CPU timer flushes nothing)."""
    return "demote" if _has_applypriority(device) else "read"


def default_timer(
    device: torch.device, *, hide_host: bool = False, flush: str | None = None
) -> Timer:
    if device.type != "cuda":
        return interpreter_timer()
    return cuda_timer(hide_host=hide_host, flush=flush)


def measure_copy_bandwidth(
    device: torch.device, *, timer: Timer | None = None, nbytes: int | None = None
) -> float:
    """Device-to-device copy bandwidth in GB/s, counting bytes read plus bytes written.

    The practical ceiling for memory-bound kernels: %copy-bw = achieved GB/s over this. 1 GB
    on a GPU, far larger than L2; 64 MB on the CPU, where the number only fills the column.
    """
    timer = timer or default_timer(device)
    nbytes = nbytes or (2**30 if device.type == "cuda" else 2**26)
    bufs = [torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device).normal_()]
    bufs.append(torch.empty_like(bufs[0]))
    _, p50, _ = timer(lambda: bufs[1].copy_(bufs[0]), lambda: None)
    bufs.clear()  # freed here: nothing else refers to them
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return 2 * nbytes / (p50 * 1e-3) / 1e9
