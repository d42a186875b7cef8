"""Starting a workflow's run in a workspace folder without losing a person's files.

A workflow writes its outputs (profile.yaml, reports, scripts) into one folder: `--out`, or its
default under kernelwright-runs/. Those outputs replace files of the same names, and some runs
remove an earlier run's outputs first. So a new run starts only in a folder that is new, empty
or the workflow's own: one holding a profile.yaml that kernelwright wrote (its digest beside
it, see `reviewed`) of one of the workflow's kinds of profile. Any other folder is refused
before any work unless `force` is given. What an earlier run of the workflow left is the
workflow's to judge (`claim_workspace` says whether there is one).
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

import yaml

from kernelwright.profiles.base import YamlProfile
from kernelwright.profiles.reviewed import digest_file


def file_above(path: Path) -> Path | None:
    """The nearest existing folder above `path` when it is a file instead (nothing can be made
    under it), else None."""
    above = next((p for p in path.parents if p.exists()), None)
    return above if above is not None and not above.is_dir() else None


class WorkspaceError(Exception):
    """A folder a run may not write in; the message names the files and what to do."""


def owned(ws: Path, kinds: Collection[type[YamlProfile]]) -> bool:
    """True when `ws/profile.yaml` was written by kernelwright (edited since or not) and has the
    keys of one of `kinds`: another workflow's profile is not this one's."""
    path = ws / "profile.yaml"
    if not (path.is_file() and digest_file(path).is_file()):
        return False
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False
    if not isinstance(data, dict):
        return False
    required = ({n for n, f in k.model_fields.items() if f.is_required()} for k in kinds)
    return any(keys <= set(data) for keys in required)


def claim_workspace(
    ws: Path,
    command: str,
    kinds: Collection[type[YamlProfile]],
    *,
    force: bool,
    given: Collection[str] = (),
) -> bool:
    """Check that a new run of `command` may write its outputs in `ws` (see the module):
    WorkspaceError naming the files it did not write, unless `force`. `given`: names of files
    the person gave the run to read there (a profile to resume from), not counted as others'.
    Returns True when `ws` holds an earlier run of `command`."""
    if ws.exists() and not ws.is_dir():
        raise WorkspaceError(f"the workspace {ws} is a file, not a folder")
    if not ws.is_dir():
        return False
    if owned(ws, kinds):
        return True
    others = sorted(p.name for p in ws.iterdir() if p.name not in given)
    if others and not force:
        shown = ", ".join(others[:4]) + (f" and {len(others) - 4} more" if len(others) > 4 else "")
        raise WorkspaceError(
            f"{ws} holds files {command} did not write ({shown}): give another --out, or pass "
            f"--force to run there (files named as {command}'s outputs are replaced)"
        )
    return False
