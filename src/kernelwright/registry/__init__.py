"""The op registry: one entry per op, read by `demo`, `bench`, `optimize`, autopatch and the CLI.

    from kernelwright import registry
    entry = registry.get("rms_norm")          # OpEntry; an unknown name lists the known ones
    entry.fn(), entry.ref(), entry.cls()      # rms_norm, rms_norm_ref, RMSNorm (imported now)
    registry.names()                          # every op, the generated ones included

A generated op made with `create --into-library --implements OP` is also the "created"
implementation of library op OP: `get(OP)` and `entries()` list it after kernelwright's kernel.

Entries hold names, not objects: nothing here imports a kernel until a callable is asked for.
This package sits just above `ops/` and `runtime/`; it imports nothing above them. Adding an
op: docs/adding-an-op.md.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence

from kernelwright.registry.catalog import DEFAULT_SHAPES, ENTRIES
from kernelwright.registry.entry import (
    INDUCTOR,
    Capability,
    DemoCase,
    HFPattern,
    Impl,
    OpEntry,
    UnknownOpError,
    import_module,
    parse_dtype,
    resolve,
    unknown_op,
    unsupported,
)
from kernelwright.registry.generated import created_impl, discover

__all__ = [
    "DEFAULT_SHAPES",
    "INDUCTOR",
    "Capability",
    "DemoCase",
    "HFPattern",
    "Impl",
    "OpEntry",
    "UnknownOpError",
    "benchmarked",
    "entries",
    "get",
    "hf_activations",
    "import_module",
    "mlp_kernels",
    "names",
    "parse_dtype",
    "resolve",
    "tuned",
    "unknown_op",
    "unsupported",
    "with_created",
]


def entries(*, generated: bool = True) -> tuple[OpEntry, ...]:
    """Every op: the library's, then (with `generated`) those `create --into-library` added."""
    extra = discover() if generated else []
    taken = {e.name for e in ENTRIES}
    own = tuple(with_created(e, extra) for e in ENTRIES)
    return own + tuple(e for e in extra if e.name not in taken)


def names(*, generated: bool = True) -> list[str]:
    return [e.name for e in entries(generated=generated)]


def get(name: str) -> OpEntry:
    """The entry of op `name`; an unknown name raises `UnknownOpError` listing the known ops."""
    extra = discover()
    for e in ENTRIES:
        if e.name == name:
            return with_created(e, extra)
    for e in extra:
        if e.name == name:
            return e
    raise unknown_op(name, names())


def with_created(entry: OpEntry, generated: Sequence[OpEntry]) -> OpEntry:
    """`entry` with the created implementation of the first generated op (by name) that
    implements it, placed after kernelwright's kernel: ties go to kernelwright, then created."""
    maker = next((g for g in generated if g.implements == entry.name), None)
    if maker is None or any(i.name == "created" for i in entry.impls):
        return entry
    impls = list(entry.impls)
    at = 1 if impls and impls[0].name == "kernelwright" else 0
    impls.insert(at, created_impl(maker))
    return dataclasses.replace(entry, impls=tuple(impls))


def benchmarked() -> list[str]:
    """The benchmark spec names the ops declare, in registry order (created ops last)."""
    return [e.bench for e in entries() if e.bench]


def tuned() -> list[str]:
    """The ops with a launch-config table (what the optimize workflow can retune), created
    ops included."""
    return [e.name for e in entries() if e.table]


def hf_activations() -> dict[str, str]:
    """A config's `hidden_act` value -> the MLP activation decision whose kernel replaces it."""
    return {
        value: p.decision
        for e in ENTRIES
        for p in e.replaces
        if p.kind == "mlp"
        for value in p.config_values
    }


def mlp_kernels(*, gated: bool = True) -> dict[str, tuple[Callable, Callable | None]]:
    """MLP activation decision -> (its kernel on separate inputs, on the fused [gate | up]
    input or None), with the decision's options bound; imports the ops. `gated`: only the
    decisions that have a fused form (the gated activations)."""
    out: dict[str, tuple[Callable, Callable | None]] = {}
    for e in ENTRIES:
        for p in e.replaces:
            if p.kind != "mlp" or (gated and p.fused is None):
                continue
            fused = e.attr(p.fused) if p.fused else None
            out[p.decision] = (
                _bind(e.fn(), p.kwargs),
                _bind(fused, p.kwargs) if fused is not None else None,
            )
    return out


def _bind(fn: Callable, kwargs) -> Callable:
    return functools.partial(fn, **kwargs) if kwargs else fn
