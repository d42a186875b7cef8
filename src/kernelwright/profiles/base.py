"""What every profile shares: strict fields, and YAML on disk with a schema version."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import yaml
from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    """A profile part: unknown keys are errors (a typo in a reviewed YAML must not vanish)."""

    model_config = ConfigDict(extra="forbid")


class YamlProfile(Strict):
    """A top-level profile: `schema_version` plus YAML round trip, save and load."""

    # the workflow command that regenerates this kind of profile, for the version error
    REGENERATE: ClassVar[str] = "kernelwright"

    def to_yaml(self) -> str:
        # python mode: json mode would write inf and nan (graph constants) as null
        return yaml.safe_dump(self.model_dump(), sort_keys=False, width=100)

    @classmethod
    def from_yaml(cls, text: str):
        data = yaml.safe_load(text)
        name = cls.__name__
        if not isinstance(data, dict):
            raise ValueError(f"{name} YAML must be a mapping at the top level")
        expected = cls.model_fields["schema_version"].default
        version = data.get("schema_version", expected)
        if version != expected:
            raise ValueError(
                f"{name} schema_version {version} is not supported by this kernelwright "
                f"(expects {expected}); re-run `{cls.REGENERATE}` to regenerate it"
            )
        return cls.model_validate(data)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_yaml())
        return path

    @classmethod
    def load(cls, path: str | Path):
        return cls.from_yaml(Path(path).read_text())
