"""`kernelwright demo`: verify every library kernel against its reference, then benchmark.

On a GPU both run there (benchmarks at real model shapes, all providers); without one, the
kernels run through Triton's interpreter on small shapes and the benchmark table only shows
that the harness works end to end — interpreter timings say nothing about GPU speed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from rich.console import Console
from rich.table import Table

from kernelwright import registry
from kernelwright.runtime import default_device, device_info
from kernelwright.testing import check_op
from kernelwright.testing.cases import maker


@dataclass(frozen=True)
class VerifyCase:
    op: str
    fn: Callable
    ref: Callable
    make: Callable[[tuple[int, ...], torch.dtype, torch.device, int], dict]
    kwargs: dict
    # Shapes in the case's own convention, (GPU shapes, CPU shapes); default: x-like [..., N].
    shapes: tuple[list[tuple[int, ...]], list[tuple[int, ...]]] | None = None
    grad_inputs: tuple[str, ...] | None = None  # default: every float input


def _with_indices(ref: Callable, names: tuple[str, ...]) -> Callable:
    # check_op hands the reference fp32 copies of every input tensor, class targets included
    def call(**inputs):
        return ref(**{k: v.long() if k in names else v for k, v in inputs.items()})

    return call


def cases(entries: tuple[registry.OpEntry, ...] | None = None) -> list[VerifyCase]:
    """The demo's correctness cases, as the registry's entries declare them."""
    out = []
    for entry in registry.entries() if entries is None else entries:
        for case in entry.demo:
            ref = entry.attr(case.reference or entry.reference)
            if case.index_inputs:
                ref = _with_indices(ref, case.index_inputs)
            out.append(
                VerifyCase(
                    case.label,
                    entry.attr(case.function or entry.function),
                    ref,
                    maker(case.inputs),
                    dict(case.kwargs),
                    case.shapes,
                    case.grad_inputs,
                )
            )
    return out


# Tolerances on the relative-norm error, as in the test suite's tables.
_TOL = {torch.float32: (1e-5, 1e-4), torch.float16: (2e-3, 4e-3), torch.bfloat16: (1.4e-2, 1.6e-2)}


def verify(console: Console, device: torch.device) -> bool:
    """Forward and backward of every case against its fp32 reference; prints a table."""
    from kernelwright.testing import Tolerance

    tols = {dt: Tolerance(*t) for dt, t in _TOL.items()}
    gpu = device.type == "cuda"
    shapes = registry.DEFAULT_SHAPES[0 if gpu else 1]
    table = Table(title=f"Correctness against the fp32 reference ({device_info(device).name})")
    for col in ("op", "dtype", "shape", "max output err", "max grad err", "result"):
        table.add_column(col)
    all_ok = True
    for case in cases():
        case_shapes = shapes if case.shapes is None else case.shapes[0 if gpu else 1]
        for dtype in (torch.float32, torch.bfloat16):
            for shape in case_shapes:
                report = check_op(
                    case.fn,
                    case.ref,
                    case.make(shape, dtype, device, 0),
                    kwargs=case.kwargs,
                    grad_inputs=case.grad_inputs,
                    tolerances=tols,
                    dtype=dtype,
                )
                out = max(r.error for r in report.rows if r.kind == "output")
                grad = max((r.error for r in report.rows if r.kind == "grad"), default=0.0)
                all_ok &= report.ok
                table.add_row(
                    case.op,
                    str(dtype).replace("torch.", ""),
                    "x".join(map(str, shape)),
                    f"{out:.2e}",
                    f"{grad:.2e}",
                    "[green]ok" if report.ok else "[red]FAIL",
                )
    console.print(table)
    return all_ok


def run_demo(console: Console | None = None) -> bool:
    from kernelwright.bench.harness import make_context, run_spec
    from kernelwright.bench.report import print_summary
    from kernelwright.bench.specs import SPECS

    console = console or Console()
    device = default_device()
    info = device_info(device)
    where = info.name if info.arch in info.name else f"{info.name} ({info.arch})"
    console.print(f"[bold]kernelwright demo[/] on {where}; torch {torch.__version__}")
    ok = verify(console, device)
    # GPU time alone: at these sizes a Triton call's launch costs as much CPU time as the
    # kernel takes, and timing the CPU would compare launchers, not kernels.
    ctx = make_context(hide_host=True)
    if device.type != "cuda":
        console.print(
            "[yellow]No GPU: the benchmark below runs through the interpreter on tiny shapes; "
            "its times show the harness works, not how fast anything is."
        )
    rows = []
    for spec in SPECS.values():
        rows += run_spec(spec, modes=("forward", "full"), quick=True, ctx=ctx)
    print_summary(rows, console=console)
    if not ok:
        console.print("[red bold]Some kernels do not match their reference (table above).")
    return ok
