"""Before a forward is replaced: does this instance compute what the profile says?

A profile is made from one config; another checkpoint of the same class may differ (another
`hidden_act`, a class with its own expert gate). Each check returns None when the kernel computes
exactly what the instance computes, else the reason it is left alone.
"""

from __future__ import annotations

import inspect

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
    own `_apply_gate` (gpt-oss clamps and offsets it) or a non-silu act_fn is left alone.
    """
    from transformers.integrations.moe import _default_apply_gate

    flags = {"has_gate": True, "has_bias": False, "is_transposed": False, "is_concatenated": True}
    for flag, want in flags.items():
        got = getattr(module, flag, None)
        if got is not want:
            return f"{flag}={got!r} (moe_experts needs {flag}={want})"
    gate = getattr(type(module), "_apply_gate", None)
    if gate is not _default_apply_gate:
        return "its class defines its own _apply_gate (not HF's act_fn(gate) * up)"
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
