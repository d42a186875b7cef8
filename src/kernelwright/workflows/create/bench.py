"""The benchmark of a generated kernel: the kernel vs the user's reference (eager and compiled).

A generated `bench_<name>.py` holds the profile's data (inputs and how they broadcast, outputs,
the sweep) and calls `run` here, so every generated op is measured by the library's harness:
the same timer (CUDA events, L2 flushed, p20/p50/p80), peak memory, byte model and CSV schema
as the hand-written ops. Providers:
- kernelwright: the generated Triton function;
- torch: the user's reference, loaded from its source and run on the benchmark dtype (what
  they run today);
- torch_compile: the same reference under torch.compile.

The spec itself (shapes from the profile's inputs and layout, the byte model) is built in
`kernelwright.bench.created`, which `kernelwright bench` and `optimize` use for created ops.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from kernelwright.bench.created import (  # noqa: F401  (the spec half, re-exported)
    LONG_ROW,
    LONG_ROW_COUNT,
    QUICK_ROWS,
    BenchInput,
    Layout,
    _quick,
    _sweeps,
    input_shape,
    make_spec,
)
from kernelwright.bench.db import new_run_id, record
from kernelwright.bench.harness import BenchRow, make_context, run_spec
from kernelwright.bench.report import geomean as report_geomean
from kernelwright.bench.report import ratio, summarize


def load_user_reference(source: str) -> tuple[Callable[..., object] | None, str]:
    """(flat callable over inputs then parameters, "") or (None, why it failed)."""
    from kernelwright.workflows.create.load import load_reference

    try:
        ref = load_reference(source)
    except Exception as e:  # reported in the error rows; the kernel is still measured
        return None, f"{type(e).__name__}: {e}"
    if ref.module is not None:
        ref.module.to("cuda" if torch.cuda.is_available() else "cpu")
    return ref.call, ""


def run(
    name: str,
    fn: Callable[..., object],
    inputs: Sequence[BenchInput],
    n_outputs: int,
    points: Sequence[dict[str, int]],
    source: str,
    *,
    quick: bool = True,
    dtype: torch.dtype = torch.bfloat16,
    hide_host: bool = True,
    on_row: Callable[[BenchRow], None] | None = None,
    layout: Layout | None = None,
) -> list[BenchRow]:
    """Measure forward, backward and forward+backward of every provider over the sweep.

    hide_host: GPU time alone, as the library's published figures are (the CPU's time to
    issue a call is still recorded, as host_ms); False times what a Python loop sees.
    """
    if not torch.cuda.is_available():
        raise RuntimeError(
            f"bench_{name}: timings need a CUDA GPU (the interpreter's times mean nothing)"
        )
    reference, error = load_user_reference(source)
    spec = make_spec(name, fn, reference, inputs, n_outputs, points, reference_error=error,
                     layout=layout)  # fmt: skip
    ctx = make_context(hide_host=hide_host)
    rows = run_spec(spec, dtype=dtype, quick=quick, ctx=ctx, on_row=on_row)
    record(rows, source="create", run_id=new_run_id())  # the results database
    return rows


def main(
    name: str,
    fn: Callable[..., object],
    inputs: Sequence[BenchInput],
    n_outputs: int,
    points: Sequence[dict[str, int]],
    source: str,
    argv: Sequence[str] | None = None,
    layout: Layout | None = None,
) -> None:
    """The generated bench file's command line: [--full] [--source S] [--csv PATH]."""
    import argparse

    from kernelwright.bench.report import print_summary, write_csv

    ap = argparse.ArgumentParser(prog=f"bench_{name}")
    ap.add_argument("--full", action="store_true", help="the profile's whole sweep")
    ap.add_argument("--source", default=source, help="the reference (default: the profile's)")
    ap.add_argument("--csv", type=Path, default=Path(f"bench_{name}.csv"))
    ap.add_argument("--with-host", action="store_true", help="time host overhead too")
    args = ap.parse_args(argv)

    def progress(row: BenchRow) -> None:
        ms = "error: " + row.error if row.error else f"{row.ms_p50:.4f} ms"
        print(f"{row.shape} {row.mode:8s} {row.provider:14s} {ms}", flush=True)

    rows = run(name, fn, inputs, n_outputs, points, args.source, quick=not args.full,
               hide_host=not args.with_host, on_row=progress, layout=layout)  # fmt: skip
    write_csv(rows, args.csv)
    print_summary(rows)
    print(f"wrote {args.csv}")


@dataclass(frozen=True)
class Comparison:
    """The generated kernel against the baselines at one shape and mode (ratios: >1 = faster)."""

    shape: str
    mode: str
    kernel_ms: float
    eager_ms: float
    compile_ms: float
    vs_eager: float  # eager time / kernel time
    vs_compile: float  # compile time / kernel time
    kernel_mb: float  # peak memory above the inputs
    eager_mb: float
    compile_mb: float
    pct_copy_bw: float  # the kernel's bytes / time against the measured copy bandwidth


def compare(rows: Sequence[BenchRow]) -> list[Comparison]:
    """One `Comparison` per (shape, mode) of a run, in the order the rows came (the harness
    summary's grouping, read for the create workflow's two baselines)."""
    nan = float("nan")
    out = []
    for s in summarize(rows, peers=("torch", "torch_compile")):
        km, em, cm = (s.ms.get(p, nan) for p in ("kernelwright", "torch", "torch_compile"))
        out.append(
            Comparison(
                s.shape,
                s.mode,
                km,
                em,
                cm,
                ratio(em, km),
                ratio(cm, km),
                *(s.mem_mb.get(p, nan) for p in ("kernelwright", "torch", "torch_compile")),
                s.pct_copy_bw,
            )  # fmt: skip
        )
    return out


def geomean(values: Sequence[float]) -> float:
    """The geometric mean of the valid values (error rows give NaN ratios: left out)."""
    return report_geomean([v for v in values if math.isfinite(v) and v > 0])


def markdown(comparisons: Sequence[Comparison]) -> str:
    """The report's table: times, speed-ups and peak memory per shape and mode."""
    lines = [
        "| shape | mode | kernel ms | eager ms | compile ms | vs eager | vs compile "
        "| % copy BW | peak MB kernel / eager / compile |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in comparisons:
        lines.append(
            f"| {c.shape} | {c.mode} | {c.kernel_ms:.4f} | {c.eager_ms:.4f} | "
            f"{c.compile_ms:.4f} | {c.vs_eager:.2f}x | {c.vs_compile:.2f}x | "
            f"{c.pct_copy_bw:.0f} | {c.kernel_mb:.0f} / {c.eager_mb:.0f} / {c.compile_mb:.0f} |"
        )
    return "\n".join(lines)


def soft_findings(comparisons: Sequence[Comparison], margin: float = 0.9) -> list[str]:
    """Soft gates: where the kernel is slower than eager, or more than 10% slower than
    torch.compile (`margin`), or needs more memory than eager."""
    out = []
    for c in comparisons:
        if c.vs_eager < 1:
            out.append(f"{c.shape} {c.mode}: slower than eager ({c.vs_eager:.2f}x)")
        if c.vs_compile < margin:
            out.append(f"{c.shape} {c.mode}: {c.vs_compile:.2f}x of torch.compile's speed")
        if c.kernel_mb > c.eager_mb * 1.01 + 1:
            out.append(f"{c.shape} {c.mode}: peak memory {c.kernel_mb:.0f} MB > eager's "
                       f"{c.eager_mb:.0f} MB")  # fmt: skip
    return out
