"""`kernelwright registry`: each op's implementations and their capabilities, the one a call
site gets and why (compile/select.py), and `bench` to measure the implementations into the
results database. Registered on the main app in cli.py."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from kernelwright.cli_bench import DTYPE_HELP, Workers, dtype_option, workers_option

registry_app = typer.Typer(
    help="The ops' implementations (kernelwright, created, liger, inductor) and their "
    "capabilities; which one a call site gets and why; bench them into the results database.",
    no_args_is_help=True,
)

DbOption = Annotated[
    Path | None,
    typer.Option(
        help="The results database (default: $KERNELWRIGHT_RESULTS_DB, else "
        "kernelwright-runs/results.db).",
        show_default=False,
    ),
]


def _console():
    from kernelwright.console import make_console

    return make_console()


def _fail(message: str) -> typer.Exit:
    from rich.markup import escape

    _console().print(f"[red]error:[/] {escape(message)}")
    return typer.Exit(1)


def site_shape(text: str) -> tuple[int, ...]:
    """A call site's main-input shape as --shape takes it: positive sizes joined by x
    (8192x4096, 4x2048x4096: the last dim is the row length, the ones before it count the
    rows); anything else is a usage error naming that form."""
    parts = text.strip().lower().split("x")
    if all(re.fullmatch(r"[0-9]+", p.strip()) and int(p) > 0 for p in parts):
        return tuple(int(p) for p in parts)
    raise typer.BadParameter(
        f"{text!r}: write it as positive sizes joined by x, the main input's shape, e.g. "
        "8192x4096 or 4x2048x4096 (the last is the row length)",
        param_hint="--shape",
    )


def _entry(op: str):
    from kernelwright import registry

    try:
        return registry.get(op)
    except registry.UnknownOpError as e:
        raise typer.BadParameter(str(e), param_hint="OP") from None


@registry_app.command("list")
def registry_list(
    op: Annotated[str | None, typer.Argument(help="Only this op.")] = None,
) -> None:
    """Every op, its implementations (in tie-breaking order) and what each can run."""
    from rich.table import Table

    from kernelwright import registry

    entries = [_entry(op)] if op else registry.entries()
    table = Table("op", "implementation", "function", "capability", "timed by")
    for e in entries:
        for i, impl in enumerate(e.impls):
            table.add_row(
                e.name if i == 0 else "",
                impl.name,
                impl.function or "(the original graph, left to Inductor)",
                impl.capability.describe(),
                impl.provider,
            )
    _console().print(table)


@registry_app.command("choose")
def registry_choose(
    op: Annotated[str, typer.Argument(help="The op.")],
    shape: Annotated[
        str,
        typer.Option(
            help="The main input's shape: positive sizes joined by x, e.g. 8192x4096 or "
            "4x2048x4096 (the last is the row length, the ones before it count the rows)."
        ),
    ],
    dtype: Annotated[str, typer.Option(help=DTYPE_HELP)] = "bf16",
    device: Annotated[
        str | None,
        typer.Option(help="cuda or cpu-interpreter (default: cuda when a GPU is present)."),
    ] = None,
    arch: Annotated[
        str | None, typer.Option(help="The GPU's arch, e.g. sm_90 (default: this GPU's).")
    ] = None,
    db: DbOption = None,
    for_pass: Annotated[
        bool,
        typer.Option(
            "--pass",
            help="Choose as kernelwright.compile's graph pass does: among what it can insert "
            "(the op's own kernel or Inductor; not Liger).",
        ),
    ] = False,
) -> None:
    """The implementation a call site of OP gets, and why."""
    from kernelwright.bench.db import ResultsDBError
    from kernelwright.compile.select import INSERTABLE, NoCapableImpl, choose

    _entry(op)
    dtype = dtype_option(dtype)
    dims = site_shape(shape)
    shape = "x".join(map(str, dims))
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu-interpreter"
    if device not in ("cuda", "cpu", "cpu-interpreter"):
        raise typer.BadParameter(f"{device!r}: cuda or cpu-interpreter", param_hint="--device")
    try:
        among = INSERTABLE if for_pass else None
        c = choose(op, dtype=dtype, shape=dims, device=device, arch=arch, db=db, among=among)
    except (ResultsDBError, NoCapableImpl) as e:
        raise _fail(str(e)) from None
    console = _console()
    console.print(f"{op} {shape} {dtype} on {device}: [bold]{c.impl}[/]", highlight=False)
    rows = math.prod(dims[:-1])  # how the shape was read: every dim before the last counts rows
    read = f"{rows} row{'s' * (rows != 1)} of {dims[-1]}"
    console.print(f"  bucket: {c.bucket} ({read})", highlight=False)
    console.print(f"  why: {c.reason}", highlight=False, markup=False)
    for name, why in c.rejected:
        console.print(f"  not {name}: {why}", highlight=False, markup=False)


@registry_app.command("bench")
def registry_bench(
    op: Annotated[
        str,
        typer.Argument(help="The op, several (comma-separated), or 'all' (every benchmarked op)."),
    ],
    mode: Annotated[
        str, typer.Option(help="forward, backward, full, or all (selection reads full first).")
    ] = "full",
    dtype: Annotated[str, typer.Option(help=DTYPE_HELP)] = "bf16",
    out: Annotated[Path, typer.Option(help="The bench's output folder.")] = Path(
        "kernelwright-runs/bench"
    ),
    db: DbOption = None,
    workers: Workers = "1",
    shape: Annotated[
        list[str] | None,
        typer.Option(
            help="A call site's main-input shape to measure, as `registry choose` takes it "
            "(8192x4096; repeat the option or give a comma-separated list): the bench runs at "
            "a shape of the op's spec in that site's bucket instead of the spec's sweeps.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """`kernelwright bench OP --quick` for the providers that time OP's implementations, rows
    appended to the results database (what `registry choose` reads). Several ops with
    --workers: one op per GPU at a time, every provider of an op on the same GPU. With
    --shape, one op at the shapes of the call sites named (what a default choice's reason
    prints)."""
    from kernelwright.bench.specs import get_spec, importable
    from kernelwright.cli_bench import bench

    n = workers_option(workers)
    console = _console()
    jobs = _bench_jobs(op, mode, dtype, importable)
    if shape:
        jobs = [_at_sites(jobs, shape)]
    if len(jobs) > 1 or n != 1 or shape:
        _bench_fanout(jobs, out, db, n)
    else:
        spec, providers = get_spec(jobs[0].spec), ", ".join(jobs[0].providers)
        console.print(f"registry bench {jobs[0].op}: providers {providers}", highlight=False)
        bench(
            op=spec.op,
            mode=mode,
            providers=",".join(jobs[0].providers),
            dtype=dtype,
            out=out,
            quick=True,
            db=db,
        )
    import torch

    if not torch.cuda.is_available():
        console.print(
            "[yellow]No GPU: the rows are interpreter timings, which are not speeds; "
            "`registry choose` does not read them.[/]"
        )


@dataclass(frozen=True)
class BenchJob:
    """One op's quick bench over the providers that time its implementations."""

    op: str  # the registry entry
    spec: str
    providers: tuple[str, ...]
    mode: str
    dtype: str
    # the call sites' bench shapes (named dims, as pairs); () runs the spec's quick sweeps
    shapes: tuple[tuple[tuple[str, int], ...], ...] = ()


def _at_sites(jobs: list[BenchJob], shapes: list[str]) -> BenchJob:
    """The one op's job at the bench shapes of the call sites `shapes` ("8192x4096", ...)."""
    import dataclasses

    import torch

    from kernelwright.compile.fill import SiteShapeError, bench_dims
    from kernelwright.runtime import interpreter_mode

    if len(jobs) != 1:
        raise typer.BadParameter("a call site's shape is one op's: give one op", param_hint="OP")
    # an empty --shape is refused as malformed, not read as no shape (the spec's sweeps)
    texts = [t.strip() for value in shapes for t in value.split(",") if t.strip()] or [""]
    interpreter = interpreter_mode() or not torch.cuda.is_available()
    points = []
    for text in texts:
        try:
            dims = bench_dims(jobs[0].op, site_shape(text), interpreter=interpreter)
        except SiteShapeError as e:
            raise _fail(str(e)) from None
        points.append(tuple(dims.items()))
    return dataclasses.replace(jobs[0], shapes=tuple(dict.fromkeys(points)))


def _bench_jobs(op: str, mode: str, dtype: str, importable) -> list[BenchJob]:
    from kernelwright import registry
    from kernelwright.bench.specs import MODES, get_spec
    from kernelwright.registry.entry import SHORT_DTYPE

    if mode != "all" and mode not in MODES:
        raise typer.BadParameter(
            f"{mode!r}; use one of {', '.join(MODES)} or all", param_hint="--mode"
        )
    dtype = SHORT_DTYPE[dtype_option(dtype)]  # BenchJob.dtype: the short name, a key of DTYPES

    everything = op == "all"
    names = [e.name for e in registry.entries()] if everything else op.split(",")
    jobs = []
    for name in (n.strip() for n in names if n.strip()):
        entry = _entry(name)
        if entry.bench is None:
            if everything:
                continue
            raise _fail(f"{name} has no benchmark spec: nothing measures its implementations")
        spec = get_spec(entry.bench)
        providers = _bench_providers(entry, spec.provider_names, importable)
        if not providers:
            if everything:
                continue
            raise _fail(
                f"{name}: no provider of its benchmark times an implementation on this machine"
            )
        jobs.append(BenchJob(entry.name, spec.op, tuple(providers), mode, dtype))
    if not jobs:
        raise _fail(f"{op}: nothing to bench")
    return jobs


def bench_job(job: BenchJob) -> list:
    """Run one `BenchJob` (in a fan-out worker: the rows name its GPU)."""
    import torch

    from kernelwright.bench import MODES, get_spec, make_context, plan
    from kernelwright.bench.harness import run_plan
    from kernelwright.cli_bench import DTYPES

    modes = list(MODES) if job.mode == "all" else [job.mode]
    spec = get_spec(job.spec)
    p = plan(spec, modes=modes, providers=list(job.providers), quick=True)
    if job.shapes:  # the call sites' shapes, each its own point (x: the row length's dim)
        p.points = [(spec.dims[-1], dict(s)[spec.dims[-1]], dict(s)) for s in job.shapes]
    return run_plan(p, dtype=getattr(torch, DTYPES[job.dtype]), ctx=make_context())


def _bench_fanout(jobs: list[BenchJob], out: Path, db: Path | None, workers: int | str) -> None:
    """Each op in a worker (runtime/fanout.py); the rows are written here, by this process:
    CSVs, plots, one run in the results database, the summary."""
    from rich.markup import escape

    from kernelwright.bench import print_summary, summary_markdown, write_csv, write_plots
    from kernelwright.bench.context import git_commit
    from kernelwright.bench.db import new_run_id
    from kernelwright.cli_options import writable_results_db
    from kernelwright.runtime.fanout import run_tasks

    results_db = writable_results_db(db)  # before anything is measured
    console = _console()
    ops = ", ".join(f"{j.op} ({', '.join(j.providers)})" for j in jobs)
    console.print(f"registry bench: {ops}; workers {workers}", highlight=False)
    results = run_tasks(
        bench_job,
        jobs,
        workers=workers,
        labels=[j.op for j in jobs],
        progress=lambda line: console.print(escape(line), highlight=False),
        env={"KERNELWRIGHT_COMMIT": git_commit()},
    )
    run_id = new_run_id()
    all_rows, failed = [], []
    for job, r in zip(jobs, results, strict=True):
        if not r.ok:
            failed.append(job.op)
            console.print(f"[red]{escape(job.op)}: {escape(r.error)}[/]")
            console.print(escape(r.traceback), highlight=False)
            continue
        csv_path = write_csv(r.value, out / f"{job.spec}.csv")
        write_plots(r.value, out)
        results_db.append(r.value, source="bench", run_id=run_id)
        console.print(f"{job.op}: {len(r.value)} rows on {r.gpu} -> {csv_path}", highlight=False)
        all_rows.extend(r.value)
    console.print(f"Results database: {results_db.path} (run {run_id})")
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.md").write_text(summary_markdown(all_rows))
    print_summary(all_rows, console)
    if failed:
        raise _fail(f"failed: {', '.join(failed)}")


def _bench_providers(entry, spec_providers, importable) -> list[str]:
    """The spec's providers that time an implementation of `entry`: Liger's when it imports,
    Inductor's (`torch_compile`) only on a GPU (on the interpreter it would time the CPU)."""
    import torch

    wanted = []
    for impl in entry.impls:
        if impl.provider not in spec_providers or impl.provider in wanted:
            continue
        if impl.name == "liger" and not importable("liger_kernel"):
            continue
        if impl.name == "inductor" and not torch.cuda.is_available():
            continue
        wanted.append(impl.provider)
    return wanted
