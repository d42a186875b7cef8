"""`kernelwright debug`: bisect a numerical divergence of an op from its fp32 reference
(kernelwright.workflows.debug). Registered on the main app in cli.py."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

from kernelwright.cli_options import ForceWorkspace
from kernelwright.console import make_console


def debug(
    target: Annotated[
        str,
        typer.Argument(
            help="A library op (a registry name), an op made by `kernelwright create` (added "
            "to the library, or its name or folder in kernelwright-runs/create/), "
            "package.module:function; or a "
            "Hugging Face model: a model type ('llama', built tiny), a config.json or a "
            "directory holding one. With --compiled: such a model, or package.module:function "
            "returning (model, batch)."
        ),
    ],
    ref: Annotated[
        str | None,
        typer.Option(
            help="The reference of a package.module:function target: a registry op (its cases, "
            "inputs, launch table and tolerances, with TARGET in place of the op) or "
            "package.module:function. Default: <function>_ref beside it."
        ),
    ] = None,
    inputs: Annotated[
        str | None,
        typer.Option(
            help="Inputs maker of a package.module:function target: a maker of "
            "kernelwright.testing.cases (x, x_weight, gate_up, logits_target, ...) or "
            "package.module:maker(shape, dtype, device, seed) -> {name: tensor}."
        ),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of every probe's random inputs.")] = 0,
    name: Annotated[str | None, typer.Option(help="Workspace name (default: from TARGET).")] = None,
    yes: Annotated[
        bool, typer.Option("--yes", help="Plan and bisect without stopping for review.")
    ] = False,
    resume: Annotated[
        bool,
        typer.Option("--resume", help="Bisect from the reviewed profile.yaml in the workspace."),
    ] = False,
    out: Annotated[
        Path | None, typer.Option(help="Workspace (default kernelwright-runs/debug/<name>).")
    ] = None,
    dtype: Annotated[
        str,
        typer.Option(
            help="MODEL: float32 or bfloat16 (fp32, bf16), both models in it. An op is checked "
            "at float32, bfloat16 and float16 alike; for one, --dtype must be one of those."
        ),
    ] = "float32",
    reference_dtype: Annotated[
        str | None,
        typer.Option(
            help="MODEL in bfloat16: the view that decides the verdict (both are reported): "
            "'float32' (fp32, the default) compares with the unpatched model in fp32, each "
            "bound the tolerance plus the unpatched bf16 model's own error there; 'same' with "
            "the unpatched model in bf16, to the bf16 tolerance."
        ),
    ] = None,
    compiled: Annotated[
        bool,
        typer.Option(
            "--compiled",
            help="MODEL through kernelwright.compile against eager; on a divergence, bisect the "
            "replaced sites to the first whose replacement diverges (pattern, kernel, nodes, "
            "module).",
        ),
    ] = False,
    backend: Annotated[
        str | None,
        typer.Option(
            help="--compiled only: the compiler after the rewrite (aot_eager, the default, runs "
            "on a CPU; eager, inductor)."
        ),
    ] = None,
    force: ForceWorkspace = False,
) -> None:
    """Bisect where an op diverges from its fp32 reference: forward or which gradient, dtype,
    shape regime, layout, extreme values, launch config; shrink the failing input; write
    profile.yaml, repro.py and report.md. For a MODEL: the first module whose output (or input
    gradient) leaves the unpatched model's, and the error's growth per module (a plot).

    Exit 0: no divergence (or stopped for review); 1: a divergence was localised; 2: stopped
    (an edited profile kept, a workspace holding files debug did not write, or a target that
    cannot be resolved).
    """
    from rich.markup import escape

    from kernelwright.workflows.debug import DebugOptions, TargetError, debug_op
    from kernelwright.workflows.debug.target import op_like

    console = make_console()
    _check_out(out)
    model_flags = [f for f, v in (("--ref", ref), ("--inputs", inputs), ("--resume", resume)) if v]
    if compiled and model_flags:  # a model has no reference function, inputs maker or plan
        raise typer.BadParameter(f"{model_flags[0]} applies to an op, not to --compiled",
                                 param_hint=model_flags[0])  # fmt: skip
    if compiled:
        _compiled(target, dtype, reference_dtype, backend or "aot_eager", seed, name, out, force)
        return
    if backend is not None:  # nothing is compiled without --compiled: the value would go unused
        raise typer.BadParameter(
            f"{backend!r}: --backend applies with --compiled only (the compiler after the "
            "rewrite); without it nothing is compiled",
            param_hint="--backend",
        )
    if not op_like(target):
        from kernelwright.workflows.debug.model import is_model

        if is_model(target) and model_flags:
            raise typer.BadParameter(f"{model_flags[0]} applies to an op, not to a model",
                                     param_hint=model_flags[0])  # fmt: skip
        if is_model(target):
            _model(target, dtype, reference_dtype, seed, name, out, force)
            return
        if ("/" in target or target.endswith((".json", ".py"))) and not Path(target).exists():
            raise typer.BadParameter(f"{target}: no such file or directory", param_hint="TARGET")
    _check_op_dtype(dtype)
    # an op is compared with its fp32 reference at every dtype: there is no view to choose
    if reference_dtype is not None and op_like(target):
        raise typer.BadParameter("--reference-dtype applies to a model, not to an op",
                                 param_hint="--reference-dtype")  # fmt: skip
    opts = DebugOptions(
        target,
        ref=ref,
        inputs=inputs,
        seed=seed,
        name=name,
        yes=yes,
        resume=resume,
        force=force,
        workspace=out,
    )
    try:
        with _claimed():
            result = debug_op(opts, progress=lambda line: console.print(escape(line)))
    except TargetError as e:
        raise typer.BadParameter(str(e), param_hint="TARGET") from None
    if result.stage == "kept":
        console.print(result.saved.message, style="yellow", markup=False)
        raise typer.Exit(2)
    if result.stage == "review":
        console.print(f"Plan: {result.saved.path}  (review the cases, tolerances and probes)")
        flags = f" --out {out}" if out else ""
        flags += f" --name {name}" if name else ""
        console.print(f"Bisect with:\n  kernelwright debug {target} --resume{flags}")
        return
    profile = result.profile
    console.print(f"Report: {result.report}")
    if profile.divergence is None:
        skipped = sum(p.status == "skipped" for p in profile.probes)
        untried = [p for p in profile.probes if p.status == "not tried"]
        agree = sum(p.status == "pass" for p in profile.probes)
        console.print(
            f"[green]no divergence[/]: {agree} probes agree with the reference ({skipped} "
            f"skipped, {len(untried)} not tried: see the report)"
        )
        return
    d = profile.divergence
    console.print(f"[red]diverged:[/] {escape(d.summary)}")
    console.print(f"smallest failing shape {tuple(d.minimal_shape)}; repro: python {result.repro}")
    raise typer.Exit(1)


def _check_out(out: Path | None) -> None:
    """--out is the workspace folder: a file there, or above it, is a usage error before any
    work (not a traceback once the run is done)."""
    if out is None:
        return
    if out.exists() and not out.is_dir():
        raise typer.BadParameter(f"{out} is a file; --out is the workspace folder",
                                 param_hint="--out")  # fmt: skip
    from kernelwright.profiles.workspace import file_above

    if (above := file_above(out)) is not None:
        raise typer.BadParameter(f"{above} is a file: the workspace {out} cannot be made "
                                 "under it", param_hint="--out")  # fmt: skip


@contextmanager
def _claimed():
    """A workspace holding files debug did not write: one line saying which and what to do,
    exit 2 (the run stops before any work)."""
    from kernelwright.profiles.workspace import WorkspaceError

    try:
        yield
    except WorkspaceError as e:
        make_console().print(str(e), style="red", markup=False, soft_wrap=True)
        raise typer.Exit(2) from None


def _in_workspace(fn, target: str, out: Path | None, label: str, console, **kwargs):
    """`fn` (debug_model or debug_compiled) run in its workspace (--out, else the default one
    named after `label`), its progress on the console."""
    from rich.markup import escape

    with _claimed():
        return fn(target, workspace=out or Path("kernelwright-runs/debug") / label, name=label,
                  progress=lambda line: console.print(escape(line)), **kwargs)  # fmt: skip


def _check_op_dtype(dtype: str) -> None:
    """An op target's --dtype: one the bisection runs (it runs every one of them), in any
    of its spellings; a usage error naming them otherwise."""
    from kernelwright.cli_bench import dtype_option
    from kernelwright.workflows.debug.bisect import DTYPES

    dtype_option(dtype, allowed=tuple(DTYPES))


def _label(target: str, name: str | None) -> str:
    return name or Path(target).name.replace(":", "_") or target


def _model(
    target: str, dtype: str, reference_dtype: str | None, seed: int, name: str | None,
    out: Path | None, force: bool,
) -> None:  # fmt: skip
    from rich.markup import escape

    from kernelwright.workflows.debug.model import DTYPES, debug_model, reference_view

    dtype = _check_dtypes(dtype, reference_dtype, DTYPES, reference_view)
    console = make_console()
    label = _label(target, name)
    try:
        result = _in_workspace(debug_model, target, out, label, console, dtype=dtype,
                               reference_dtype=reference_dtype, seed=seed, force=force)  # fmt: skip
    except ValueError as e:  # transformers cannot build a causal LM of this config
        raise typer.BadParameter(str(e), param_hint="TARGET") from None
    console.print(f"Report: {result.report}" + (f"  plot: {result.plot}" if result.plot else ""))
    d = result.profile.divergence
    if d is None:
        against = "in fp32" if result.profile.reference_dtype == "float32" else ""
        console.print(f"[green]no divergence[/]: every module agrees with the unpatched model "
                      f"{against}".rstrip())  # fmt: skip
        return
    console.print(f"[red]diverged ({d.pass_name}):[/] {escape(d.summary)}")
    raise typer.Exit(1)


def _check_dtypes(dtype: str, reference_dtype: str | None, dtypes, reference_view) -> str:
    """--dtype as the model workflows name it ("bfloat16"), from any of its spellings."""
    from kernelwright.cli_bench import dtype_option

    dtype = dtype_option(dtype, allowed=tuple(dtypes))
    try:
        reference_view(dtype, reference_dtype)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--reference-dtype") from None
    return dtype


def _compiled(
    target: str, dtype: str, reference_dtype: str | None, backend: str, seed: int,
    name: str | None, out: Path | None, force: bool,
) -> None:  # fmt: skip
    from rich.markup import escape

    from kernelwright.workflows.debug.compiled import debug_compiled, is_compiled_target
    from kernelwright.workflows.debug.model import DTYPES, reference_view
    from kernelwright.workflows.debug.target import TargetError

    dtype = _check_dtypes(dtype, reference_dtype, DTYPES, reference_view)
    import torch._dynamo

    backends = sorted(set(torch._dynamo.list_backends()) | {"eager", "aot_eager"})
    if backend not in backends:
        raise typer.BadParameter(
            f"{backend!r}: one of {', '.join(backends)}", param_hint="--backend"
        )
    if not is_compiled_target(target):
        raise typer.BadParameter(
            "--compiled takes a model type, a config.json, a directory holding one or "
            "package.module:function returning (model, batch)",
            param_hint="TARGET",
        )
    console = make_console()
    label = _label(target, name)
    try:
        result = _in_workspace(debug_compiled, target, out, label, console, dtype=dtype,
                               reference_dtype=reference_dtype, seed=seed, backend=backend,
                               force=force)  # fmt: skip
    except (TargetError, ValueError) as e:
        raise typer.BadParameter(str(e), param_hint="TARGET") from None
    console.print(f"Report: {result.report}")
    d = result.profile.divergence
    if d is None:
        replaced = sum(s.replaced for s in result.profile.sites)
        console.print(f"[green]no divergence[/]: the compiled model ({replaced} sites replaced) "
                      "agrees with eager")  # fmt: skip
        return
    console.print(f"[red]diverged ({d.pass_name}):[/] {escape(d.summary)}")
    raise typer.Exit(1)
