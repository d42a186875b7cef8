"""What the patcher puts in place of a module's forward, as a function of one profile decision.

The analyser runs these same functions in its numerical checks on a tiny instance, so what was
checked is exactly what gets patched. Each builder returns a plain function:

    norm_forward(d)(module, x)                 -> the norm module's output
    mlp_forward(d)(module, x)                  -> the MLP module's output
    rope_function(d)(q, k, cos, sin, unsqueeze_dim=1) -> (q_embed, k_embed), HF's signature

They read the module's own parameters and attributes (named in the decision), so the patched
model keeps its parameters, state dict and optimizer references unchanged.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from kernelwright.ops.geglu import geglu, geglu_fused
from kernelwright.ops.layer_norm import layer_norm
from kernelwright.ops.relu_squared import relu_squared
from kernelwright.ops.rms_norm import rms_norm
from kernelwright.ops.rope import rope
from kernelwright.ops.swiglu import swiglu, swiglu_fused
from kernelwright.profiles.model import MLPDecision, NormDecision, RopeDecision

# gated activation -> (separate gate/up kernel, fused [gate | up] kernel)
_GATED: dict[str, tuple[Callable, Callable]] = {
    "swiglu": (swiglu, swiglu_fused),
    "geglu_tanh": (
        lambda g, u: geglu(g, u, approximate="tanh"),
        lambda x: geglu_fused(x, approximate="tanh"),
    ),
    "geglu_erf": (
        lambda g, u: geglu(g, u, approximate="none"),
        lambda x: geglu_fused(x, approximate="none"),
    ),
}


def _require(decision, *fields: str) -> None:
    if decision.status != "patch":
        raise ValueError(
            f"{type(decision).__name__} for {getattr(decision, 'class_name', '?')} has status "
            f"{decision.status!r}; only 'patch' decisions can be applied"
        )
    missing = [f for f in fields if getattr(decision, f) is None]
    if missing:
        raise ValueError(
            f"{type(decision).__name__} for {getattr(decision, 'class_name', '?')} is marked "
            f"'patch' but lacks {missing}; re-run the analyser or mark it unsupported"
        )


def norm_forward(d: NormDecision, *, in_place_backward: bool = False) -> Callable:
    """forward(module, x) for one norm class. `in_place_backward` only for uses proven safe."""
    _require(d, "kind", "eps_attribute", "weight_attribute")
    eps_attr, w_attr, b_attr, offset = (
        d.eps_attribute,
        d.weight_attribute,
        d.bias_attribute,
        d.offset,
    )
    if d.kind == "rms_norm":
        _require(d, "casting_mode")
        mode = d.casting_mode

        def forward(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
            w = getattr(module, w_attr)
            return rms_norm(
                x,
                w,
                getattr(module, eps_attr),
                offset=offset,
                casting_mode=mode,
                in_place_backward=in_place_backward,
            )

        return forward

    def forward(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        w = getattr(module, w_attr)
        if w is not None and offset:
            w = w + offset  # Nemotron's LayerNorm1P: the scale is (1 + weight)
        b = getattr(module, b_attr) if b_attr else None
        return layer_norm(x, w, b, getattr(module, eps_attr))

    return forward


def mlp_forward(d: MLPDecision) -> Callable:
    """forward(module, x) for one MLP class: projections by attribute name, our activation."""
    _require(d, "activation", "layout", "down_attribute")
    down = d.down_attribute
    if d.layout == "non_gated":
        _require(d, "up_attribute")
        if d.activation != "relu_squared":
            raise ValueError(f"MLPDecision {d.class_name}: non-gated layout needs relu_squared")
        up = d.up_attribute

        def forward(module, x):
            return getattr(module, down)(relu_squared(getattr(module, up)(x)))

        return forward
    if d.activation not in _GATED:
        raise ValueError(f"MLPDecision {d.class_name}: {d.activation!r} is not a gated activation")
    separate, fused = _GATED[d.activation]
    if d.layout == "fused_gate_up":
        _require(d, "gate_up_attribute")
        gate_up = d.gate_up_attribute

        def forward(module, x):
            return getattr(module, down)(fused(getattr(module, gate_up)(x)))

        return forward
    _require(d, "gate_attribute", "up_attribute")
    gate, up = d.gate_attribute, d.up_attribute

    def forward(module, x):
        return getattr(module, down)(separate(getattr(module, gate)(x), getattr(module, up)(x)))

    return forward


def rope_function(d: RopeDecision) -> Callable:
    """A drop-in for the modeling file's apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)."""
    _require(d, "variant")
    interleaved = d.variant == "interleaved"

    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim: int = 1):
        return rope(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim, interleaved=interleaved)

    return apply_rotary_pos_emb
