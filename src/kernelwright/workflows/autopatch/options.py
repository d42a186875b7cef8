"""The `kernelwright autopatch` command's options, checked before any analysis runs.

`problem(...)` names the first option that cannot work, as (option, why), so the command stops
with one line instead of a traceback after the analysis (an --out under a file) or a silently
ignored option (`autopatch llama --dtype bf16` analyses in fp32: --dtype is the sweep's).
`profile_path` is where the profile goes: --out, or profile.yaml inside an --out directory.
"""

from __future__ import annotations

from pathlib import Path

from kernelwright.profiles.workspace import file_above
from kernelwright.workflows.autopatch.emit import emitted, path_problem

# the options only --sweep reads, with their defaults: given without --sweep they would do nothing
SWEEP_DEFAULTS = {
    "mapping": "all",
    "only": None,
    "timeout": 300.0,
    "jobs": 2,
    "profiles": True,
    "device": "cpu",
    "dtype": "fp32",
}


def problem(
    sweep: bool,
    out: Path | None,
    emit: Path | None,
    check: bool,
    force: bool,
    sweep_options: dict,
) -> tuple[str, str] | None:
    """(option, why) for the first option that cannot work as given; None when all can."""
    if out is not None:
        if sweep and out.exists() and not out.is_dir():
            return "--out", f"{out} is a file: with --sweep, --out is the results directory"
        if (above := file_above(out)) is not None:
            return "--out", f"{above} is a file, not a directory: {out} cannot be created under it"
    if sweep:
        if emit is not None:
            return "--emit", "--emit applies to one MODEL, not to --sweep"
        if not check:
            return "--no-check", "--no-check applies to one MODEL: --sweep always checks"
        if sweep_options["jobs"] < 0:
            return "--jobs", f"{sweep_options['jobs']}: 0 (in this process) or more workers"
        if not sweep_options["timeout"] > 0:
            return "--timeout", f"{sweep_options['timeout']}: the seconds a type may take, > 0"
        return None
    for name, default in SWEEP_DEFAULTS.items():
        if sweep_options[name] != default:
            flag = "--no-profiles" if name == "profiles" else f"--{name}"
            return (
                flag,
                f"{flag} applies with --sweep only; one MODEL is analysed on the CPU in fp32",
            )
    if emit is not None and (why := path_problem(emit)) is not None:
        return "--emit", why
    if emit is not None and emit.is_file() and not force and not emitted(emit):
        return (
            "--emit",
            f"{emit} exists and is not a test kernelwright emitted (--force: overwrite)",
        )
    return None


def profile_path(out: Path | None, model_type: str) -> Path:
    """The profile's file: --out, profile.yaml inside an --out that is a directory, or
    kernelwright-runs/autopatch/<type>/profile.yaml."""
    if out is None:
        return Path("kernelwright-runs/autopatch") / model_type / "profile.yaml"
    return out / "profile.yaml" if out.is_dir() else out
