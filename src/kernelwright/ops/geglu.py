"""GeGLU: c = gelu(gate) * up, elementwise over tensors of identical shape [..., N].

Numerics as Hugging Face's MLP writes it, `act_fn(gate_proj(x)) * up_proj(x)` with `act_fn`
either `gelu_pytorch_tanh` (Gemma; approximate="tanh") or the exact erf `gelu`
(approximate="none"): the kernel computes in fp32, rounds gelu(gate) to the input dtype (the
activation's output tensor), multiplies by up in fp32 and rounds once. The formulas are
PyTorch's own, term for term, so the roundings land where eager's do:
    tanh:  u = k * (a + 0.044715 * a^3),  t = tanh(u),  k = sqrt(2/pi)
           gelu(a)  = 0.5 * a * (1 + t)
           gelu'(a) = 0.5 * (1 + t) + 0.5 * a * (1 - t^2) * k * (1 + 3 * 0.044715 * a^2)
    erf:   cdf = 0.5 * (1 + erf(a / sqrt(2))),  pdf = exp(-a^2 / 2) / sqrt(2 pi)
           gelu(a)  = a * cdf,  gelu'(a) = cdf + a * pdf
The backward recomputes gelu and gelu' from gate in fp32 (only gate and up are saved) and
rounds where eager autograd does:
    h = round(gelu(a)),  dh = round(dc * b),  da = dh * gelu'(a),  db = dc * h
Triton has no portable tanh (libdevice is GPU-only, `tl.math` has none), so
tanh(u) = 2 * sigmoid(2u) - 1: exact algebra, and in the far negative tail, where eager's
1 + tanh(u) cancels, the fp32 rounding of 2 * sigmoid(2u) - 1 cancels the same way.

Two forms share the gated family's kernels (ops/_gated.py, ACTIVATION="gelu_tanh" or
"gelu_erf"):
- `geglu(gate, up)`: separate tensors (the outputs of gate_proj and up_proj).
- `geglu_fused(x)`: x = [gate | up] along the last dimension (a fused gate_up_proj). The halves
  are two row-strided views of x, so nothing is split or copied.

Layer order: launchers → `geglu`/`geglu_fused` → `GeGLU`/`GeGLUFused` → references.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernelwright.ops._gated import (
    _gated_bwd_kernel,
    _gated_fwd_kernel,
    gated,
    gated_bwd_launch,
    gated_fused,
    gated_fused_bwd_launch,
    gated_fused_fwd_launch,
    gated_fwd_launch,
)
from kernelwright.runtime.launch import LaunchConfig

# The family's kernels, named here too: the optimize workflow profiles the Triton kernels it
# finds in an op's module (workflows/optimize/resources.py).
KERNELS = (_gated_fwd_kernel, _gated_bwd_kernel)

APPROXIMATIONS = ("tanh", "none")
_ACTIVATION = {"tanh": "gelu_tanh", "none": "gelu_erf"}  # F.gelu's approximate -> ACTIVATION

# --------------------------------------------------------------------------- launchers


def _activation(op: str, approximate: object) -> str:
    # F.gelu's `approximate` -> the family's ACTIVATION, with an error that names the op
    if approximate not in APPROXIMATIONS:
        raise ValueError(
            f"{op}: argument 'approximate' must be one of {APPROXIMATIONS} (as F.gelu: 'tanh' "
            f"for gelu_pytorch_tanh, 'none' for the erf gelu), got {approximate!r}"
        )
    return _ACTIVATION[approximate]


def geglu_fwd_launch(
    a: torch.Tensor,  # gate [M, N], stride(1) == 1
    b: torch.Tensor,  # up [M, N], stride(1) == 1
    c: torch.Tensor,  # out [M, N], stride(1) == 1
    approximate: str = "tanh",
    config: LaunchConfig | None = None,
) -> None:
    gated_fwd_launch(_activation("geglu", approximate), a, b, c, config)


def geglu_bwd_launch(
    dc: torch.Tensor,  # [M, N], stride(1) == 1 (row stride may be 0: an expanded gradient)
    a: torch.Tensor,  # gate [M, N]
    b: torch.Tensor,  # up [M, N]
    da: torch.Tensor,  # [M, N]; may be a itself (in-place backward)
    db: torch.Tensor,  # [M, N]; may be b itself
    approximate: str = "tanh",
    config: LaunchConfig | None = None,
) -> None:
    gated_bwd_launch(_activation("geglu", approximate), dc, a, b, da, db, config)


def geglu_fused_fwd_launch(
    x: torch.Tensor,  # [M, 2N] = [gate | up], stride(1) == 1
    c: torch.Tensor,  # [M, N]
    approximate: str = "tanh",
    config: LaunchConfig | None = None,
) -> None:
    gated_fused_fwd_launch(_activation("geglu", approximate), x, c, config)


def geglu_fused_bwd_launch(
    dc: torch.Tensor,  # [M, N]
    x: torch.Tensor,  # [M, 2N]
    dx: torch.Tensor,  # [M, 2N]: [da | db]
    approximate: str = "tanh",
    config: LaunchConfig | None = None,
) -> None:
    gated_fused_bwd_launch(_activation("geglu", approximate), dc, x, dx, config)


# --------------------------------------------------------------------------- public API


def geglu(
    gate: torch.Tensor,
    up: torch.Tensor,
    *,
    approximate: str = "tanh",
    in_place_backward: bool = False,
) -> torch.Tensor:
    """gelu(gate) * up, forward and backward in Triton, rounded as Hugging Face's MLP rounds.

    Args:
        gate: [..., N] float32/float16/bfloat16 (any leading dims, any layout), on a CUDA GPU
            (CPU under TRITON_INTERPRET=1).
        up: same shape, dtype and device as gate.
        approximate: "tanh" (gelu_pytorch_tanh, Gemma) or "none" (exact erf gelu).
        in_place_backward: write the gradient of gate into gate's storage and that of up into
            up's (see `kernelwright.ops.swiglu.swiglu`: UNSAFE when gate or up is read after
            this forward). Ignored under torch.compile and when the kernel cannot write
            through gate/up (a copy was needed, rows overlap, or they share elements).
    """
    return gated(_activation("geglu", approximate), gate, up, in_place_backward)


def geglu_fused(x: torch.Tensor, *, approximate: str = "tanh") -> torch.Tensor:
    """gelu(gate) * up for x = [gate | up] along the last dim (a fused gate_up_proj output).

    Args:
        x: [..., 2N] float32/float16/bfloat16; the first N columns are gate, the last N up.
        approximate: "tanh" or "none", as in `geglu`.
    Returns:
        [..., N] in x's dtype. The gradient of x is one [..., 2N] tensor.
    """
    return gated_fused(_activation("geglu_fused", approximate), x)


class GeGLU(torch.nn.Module):
    """The gated activation of a Gemma-style MLP: `forward(gate, up) = gelu(gate) * up`."""

    def __init__(self, *, approximate: str = "tanh", in_place_backward: bool = False):
        super().__init__()
        _activation("GeGLU", approximate)  # raises on an unknown form
        self.approximate = approximate
        self.in_place_backward = in_place_backward

    def forward(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return geglu(
            gate, up, approximate=self.approximate, in_place_backward=self.in_place_backward
        )

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}, in_place_backward={self.in_place_backward}"


class GeGLUFused(torch.nn.Module):
    """The same on a fused gate_up_proj output: `forward(x)` with x = [gate | up]."""

    def __init__(self, *, approximate: str = "tanh"):
        super().__init__()
        _activation("GeGLUFused", approximate)  # raises on an unknown form
        self.approximate = approximate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return geglu_fused(x, approximate=self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


# --------------------------------------------------------------------------- references


def geglu_ref(
    gate: torch.Tensor,
    up: torch.Tensor,
    *,
    approximate: str = "tanh",
    in_place_backward: bool = False,
) -> torch.Tensor:
    """fp32 reference (differentiable), no intermediate rounding."""
    del in_place_backward  # changes where gradients are written, not their values
    return F.gelu(gate.float(), approximate=approximate) * up.float()


def geglu_fused_ref(x: torch.Tensor, *, approximate: str = "tanh") -> torch.Tensor:
    """fp32 reference of `geglu_fused` (differentiable)."""
    gate, up = x.float().chunk(2, dim=-1)
    return F.gelu(gate, approximate=approximate) * up


def geglu_eager(gate: torch.Tensor, up: torch.Tensor, approximate: str = "tanh") -> torch.Tensor:
    """Eager PyTorch as Hugging Face writes it (the `torch` provider)."""
    return F.gelu(gate, approximate=approximate) * up


def geglu_fused_eager(x: torch.Tensor, approximate: str = "tanh") -> torch.Tensor:
    """Eager PyTorch on a fused gate_up_proj output."""
    gate, up = x.chunk(2, dim=-1)
    return F.gelu(gate, approximate=approximate) * up
