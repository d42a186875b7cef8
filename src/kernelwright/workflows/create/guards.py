"""What the generated op checks of its inputs at run time, beyond their dtypes and shapes
broadcasting together: the template context codegen adds for those checks.

The kernel broadcasts every input to the full [rows, cols] view before it computes, so a
reduction (or scan) along the row of an input passed with the row's dims broadcast (a mask
[B, 1] where [B, T] was traced) would count each broadcast copy, where the reference counts
the element once: the op refuses such a call instead (`row_groups`). An input the reference
takes as a bool tensor (a mask) must be one (`bools`): an integer tensor there would select by
nonzero where the reference raises.
"""

from __future__ import annotations

from kernelwright.profiles.kernel import KernelProfile
from kernelwright.workflows.create import dtypes, params
from kernelwright.workflows.create.emit import _Emitter
from kernelwright.workflows.create.lowering import _REDUCE


def row_groups(profile: KernelProfile, em: _Emitter) -> list[list[int]]:
    """Per forward reduction or scan along the row: the inputs it reads (through element-wise
    work) that were traced spanning the row (full or per-feature). At run time at least one of
    each group must still span it, or the op raises; groups of no such input are left out."""
    spans = {i for i, s in enumerate(profile.inputs) if s.broadcast in ("full", "col")}
    groups: list[list[int]] = []
    for n in em.fwd:
        if n.target not in _REDUCE or em.reduce_kind(n) != "row" or not n.args:
            continue
        names = {a.name for a in em.fwd_needed([n.args[0]]) if a.op == "placeholder"}
        group = [i for i, ph in enumerate(em.f_ph) if ph in names and i in spans]
        if group and group not in groups:
            groups.append(group)
    return sorted(groups)


def context(profile: KernelProfile, em: _Emitter) -> dict:
    """The template context of the run-time input checks, and the parameters' starting values
    (params.py)."""
    inits, unknown = params.inits(profile)
    return {
        "row_groups": row_groups(profile, em),
        "bools": dtypes.bool_inputs(profile),
        "inits": inits,
        "unknown_inits": unknown,
    }
