"""`kernelwright bench`: time each provider of an op, write CSVs, plots and a summary, and
append the rows to the results database. Registered on the main app in cli.py."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from kernelwright import registry  # the op list in the help (data only: no kernel imported)
from kernelwright.cli_options import writable_results_db
from kernelwright.console import make_console

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
DTYPE_HELP = "bf16, fp16 or fp32 (or bfloat16, float16, float32)."
_TORCH_NAMES = tuple(DTYPES.values())

# optimize and `registry bench` (and benchmarks/create_corpus.py): runtime/fanout.py
Workers = Annotated[
    str,
    typer.Option(
        help="Measure on this many GPUs at once, one task per GPU (auto: every visible GPU; "
        "with Ray installed and $KERNELWRIGHT_RAY_ADDRESS set, the cluster's). 1: in this "
        "process, one after the other.",
    ),
]


def workers_option(text: str) -> int | str:
    from kernelwright.runtime.fanout import parse_workers

    try:
        return parse_workers(text)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--workers") from None


def dtype_option(text: str, allowed: Sequence[str] = _TORCH_NAMES, hint: str = "--dtype") -> str:
    """A --dtype value, in any of its spellings (registry.parse_dtype), as its torch name
    ("bfloat16"); a usage error naming the spellings otherwise."""
    try:
        return registry.parse_dtype(text, allowed)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint=hint) from None


def _split(text: str | None) -> list[str] | None:
    if text is None:
        return None
    items = [t.strip() for t in text.split(",") if t.strip()]
    return items or None


def bench(
    op: Annotated[
        str,
        typer.Argument(help=f"The op ({', '.join(registry.benchmarked())}), or 'all'."),
    ],
    mode: Annotated[str, typer.Option(help="forward, backward, full, or all (the three).")] = "all",
    sweep: Annotated[
        str | None, typer.Option(help="Run only this sweep (e.g. hidden, tokens).")
    ] = None,
    providers: Annotated[
        str | None,
        typer.Option(help="Comma-separated providers (default: all available on this device)."),
    ] = None,
    dtype: Annotated[str, typer.Option(help=DTYPE_HELP)] = "bf16",
    out: Annotated[
        Path, typer.Option(help="Output folder: <op>.csv, PNG plots, summary.md.")
    ] = Path("kernelwright-runs/bench"),
    quick: Annotated[
        bool,
        typer.Option(
            help="A couple of shapes per op (tiny ones on the CPU interpreter); on a GPU "
            "without the slow providers (jagged_mean's Python loop) unless --providers names them."
        ),
    ] = False,
    append: Annotated[
        bool, typer.Option(help="Append to existing CSVs instead of replacing them.")
    ] = False,
    plots: Annotated[bool, typer.Option(help="Write PNG plots.")] = True,
    hide_host: Annotated[
        bool,
        typer.Option(
            help="Time GPU work alone: a GPU sleep before each rep lets the CPU queue all "
            "kernels first, so Python/launch overhead drops out (as in a training step)."
        ),
    ] = False,
    flush: Annotated[
        str | None,
        typer.Option(
            help="L2 flush before each rep: 'read' (a plain read of a 256 MB buffer) or "
            "'demote' (also clears L2 lines an earlier kernel loaded with evict_last, which a "
            "plain read leaves; docs/benchmarks.md). Default: demote on sm_80 "
            "and later GPUs, read on older ones.",
            show_default=False,
        ),
    ] = None,
    strict: Annotated[
        bool,
        typer.Option(help="Exit with status 1 if a kernelwright provider has an error row."),
    ] = False,
    db: Annotated[
        Path | None,
        typer.Option(
            help="The results database the rows are appended to (default: "
            "$KERNELWRIGHT_RESULTS_DB, else kernelwright-runs/results.db).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Time each provider of OP: CSV, plots, summary.md, and rows in the results database."""
    import torch

    from kernelwright.bench import (
        MODES,
        SPECS,
        make_context,
        plan,
        print_summary,
        summary_markdown,
        write_csv,
        write_plots,
    )
    from kernelwright.bench.specs import get_spec

    console = make_console()
    if op == "all":  # the library's ops, then those `create --into-library` added
        specs = list(SPECS.values()) + [get_spec(e.name) for e in registry.entries() if e.generated]
    else:
        try:
            specs = [get_spec(op)]
        except KeyError as e:
            raise typer.BadParameter(str(e.args[0]), param_hint="OP") from None
    modes = list(MODES) if mode == "all" else [mode]
    if any(m not in MODES for m in modes):
        raise typer.BadParameter(
            f"{mode!r}; use one of {', '.join(MODES)} or all", param_hint="--mode"
        )
    torch_dtype = getattr(torch, dtype_option(dtype))
    provider_names = _split(providers)

    known = {n for spec in specs for n in spec.provider_names}
    unknown = sorted(set(provider_names or ()) - known)
    if unknown:
        raise typer.BadParameter(
            f"unknown provider(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}",
            param_hint="--providers",
        )
    plans = []
    for spec in specs:
        names = None
        if provider_names is not None:
            names = [n for n in provider_names if n in spec.provider_names]
        try:
            plans.append(plan(spec, modes=modes, sweep=sweep, providers=names, quick=quick))
        except KeyError as e:
            raise typer.BadParameter(str(e.args[0]), param_hint="--sweep") from None

    if flush not in (None, "read", "demote"):
        raise typer.BadParameter("flush must be 'read' or 'demote'", param_hint="--flush")
    results_db = writable_results_db(db)  # before anything is measured
    ctx = make_context(hide_host=hide_host, flush=flush)
    console.print(
        f"[bold]kernelwright bench[/] on {ctx.gpu} · torch {ctx.torch} · triton {ctx.triton} · "
        f"commit {ctx.commit} · copy bandwidth {ctx.copy_gbps:,.0f} GB/s"
    )
    if ctx.hide_host:
        console.print("Timing GPU work alone (--hide-host): host overhead is not in the times.")
    if ctx.interpreter:
        console.print(
            "[yellow]No GPU: kernels run in Triton's CPU interpreter on tiny shapes. The times "
            "check that the harness works; they are not speeds.[/]"
        )

    from kernelwright.bench.db import new_run_id

    run_id = new_run_id()
    all_rows = []
    for p in plans:
        measured: list = []  # this plan's rows so far: kept if the run is interrupted
        try:
            rows = _run_with_progress(console, p, measured, dtype=torch_dtype, ctx=ctx)
        except KeyboardInterrupt:
            if measured:
                write_csv(measured, out / f"{p.spec.op}.csv", append=append)
                results_db.append(measured, source="bench", run_id=run_id)
            console.print(
                f"Kept: the {len(all_rows) + len(measured)} rows measured before the interrupt "
                f"(CSVs in {out}, results database run {run_id}); summary.md and the plots of "
                f"{p.spec.op} are not written."
            )
            raise typer.Exit(130) from None
        csv_path = write_csv(rows, out / f"{p.spec.op}.csv", append=append)
        results_db.append(rows, source="bench", run_id=run_id)
        written = write_plots(rows, out) if plots else []
        console.print(f"{p.spec.op}: {len(rows)} rows -> {csv_path}, {len(written)} plot(s)")
        all_rows.extend(rows)
    console.print(f"Results database: {results_db.path} (run {run_id})")

    out.mkdir(parents=True, exist_ok=True)
    md = out / "summary.md"
    kept = _other_ops_rows(out, {p.spec.op for p in plans})
    md.write_text(summary_markdown(kept + all_rows))
    print_summary(all_rows, console)
    also = (
        f" (with {len({r.op for r in kept})} other op(s) whose CSVs are in {out})" if kept else ""
    )
    console.print(f"Markdown summary: {md}{also}")
    failed = [r for r in all_rows if r.provider.startswith("kernelwright") and r.error]
    failed = [r for r in failed if not r.error.startswith("skipped")]
    if strict and failed:
        console.print(f"[red]{len(failed)} kernelwright row(s) failed.[/]")
        raise typer.Exit(1)


def _run_with_progress(console: Console, p, measured: list, **kwargs):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from kernelwright.bench.harness import run_plan

    names = [pr.name for pr in p.providers]
    per_shape = max(1, len(p.providers) * len(p.modes))
    done = [0]
    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as progress:
        task = progress.add_task(f"{p.spec.op} ({', '.join(names)})", total=p.size)

        def on_row(row) -> None:
            measured.append(row)
            done[0] += 1
            progress.advance(task)
            if row.error and not row.error.startswith("skipped"):
                console.print(
                    f"  [yellow]{row.op}/{row.provider}/{row.mode} {row.shape}:[/] {row.error}"
                )
            if not console.is_terminal and done[0] % per_shape == 0:
                # Off a terminal the bar is not drawn: one line per finished shape instead
                # (every provider and mode of it), counted in shapes.
                console.print(
                    f"  {row.op} {row.x_name}={row.x_value} ({row.shape}): "
                    f"shape {done[0] // per_shape}/{len(p.points)} done"
                )

        return run_plan(p, on_row=on_row, **kwargs)


def _other_ops_rows(out: Path, ran: set[str]) -> list:
    """The rows of the other ops' bench CSVs in `out` (earlier runs of other ops into the same
    folder), so that summary.md covers every op there rather than the last run's alone."""
    from kernelwright.bench.report import read_csv

    rows = []
    for f in sorted(out.glob("*.csv")):
        if f.stem in ran:
            continue
        try:
            got = read_csv(f)
        except (ValueError, TypeError, KeyError, OSError):  # not a bench CSV: not ours to show
            continue
        rows += [r for r in got if r.op == f.stem]
    return rows
