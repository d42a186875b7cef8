"""What every row of a benchmark run records about the run: device, architecture, versions,
commit, time, the timing method and the copy-bandwidth ceiling."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch
import triton

from kernelwright.bench.timers import (
    FLUSHES,
    Timer,
    default_flush,
    default_timer,
    measure_copy_bandwidth,
)
from kernelwright.runtime import default_device, device_info

CPU_ARCH = "cpu-interpreter"


def package_version(dist: str) -> str:
    """The installed version of distribution `dist` ("" when it is not installed)."""
    import importlib.metadata

    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return ""


def git_commit(cwd: str | Path | None = None) -> str:
    """The short commit kernelwright runs from, "+dirty" if tracked files changed since.

    $KERNELWRIGHT_COMMIT, when set, wins: a copy of the tree on a remote GPU machine may have no
    .git, or a stale one. Without either, "unknown".
    """
    if os.environ.get("KERNELWRIGHT_COMMIT"):
        return os.environ["KERNELWRIGHT_COMMIT"]
    where = Path(cwd) if cwd is not None else Path(__file__).resolve().parent

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(
                ["git", *args], cwd=where, capture_output=True, text=True, timeout=10
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    commit = git("rev-parse", "--short", "HEAD")
    if not commit:
        return "unknown"
    if git("status", "--porcelain", "--untracked-files=no"):
        commit += "+dirty"
    return commit


def arch_of(device: torch.device) -> str:
    """The architecture a row records: "sm_90" and the like on a CUDA GPU, "cpu-interpreter"
    where kernels run on the CPU."""
    cap = device_info(device).capability if device.type == "cuda" else None
    return f"sm_{cap[0]}{cap[1]}" if cap else CPU_ARCH


@dataclass(frozen=True)
class RunContext:
    """What every row of one run records: where, with what, and the bandwidth ceiling."""

    device: torch.device
    gpu: str
    torch: str
    triton: str
    commit: str
    timestamp: str
    copy_gbps: float
    # "cuda_events" | "cuda_events_gpu_only" (hide_host), + "_read_flush" / "_demote_flush"
    # with the default timer's flush (cuda_timer) | "interpreter"
    timing: str
    hide_host: bool = False  # see cuda_timer
    flush: str = "demote"  # see cuda_timer and default_flush
    arch: str = ""  # see arch_of

    @property
    def interpreter(self) -> bool:
        return self.timing == "interpreter"


def make_context(
    device: torch.device | None = None,
    *,
    timer: Timer | None = None,
    copy_gbps: float | None = None,
    hide_host: bool = False,
    flush: str | None = None,
) -> RunContext:
    """Describe this run and measure the copy bandwidth once (unless `copy_gbps` is given).

    `hide_host`: time GPU work alone, without host overhead; `flush`: the L2 flush before each
    rep, "read" or "demote" (see `cuda_timer`); None picks `default_flush(device)`.
    """
    if flush not in (None, *FLUSHES):
        raise ValueError(f"make_context: flush must be 'read' or 'demote', got {flush!r}")
    device = device or default_device()
    flush = flush or default_flush(device)
    own_timer = timer is None
    timer = timer or default_timer(device, hide_host=hide_host, flush=flush)
    on_cuda = device.type == "cuda"
    timing = "interpreter"
    if on_cuda:
        timing = "cuda_events_gpu_only" if hide_host else "cuda_events"
        if own_timer:  # the rows say which flush the default timer used
            timing += f"_{flush}_flush"
    if copy_gbps is None:
        copy_gbps = measure_copy_bandwidth(device, timer=timer)
    return RunContext(
        device=device,
        gpu=device_info(device).name,
        torch=torch.__version__,
        triton=triton.__version__,
        commit=git_commit(),
        timestamp=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        copy_gbps=float(copy_gbps),
        timing=timing,
        hide_host=hide_host and on_cuda,
        flush=flush,
        arch=arch_of(device),
    )
