"""What every profile shares: strict fields, and YAML on disk with a schema version."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, ClassVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError


class Strict(BaseModel):
    """A profile part: unknown keys are errors (a typo in a reviewed YAML must not vanish)."""

    model_config = ConfigDict(extra="forbid")


class ProfileError(ValueError):
    """A profile YAML that cannot be loaded: not YAML, another workflow's profile, an unsupported
    schema version, or fields that fail validation. The message names the file and gives one
    line per problem, for a person who edited the file to fix it there."""


class YamlProfile(Strict):
    """A top-level profile: `schema_version` plus YAML round trip, save and load."""

    # the workflow command that regenerates this kind of profile, for the version error
    REGENERATE: ClassVar[str] = "kernelwright"

    def to_yaml(self) -> str:
        # python mode: json mode would write inf and nan (graph constants) as null
        return yaml.safe_dump(self.model_dump(), sort_keys=False, width=100)

    @classmethod
    def from_yaml(cls, text: str, source: str | None = None):
        """The profile in `text`; `source` (the file's path) names it in a ProfileError."""
        name = cls.__name__
        where = source or f"the {_kind(cls)} YAML"
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ProfileError(f"{where} is not valid YAML{_yaml_problem(e)}") from None
        if not isinstance(data, dict):
            raise ProfileError(f"{where}: a {name} YAML must be a mapping at the top level")
        other = _other_kind(cls, data)
        if other is not None:
            raise ProfileError(
                f"{where} is a {_kind(other)} ({_command(other)}), not a {_kind(cls)} "
                f"({_command(cls)})"
            )
        expected = cls.model_fields["schema_version"].default
        version = data.get("schema_version", expected)
        if version != expected:
            raise ProfileError(
                f"{where}: {name} schema_version {version} is not supported by this "
                f"kernelwright (expects {expected}); re-run `{cls.REGENERATE}` to regenerate it"
            )
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            lines = [f"{where}: {_problem(err, data)}" for err in e.errors()]
            raise ProfileError("\n".join(lines)) from None

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_yaml())
        return path

    @classmethod
    def load(cls, path: str | Path):
        """The profile at `path`: FileNotFoundError when it is missing, ProfileError when it
        does not hold a valid profile of this kind."""
        return cls.from_yaml(Path(path).read_text(), source=str(path))


def _kind(cls: type) -> str:
    """ "ModelProfile" -> "model profile": how the messages name a kind of profile."""
    return re.sub(r"(?<!^)(?=[A-Z])", " ", cls.__name__).lower()


def _command(cls: type[YamlProfile]) -> str:
    """The workflow that writes this kind: "kernelwright autopatch" -> "autopatch"."""
    return cls.REGENERATE.removeprefix("kernelwright").strip() or "kernelwright"


def _yaml_problem(e: yaml.YAMLError) -> str:
    """ " (line N): <the parser's problem>" from a PyYAML error, as much of it as it has."""
    mark = getattr(e, "problem_mark", None)
    line = f" (line {mark.line + 1})" if mark is not None else ""
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    context, start = getattr(e, "context", None), getattr(e, "context_mark", None)
    if context and start is not None:  # where the unfinished construct began
        problem += f" ({context} that starts on line {start.line + 1})"
    return f"{line}: {problem}"


def _all_kinds(cls: type = YamlProfile) -> list[type[YamlProfile]]:
    out = []
    for sub in cls.__subclasses__():
        out += [sub, *_all_kinds(sub)]
    return out


def _other_kind(cls: type[YamlProfile], data: dict) -> type[YamlProfile] | None:
    """Another kind of profile that `data` is, by its top-level keys, when it is not a `cls`:
    a profile given to the wrong workflow is one sentence, not a page of field errors."""
    keys = set(data)
    if keys <= set(cls.model_fields):
        return None  # this kind's keys: any errors are its own
    import kernelwright.profiles.loss  # noqa: F401  every kind is a candidate, loaded or not

    fits = [
        other
        for other in _all_kinds()
        if other is not cls
        and keys <= set(other.model_fields)
        and {n for n, f in other.model_fields.items() if f.is_required()} <= keys
    ]
    return min(fits, key=lambda other: len(other.model_fields), default=None)


def _problem(err: Any, data: dict) -> str:
    """One pydantic error as one line: where (`norms[0] (LlamaRMSNorm)`) and what."""
    where, label, node = "", None, data
    for step in err["loc"]:
        if isinstance(step, int):
            where += f"[{step}]"
        else:
            where += f".{step}" if where else str(step)
        node = node[step] if isinstance(node, (dict, list)) and _has(node, step) else None
        if isinstance(step, int) and isinstance(node, dict):
            # a list item: its class or attribute name says which one it is
            names = [node.get(k) for k in ("class_name", "name", "attribute")]
            label = next((n for n in names if isinstance(n, str)), label)
    what = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        what = "unknown key (a typo?)"
    elif err["type"] == "missing":
        what = "missing (a required key)"
    elif not isinstance(err.get("input"), (dict, list)) and err["type"] != "value_error":
        what += f" (got {err['input']!r})"
    place = where or "top level"
    return f"{place} ({label}): {what}" if label else f"{place}: {what}"


def _has(node: dict | list, step: str | int) -> bool:
    if isinstance(node, dict):
        return step in node
    return isinstance(step, int) and -len(node) <= step < len(node)
