"""Re-create a modeling class's forward with one global swapped: how RoPE is patched.

HF attention forwards call a module-level `apply_rotary_pos_emb`; `rope_forward(cls, d)` is
`cls.forward` re-created with a globals dict in which that name is our kernel, so the modeling
module itself is never touched and other instances keep the original.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable
from typing import Any

from kernelwright.integrations.transformers import replacements
from kernelwright.integrations.transformers.forward import NotStandardForward
from kernelwright.profiles.model import RopeDecision

# the rope replacement accepts HF's apply_rotary_pos_emb signatures named here, nothing else
_ROPE_SIGNATURES = {
    ("q", "k", "cos", "sin", "unsqueeze_dim"),
    ("q", "k", "cos", "sin", "position_ids", "unsqueeze_dim"),
}


def _rope_adapter(d: RopeDecision, original: Callable) -> Callable:
    """Our rope with the modeling function's own signature (some keep a dead position_ids)."""
    names = tuple(inspect.signature(original).parameters)
    if names not in _ROPE_SIGNATURES:
        raise NotStandardForward(
            f"{d.call_name}{tuple(names)} is not HF's apply_rotary_pos_emb signature "
            "(q, k, cos, sin[, position_ids], unsqueeze_dim)"
        )
    fn = replacements.rope_function(d)
    if "position_ids" not in names:
        return fn

    def apply_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
        return fn(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)

    return apply_rotary_pos_emb


def _copy_function(f: types.FunctionType, globals_: dict, closure=None) -> types.FunctionType:
    g = types.FunctionType(
        f.__code__,
        globals_,
        f.__name__,
        f.__defaults__,
        f.__closure__ if closure is None else closure,
    )
    g.__kwdefaults__ = dict(f.__kwdefaults__) if f.__kwdefaults__ else None
    g.__dict__.update(f.__dict__)
    g.__qualname__, g.__doc__, g.__module__ = f.__qualname__, f.__doc__, f.__module__
    g.__annotations__ = f.__annotations__
    return g


def with_global(fn: Callable, name: str, value: Any) -> Callable:
    """A copy of `fn` in which the global `name` is `value`; the modeling module is untouched.

    Decorators that follow functools.wraps (`__wrapped__`, the inner function in a closure
    cell) are rebuilt around the new inner function; anything else raises NotStandardForward.
    The new globals are a snapshot of the module's dict taken now.
    """
    chain = [fn]
    while hasattr(chain[-1], "__wrapped__"):
        chain.append(chain[-1].__wrapped__)
    reads = [
        i
        for i, f in enumerate(chain)
        if isinstance(f, types.FunctionType) and name in f.__code__.co_names
    ]
    if not reads:
        raise NotStandardForward(f"{fn.__qualname__} never reads a global named {name!r}")
    i = reads[-1]
    inner = chain[i]
    new_globals = dict(inner.__globals__)
    new_globals[name] = value
    # Without __name__, torch.compile reads globals from this dict; with it, dynamo would import
    # the modeling module by that name and guard on the module's own apply_rotary_pos_emb.
    new_globals.pop("__name__", None)
    new = _copy_function(inner, new_globals)
    # rebuild each wrapper outwards: swap the closure cell that held the old inner function
    for j in range(i - 1, -1, -1):
        outer, old = chain[j], chain[j + 1]
        cells = getattr(outer, "__closure__", None) or ()
        if not isinstance(outer, types.FunctionType) or not any(_holds(c, old) for c in cells):
            raise NotStandardForward(
                f"cannot rebuild the decorator around {inner.__qualname__}: "
                f"{getattr(outer, '__qualname__', outer)!r} keeps the wrapped function elsewhere"
            )
        closure = tuple(types.CellType(new) if _holds(c, old) else c for c in cells)
        new_outer = _copy_function(outer, outer.__globals__, closure)
        new_outer.__wrapped__ = new
        new = new_outer
    return new


def _holds(cell, obj) -> bool:
    try:
        return cell.cell_contents is obj
    except ValueError:  # an empty cell holds nothing
        return False


def rope_forward(cls: type, d: RopeDecision) -> Callable:
    """cls.forward re-created so that its global `d.call_name` is our rope."""
    inner = inspect.unwrap(cls.forward)
    original = inner.__globals__.get(d.call_name)
    if original is None:
        raise NotStandardForward(f"{cls.__name__}.forward's module has no global {d.call_name!r}")
    return with_global(cls.forward, d.call_name, _rope_adapter(d, original))
