"""The starting values of a module reference's parameters, for the generated nn.Module.

Understand records each parameter's starting value, as the reference's `__init__` leaves it, in
one profile note: `parameter init: <name> = zeros | ones | full(<value>)` for a tensor holding
one value throughout (a Gemma norm's zeros under `1 + weight`, a LayerNorm's ones), `= own
values` for anything else (a random init). The generated module starts each parameter there;
one of its own values starts at ones, and the module's docstring says to load the reference's
state_dict. A reviewer may edit the note.
"""

from __future__ import annotations

import re

import torch

from kernelwright.profiles.kernel import KernelProfile

_NOTE = re.compile(r"^parameter init: (\w+) = (zeros|ones|full\(([^()]*)\)|own values)")


def init_notes(names: list[str], params: list[torch.Tensor]) -> list[str]:
    """One note per parameter: its starting value."""
    notes = []
    for name, t in zip(names, params, strict=True):
        flat = t.detach().flatten()
        value = "own values"
        if flat.numel() and t.is_floating_point() and bool((flat == flat[0]).all()):
            c = float(flat[0])
            value = "zeros" if c == 0 else "ones" if c == 1 else f"full({c!r})"
        notes.append(f"parameter init: {name} = {value}")
    return notes


def inits(profile: KernelProfile) -> tuple[dict[str, str], list[str]]:
    """Per parameter, the torch call making its starting value, `{}` standing for its shape;
    and the parameters that start at ones for want of a note saying where (own values)."""
    out = {s.name: "torch.ones({})" for s in profile.inputs if s.role == "parameter"}
    known = set()
    for note in profile.notes:
        m = _NOTE.match(note)
        if not m or m.group(1) not in out or m.group(2) == "own values":
            continue
        kind, value = m.group(2), m.group(3)
        out[m.group(1)] = (
            f"torch.{kind}({{}})" if value is None else f"torch.full({{}}, {float(value)!r})"
        )
        known.add(m.group(1))
    return out, [name for name in out if name not in known]
