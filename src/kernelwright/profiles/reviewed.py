"""Saving a workflow's profile without losing a reviewer's edits.

A workflow writes `profile.yaml` for a person to review and edit. Re-running the workflow must
not overwrite those edits: `save_profile` overwrites the file only when it is absent, unchanged
since kernelwright wrote it, or `force` is given. Otherwise the file stays as it is, the new
profile goes beside it (`profile.new.yaml`) and the returned `Saved` says so, for the workflow
to stop there and tell the user. What kernelwright wrote last is remembered as a digest in a
hidden file beside the profile (`.profile.yaml.sha256`); a profile with no digest that differs
from the new one counts as edited.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from kernelwright.profiles.base import YamlProfile


@dataclass(frozen=True)
class Saved:
    path: Path  # where this run's profile was written
    kept: Path | None = None  # the edited profile left in place (then `path` is beside it)

    @property
    def message(self) -> str:
        if self.kept is None:
            return f"Profile: {self.path}"
        return (
            f"{self.kept} was edited since kernelwright wrote it: kept as it is. This run's "
            f"profile is {self.path}; compare the two, keep the one you want as {self.kept.name} "
            "and resume from it, or re-run with --force to overwrite the edited one."
        )


def digest_file(path: Path) -> Path:
    """The hidden file beside `path` that remembers what kernelwright wrote there."""
    return path.with_name(f".{path.name}.sha256")


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def edited(path: str | Path) -> bool:
    """True when `path` holds a profile that kernelwright did not write as it now stands."""
    path = Path(path)
    if not path.is_file():
        return False
    mark = digest_file(path)
    return not (mark.is_file() and mark.read_text().strip() == _digest(path.read_text()))


def adopt(path: str | Path) -> None:
    """A workflow resumes from `path` (the reviewed profile it loaded): later saves of that
    run carry the edits on and may overwrite it."""
    path = Path(path)
    digest_file(path).write_text(_digest(path.read_text()) + "\n")


def write(profile: YamlProfile, path: str | Path) -> Path:
    """Save `profile` to `path` unconditionally, remembering what was written."""
    path = profile.save(path)
    adopt(path)
    return path


def save_profile(profile: YamlProfile, path: str | Path, *, force: bool = False) -> Saved:
    """Save `profile` to `path` unless a person edited the profile there (see the module)."""
    path = Path(path)
    if force or not edited(path) or path.read_text() == profile.to_yaml():
        return Saved(write(profile, path))
    beside = path.with_name(f"{path.stem}.new{path.suffix}")
    return Saved(write(profile, beside), kept=path)


def drop_new(path: str | Path, resumed: str | Path | None = None) -> None:
    """Remove the profile.new.yaml an earlier run wrote beside `path` (with its digest and its
    .md): once `path` holds this run's profile or was resumed from, it is stale. Not the file
    this run resumed from (`resumed`)."""
    path = Path(path)
    new = path.with_name(f"{path.stem}.new{path.suffix}")
    if resumed is not None and Path(resumed).resolve() == new.resolve():
        return
    for p in (new, digest_file(new), new.with_suffix(".md")):
        p.unlink(missing_ok=True)
