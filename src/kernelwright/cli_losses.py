"""`kernelwright losses ...`: the post-training losses workflow (workflows/losses)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kernelwright.cli_options import Force
from kernelwright.console import make_console

console = make_console()

losses_app = typer.Typer(
    # Typer renders help as Rich markup: a literal [ ... ] is escaped or it is dropped as a tag
    help="Post-training losses: `new` turns a loss written on full logits (token log-probs, the "
    "entropy) into one on the fused log-prob primitive (no \\[tokens, vocab] logits), with tests "
    "and a memory benchmark.",
    no_args_is_help=True,
)


@losses_app.command()
def new(
    file: Annotated[
        str | None,
        typer.Argument(
            help="The loss: a .py file (or path.py:function, package.module:function) "
            "with get_inputs(); its logits argument is [..., V]."
        ),  # fmt: skip
    ] = None,
    name: Annotated[str | None, typer.Option(help="Name (default: the function's).")] = None,
    logits: Annotated[str, typer.Option(help="The logits argument's name.")] = "logits",
    from_profile: Annotated[
        Path | None, typer.Option(help="Generate from a reviewed profile.yaml.")
    ] = None,
    out: Annotated[
        Path | None, typer.Option(help="Output folder (default kernelwright-runs/losses/NAME).")
    ] = None,
    yes: Annotated[
        bool, typer.Option("--yes", help="Generate without stopping for review.")
    ] = False,
    force: Force = False,
) -> None:
    """Understand (trace the loss, write profile.yaml, stop for review) → Act (the loss on
    fused_linear_logprobs, tests, a benchmark) → Verify (run the tests).

    A profile.yaml you edited is never overwritten without --force."""
    from kernelwright.profiles.loss import LossProfile
    from kernelwright.profiles.reviewed import save_profile
    from kernelwright.workflows.losses import LossGenError, generate, understand
    from kernelwright.workflows.losses.lossgen import check_profile, verify

    if (file is None) == (from_profile is None):
        console.print("[red]give a loss FILE or --from-profile PATH (one of them)[/red]")
        raise typer.Exit(2)
    if from_profile is not None and not from_profile.is_file():
        console.print(f"profile file {from_profile} does not exist", style="red", markup=False)
        raise typer.Exit(2)
    try:
        if from_profile is not None:
            profile = LossProfile.load(from_profile)
        else:
            profile = understand(file, name=name, logits_arg=logits)
    except (LossGenError, ValueError) as e:
        console.print(str(e), style="red", markup=False)
        raise typer.Exit(2) from e
    folder = out or (from_profile.parent if from_profile else Path("kernelwright-runs/losses")
                     / profile.name)  # fmt: skip
    if from_profile is None:
        saved = save_profile(profile, folder / "profile.yaml", force=force)
        if saved.kept is not None:  # a reviewer's edits stay; this run's profile is beside them
            console.print(saved.message, style="yellow", markup=False)
            console.print(f"resume: kernelwright losses new --from-profile {saved.kept}",
                          markup=False)  # fmt: skip
            raise typer.Exit(2)
        path = saved.path
    else:
        path = from_profile
    _show(profile)
    console.print(f"profile: {path}")
    if profile.stop:
        console.print(f"[red]stopped:[/red] {profile.stop}")
        raise typer.Exit(2)
    if from_profile is None and not yes:
        console.print(f"review it, then: kernelwright losses new --from-profile {path}")
        return
    try:
        if from_profile is not None:
            check_profile(profile, from_profile)
        files = generate(profile, folder)
    except LossGenError as e:
        console.print(str(e), style="red", markup=False)
        raise typer.Exit(2) from e
    for f in files:
        console.print(f"wrote {f}")
    console.print("verify: running the generated tests ...")
    result = verify(folder, profile.name)
    tail = (result.stdout.strip().splitlines() or [""])[-1]
    if result.returncode != 0:
        console.print(result.stdout[-3000:] + result.stderr[-2000:])
        console.print(f"[red]the generated tests failed:[/red] {tail}")
        raise typer.Exit(1)
    console.print(f"[green]verified:[/green] {tail}")


def _show(profile) -> None:
    for i in profile.inputs:
        console.print(f"  {i.name:16s} {i.role:9s} {i.dtype:8s} {i.shape}")
    for s in profile.sites:
        shape = " (keeps the gathered dim)" if s.keepdim else ""
        console.print(f"  log-probs of `{s.target}` at temperature {s.temperature:g} replace "
                      f"`{s.node}`{shape}")  # fmt: skip
    for e in profile.entropies:
        what = ("minus " if e.negated else "") + (
            "the entropy summed over every token" if e.over == "all" else "each token's entropy"
        )
        console.print(f"  {what} at temperature {e.temperature:g} replaces `{e.node}`")
    if profile.reductions:
        console.print(f"  reductions after them: {', '.join(profile.reductions)}")
