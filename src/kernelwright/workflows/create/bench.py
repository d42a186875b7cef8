"""The benchmark of a generated kernel: the kernel vs the user's reference (eager and compiled).

A generated `bench_<name>.py` holds the profile's data (inputs and how they broadcast, outputs,
the sweep) and calls `run` here, so every generated op is measured by the library's harness:
the same timer (CUDA events, L2 flushed, p20/p50/p80), peak memory, byte model and CSV schema
as the hand-written ops. Providers:
- kernelwright: the generated Triton function;
- torch: the user's reference, loaded from its source and run on the benchmark dtype (what
  they run today);
- torch_compile: the same reference under torch.compile.

Shapes are the kernel's [rows, cols] view: a full-size input is [rows, cols], a per-row one
[rows, 1], a per-feature one [cols] (with the reference's leading singleton dims), a scalar
keeps the reference's shape. A kernel whose row is several dims, or not the last one (a norm
over channels, a loss over every dim), runs at the traced rank instead (`Layout`): the rows go
into the first kept dim, the row's length into the last reduced dim.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from kernelwright.bench.db import new_run_id, record
from kernelwright.bench.harness import BenchRow, make_context, run_spec
from kernelwright.bench.report import geomean as report_geomean
from kernelwright.bench.report import ratio, summarize
from kernelwright.bench.specs import BenchSpec, Provider, Sweep, compiled

# quick runs (the create workflow's default on a GPU): the reference sweep's default token
# count and its largest one, at the profile's column count
QUICK_ROWS = (8192, 32768)
LONG_ROW, LONG_ROW_COUNT = 393216, 1024  # 768 MiB in bf16


@dataclass(frozen=True)
class BenchInput:
    name: str
    broadcast: str  # "full" | "row" | "col" | "scalar"
    example_shape: tuple[int, ...]
    requires_grad: bool
    dtype: str = "same"  # "same" (the benchmark dtype) | "fp32" | "int" (a column index)


@dataclass(frozen=True)
class Layout:
    """The kernel's row in the reference's tensors: the traced shape of the main input, the
    reduced dims (non-negative; the last dim alone for element-wise and last-dim kernels) and
    each output's kind ("full", "row" one value per row, "row1" the same kept as size 1)."""

    traced: tuple[int, ...]
    block: tuple[int, ...]
    out_kinds: tuple[str, ...] = ("full",)
    long_rows: bool = False  # a row kernel that runs rows longer than one program holds
    float_outs: tuple[int, ...] | None = None  # the outputs a backward runs through (not indices)

    @property
    def classic(self) -> bool:
        return self.block == (len(self.traced) - 1,)

    def full(self, rows: int, cols: int) -> tuple[int, ...]:
        if self.classic:
            return (rows, cols)
        shape = list(self.traced)
        kept = [d for d in range(len(shape)) if d not in self.block]
        if kept:  # the rows into the first kept dim
            shape[kept[0]] = max(1, rows // math.prod(shape[d] for d in kept[1:]))
        else:  # every dim is reduced (a loss): one row of rows * cols elements
            cols = rows * cols
        shape[self.block[-1]] = max(1, cols // math.prod(shape[d] for d in self.block[:-1]))
        return tuple(shape)

    def row_len(self, full: Sequence[int]) -> int:
        return full[-1] if self.classic else math.prod(full[d] for d in self.block)


def input_shape(
    spec: BenchInput, rows: int, cols: int, layout: Layout | None = None
) -> tuple[int, ...]:
    ex = spec.example_shape
    if layout is None or layout.classic:
        if spec.broadcast == "full":
            return (rows, cols)
        if spec.broadcast == "row":  # [rows, 1], or [rows] when traced without the row's dim
            dropped = layout is not None and len(ex) == len(layout.traced) - 1
            return (rows,) if dropped else (rows, 1)
        if spec.broadcast == "col":
            return (1,) * max(len(ex) - 1, 0) + (cols,)
        return ex  # scalar: () or all ones
    full = layout.full(rows, cols)
    if spec.broadcast == "full":
        return full
    if spec.broadcast in ("row", "col"):  # 1 on the other dims, at the traced rank
        kept = spec.broadcast == "row"
        size = tuple(1 if (d in layout.block) == kept else s for d, s in enumerate(full))
        return size[len(size) - len(ex) :]
    return ex


def _sweeps(points: Sequence[dict[str, int]]) -> tuple[Sweep, ...]:
    """The profile's [rows, cols] points as harness sweeps: one per fixed column count (rows
    vary) and one per fixed row count for the points left (columns vary)."""
    by_cols: dict[int, list[int]] = {}
    for p in points:
        by_cols.setdefault(p["cols"], []).append(p["rows"])
    sweeps, rest = [], []
    for cols, rows in by_cols.items():
        if len(rows) > 1:
            sweeps.append(Sweep("rows", tuple(rows), {"cols": cols}))
        else:
            rest.append({"rows": rows[0], "cols": cols})
    by_rows: dict[int, list[int]] = {}
    for p in rest:
        by_rows.setdefault(p["rows"], []).append(p["cols"])
    sweeps += [Sweep("cols", tuple(c), {"rows": r}) for r, c in by_rows.items()]
    return tuple(sweeps)


def _quick(points: Sequence[dict[str, int]], long_rows: bool = False) -> tuple[Sweep, ...]:
    cols = max(set(p["cols"] for p in points), key=lambda c: sum(q["cols"] == c for q in points))
    sweeps = (Sweep("rows", QUICK_ROWS, {"cols": cols}),)
    if long_rows:  # rows of 393,216 columns (a long-context softmax): the looped kernels
        sweeps += (Sweep("cols", (LONG_ROW,), {"rows": LONG_ROW_COUNT}),)
    return sweeps


def make_spec(
    name: str,
    fn: Callable[..., object],
    reference: Callable[..., object] | None,
    inputs: Sequence[BenchInput],
    n_outputs: int,
    points: Sequence[dict[str, int]],
    *,
    reference_error: str = "",
    layout: Layout | None = None,
) -> BenchSpec:
    """A harness spec for the generated `fn` against `reference` (the user's code)."""
    names = tuple(i.name for i in inputs)
    kinds = layout.out_kinds if layout is not None else ("full",) * n_outputs

    def make_inputs(shape, dtype, device, *, seed: int = 0):
        gen = torch.Generator(device=device).manual_seed(seed)
        out = {}
        full = layout.full(shape["rows"], shape["cols"]) if layout else None
        for i in inputs:
            dt = torch.float32 if i.dtype == "fp32" else dtype
            s = input_shape(i, shape["rows"], shape["cols"], layout)
            if i.dtype == "int":  # a column of the row
                n = layout.row_len(full) if layout else shape["cols"]
                out[i.name] = torch.randint(0, n, s, device=device, generator=gen)
                continue
            out[i.name] = torch.randn(s, dtype=dt, device=device, generator=gen)
        return out

    def nbytes(shape, dtype, mode: str) -> int:
        # minimal traffic: the forward reads every input once and writes every output once;
        # the backward reads the inputs (recomputing intermediates), reads dy per output and
        # writes one gradient per differentiable input. full = both.
        rows, cols = shape["rows"], shape["cols"]
        size = torch.empty((), dtype=dtype).element_size()
        ins = [math.prod(input_shape(i, rows, cols, layout)) * (8 if i.dtype == "int" else size)
               for i in inputs]  # fmt: skip
        full = math.prod(layout.full(rows, cols)) if layout else rows * cols
        per_row = full // (layout.row_len(layout.full(rows, cols)) if layout else cols)
        out = sum((full if k == "full" else per_row) * size for k in kinds)
        fwd = sum(ins) + out
        bwd = sum(ins) + out + sum(b for b, i in zip(ins, inputs, strict=True) if i.requires_grad)
        return {"forward": fwd, "backward": bwd, "full": fwd + bwd}[mode]

    def call(f: Callable[..., object]):
        def build(inp):
            a = tuple(inp[n] for n in names)
            return lambda: f(*a)

        return build

    def missing(inp):
        raise RuntimeError(f"the reference could not be loaded: {reference_error}")

    providers = [Provider("kernelwright", call(fn))]
    if reference is not None:
        providers += [
            Provider("torch", call(reference)),
            Provider("torch_compile", call(compiled(reference)), compiled=True),
        ]
    else:
        providers += [Provider("torch", missing), Provider("torch_compile", missing)]
    tiny = (Sweep("rows", (4, 9), {"cols": 96}),)
    return BenchSpec(
        op=name,
        dims=("rows", "cols"),
        providers=tuple(providers),
        make_inputs=make_inputs,
        grad_inputs=tuple(i.name for i in inputs if i.requires_grad),
        bytes=nbytes,
        sweeps=_sweeps(points),
        quick_sweeps=_quick(points, layout is not None and layout.long_rows),
        interpreter_sweeps=tiny,
        backward_through=(
            layout.float_outs
            if layout and layout.float_outs is not None
            else tuple(range(n_outputs))
        ),  # fmt: skip
        notes={
            "torch": "the reference from the profile's source, eager, in the benchmark dtype",
            "torch_compile": "the same reference under torch.compile (static shapes)",
        },
    )


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
