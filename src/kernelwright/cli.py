"""The `kernelwright` command. Each command is a function on the module-level `app`:

    kernelwright bench rms_norm --quick        # time ops against their peers, CSV + plots
    kernelwright info                          # the device, its architecture and versions
    kernelwright demo                          # verify every kernel, then a benchmark table

A new command is one more `@app.command()` function below (or in another module that
imports `app`). Without an installed package: `PYTHONPATH=src python -m kernelwright.cli ...`.
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

import kernelwright  # noqa: F401  (selects the Triton interpreter on machines without a GPU)
from kernelwright import registry  # the op lists in the help (data only: no kernel imported)
from kernelwright.cli_options import ForceWorkspace, writable_results_db
from kernelwright.console import make_console

app = typer.Typer(
    name="kernelwright",
    help="Fast, tested Triton kernels for LLM training, and the workflows that make and keep "
    "them fast.\n\n"
    "Workflows: create (a PyTorch reference → a tested Triton kernel), autopatch (a Hugging "
    "Face model → a reviewed profile → kernels patched in), optimize (an op's launch table "
    "tuned on this GPU), debug (where an op diverges from its reference). Tools: bench (time "
    "ops against their peers), results (query every run's rows), demo (verify every kernel, "
    "then a benchmark), info (the device and versions), skills (the workflows as skills a "
    "coding agent loads).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"kernelwright {kernelwright.__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    pass


# `kernelwright bench`: cli_bench.py
from kernelwright.cli_bench import Workers, bench, workers_option  # noqa: E402

app.command()(bench)


# `kernelwright debug`: cli_debug.py
from kernelwright.cli_debug import debug  # noqa: E402

app.command()(debug)


# the command groups: results (the results database), registry (implementations and their
# selection), skills (the workflows for coding agents), losses (post-training losses)
from kernelwright.cli_losses import losses_app  # noqa: E402
from kernelwright.cli_registry import registry_app  # noqa: E402
from kernelwright.cli_results import results_app  # noqa: E402
from kernelwright.cli_skills import skills_app  # noqa: E402

app.add_typer(results_app, name="results")
app.add_typer(registry_app, name="registry")
app.add_typer(skills_app, name="skills")
app.add_typer(losses_app, name="losses")


@app.command()
def demo() -> None:
    """Verify every library kernel against its reference, then print a benchmark table."""
    from kernelwright.demo import run_demo

    if not run_demo(make_console()):
        raise typer.Exit(1)


@app.command()
def info() -> None:
    """Print the device kernels run on (a GPU's architecture, SMs, L2, memory) and versions."""
    import platform

    import torch
    import triton

    from kernelwright.bench.specs import importable
    from kernelwright.runtime import device_info

    d = device_info()
    table = Table(title="kernelwright info", show_header=False, title_justify="left")
    if d.backend == "interpreter":  # the CPU has no SMs or L2 of a GPU's kind: none are shown
        why = "TRITON_INTERPRET=1 is set" if torch.cuda.is_available() else "no CUDA GPU"
        rows = [("device", f"{why}: kernels run through Triton's interpreter on the CPU")]
    else:
        sm = f"  (sm_{d.capability[0]}{d.capability[1]})" if d.capability else ""
        rows = [
            ("device", d.name),
            ("backend", d.backend),
            ("arch", d.arch + sm),
            ("SMs", str(d.sm_count)),
            ("L2", f"{d.l2_bytes / 2**20:.0f} MiB"),
            ("memory", f"{d.total_memory_bytes / 2**30:.1f} GiB"),
        ]
    cuda = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU-only build"
    rows += [
        ("kernelwright", kernelwright.__version__),
        ("torch", f"{torch.__version__} ({cuda})"),
        ("triton", triton.__version__),
        ("python", platform.python_version()),
        ("liger_kernel", "installed" if importable("liger_kernel") else "not installed"),
    ]
    for k, v in rows:
        table.add_row(k, v)
    make_console().print(table)


# `kernelwright autopatch`: cli_autopatch.py
from kernelwright.cli_autopatch import EPILOG, autopatch  # noqa: E402

app.command(epilog=EPILOG)(autopatch)


@app.command()
def create(
    source: Annotated[
        str | None,
        typer.Argument(
            help="A reference: a .py file (function, nn.Module or KernelBench) or "
            "package.module:function."
        ),
    ] = None,
    name: Annotated[
        str | None, typer.Option(help="The op name (default: from the source).")
    ] = None,
    yes: Annotated[bool, typer.Option("--yes", help="Run every stage without stopping.")] = False,
    from_profile: Annotated[
        Path | None,
        typer.Option(
            help="Resume from a reviewed (edited) profile YAML.", exists=True, dir_okay=False
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            help="Also write the standalone package, once it passes its tests, to DIR/<name>/.",
            metavar="DIR",
        ),
    ] = None,
    into_library: Annotated[
        bool,
        typer.Option(
            help="Also add the verified op to kernelwright itself (a source checkout): "
            "kernelwright.ops.generated, tests/generated, benchmarks/generated."
        ),
    ] = False,
    bench: Annotated[
        str,
        typer.Option(
            help="On a GPU, after the tests pass: 'quick' (two token counts), 'full' (the "
            "profile's sweep) or 'none'. Against the reference, eager and torch.compile."
        ),
    ] = "quick",
    save: Annotated[
        str | None,
        typer.Option(
            help="Intermediates the backward loads instead of recomputing (profile.stored): "
            "'recompute' (none, the default) or 'min-bytes' (store one when the backward then "
            "reads fewer bytes). With --from-profile it replaces the reviewed choice."
        ),
    ] = None,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Overwrite an edited profile.yaml (without it an edited profile is kept: this "
            "run's goes beside it as profile.new.yaml where it differs, and the command stops, "
            "exit 2), and "
            "replace an --out DIR/<name>/ that is not a package `create` wrote, or an op "
            "--into-library created before under this name (without it both are refused, exit "
            "2). A kernel that fails its tests replaces nothing.",
        ),
    ] = False,
    implements: Annotated[
        str | None,
        typer.Option(
            help="With --into-library: also register the kernel as the 'created' "
            "implementation of this library op (e.g. rms_norm), chosen per call site by the "
            "registry and inserted by kernelwright.compile where it is the op's call.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """PyTorch reference → reviewed KernelProfile → generated Triton kernel, tests, benchmark.

    A profile.yaml you edited, or an --out folder other than a package `create` wrote, is never
    overwritten without --force.
    """
    from rich.markup import escape

    from kernelwright.profiles.base import ProfileError
    from kernelwright.workflows.create.implements import ImplementsError
    from kernelwright.workflows.create.library import LibraryError
    from kernelwright.workflows.create.load import name_problem
    from kernelwright.workflows.create.run import RUNS, OutError
    from kernelwright.workflows.create.run import create as run_create

    console = make_console()
    if bench not in ("quick", "full", "none"):
        raise typer.BadParameter("one of quick, full, none", param_hint="--bench")
    if save not in (None, "recompute", "min-bytes"):
        raise typer.BadParameter("one of recompute, min-bytes", param_hint="--save")
    if name is not None and (problem := name_problem(name)):
        raise typer.BadParameter(f"{problem}: pick another", param_hint="--name")
    import torch  # the benchmark runs, and appends its rows to the results database, on a GPU

    if bench != "none" and torch.cuda.is_available():
        writable_results_db()
    try:
        result = run_create(
            source,
            name=name,
            yes=yes,
            from_profile=from_profile,
            out=out,
            bench=bench,
            into_library=into_library,
            save_policy=save,
            force=force,
            implements=implements,
        )
    except ImplementsError as e:
        raise typer.BadParameter(str(e), param_hint="--implements") from None
    except (OutError, LibraryError) as e:  # before any work: one line
        console.print(str(e), style="red", markup=False, soft_wrap=True)
        raise typer.Exit(2) from None
    except ProfileError as e:  # the --from-profile file: one line per problem, unwrapped
        console.print(str(e), style="red", markup=False, soft_wrap=True)
        raise typer.Exit(2) from None
    except (ValueError, FileNotFoundError) as e:
        raise typer.BadParameter(str(e), param_hint="SOURCE") from None
    except Exception as e:  # noqa: BLE001  a kernelwright bug: one line and a log, no traceback
        import traceback

        log = RUNS / "create_error.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(traceback.format_exc())
        console.print(
            f"[red]create failed[/] ({type(e).__name__}: {escape(str(e).strip()[:200])}): a "
            f"kernelwright bug, not the reference's; the traceback is in {log}, please report it"
        )
        raise typer.Exit(1) from None
    for note in result.notes:  # what the person should know of the generated op
        console.print(f"[yellow]note:[/] {escape(note)}", soft_wrap=True)
    if result.stage == "kept":
        console.print(result.message, style="yellow", markup=False)
        raise typer.Exit(2)
    if result.stage == "review":
        p = result.profile  # what was understood, in one line (and the inputs read in parts)
        console.print(f"tier {p.tier}: {p.tier_reason}", markup=False, soft_wrap=True)
        for whole, parts in p.input_parts.items():
            line = f"{whole} is read in {len(parts)} equal parts of its last dim"
            console.print(line, markup=False)
        console.print(f"Profile: {result.message}  (review it, then resume with:)")
        console.print(
            f"  kernelwright create --from-profile {result.message}"
            + (f" --out {out}" if out else "")
            + (" --into-library" if into_library else "")
            + (f" --implements {implements}" if implements else "")
        )
        return
    console.print(f"Report: {result.report}")
    if result.stage == "stopped":
        console.print(f"[yellow]stopped:[/] {result.message}")
        raise typer.Exit(2)
    for f in result.files:
        console.print(f"  {f}")
    if not result.passed:
        if result.message == "passed":  # verified, but its tests failed inside the library
            console.print(
                "[red]not added to the library[/]: the op's tests failed there (every file "
                f"written was removed); see {result.workdir / 'library_tests.log'}"
            )
        else:
            console.print("[red]verify failed[/]: see the report and logs")
        raise typer.Exit(1)
    console.print("[green]verified[/]: the generated tests pass")
    if result.bench is not None:
        console.print(result.bench.note)
        for c in result.bench.comparisons:
            console.print(
                f"  {c.shape} {c.mode:8s} {c.kernel_ms:.4f} ms: {c.vs_eager:.2f}x eager, "
                f"{c.vs_compile:.2f}x torch.compile"
            )
        for f in result.bench.findings:
            console.print(f"  [yellow]soft:[/] {f}")


@app.command()
def optimize(
    ctx: typer.Context,
    op: Annotated[str, typer.Argument(help=f"The op to tune: {', '.join(registry.tuned())}.")],
    goal: Annotated[str, typer.Option(help="speed | memory | balanced")] = "speed",
    scope: Annotated[str, typer.Option(help="forward | backward | all")] = "all",
    gpu: Annotated[
        str,
        typer.Option(help="The table key to tune: auto (this GPU) | ampere | hopper | blackwell"),
    ] = "auto",
    max_variants: Annotated[int, typer.Option(help="Variant budget (v1 is the sweep).")] = 8,
    target: Annotated[
        str | None, typer.Option(help='Stop when met, e.g. "full < 0.3 ms at 8192x4096".')
    ] = None,
    yes: Annotated[bool, typer.Option("--yes", help="Run every stage without stopping.")] = False,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="No GPU needed: interpreter correctness, placeholder timings, no library writes.",
        ),
    ] = False,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue from the reviewed profile.yaml.")
    ] = False,
    quick: Annotated[
        bool, typer.Option(help="The bench spec's quick sweep (fewer shapes).")
    ] = False,
    out: Annotated[
        Path | None, typer.Option(help="Workspace (default kernelwright-runs/optimize/OP).")
    ] = None,
    plant_regression: Annotated[
        bool,
        typer.Option(
            "--plant-regression",
            help="De-tune the tuned arch's table entry in-process first (a recovery test); "
            "the library is never written.",
        ),
    ] = False,
    force: ForceWorkspace = False,
    workers: Workers = "1",
) -> None:
    """Make OP faster on this GPU: profile → versioned variants with notebooks → the winner.

    A profile.yaml you edited is never overwritten without --force.
    """
    from rich.markup import escape

    from kernelwright.runtime import device_info
    from kernelwright.workflows import optimize as wf

    console = make_console()
    if resume:  # the reviewed profile holds these: a value given now would be dropped silently
        held = ("goal", "scope", "gpu", "max_variants", "target", "quick")
        given = [f"--{n.replace('_', '-')}" for n in held
                 if getattr(ctx.get_parameter_source(n), "name", "") == "COMMANDLINE"]  # fmt: skip
        if given:
            console.print(
                f"[yellow]{', '.join(given)} ignored with --resume:[/] the reviewed profile.yaml "
                "holds them; edit it there (or start again without --resume)"
            )
    opts = wf.OptimizeOptions(
        op,
        goal=goal,
        scope=scope,
        gpu=gpu,
        max_variants=max_variants,
        target=target,
        yes=yes,
        dry_run=dry_run,
        resume=resume,
        force=force,
        quick=quick,
        workspace=out,
        write_library=not plant_regression,
        planted_regression=plant_regression,
        workers=workers_option(workers),
    )
    try:
        if plant_regression and not resume:
            arch = device_info().arch if gpu == "auto" else gpu
            wf.plant_regression(op, arch)
            console.print(f"[yellow]planted regression:[/] {op}'s '{arch}' entry de-tuned")
        result = wf.optimize(opts, progress=lambda line: console.print(escape(line)))
    except wf.PreflightError as e:
        console.print(f"[red]optimize {op}: stopped before measuring anything.[/] {escape(str(e))}")
        raise typer.Exit(2) from None
    if result.stage == "kept":
        console.print(result.saved.message, style="yellow", markup=False)
        raise typer.Exit(2)
    if result.stage == "review":
        console.print(f"Profile: {result.profile_path}  (and profile.md beside it; review it)")
        flags = " --dry-run" if dry_run else ""
        flags += f" --out {out}" if out else ""
        console.print(f"Resume with:\n  kernelwright optimize {op} --resume --yes{flags}")
        return
    table = Table(title=f"optimize {op}: variants (stopped: {result.stop_reason})")
    for col in ("v", "strategy", "verdict", "gain", "vs v0", "reason"):
        table.add_column(col, overflow="fold")
    colour = {"accepted": "green", "rejected": "yellow", "discarded": "red"}
    for r in result.records:
        table.add_row(
            str(r.version),
            r.strategy,
            f"[{colour[r.verdict]}]{r.verdict}[/]",
            f"{r.gain_pct:+.2f}%",
            f"{r.vs_baseline_pct:+.2f}%",
            escape(r.reason),
        )
    console.print(table)
    if result.profile.placeholder:
        console.print("[yellow]placeholder timings (dry run): not speeds.[/]")
    final = result.final
    console.print(f"Applied: {escape(final.applied)}")
    console.print(f"Report: {final.report}")
    if final.gate is not None and not final.gate.passed:
        raise typer.Exit(1)


def _reflow(text: str) -> str:
    """A docstring's paragraphs each as one line: the terminal wraps them to its width, where a
    line break kept from the source would cut a sentence in two."""
    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(" ".join(p.split("\n")) for p in paragraphs)


def _reflow_help(typer_app: typer.Typer) -> None:
    for command in typer_app.registered_commands:
        text = command.help or inspect.getdoc(command.callback) or ""
        command.help = _reflow(text) if text else command.help
    for group in typer_app.registered_groups:
        if isinstance(group.typer_instance.info.help, str):
            group.typer_instance.info.help = _reflow(group.typer_instance.info.help)
        _reflow_help(group.typer_instance)


_reflow_help(app)


def main() -> None:
    try:
        app()
    except SystemExit as e:
        if e.code == 130:  # Ctrl-C: typer exits with 130 and says nothing
            print("kernelwright: interrupted", file=sys.stderr)
        raise


if __name__ == "__main__":
    main()
