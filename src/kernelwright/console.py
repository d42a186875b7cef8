"""The rich console every command prints through."""

from __future__ import annotations

import os

from rich.console import Console


def make_console() -> Console:
    # Off a terminal (the GPU machine's captured output, CI logs) rich falls back to 80
    # columns, which wraps the summary tables; use a wider page unless COLUMNS says otherwise.
    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(width=180)
    return console
