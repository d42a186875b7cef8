"""`kernelwright registry`: each op's implementations and their capabilities, the one a call
site gets and why (compile/select.py), and `bench` to measure the implementations into the
results database. Registered on the main app in cli.py."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

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
    shape: Annotated[str, typer.Option(help="The main input's shape, e.g. 8192x4096.")],
    dtype: Annotated[str, typer.Option(help="bf16, fp16 or fp32.")] = "bf16",
    device: Annotated[
        str | None,
        typer.Option(help="cuda or cpu-interpreter (default: cuda when a GPU is present)."),
    ] = None,
    arch: Annotated[
        str | None, typer.Option(help="The GPU's arch, e.g. sm_90 (default: this GPU's).")
    ] = None,
    db: DbOption = None,
) -> None:
    """The implementation a call site of OP gets, and why."""
    from kernelwright.bench.db import ResultsDBError
    from kernelwright.compile.select import NoCapableImpl, choose

    _entry(op)
    try:
        dims = tuple(int(s) for s in shape.lower().split("x"))
    except ValueError:
        raise typer.BadParameter(
            f"{shape!r}; write it as 8192x4096", param_hint="--shape"
        ) from None
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu-interpreter"
    try:
        c = choose(op, dtype=dtype, shape=dims, device=device, arch=arch, db=db)
    except (ResultsDBError, NoCapableImpl) as e:
        raise _fail(str(e)) from None
    console = _console()
    console.print(f"{op} {shape} {dtype} on {device}: [bold]{c.impl}[/]", highlight=False)
    console.print(f"  bucket: {c.bucket}", highlight=False)
    console.print(f"  why: {c.reason}", highlight=False, markup=False)
    for name, why in c.rejected:
        console.print(f"  not {name}: {why}", highlight=False, markup=False)


@registry_app.command("bench")
def registry_bench(
    op: Annotated[str, typer.Argument(help="The op.")],
    mode: Annotated[
        str, typer.Option(help="forward, backward, full, or all (selection reads full first).")
    ] = "full",
    dtype: Annotated[str, typer.Option(help="bf16, fp16 or fp32.")] = "bf16",
    out: Annotated[Path, typer.Option(help="The bench's output folder.")] = Path(
        "kernelwright-runs/bench"
    ),
    db: DbOption = None,
) -> None:
    """`kernelwright bench OP --quick` for the providers that time OP's implementations, rows
    appended to the results database (what `registry choose` reads)."""
    from kernelwright.bench.specs import get_spec, importable
    from kernelwright.cli_bench import bench

    entry = _entry(op)
    if entry.bench is None:
        raise _fail(f"{op} has no benchmark spec: nothing measures its implementations")
    spec = get_spec(entry.bench)
    providers = _bench_providers(entry, spec.provider_names, importable)
    console = _console()
    if not providers:
        raise _fail(f"{op}: no provider of its benchmark times an implementation on this machine")
    console.print(f"registry bench {op}: providers {', '.join(providers)}", highlight=False)
    bench(
        op=spec.op,
        mode=mode,
        providers=",".join(providers),
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
