"""`kernelwright skills`: the workflows as skills for coding agents (kernelwright.skills), listed
and copied where an agent loads them. Registered on the main app in cli.py."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

skills_app = typer.Typer(
    help="The workflows as skills a coding agent loads (one SKILL.md each): list them, or "
    "install them into a project (default .claude/skills).",
    no_args_is_help=True,
)

DEFAULT_TARGET = Path(".claude") / "skills"


def _console():
    from kernelwright.console import make_console

    return make_console()


def _fail(message: str) -> typer.Exit:
    from rich.markup import escape

    _console().print(f"[red]error:[/] {escape(message)}", soft_wrap=True)  # paths stay whole
    return typer.Exit(1)


@skills_app.command("list")
def skills_list() -> None:
    """Every skill shipped with kernelwright: its name and when an agent should use it."""
    from rich.markup import escape
    from rich.table import Table

    from kernelwright import skills

    table = Table("skill", "description", show_lines=True)
    for name in skills.names():
        table.add_row(name, escape(skills.load(name).description))
    console = _console()
    console.print(table)
    console.print(f"Install them with: kernelwright skills install (default {DEFAULT_TARGET}/)")


@skills_app.command("install")
def skills_install(
    names: Annotated[
        list[str] | None, typer.Argument(help="Only these skills (default: every one).")
    ] = None,
    target: Annotated[
        Path,
        typer.Option(help="The folder the skills go into, one sub-folder each."),
    ] = DEFAULT_TARGET,
    force: Annotated[
        bool,
        typer.Option("--force", help="Overwrite installed files that differ from this version."),
    ] = False,
) -> None:
    """Copy the skills into TARGET/<name>/, where a coding agent loads them.

    A file already there that differs (edited, or from another kernelwright version) is never
    overwritten without --force: the command then writes nothing and exits with status 1.
    """
    from rich.markup import escape

    from kernelwright import skills

    available = skills.names()
    chosen = list(dict.fromkeys(names)) if names else available
    unknown = [n for n in chosen if n not in available]
    if unknown:
        raise typer.BadParameter(
            f"no skill {', '.join(unknown)}; the skills are: {', '.join(available)}",
            param_hint="NAMES",
        )

    # plan every file first, so a refusal leaves the target exactly as it was
    plan: list[tuple[str, list[tuple[Path, bytes]]]] = []
    state: dict[str, str] = {}
    differing: list[Path] = []
    for name in chosen:
        files = [(target / name / rel, data) for rel, data in skills.skill_files(name)]
        plan.append((name, files))
        existing = [(dest, data) for dest, data in files if dest.exists()]
        for dest, _ in existing:
            if not dest.is_file():
                raise _fail(f"{dest} is in the way: it is not a file; remove it first")
        changed = [dest for dest, data in existing if dest.read_bytes() != data]
        differing += changed
        if not existing:
            state[name] = "installed"
        elif changed or len(existing) < len(files):
            state[name] = "updated"
        else:
            state[name] = "unchanged"
    if differing and not force:
        listed = "\n".join(f"  {p}" for p in differing)
        raise _fail(
            f"{len(differing)} installed file(s) differ from this kernelwright's skills:\n"
            f"{listed}\nnothing was written; re-run with --force to overwrite them"
        )

    console = _console()
    try:
        for name, files in plan:
            for dest, data in files:
                dest.parent.mkdir(parents=True, exist_ok=True)
                if not dest.is_file() or dest.read_bytes() != data:
                    dest.write_bytes(data)
            where = escape(str(target / name))
            console.print(f"{name}: {state[name]} in {where}", highlight=False, soft_wrap=True)
    except OSError as e:
        raise _fail(f"installing into {target}: {e}") from None
    console.print(
        f"{len(plan)} skill(s) in {escape(str(target.resolve()))}", highlight=False, soft_wrap=True
    )
