"""The `--target` of an optimize run: "full < 0.3 ms at 8192x4096" — mode, bound, shape."""

from __future__ import annotations

import re
from dataclasses import dataclass

# mode aliases a person might type
_MODES = {
    "full": "full",
    "fwd+bwd": "full",
    "forward": "forward",
    "fwd": "forward",
    "backward": "backward",
    "bwd": "backward",
}
_UNITS = {"ms": 1.0, "us": 1e-3, "µs": 1e-3, "s": 1e3}
_PATTERN = re.compile(
    r"^\s*(?P<mode>[a-z+]+)\s*(?P<op><=|<)\s*(?P<value>[0-9]*\.?[0-9]+(?:e-?[0-9]+)?)\s*"
    r"(?P<unit>ms|us|µs|s)\s+at\s+(?P<shape>[0-9]+(?:x[0-9]+)*)\s*$",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Target:
    mode: str  # "forward" | "backward" | "full"
    ms: float
    shape: str  # "8192x4096", as the bench spec labels shapes
    inclusive: bool = False  # "<=" rather than "<"

    def met(self, ms: float) -> bool:
        return ms <= self.ms if self.inclusive else ms < self.ms

    def __str__(self) -> str:
        return f"{self.mode} {'<=' if self.inclusive else '<'} {self.ms:g} ms at {self.shape}"


def parse_target(text: str) -> Target:
    """Parse "MODE < VALUE UNIT at SHAPE", e.g. "full < 0.3 ms at 8192x4096"."""
    m = _PATTERN.match(text)
    if m is None or m["mode"].lower() not in _MODES:
        raise ValueError(
            f"cannot read target {text!r}: write it as 'MODE < VALUE UNIT at SHAPE', e.g. "
            f"'full < 0.3 ms at 8192x4096' (MODE: forward, backward or full; UNIT: ms or us)"
        )
    ms = float(m["value"]) * _UNITS[m["unit"].lower()]
    if ms <= 0:
        raise ValueError(f"target {text!r}: the time bound must be positive")
    return Target(
        mode=_MODES[m["mode"].lower()], ms=ms, shape=m["shape"].lower(), inclusive=m["op"] == "<="
    )
