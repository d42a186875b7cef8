"""Options shared by several commands (a module of its own: cli.py imports the command modules,
so they cannot import from it)."""

from __future__ import annotations

from typing import Annotated

import typer

# every command that writes a profile.yaml: a reviewer's edits to it are never lost
Force = Annotated[
    bool,
    typer.Option(
        "--force",
        help="Overwrite an edited profile.yaml. Without it an edited profile is kept: this "
        "run's goes beside it as profile.new.yaml and the command stops (exit 2).",
    ),
]

# a command that also writes its outputs into a workspace folder (--out, or its default)
ForceWorkspace = Annotated[
    bool,
    typer.Option(
        "--force",
        help="Overwrite an edited profile.yaml, and run in a workspace holding files this "
        "command did not write (files named as its outputs are replaced). Without it an edited "
        "profile is kept (this run's goes beside it as profile.new.yaml) and such a workspace "
        "is refused; both stop the command (exit 2).",
    ),
]


def writable_results_db(db=None):
    """The results database a command will append rows to (`ResultsDB.writable`: --db, else
    $KERNELWRIGHT_RESULTS_DB, else the default), checked before any work: a file that is not
    one ends the command with one line (exit 2) and is left as it is."""
    from rich.markup import escape

    from kernelwright.bench.db import ResultsDB, ResultsDBError
    from kernelwright.console import make_console

    try:
        return ResultsDB.writable(db)
    except ResultsDBError as e:
        make_console().print(f"[red]error:[/] {escape(str(e))}", soft_wrap=True)
        raise typer.Exit(2) from None
