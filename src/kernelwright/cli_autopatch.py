"""`kernelwright autopatch`: a Hugging Face model type (or config, or modeling file) into a
reviewed ModelProfile, or with --sweep every model type transformers registers. Registered on
the main app in cli.py."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from kernelwright.cli_options import Force
from kernelwright.console import make_console
from kernelwright.testing.model_configs import ARCHITECTURES

EPILOG = (
    "Tested model types (each trained patched against unpatched by the convergence suite): "
    f"{', '.join(ARCHITECTURES)}. Others are analysed the same way; what is not proven is "
    "left unpatched."
)


def autopatch(
    model: Annotated[
        str | None,
        typer.Argument(
            help="A model type ('llama', 'qwen3', 'qwen2_vl'), a directory holding config.json, "
            "a config.json, or a modeling_*.py file. No weights are downloaded."
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            help="Profile YAML, or a directory to hold profile.yaml (default "
            "kernelwright-runs/autopatch/<type>/profile.yaml); "
            "with --sweep, the results directory (default kernelwright-runs/autopatch/sweep)."
        ),
    ] = None,
    check: Annotated[
        bool,
        typer.Option(
            help="Confirm each patch decision numerically on a tiny CPU instance: each module "
            "against its replacement, then the whole model patched against unpatched."
        ),
    ] = True,
    emit: Annotated[
        Path | None,
        typer.Option(
            help="Also write a convergence test for the profile: a .py file, or a directory. "
            "A file kernelwright did not emit is kept without --force (exit 2)."
        ),
    ] = None,
    force: Force = False,
    sweep: Annotated[
        bool,
        typer.Option(
            "--sweep",
            help="Instead of MODEL: every causal-LM and image-text-to-text model type "
            "transformers registers, each built tiny, analysed, patched and compared with "
            "itself unpatched (loss, every gradient, top-k log-probs; train() and eval(); "
            "images where the model takes them). Writes a CSV and a markdown table per mapping.",
        ),
    ] = False,
    mapping: Annotated[
        str,
        typer.Option(
            help="--sweep: 'causal-lm' (cpu_fp32.*), 'image-text-to-text' (cpu_fp32_vlm.*) "
            "or 'all'."
        ),
    ] = "all",
    only: Annotated[
        str | None, typer.Option(help="--sweep: these model types only (comma-separated).")
    ] = None,
    timeout: Annotated[
        float, typer.Option(help="--sweep: seconds one model type may take.")
    ] = 300.0,
    jobs: Annotated[
        int, typer.Option(help="--sweep: worker processes (0: in this process, no timeout).")
    ] = 2,
    profiles: Annotated[
        bool, typer.Option(help="--sweep: also write each type's profile to OUT/profiles/.")
    ] = True,
    device: Annotated[
        str,
        typer.Option(
            help="--sweep: 'cpu' (the Triton interpreter; tables cpu_<dtype>.*) or 'cuda' "
            "(a GPU; gpu_<dtype>.*, worker i on GPU i % n)."
        ),
    ] = "cpu",
    dtype: Annotated[
        str,
        typer.Option(
            help="--sweep: fp32 (float32) or bf16 (bfloat16), any case: patched and unpatched "
            "model both in it, compared within that dtype's parity tolerances."
        ),
    ] = "fp32",
) -> None:
    """Analyse MODEL into a reviewed ModelProfile: every decision, its status and evidence.

    A profile.yaml you edited is never overwritten without --force. With --sweep: every
    causal-LM model type, patched with parity, left alone (with the reason) or not buildable.
    """
    from rich.markup import escape

    from kernelwright.profiles.reviewed import save_profile
    from kernelwright.workflows.autopatch import options

    swept = {k: v for k, v in locals().items() if k in options.SWEEP_DEFAULTS}  # as given
    bad = options.problem(sweep, out, emit, check, force, swept)
    if bad is not None:
        raise typer.BadParameter(bad[1], param_hint=bad[0])
    if sweep:
        if model is not None:
            raise typer.BadParameter("give MODEL or --sweep, not both", param_hint="MODEL")
        from kernelwright.cli_sweep import sweep as run_sweep

        run_sweep(only, out, timeout, jobs, profiles, mapping, device, dtype)
        return
    if model is None:
        raise typer.BadParameter("missing MODEL (or --sweep)", param_hint="MODEL")
    from kernelwright.workflows.autopatch import analyze
    from kernelwright.workflows.autopatch.summary import rows

    console = make_console()
    how = "; each decision is checked numerically on it" if check else ""
    console.print(f"autopatch {escape(model)}: a tiny instance built and analysed{how} ...")
    try:
        profile = analyze(model, check=check)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="MODEL") from None
    saved = save_profile(profile, options.profile_path(out, profile.model_type), force=force)

    table = Table(title=f"autopatch {profile.architecture} ({profile.modeling_file})")
    for col in ("what", "status", "value", "evidence"):
        table.add_column(col, overflow="fold")
    colour = {"patch": "green", "unsupported": "yellow", "absent": "dim"}
    for r in rows(profile):
        value = escape(r.value)
        if r.status == "unsupported":  # the reason under the value, in the status colour
            value = "\n".join(v for v in (value, f"[yellow]{escape(r.reason)}[/]") if v)
        table.add_row(escape(r.what), f"[{colour[r.status]}]{r.status}[/]", value, str(r.evidence))
    console.print(table)
    for note in profile.notes:
        console.print(f"note: {escape(note)}")
    if not check:
        console.print("[yellow]--no-check: no decision was confirmed numerically.[/]")
    if saved.kept is not None:
        console.print(saved.message, style="yellow", markup=False)
        raise typer.Exit(2)
    console.print(
        f"Profile: {saved.path}  (review it; to skip a decision set its `status: unsupported` "
        "and fill in `reason:` with one sentence why)",
        markup=False,
    )
    if emit is not None:
        from kernelwright.workflows.autopatch.emit import emit_convergence_test

        try:
            written = emit_convergence_test(profile, emit, force=force)
        except (ValueError, FileExistsError) as e:  # exit 2: kept, as an edited profile is
            console.print(f"No convergence test written: {e}", style="yellow", markup=False)
            raise typer.Exit(2 if isinstance(e, FileExistsError) else 1) from None
        console.print(f"Convergence test: {written or emit}")
