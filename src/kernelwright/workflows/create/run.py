"""The create workflow's stages: Understand → (review) → Act → Verify → report."""

from __future__ import annotations

import shutil
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from kernelwright.profiles import reviewed
from kernelwright.profiles.kernel import KernelProfile
from kernelwright.workflows.create.codegen import UnsupportedNode, render

RUNS = Path("kernelwright-runs/create")


@dataclass
class CreateResult:
    profile: KernelProfile
    workdir: Path
    # "review" (stopped for the person), "kept" (an edited profile.yaml was left alone: the new
    # one went beside it, see `message`), "stopped" (tier 3 / no lowering), "verified"
    stage: str
    passed: bool = False
    report: Path | None = None
    files: list[Path] = field(default_factory=list)
    message: str = ""
    bench: object | None = None  # verify.BenchResult, when the kernel passed its tests


def understand_source(
    source: str, name: str | None = None, save_policy: str = "recompute"
) -> KernelProfile:
    from kernelwright.workflows.create.understand import understand  # the Understand stage

    profile = understand(source, save_policy=save_policy)
    if name:
        profile.name = name
    return profile


def create(
    source: str | None,
    *,
    name: str | None = None,
    yes: bool = False,
    from_profile: str | Path | None = None,
    out: str | Path | None = None,
    runs: str | Path = RUNS,
    bench: str = "quick",
    into_library: bool = False,
    save_policy: str | None = None,
    force: bool = False,
    implements: str | None = None,
) -> CreateResult:
    """save_policy: which intermediates the backward loads instead of recomputing ("recompute"
    or "min-bytes", see stored.plan_stored); None keeps a resumed profile's `stored` as
    reviewed and means "recompute" for a new one.

    An edited workspace profile.yaml is never overwritten unless `force`: the new profile goes
    to profile.new.yaml and the run stops there (stage "kept"; `profiles.reviewed`).

    implements: with `into_library`, the library op whose "created" implementation the op also
    is (workflows/create/implements.py); checked before Verify, an `ImplementsError` if not."""
    if implements is not None:
        from kernelwright.workflows.create.implements import ImplementsError, library_op

        if not into_library:
            raise ImplementsError("--implements registers a library op: add --into-library")
        library_op(implements, name)  # an unknown name fails before anything runs
    if from_profile is not None:
        profile = KernelProfile.load(from_profile)
        if name:
            profile.name = name
        if save_policy is not None:
            from kernelwright.workflows.create.stored import plan_stored

            plan_stored(profile, save_policy)
    elif source is None:
        raise ValueError("create: give a SOURCE file or --from-profile FILE")
    else:
        profile = understand_source(source, name, save_policy or "recompute")
    workdir = Path(runs) / profile.name
    workdir.mkdir(parents=True, exist_ok=True)
    profile_path = workdir / "profile.yaml"
    if Path(from_profile or "").resolve() == profile_path.resolve():
        reviewed.adopt(profile_path)  # resumed from it: this run carries its edits on
    else:
        saved = reviewed.save_profile(profile, profile_path, force=force)
        if saved.kept is not None:
            return CreateResult(profile, workdir, "kept", message=saved.message)
    if not yes and from_profile is None and profile.tier != 3:  # tier 3: nothing to review
        return CreateResult(profile, workdir, "review", message=str(profile_path))

    try:
        render(profile)
    except UnsupportedNode as e:
        profile.unsupported_node = profile.unsupported_node or e.node
        profile.unsupported_reason = profile.unsupported_reason or e.reason
        reviewed.write(profile, profile_path)
        report = _report(profile, workdir, None, f"stopped: {e}")
        return CreateResult(profile, workdir, "stopped", report=report, message=str(e))
    except Exception as e:  # noqa: BLE001  a generator bug (RecursionError, ...): a stop, not a crash
        log = workdir / "generator_error.log"
        log.write_text(traceback.format_exc())
        message = (
            f"the generator failed on this profile ({type(e).__name__}: "
            f"{str(e).strip()[:200]}); its traceback is in {log}. This is a kernelwright bug: "
            "please report it with the profile"
        )
        report = _report(profile, workdir, None, f"stopped: {message}")
        return CreateResult(profile, workdir, "stopped", report=report, message=message)

    if implements is not None:  # a kernel that is not the op's call stops here, not after Verify
        from kernelwright.workflows.create.library import library_files

        library_files(profile, implements)

    from kernelwright.workflows.create.verify import benchmark, verify

    result = verify(profile, workdir)
    reviewed.write(profile, profile_path)  # with the repairs the Verify stage logged
    # a kernel that failed its tests is not worth timing
    timing = benchmark(profile, workdir, bench) if result.passed else None
    library = None
    if into_library and result.passed:
        from kernelwright.workflows.create.library import into_library as add_to_library

        library = add_to_library(profile, workdir / "library_tests.log", implements=implements)
    files = result.files
    if out is not None:
        dest = Path(out) / profile.name
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(workdir / "pkg" / profile.name, dest)
        files = sorted(dest.iterdir())
    status = "passed" if result.passed else "FAILED"
    headline = f"verify {status} ({result.gate} gate)"
    if library is not None:
        headline += (
            "; added to the library"
            if library.passed
            else "; NOT added to the library: its tests failed there (library_tests.log)"
        )
    report = _report(profile, workdir, result, headline, timing)
    passed = result.passed and (library is None or library.passed)
    files = files + (library.files if library is not None else [])
    return CreateResult(profile, workdir, "verified", passed, report, files, status, timing)


def _report(profile: KernelProfile, workdir: Path, result, headline: str, timing=None) -> Path:
    lines = [f"# create {profile.name}", "", f"source: {profile.source}", "",
             f"tier {profile.tier}: {profile.tier_reason}", "", f"**{headline}**", ""]  # fmt: skip
    if profile.stored:
        stored = ", ".join(f"{t.name} ({t.dtype})" for t in profile.stored)
        lines += [f"stored for the backward ({profile.save_policy}): {stored}", ""]
    if profile.unsupported_node:
        lines += [
            f"unsupported node `{profile.unsupported_node}`: {profile.unsupported_reason}",
            "",
        ]
    if result is not None:
        lines += ["| attempt | config | gate | reason | log |", "|---|---|---|---|---|"]
        for a in result.attempts:
            lines.append(f"| {a.attempt} | {a.config} | {a.gate} | {a.reason} | {a.log.name} |")
        if timing is not None:
            from kernelwright.workflows.create.bench import markdown

            lines += ["", timing.note]
            if timing.comparisons:
                lines += ["", markdown(timing.comparisons)]
            lines += [f"- soft: {f}" for f in timing.findings]
        lines += ["", "files:"]
        lines += [f"- {f}" for f in result.files]
    for r in profile.repairs:
        lines.append(f"- repair {r.attempt}: {r.change} ({r.reason})")
    path = workdir / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path
