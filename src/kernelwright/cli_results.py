"""`kernelwright results`: query the results database (bench/db.py) that every bench,
optimize and create run appends to; import bench CSVs, export, and regenerate the README's
performance tables (bench/db_views.py). Registered on the main app in cli.py."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

results_app = typer.Typer(
    help="Query the results database that bench, and optimize and create where they measure, "
    "append to (filters; a table, --markdown or --csv; --best), import bench CSVs, export, and "
    "regenerate the README's performance tables.",
    no_args_is_help=False,
)


def _console():
    from kernelwright.console import make_console

    return make_console()


DbOption = Annotated[
    Path | None,
    typer.Option(
        help="The database (default: $KERNELWRIGHT_RESULTS_DB, else kernelwright-runs/results.db).",
        show_default=False,
    ),
]


def _fail(message: str) -> typer.Exit:
    """The error on stderr (stdout may be a CSV a program reads: `--csv`, `export --csv -`)."""
    from rich.console import Console
    from rich.markup import escape

    Console(stderr=True, soft_wrap=True).print(f"[red]error:[/] {escape(message)}")
    return typer.Exit(1)


def _results_db(db: Path | None):
    from kernelwright.bench.db import ResultsDB, ResultsDBError

    try:
        return ResultsDB.existing(db)
    except ResultsDBError as e:
        raise _fail(str(e)) from None


def _query(results_db, **filters) -> list[dict]:
    from kernelwright.bench.db import Filters, ResultsDBError

    try:
        return results_db.query(Filters(**filters))
    except ResultsDBError as e:
        raise _fail(str(e)) from None


@results_app.callback(invoke_without_command=True)
def results(
    ctx: typer.Context,
    op: Annotated[str | None, typer.Option(help="Only this op.")] = None,
    provider: Annotated[str | None, typer.Option(help="Only this provider.")] = None,
    gpu: Annotated[
        str | None, typer.Option(help="Part of the GPU's name (h100) or its arch (sm_90).")
    ] = None,
    dtype: Annotated[
        str | None, typer.Option(help="bfloat16, float16 or float32 (or bf16, fp16, fp32).")
    ] = None,
    mode: Annotated[str | None, typer.Option(help="forward, backward or full.")] = None,
    source: Annotated[str | None, typer.Option(help="bench, optimize or create.")] = None,
    run: Annotated[str | None, typer.Option(help="'latest' or a run id (or its prefix).")] = None,
    since: Annotated[
        str | None,
        typer.Option(
            help="A date/time (YYYY-MM-DD[THH:MM], in UTC unless it ends with an offset such "
            "as +02:00) or an age (7d, 12h)."
        ),
    ] = None,
    best: Annotated[
        bool, typer.Option("--best", help="Per (op, shape, mode): the best provider, ratios.")
    ] = False,
    markdown: Annotated[bool, typer.Option("--markdown", help="Markdown, not a table.")] = False,
    csv: Annotated[bool, typer.Option("--csv", help="CSV on stdout, every column.")] = False,
    limit: Annotated[
        int,
        typer.Option(
            min=0, help="Show at most the newest N rows (0: all; --csv: all unless given)."
        ),
    ] = 200,
    db: DbOption = None,
) -> None:
    """List results, newest last (see the subcommands for import, export and readme)."""
    import sys

    from kernelwright.bench import db_views as views
    from kernelwright.bench.db import write_rows_csv

    if ctx.invoked_subcommand is not None:
        return
    if csv and markdown:
        raise typer.BadParameter("one of --csv and --markdown", param_hint="--csv / --markdown")
    results_db = _results_db(db)
    if dtype is not None:
        import contextlib

        from kernelwright.registry import parse_dtype

        # rows hold the torch name ("bfloat16"); another dtype is left for the database's
        # error, which lists those it holds
        with contextlib.suppress(ValueError):
            dtype = parse_dtype(dtype)
    filters = dict(op=op, provider=provider, gpu=gpu, dtype=dtype, mode=mode, source=source)
    rows = _query(results_db, **filters, run=run, since=since)
    if csv and getattr(ctx.get_parameter_source("limit"), "name", "") != "COMMANDLINE":
        limit = 0  # a CSV is for a program: every row, unless --limit is given
    if csv and not best:
        write_rows_csv(rows[-limit:] if limit else rows, sys.stdout)
        return
    if not rows:
        typer.echo(f"No rows in {results_db.path} match these filters.", err=True)
        return
    heads, body = views.best_table(rows) if best else views.listing(rows)
    left_out = max(0, len(body) - limit) if limit else 0
    body = body[left_out:]
    if csv:
        import csv as csv_module

        writer = csv_module.writer(sys.stdout, lineterminator="\n")
        writer.writerows([heads, *body])
    elif markdown:
        typer.echo(views.markdown_table(heads, body))
    else:
        title = f"{'best of ' if best else ''}{len(rows)} result rows · {results_db.path}"
        console = _console()
        console.print(views.rich_table(title, heads, body, width=console.width))
    if left_out:
        typer.echo(f"({left_out} older rows left out: --limit 0 shows all)", err=True)


@results_app.command("import")
def results_import(
    csvs: Annotated[
        list[Path], typer.Argument(help="Bench CSVs or folders of them (searched recursively).")
    ],
    source: Annotated[
        str,
        typer.Option(help="The runs' source: bench, optimize, or create for create's bench CSVs."),
    ] = "bench",
    db: DbOption = None,
) -> None:
    """Load bench CSVs (as `kernelwright bench` writes them) into the database."""
    from rich.markup import escape

    from kernelwright.bench.db import SOURCES, csv_missing_columns, import_csv
    from kernelwright.cli_options import writable_results_db

    if source not in SOURCES:
        raise typer.BadParameter(f"one of {', '.join(SOURCES)}", param_hint="--source")
    results_db = writable_results_db(db)
    console = _console()
    files = [f for p in csvs for f in (sorted(p.rglob("*.csv")) if p.is_dir() else [p])]
    missing = [str(f) for f in files if not f.is_file()]
    if missing or not files:
        named = ", ".join(missing) or " ".join(map(str, csvs))
        console.print(f"[red]error:[/] no CSV file at {named}")
        raise typer.Exit(1)
    # a file named on the command line must be a bench CSV (one found in a folder is skipped)
    for f in (p for p in csvs if p.is_file()):
        if lacking := csv_missing_columns(f):
            console.print(
                f"[red]error:[/] {escape(str(f))} is not a bench CSV (as `kernelwright bench` "
                f"writes them): it has no column {', '.join(lacking)}",
                soft_wrap=True,
            )
            raise typer.Exit(2)
    added = 0
    for f in files:
        try:
            got = import_csv(results_db, f, source=source)
        except ValueError as e:  # a malformed cell: nothing of this file is added
            console.print(f"[red]error:[/] {escape(str(e))}", soft_wrap=True)
            raise typer.Exit(2) from None
        added += got.rows
        note = f" ({got.skipped})" if got.skipped else ""
        console.print(f"{f}: {got.rows} rows in {got.runs} run(s){note}")
    console.print(f"{added} rows added to {results_db.path}")


@results_app.command("export")
def results_export(
    csv: Annotated[Path, typer.Option("--csv", help="The CSV to write ('-': stdout).")],
    op: Annotated[str | None, typer.Option(help="Only this op.")] = None,
    gpu: Annotated[str | None, typer.Option(help="Part of the GPU's name, or its arch.")] = None,
    source: Annotated[str | None, typer.Option(help="bench, optimize or create.")] = None,
    run: Annotated[str | None, typer.Option(help="'latest' or a run id.")] = None,
    db: DbOption = None,
) -> None:
    """Write the database's rows (every column) to a CSV that `results import` reads back."""
    import sys

    from kernelwright.bench.db import write_rows_csv

    rows = _query(_results_db(db), op=op, gpu=gpu, source=source, run=run)
    if str(csv) == "-":
        write_rows_csv(rows, sys.stdout)
        return
    try:
        csv.parent.mkdir(parents=True, exist_ok=True)
        with csv.open("w", newline="") as fh:
            write_rows_csv(rows, fh)
    except OSError as e:  # a folder, a path that cannot be made or written
        raise _fail(f"cannot write {csv}: {e}") from None
    _console().print(f"{len(rows)} rows -> {csv}")


@results_app.command("readme")
def results_readme(
    path: Annotated[Path, typer.Argument(help="The README to update.")] = Path("README.md"),
    mode: Annotated[str, typer.Option(help="Comma-separated modes in the tables.")] = "full",
    all_shapes: Annotated[
        bool, typer.Option(help="Every shape, not the smallest and largest per op.")
    ] = False,
    db: DbOption = None,
) -> None:
    """Regenerate the README's tables between `<!-- results:h100 -->` and
    `<!-- /results:h100 -->` lines (any GPU name) from the database's bench rows."""
    from rich.markup import escape

    from kernelwright.bench.db_views import regenerate_readme

    console = _console()
    results_db = _results_db(db)
    rows = [r for r in _query(results_db) if r["source"] == "bench"]
    if not rows:
        console.print(
            f"[red]error:[/] {escape(str(results_db.path))} has no bench rows yet (the tables "
            "are made of them): run `kernelwright bench OP` on a GPU, or load its CSVs with "
            "`kernelwright results import CSV...`",
            soft_wrap=True,
        )
        raise typer.Exit(1)
    modes = [m.strip() for m in mode.split(",") if m.strip()] or ["full"]
    wrong = [m for m in modes if m not in ("forward", "backward", "full")]
    if wrong:
        raise typer.BadParameter(f"{wrong[0]!r}: forward, backward or full", param_hint="--mode")
    try:
        done = regenerate_readme(path, rows, modes=modes, all_shapes=all_shapes)
    except (ValueError, OSError) as e:  # no markers, not text; missing, a folder, read-only
        console.print(f"[red]error:[/] {escape(str(e))}")
        raise typer.Exit(1) from None
    for key, ok in done.items():
        console.print(f"{key}: " + ("regenerated" if ok else "no bench rows on such a GPU; kept"))
