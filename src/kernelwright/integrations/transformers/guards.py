"""Before a forward is replaced: does this instance compute what the profile says?

A profile is made from one config; another checkpoint of the same class may differ (another
`hidden_act`, a class with its own expert gate). Each check returns None when the kernel computes
exactly what the instance computes, else the reason it is left alone.
"""

from __future__ import annotations

import ast
import inspect
import textwrap

import torch
from transformers.activations import ACT2FN


def activation_matches(module: torch.nn.Module, hidden_act: str | None) -> str | None:
    """None when the MLP's activation module computes `hidden_act`, else why not.

    The profile was made from one config; another checkpoint of the same class may set another
    hidden_act, and a swiglu kernel on a gelu MLP would train silently wrong. Compared by value
    on a probe (aliases such as silu/swish are different classes with the same function).
    """
    if hidden_act is None or hidden_act not in ACT2FN:
        return None
    acts = [
        c
        for c in module.children()
        if type(c).__module__ in ("transformers.activations", "torch.nn.modules.activation")
    ]
    if not acts:
        return None  # nothing to compare: the analyser's evidence stands
    probe = torch.linspace(-6.0, 6.0, 97)
    want = ACT2FN[hidden_act](probe)
    for act in acts:
        with torch.no_grad():
            got = act(probe)
        if got.shape == want.shape and torch.allclose(got, want, rtol=1e-5, atol=1e-6):
            return None
    names = ", ".join(type(a).__name__ for a in acts)
    return f"its activation ({names}) does not compute the profile's hidden_act={hidden_act!r}"


def experts_unsupported(module: torch.nn.Module) -> str | None:
    """None when `moe_experts` computes exactly what this stacked-experts instance computes.

    The flags are the ones `@use_experts_implementation` sets on the instance; a class with its
    own `_apply_gate` (gpt-oss clamps and offsets it) or a non-silu act_fn is left alone. The
    reason names every flag that differs and quotes an own `_apply_gate`.
    """
    from transformers.integrations.moe import _default_apply_gate

    flags = {"has_gate": True, "has_bias": False, "is_transposed": False, "is_concatenated": True}
    got = {flag: getattr(module, flag, None) for flag in flags}
    if all(v is None for v in got.values()):
        return (
            f"{type(module).__name__} is not a @use_experts_implementation experts class (it "
            f"sets none of {', '.join(flags)}); moe_experts replaces only those"
        )
    wrong = [flag for flag, want in flags.items() if got[flag] is not want]
    problems = []
    if wrong:
        problems.append(
            ", ".join(f"{f}={got[f]!r}" for f in wrong)
            + " (moe_experts needs "
            + ", ".join(f"{f}={flags[f]}" for f in wrong)
            + ")"
        )
    gate = getattr(type(module), "_apply_gate", None)
    if gate is None:
        problems.append(f"{type(module).__name__} has no _apply_gate")
    elif gate is not _default_apply_gate:
        problems.append(_own_gate(type(module), gate))
    if problems:
        return "; ".join(problems)
    gu, down = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    if not isinstance(gu, torch.Tensor) or not isinstance(down, torch.Tensor):
        return "it has no gate_up_proj/down_proj tensors"
    if gu.dim() != 3 or down.dim() != 3 or gu.shape[1] != 2 * down.shape[2]:
        return (
            f"gate_up_proj {tuple(gu.shape)} / down_proj {tuple(down.shape)} are not "
            "[E, 2I, H] / [E, H, I]"
        )
    names = tuple(inspect.signature(inspect.unwrap(type(module).forward)).parameters)
    if names != ("self", "hidden_states", "top_k_index", "top_k_weights"):
        return f"its forward{names} is not HF's (hidden_states, top_k_index, top_k_weights)"
    act = getattr(module, "act_fn", None)
    if not callable(act):
        return "it has no act_fn"
    probe = torch.linspace(-6.0, 6.0, 97)
    with torch.no_grad():
        got = act(probe)
    if not torch.allclose(got, torch.nn.functional.silu(probe), rtol=1e-5, atol=1e-6):
        return f"its act_fn ({type(act).__name__}) does not compute silu"
    return None


def _own_gate(cls: type, gate) -> str:
    """What a class's own `_apply_gate` computes, quoted from its source (its statements, without
    comments), against the act_fn(gate) * up that moe_experts computes."""
    head = f"{cls.__name__}._apply_gate is its own, not HF's act_fn(gate) * up"
    try:
        fdef = ast.parse(textwrap.dedent(inspect.getsource(inspect.unwrap(gate)))).body[0]
    except (OSError, TypeError, SyntaxError, IndexError):
        return head
    body = [
        ast.unparse(stmt)
        for stmt in getattr(fdef, "body", [])
        if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant))  # docstring
    ]
    return f"{head}: {'; '.join(body)}" if body else head


# (alpha attribute or None for 1, limit attribute) as the experts classes name them
_GATE_ATTRS = (("alpha", "limit"), ("swiglu_alpha", "swiglu_limit"), (None, "swiglu_limit"))
_GATE_ATTRS += ((None, "limit"),)


def clamped_gate(module: torch.nn.Module) -> tuple[dict | None, str]:
    """(spec, evidence) when the class's own `_apply_gate` computes `swiglu_clamped_fused` with
    spec = (alpha, limit, up_offset, interleaved), else (None, why not).

    alpha and limit are read from the instance's attributes; up_offset (1 or 0) and the layout
    (interleaved or halves) are found by running the class's `_apply_gate` on a sample input
    whose values lie on both sides of +-limit, forward and backward (clamp's zero gradients
    included), against the fp32 reference. Only a candidate that reproduces both is accepted.
    """
    from kernelwright.ops.swiglu_clamped import swiglu_clamped_fused_ref

    gate = getattr(type(module), "_apply_gate", None)
    if gate is None:
        return None, f"{type(module).__name__} has no _apply_gate"
    specs = []
    for alpha_name, limit_name in _GATE_ATTRS:
        limit = getattr(module, limit_name, None)
        alpha = getattr(module, alpha_name, None) if alpha_name else 1.0
        if not _number(limit) or not _number(alpha) or not 0 < limit < float("inf"):
            continue
        for up_offset in (1.0, 0.0):
            for interleaved in (True, False):
                spec = dict(alpha=float(alpha), limit=float(limit), up_offset=up_offset)
                specs.append({**spec, "interleaved": interleaved})
    if not specs:
        return None, "no numeric alpha/limit (or swiglu_alpha/swiglu_limit) attribute"
    gen = torch.Generator().manual_seed(0)
    limit = specs[0]["limit"]
    x = ((torch.rand(4, 2 * 24, generator=gen) * 4 - 2) * limit).requires_grad_()
    dc = torch.randn(4, 24, generator=gen)
    try:
        want = gate(module, x)
        (want_dx,) = torch.autograd.grad(want, x, dc)
    except Exception as e:  # a gate that cannot run on a plain [rows, 2I] tensor
        return None, f"its _apply_gate raised {type(e).__name__} on a sample input"
    for spec in specs:
        got = swiglu_clamped_fused_ref(x, **spec)
        if got.shape != want.shape:
            continue
        (got_dx,) = torch.autograd.grad(got, x, dc)
        scale = max(1.0, want.abs().max().item(), want_dx.abs().max().item())
        err = max((got - want).abs().max().item(), (got_dx - want_dx).abs().max().item())
        if err <= 1e-5 * scale:
            return spec, f"_apply_gate matches swiglu_clamped {spec} (max |diff| {err:.1e})"
    return None, _own_gate(type(module), gate) + " (not a clamped SwiGLU swiglu_clamped computes)"


def _number(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)
