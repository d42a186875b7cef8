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
