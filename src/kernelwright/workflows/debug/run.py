"""`debug_op(options)`: Plan → (review stop) → Bisect → profile.yaml, repro.py, report.md.

The workspace is `kernelwright-runs/debug/<name>/`. Without `yes` the run stops after the plan
(profile.yaml, verdict "pending") for a person to review; `resume` runs the bisection from the
reviewed profile. An edited profile.yaml is never overwritten without `force`, and a run
starts only in a workspace that is new, empty or debug's own (`claim`): an earlier debug run's
outputs are replaced, a folder of other files is refused without `force`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kernelwright.profiles import reviewed, workspace
from kernelwright.profiles.debug import CompiledDebugProfile, DebugProfile, ModelDebugProfile
from kernelwright.profiles.reviewed import Saved
from kernelwright.workflows.debug.bisect import bisect, probed_values
from kernelwright.workflows.debug.repro import write_repro
from kernelwright.workflows.debug.target import TargetError, plan

RUNS = Path("kernelwright-runs/debug")
Progress = Callable[[str], None]


@dataclass
class DebugOptions:
    target: str
    ref: str | None = None
    inputs: str | None = None
    seed: int = 0
    name: str | None = None
    yes: bool = False
    resume: bool = False
    force: bool = False
    workspace: Path | None = None


@dataclass
class DebugResult:
    # "review": stopped after the plan; "kept": an edited profile.yaml was left alone;
    # "done": bisected (see profile.verdict)
    stage: str
    workspace: Path
    profile: DebugProfile
    saved: Saved | None = None
    repro: Path | None = None
    report: Path | None = None

    @property
    def diverged(self) -> bool:
        return self.profile.verdict == "diverged"


def _quiet(_: str) -> None:
    return None


def workspace_of(opts: DebugOptions, name: str) -> Path:
    return opts.workspace or RUNS / name


# every kind of profile debug writes: a workspace holding one is debug's own
KINDS = (DebugProfile, ModelDebugProfile, CompiledDebugProfile)


def claim(ws: Path, force: bool, given: tuple[str, ...] = ()) -> None:
    """Refuse (WorkspaceError, before any work) a workspace holding files debug did not
    write, unless `force`; `given`: the files the person gave the run there (a plan to resume)."""
    workspace.claim_workspace(ws, "debug", KINDS, force=force, given=given)


def debug_op(opts: DebugOptions, progress: Progress = _quiet) -> DebugResult:
    if opts.resume:
        ws = opts.workspace or RUNS / (opts.name or _default_name(opts.target))
        path = ws / "profile.yaml"
        if not path.is_file():
            raise TargetError(f"--resume: no profile at {path}; run `kernelwright debug` first")
        profile = DebugProfile.load(path)
        if profile.target != opts.target:
            raise TargetError(f"--resume: {path} is the plan of {profile.target!r}")
        claim(ws, opts.force, given=("profile.yaml",))  # a plan written by hand, beside others'
        reviewed.adopt(path)  # this run carries the reviewed edits on
        saved = Saved(path)
    else:
        profile = plan(opts.target, ref=opts.ref, inputs=opts.inputs, seed=opts.seed,
                       name=opts.name)  # fmt: skip
        ws = workspace_of(opts, profile.name)
        claim(ws, opts.force)
        ws.mkdir(parents=True, exist_ok=True)
        saved = reviewed.save_profile(profile, ws / "profile.yaml", force=opts.force)
        progress(f"[plan] {describe_plan(profile)}; profile {saved.path}")
        if saved.kept is not None:
            return DebugResult("kept", ws, profile, saved)
        if not opts.yes:
            return DebugResult("review", ws, profile, saved)
    for stale in ("repro.py", "report.md"):
        (ws / stale).unlink(missing_ok=True)
    profile.probes, profile.divergence, profile.verdict = [], None, "pending"
    bisect(profile, progress)
    reviewed.write(profile, saved.path)
    repro = None
    if profile.divergence is not None:
        forced, case = _forced_of(profile)
        repro = write_repro(profile, ws / "repro.py", forced, case)
    report = write_report(profile, ws, repro)
    return DebugResult("done", ws, profile, saved, repro, report)


def _default_name(target: str) -> str:
    from kernelwright.workflows.debug.target import _name_of

    return _name_of(target)


def describe_plan(profile: DebugProfile) -> str:
    cases = ", ".join(c.label for c in profile.cases)
    return (
        f"{profile.target} ({profile.kind}; cases: {cases}) against its fp32 reference; "
        f"tolerances from {profile.tolerance_source}; launch table "
        f"{profile.launch_table or 'none'} ({profile.arch})"
    )


def _forced_of(profile: DebugProfile):
    """The launch config the first divergence forced (for repro.py), and its case's index."""
    from kernelwright.workflows.debug.bisect import Runner

    d = profile.divergence
    case = next(i for i, c in enumerate(profile.cases) if c.label == d.case)
    if not d.config.startswith("forced "):
        return [], case
    runner = Runner(profile, _quiet)
    for axis, value, point in runner.config_points():
        if axis == "config" and value == d.config:
            return list(point.forced), case
    return [], case


# --------------------------------------------------------------------------- report.md


def write_report(profile: DebugProfile, ws: Path, repro: Path | None) -> Path:
    d = profile.divergence
    lines = [f"# debug {profile.target}", ""]
    lines += [describe_plan(profile) + f", on {profile.device}; seed {profile.seed}.", ""]
    untried = [p for p in profile.probes if p.status == "not tried"]
    if d is None:
        lines += [
            f"**No divergence**: {sum(p.status == 'pass' for p in profile.probes)} probes "
            f"agree with the reference ({sum(p.status == 'skipped' for p in profile.probes)} "
            f"skipped, {len(untried)} not tried).",
            "",
        ]
    else:
        lines += [
            f"**Diverged: {d.pass_name}.** {d.summary}.",
            "",
            f"- first failing probe: {d.case}, {d.dtype}, shape {tuple(d.shape)} "
            f"({d.shape_regime}), {d.layout}, {d.values} values, config {d.config}",
            f"- error {d.error:.3g} (relative-norm, over the elements where the reference is "
            f"finite) > tol {d.tol:.3g}; failing passes: {', '.join(d.passes)}",
            f"- smallest failing shape: {tuple(d.minimal_shape)}"
            + (
                f" (halved through {', '.join(str(tuple(s)) for s in d.shrink_steps)})"
                if d.shrink_steps
                else ""
            ),  # fmt: skip
        ]
        if d.message:
            lines.append(f"- message: {d.message}")
        if repro is not None:
            lines.append(f"- repro: `python {repro}` (fails while the divergence is there)")
        lines += ["", "## Where it diverges", "", "| axis | failing | probed |", "|---|---|---|"]
        probed = probed_values(profile, profile.probes)
        for axis, values in probed.items():
            failed = d.regime.get(axis, [])
            mark = "every value" if failed and len(failed) == len(values) else ", ".join(failed)
            if any(p.axis == axis and p.status == "not applicable" for p in profile.probes):
                mark = "not applicable"
            lines.append(f"| {axis} | {mark or '-'} | {len(values)} |")
        lines.append("")
    not_applicable = [p for p in profile.probes if p.status == "not applicable"]
    if not_applicable:
        lines += ["## Not applicable", ""]
        lines += [f"- {p.axis}: {p.message}" for p in not_applicable] + [""]
    if untried:
        lines += ["## Not tried", ""]
        lines += [f"- {p.axis} {p.value}, {p.dtype}, shape {tuple(p.shape)}: {p.message}"
                  for p in untried]  # fmt: skip
        lines.append("")
    lines += ["## Probes", "", "| axis | value | dtype | shape | layout | values | result | "
              "worst pass | error |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for p in profile.probes:
        worst = next((x for x in p.passes if not x.ok), None)
        worst = worst or max(p.passes, key=lambda x: x.error / x.tol if x.tol else 0, default=None)
        name = worst.name if worst is not None else "-"
        result = p.status + (f" ({p.message[:60]})" if p.status == "skipped" else "")
        result += " (see Not tried)" if p.status == "not tried" else ""
        lines.append(
            f"| {p.axis} | {p.value} | {p.dtype} | {tuple(p.shape)} | {p.layout} | {p.values} "
            f"| {result} | {name} | {p.max_error:.2e} |"
        )
    lines += ["", "Tolerances (relative-norm error, forward / gradients), from "
              f"{profile.tolerance_source}:", ""]  # fmt: skip
    lines += [f"- {k}: {t.fwd:g} / {t.bwd:g}" for k, t in profile.tolerances.items()]
    lines += [f"- note: {n}" for n in profile.notes]
    path = ws / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path
