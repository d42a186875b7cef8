"""`optimize(options)`: pre-flight → Profile → (review stop) → variant loop → Finalize.

The in-process launch table is left as it was found, except when Finalize keeps a new table
in the library (then this process serves it too). A planted regression stays planted: the
caller planted it (`plant_regression`) and is the one to restore it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from pathlib import Path

from kernelwright.profiles import workspace
from kernelwright.profiles.base import ProfileError
from kernelwright.profiles.optimization import OptimizationProfile, VariantRecord
from kernelwright.profiles.reviewed import Saved, drop_new
from kernelwright.runtime.fanout import Fanout
from kernelwright.runtime.launch import LaunchConfig, Table
from kernelwright.workflows.optimize import notebook
from kernelwright.workflows.optimize.finalize import FinalizeResult, finalize
from kernelwright.workflows.optimize.loop import clear_variants, read_records, run_loop
from kernelwright.workflows.optimize.profile_stage import run_profile
from kernelwright.workflows.optimize.setup import (
    GPUS,
    OptimizeOptions,
    PreflightError,
    Progress,
    preflight,
)
from kernelwright.workflows.optimize.strategies import BY_NAME
from kernelwright.workflows.optimize.tables import ArchRows, get_table, install, rows_for


@dataclass
class OptimizeResult:
    # "review": stopped after Stage 1 for review; "kept": stopped after Stage 1 because the
    # workspace's profile.yaml was edited (this run's went beside it); "done": all stages ran
    stage: str
    workspace: Path
    profile: OptimizationProfile
    records: list[VariantRecord] = field(default_factory=list)
    stop_reason: str = ""
    final: FinalizeResult | None = None
    saved: Saved | None = None  # where Stage 1 wrote the profile, when it ran

    @property
    def profile_path(self) -> Path:
        return self.saved.path if self.saved is not None else self.workspace / "profile.yaml"


def _quiet(_: str) -> None:
    return None


def resume_options(opts: OptimizeOptions) -> tuple[OptimizeOptions, OptimizationProfile]:
    """The options of a run resumed from its reviewed profile: the profile's settings win."""
    ws = opts.workspace or Path("kernelwright-runs") / "optimize" / opts.op
    path = ws / "profile.yaml"
    if not path.exists():
        raise PreflightError(
            f"--resume: no profile at {path}; run `kernelwright optimize {opts.op}` first"
        )
    try:
        profile = OptimizationProfile.load(path)
    except ProfileError as e:
        raise PreflightError(f"--resume: {e}") from None
    unknown = [s.name for s in profile.strategies if s.name not in BY_NAME]
    if unknown:
        raise PreflightError(
            f"--resume: {path} names strategies that do not exist: {', '.join(unknown)}; "
            f"known: {', '.join(BY_NAME)}"
        )
    if profile.op != opts.op:
        raise PreflightError(f"--resume: {path} is a profile of {profile.op!r}, not {opts.op!r}")
    if profile.placeholder != opts.dry_run:
        kind = "a dry run (placeholder timings)" if profile.placeholder else "a GPU run"
        raise PreflightError(
            f"--resume: {path} comes from {kind}; resume it the same way"
            + (" (add --dry-run)" if profile.placeholder else " (without --dry-run)")
        )
    return (
        replace(
            opts,
            workspace=ws,
            goal=profile.goal,
            scope=profile.scope,
            # a dry run may have tuned any key; a GPU run tunes the GPU it runs on
            gpu=profile.arch if profile.placeholder and profile.arch in GPUS else "auto",
            max_variants=profile.max_variants,
            target=profile.target,
            dtype=profile.dtype,
            shapes=[dict(s) for s in profile.shapes],
            planted_regression=profile.planted_regression,
        ),
        profile,
    )


def claim_workspace(ws: Path, force: bool) -> None:
    """A new run starts in `ws` only where it loses nothing: a folder that is new, empty or
    optimize's own with no earlier variants; anything else needs `force` (PreflightError)."""
    try:
        earlier_run = workspace.claim_workspace(ws, "optimize", (OptimizationProfile,), force=force)
    except workspace.WorkspaceError as e:
        raise PreflightError(str(e)) from None
    if force or not earlier_run:
        return
    earlier = [f"v{r.version}" for r in read_records(ws)]
    earlier += [n for n in ("report.md", "proposed_table.py") if (ws / n).exists()]
    if earlier:
        raise PreflightError(
            f"{ws} holds an earlier run ({', '.join(earlier)}): continue it with --resume --yes, "
            "or pass --force to start over (its notebooks, report and proposed table are removed)"
        )


def optimize(opts: OptimizeOptions, progress: Progress = _quiet) -> OptimizeResult:
    profile = None
    if opts.resume:
        opts, profile = resume_options(opts)
        # the reviewed profile was chosen over an earlier run's new one
        drop_new(opts.workspace / "profile.yaml")
        (opts.workspace / "profile.md").write_text(notebook.profile_md(profile))  # as reviewed
        if profile.planted_regression:
            plant_regression(opts.op, profile.arch)
    setup = preflight(opts)
    if profile is None:
        claim_workspace(setup.workspace, opts.force)
        setup.workspace.mkdir(parents=True, exist_ok=True)
        clear_variants(setup.workspace)
        progress(f"[pre-flight] ok: {opts.op} on {setup.ctx.gpu}, tuning '{setup.arch}'")
        profile = run_profile(setup, progress)
        progress(f"[Stage 1] bottleneck: {profile.bottleneck.cls}; profile {setup.workspace}")
        kept = setup.saved is not None and setup.saved.kept is not None
        if not kept:
            drop_new(setup.workspace / "profile.yaml")  # profile.yaml holds this run's profile now
        if kept or not opts.yes:
            setup.bench.release()
            stage = "kept" if kept else "review"
            return OptimizeResult(stage, setup.workspace, profile, saved=setup.saved)
    elif read_records(setup.workspace):
        progress(f"[resume] continuing after v{len(read_records(setup.workspace))}")
    # the sweep's workers start on its first candidates and stop with the loop
    env = {"KERNELWRIGHT_COMMIT": setup.ctx.commit}
    with Fanout(opts.workers, progress=progress, env=env) as setup.fanout:
        records, stop = run_loop(setup, profile, progress)
    progress(f"[Stage 2] stopped: {stop}")
    setup.bench.release()
    final = finalize(setup, profile, records, stop, progress)
    return OptimizeResult("done", setup.workspace, profile, records, stop, final)


# --------------------------------------------------------------------------- planted regression


def detuned(rows: list[tuple[int, LaunchConfig]]) -> list[tuple[int, LaunchConfig]]:
    """Rows that stay correct but run badly: one warp, one row per program, one program per SM,
    and rows walked in chunks of at most 128 columns (the looped kernels)."""
    return [
        (max_n, c.with_(block_n=min(c.block_n, 128), num_warps=1, rows=1, programs_per_sm=1))
        for max_n, c in rows
    ]


def l2_flags_off(rows: list[tuple[int, LaunchConfig]]) -> list[tuple[int, LaunchConfig]]:
    """The same rows without the two-pass kernels' L2 flags (the tables before they existed):
    a plant that only the flag steps of the sweep or the L2 strategies can win back."""
    return [(max_n, c.with_(evict_hints=False, reverse_pass=False)) for max_n, c in rows]


PLANTS = {"detuned": detuned, "l2_flags_off": l2_flags_off}


def plant_regression(op: str, arch: str, plant: str = "detuned") -> ArchRows:
    """De-tune `arch`'s entry of every kernel of `op`'s table (`plant`: a name in PLANTS), in
    this process only.

    Returns the entries that were there before (the tuned rows `lookup` used) for
    `restore_table`. The library file is not touched.
    """
    try:
        table = get_table(op)
    except ValueError as e:
        raise PreflightError(str(e)) from None
    before = {k: rows_for(table, k, arch) for k in table}
    saved = {k: copy.copy(table[k].get(arch)) for k in table}
    install(table, {k: PLANTS[plant](rows) for k, rows in before.items()}, [arch])
    _PLANTED[(op, arch)] = saved
    return before


_PLANTED: dict[tuple[str, str], dict[str, list | None]] = {}


def restore_table(op: str, arch: str) -> None:
    """Undo `plant_regression(op, arch)`."""
    table: Table = get_table(op)
    saved = _PLANTED.pop((op, arch))
    for k, rows in saved.items():
        if rows is None:
            table[k].pop(arch, None)
        else:
            table[k][arch] = rows
