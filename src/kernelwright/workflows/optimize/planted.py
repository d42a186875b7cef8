"""The planted-regression check: de-tune an op's table entry for this GPU, let the optimize
workflow run autonomously, and measure how much of the tuned speed it recovers per shape.

Tuned and recovered times are measured back to back with the same timer at the end (not taken
from the loop's notebooks), so both sides see the same clocks and the same warm caches. The
library table file is never written (the run has `write_library=False`).
"""

from __future__ import annotations

import csv
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from kernelwright.bench.harness import Timer, make_context
from kernelwright.bench.specs import get_spec
from kernelwright.runtime import default_device, device_info
from kernelwright.workflows.optimize.clock import FakeClock
from kernelwright.workflows.optimize.measure import Bench, points_of
from kernelwright.workflows.optimize.run import optimize, plant_regression, restore_table
from kernelwright.workflows.optimize.setup import DTYPES, OptimizeOptions, Progress
from kernelwright.workflows.optimize.tables import get_table, installed

RECOVERY_GOAL_PCT = 95.0


@dataclass
class Recovery:
    op: str
    shape: str
    mode: str
    tuned_ms: float
    planted_ms: float
    recovered_ms: float
    recovered_pct: float  # tuned / recovered time, in %: 100 = as fast as the tuned table
    variants: int
    stop: str
    gpu: str
    timing: str  # "cuda_events" or "placeholder"


def _quiet(_: str) -> None:
    return None


def run_planted(
    op: str,
    shapes: list[dict[str, int]],
    workspace: Path,
    *,
    timer: Timer | None = None,
    dry_run: bool = False,
    execute: bool = True,
    arch: str | None = None,
    max_variants: int = 8,
    deadline_s: float | None = None,
    dtype: str = "bfloat16",
    plant: str = "detuned",
    progress: Progress = _quiet,
) -> list[Recovery]:
    """Plant, optimize (autonomous, no library writes), measure; returns one row per point."""
    spec = get_spec(op)
    table = get_table(op)
    device = default_device()
    arch = arch or ("hopper" if dry_run else device_info(device).arch)
    installs = sorted({arch, device_info(device).arch})
    torch_dtype = DTYPES[dtype]
    clock = FakeClock(table, arch, itemsize=torch_dtype.itemsize) if dry_run else None
    timer = timer if dry_run or timer is not None else short_timer()
    ctx = make_context(
        device,
        timer=clock or timer,
        copy_gbps=clock.gpu.gbps if clock is not None else None,
        hide_host=not dry_run,
    )
    bench = Bench(
        spec,
        ctx=ctx,
        timer=clock or timer,
        dtype=torch_dtype,
        clock=clock,
        execute=execute,
    )
    points = points_of(spec, shapes)
    modes = ["forward", "backward"]

    def timed(label: str) -> dict[tuple[str, str], float]:
        rows = bench.run(
            points,
            modes,
            on_row=lambda r: progress(f"  {label} {r.shape} {r.mode}: {r.ms_p50:.4f} ms"),
        )
        return {(r.shape, r.mode): r.ms_p50 for r in rows}

    progress(f"[planted] tuned '{arch}' table")
    tuned_rows = plant_regression(op, arch, plant)
    try:
        with installed(table, tuned_rows, installs):
            tuned = timed("tuned")
        # the plant covers the device's key too in a dry run, so the interpreter runs it
        with installed(table, {k: table[k][arch] for k in table}, installs):
            planted = timed("planted")
            progress("[planted] optimize, autonomous (--yes), no library writes")
            result = optimize(
                OptimizeOptions(
                    op,
                    yes=True,
                    force=True,  # its own workspace, re-made each run
                    dry_run=dry_run,
                    gpu=arch if dry_run else "auto",
                    workspace=workspace,
                    write_library=False,
                    planted_regression=True,
                    shapes=shapes,
                    timer=timer,
                    deadline_s=deadline_s,
                    ncu=False,
                    execute=execute,
                    max_variants=max_variants,
                    dtype=dtype,
                ),
                progress=progress,
            )
        final_rows = result.final.rows
        with installed(table, final_rows, installs):
            recovered = timed("recovered")
        # the tuned side again, right after: both sides of the ratio under the same conditions
        with installed(table, tuned_rows, installs):
            tuned_again = timed("tuned")
    finally:
        restore_table(op, arch)
    out = []
    for key, ms in recovered.items():
        t = min(tuned[key], tuned_again[key])
        out.append(
            Recovery(
                op=op,
                shape=key[0],
                mode=key[1],
                tuned_ms=t,
                planted_ms=planted[key],
                recovered_ms=ms,
                recovered_pct=100.0 * t / ms if ms > 0 else math.nan,
                variants=len(result.records),
                stop=result.stop_reason,
                gpu=ctx.gpu,
                timing="placeholder" if dry_run else ctx.timing,
            )
        )
    return out


def short_timer() -> Timer:
    """CUDA events with short budgets and GPU time alone: a whole planted run fits one device
    call of a few minutes, and small shapes are not timed as launch overhead."""
    from kernelwright.bench.harness import cuda_timer

    return cuda_timer(warmup_ms=5, rep_ms=25, hide_host=True)


def write_recovery_csv(rows: list[Recovery], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(asdict(rows[0])))
        w.writeheader()
        w.writerows(asdict(r) for r in rows)
    return path
