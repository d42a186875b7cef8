"""What the patcher puts in place of a module's forward, as a function of one profile decision.

The analyser runs these same functions in its numerical checks on a tiny instance, so what was
checked is exactly what gets patched. Each builder returns a plain function:

    norm_forward(d)(module, x)                 -> the norm module's output
    mlp_forward(d)(module, x)                  -> the MLP module's output
    rope_function(d)(q, k, cos, sin, unsqueeze_dim=1) -> (q_embed, k_embed), HF's signature
    experts_forward(module, hidden_states, top_k_index, top_k_weights)  stacked SwiGLU experts
    clamped_gate(spec)(module, gate_up)        -> an experts class's own clamped `_apply_gate`

They read the module's own parameters and attributes (named in the decision), so the patched
model keeps its parameters, state dict and optimizer references unchanged.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.autograd.function import once_differentiable

from kernelwright import registry
from kernelwright.ops.layer_norm import layer_norm
from kernelwright.ops.moe_experts import moe_experts
from kernelwright.ops.relu_squared import relu_squared
from kernelwright.ops.rms_norm import rms_norm
from kernelwright.ops.rope import rope
from kernelwright.ops.swiglu_clamped import swiglu_clamped_fused
from kernelwright.profiles.model import MLPDecision, NormDecision, RopeDecision

# gated activation -> (separate gate/up kernel, fused [gate | up] kernel), options bound, as the
# ops' registry entries declare them (HFPattern)
_GATED: dict[str, tuple[Callable, Callable]] = registry.mlp_kernels()


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


class _ActThenLinear(torch.autograd.Function):
    """y = linear(act(*inputs), weight, bias), saving act's inputs and not its output.

    The activation output h ([tokens, intermediate], the largest activation of a decoder layer)
    is what nn.Linear would save for its weight gradient. Here the backward recomputes it from
    the inputs the activation kernel saves anyway, one elementwise pass (our kernel again):
        dW = dy^T h,  db = sum(dy),  dh = dy W,  d inputs = act's backward(dh)
    The matmuls are the same two cuBLAS calls nn.Linear's backward makes.
    """

    @staticmethod
    def forward(ctx, act, weight, bias, *inputs):
        with torch.no_grad():
            h = act(*inputs)
        ctx.act, ctx.has_bias = act, bias is not None
        ctx.save_for_backward(weight, *inputs)
        return torch.nn.functional.linear(h, weight, bias)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        weight, *inputs = ctx.saved_tensors
        leaves = [
            t.detach().requires_grad_(ctx.needs_input_grad[3 + i]) for i, t in enumerate(inputs)
        ]
        with torch.enable_grad():
            h = ctx.act(*leaves)
        dy2, h2 = dy.reshape(-1, dy.shape[-1]), h.detach().reshape(-1, h.shape[-1])
        dw = dy2.t().mm(h2) if ctx.needs_input_grad[1] else None  # [out, in]
        db = dy2.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        wanted = [leaf for leaf in leaves if leaf.requires_grad]
        grads = iter(torch.autograd.grad(h, wanted, dy.matmul(weight)) if wanted else ())
        dinputs = [next(grads) if leaf.requires_grad else None for leaf in leaves]
        return (None, dw, db, *dinputs)


def _act_then_down(down: torch.nn.Module, act: Callable, *inputs: torch.Tensor) -> torch.Tensor:
    """down(act(*inputs)), recomputing act in the backward when that is exact to do by hand:
    a plain nn.Linear (not LoRA/quantised: their own forward must run), eager (under
    torch.compile the custom Function's backward would not trace), no autocast (the backward
    would not see its casts), and something to differentiate."""
    plain = (
        type(down) is torch.nn.Linear
        and not torch.compiler.is_compiling()
        and not torch.is_autocast_enabled()
        and torch.is_grad_enabled()
        and (down.weight.requires_grad or any(t.requires_grad for t in inputs))
        and all(t.dtype == down.weight.dtype for t in inputs)
    )
    if not plain:
        return down(act(*inputs))
    return _ActThenLinear.apply(act, down.weight, down.bias, *inputs)


def mlp_forward(d: MLPDecision, *, recompute: bool = True) -> Callable:
    """forward(module, x) for one MLP class: projections by attribute name, our activation.

    `recompute`: the down projection's input (the activation output) is recomputed in the
    backward instead of stored: intermediate_size x 2 bytes less per token and layer in bf16,
    for one extra elementwise pass (see `_ActThenLinear`)."""
    _require(d, "activation", "layout", "down_attribute")
    down = d.down_attribute

    def act_down(module, act, *inputs):
        if recompute:
            return _act_then_down(getattr(module, down), act, *inputs)
        return getattr(module, down)(act(*inputs))

    if d.layout == "non_gated":
        _require(d, "up_attribute")
        if d.activation != "relu_squared":
            raise ValueError(f"MLPDecision {d.class_name}: non-gated layout needs relu_squared")
        up = d.up_attribute

        def forward(module, x):
            return act_down(module, relu_squared, getattr(module, up)(x))

        return forward
    if d.activation not in _GATED:
        raise ValueError(f"MLPDecision {d.class_name}: {d.activation!r} is not a gated activation")
    separate, fused = _GATED[d.activation]
    if d.layout == "fused_gate_up":
        _require(d, "gate_up_attribute")
        gate_up = d.gate_up_attribute

        def forward(module, x):
            return act_down(module, fused, getattr(module, gate_up)(x))

        return forward
    _require(d, "gate_attribute", "up_attribute")
    gate, up = d.gate_attribute, d.up_attribute

    def forward(module, x):
        return act_down(module, separate, getattr(module, gate)(x), getattr(module, up)(x))

    return forward


def rope_function(d: RopeDecision) -> Callable:
    """A drop-in for the modeling file's apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)."""
    _require(d, "variant")
    pairing = {v: d.variant == v for v in ("interleaved", "deinterleave", "half_table")}

    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim: int = 1):
        return rope(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim, **pairing)

    return apply_rotary_pos_emb


def experts_forward(self, hidden_states, top_k_index, top_k_weights):
    return moe_experts(hidden_states, self.gate_up_proj, self.down_proj, top_k_index, top_k_weights)


def clamped_gate(spec: dict) -> Callable:
    """A drop-in for GPT-OSS-style `_apply_gate(gate_up)`: `swiglu_clamped_fused` with the
    (alpha, limit, up_offset, interleaved) that `guards.clamped_gate` proved on the instance."""
    spec = dict(spec)

    def _apply_gate(self, gate_up):
        return swiglu_clamped_fused(gate_up, **spec)

    return _apply_gate
