"""The workflows as skills a coding agent loads: one folder per skill, holding a SKILL.md whose
YAML front matter gives the skill's `name` (the folder's name) and a `description` that tells
the agent when to use it, followed by the instructions.

The folders ship as package data and are the one source of truth: `kernelwright skills install`
copies them where an agent looks for skills (`.claude/skills` by default), and
tests/test_skills.py checks that every command, flag and Python name they mention exists.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.resources import files

import yaml

SKILL_FILE = "SKILL.md"


@dataclass(frozen=True)
class Skill:
    name: str
    description: str
    text: str  # the whole SKILL.md, front matter included


def _root():
    return files(__name__)


def names() -> list[str]:
    """Every skill shipped with the package, by folder name, sorted."""
    return sorted(p.name for p in _root().iterdir() if p.is_dir() and (p / SKILL_FILE).is_file())


def front_matter(text: str) -> dict:
    """The YAML mapping between a SKILL.md's opening `---` line and the next `---` line."""
    lines = text.splitlines()
    if not lines or lines[0].strip() != "---":
        raise ValueError("a SKILL.md starts with a '---' line, then YAML front matter")
    try:
        end = next(i for i, line in enumerate(lines[1:], 1) if line.strip() == "---")
    except StopIteration:
        raise ValueError("the SKILL.md front matter has no closing '---' line") from None
    data = yaml.safe_load("\n".join(lines[1:end]))
    if not isinstance(data, dict):
        raise ValueError("the SKILL.md front matter must be a YAML mapping")
    return data


def load(name: str) -> Skill:
    """One skill; ValueError if it does not exist or its front matter is malformed."""
    if name not in names():
        raise ValueError(f"no skill {name!r}; the skills are: {', '.join(names())}")
    text = (_root() / name / SKILL_FILE).read_text(encoding="utf-8")
    data = front_matter(text)
    if data.get("name") != name:
        raise ValueError(f"skill {name}: front matter name is {data.get('name')!r}, not {name!r}")
    description = str(data.get("description") or "").strip()
    if not description:
        raise ValueError(f"skill {name}: the front matter has no description")
    return Skill(name, description, text)


def skill_files(name: str) -> list[tuple[str, bytes]]:
    """(path relative to the skill's folder, content) of every file in it, sorted."""
    out: list[tuple[str, bytes]] = []

    def walk(node, prefix: str) -> None:
        for child in node.iterdir():
            if child.name == "__pycache__":
                continue
            rel = f"{prefix}{child.name}"
            if child.is_dir():
                walk(child, rel + "/")
            else:
                out.append((rel, child.read_bytes()))

    walk(_root() / name, "")
    return sorted(out)
