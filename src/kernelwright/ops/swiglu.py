"""SwiGLU: c = silu(gate) * up, elementwise over tensors of identical shape [..., N].

Numerics as Hugging Face's MLP writes it, `act_fn(gate_proj(x)) * up_proj(x)`: the kernel
computes in fp32, rounds silu(gate) to the input dtype (the activation's output tensor), then
multiplies by up in fp32 and rounds once. The backward is the gradient of that same
computation as eager autograd takes it, with silu recomputed from gate (only gate and up are
saved; the activation is never stored):
    s = sigmoid(a),  h = round(silu(a)),  dh = round(dc * b)
    da = dh * s * (1 + a * (1 - s)),  db = dc * h
In fp32 every round() is the identity. In fp16/bf16 the roundings sit where eager PyTorch puts
them, so results agree with eager to the last bit except for ~1 in 10^4 elements (1 ulp), where
the fast fp32 sigmoid differs from PyTorch's in its last bits.

Two forms share the gated family's kernels (ops/_gated.py, ACTIVATION="silu"):
- `swiglu(gate, up)`: separate tensors (the outputs of gate_proj and up_proj).
- `swiglu_fused(x)`: x = [gate | up] along the last dimension (a fused gate_up_proj). The halves
  are two row-strided views of x, so nothing is split or copied, and the backward writes the
  one [..., 2N] gradient directly.

Layer order: launchers → `swiglu`/`swiglu_fused` → `SwiGLU`/`SwiGLUFused` → references.
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

# --------------------------------------------------------------------------- launchers


def swiglu_fwd_launch(
    a: torch.Tensor,  # gate [M, N], stride(1) == 1
    b: torch.Tensor,  # up [M, N], stride(1) == 1
    c: torch.Tensor,  # out [M, N], stride(1) == 1
    config: LaunchConfig | None = None,
) -> None:
    gated_fwd_launch("silu", a, b, c, config)


def swiglu_bwd_launch(
    dc: torch.Tensor,  # [M, N], stride(1) == 1 (row stride may be 0: an expanded gradient)
    a: torch.Tensor,  # gate [M, N]
    b: torch.Tensor,  # up [M, N]
    da: torch.Tensor,  # [M, N]; may be a itself (in-place backward)
    db: torch.Tensor,  # [M, N]; may be b itself
    config: LaunchConfig | None = None,
) -> None:
    gated_bwd_launch("silu", dc, a, b, da, db, config)


def swiglu_fused_fwd_launch(
    x: torch.Tensor,  # [M, 2N] = [gate | up], stride(1) == 1
    c: torch.Tensor,  # [M, N]
    config: LaunchConfig | None = None,
) -> None:
    gated_fused_fwd_launch("silu", x, c, config)


def swiglu_fused_bwd_launch(
    dc: torch.Tensor,  # [M, N]
    x: torch.Tensor,  # [M, 2N]
    dx: torch.Tensor,  # [M, 2N]: [da | db]
    config: LaunchConfig | None = None,
) -> None:
    gated_fused_bwd_launch("silu", dc, x, dx, config)


# --------------------------------------------------------------------------- public API


def swiglu(
    gate: torch.Tensor, up: torch.Tensor, *, in_place_backward: bool = False
) -> torch.Tensor:
    """silu(gate) * up, forward and backward in Triton, rounded as Hugging Face's MLP rounds.

    Args:
        gate: [..., N] float32/float16/bfloat16 (any leading dims, any layout), on a CUDA GPU
            (CPU under TRITON_INTERPRET=1).
        up: same shape, dtype and device as gate.
        in_place_backward: write the gradient of gate into gate's storage and that of up into
            up's, saving two [..., N] buffers (what Liger Kernel always does). UNSAFE when gate
            or up is read by anything after this forward — another op, a second backward, a
            residual — since it will see gradients instead of activations. Ignored under
            torch.compile, and when gate/up are not views the kernel can write through (a
            copy was needed, rows overlap, or gate and up share elements).
    """
    return gated("silu", gate, up, in_place_backward)


def swiglu_fused(x: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for x = [gate | up] along the last dim (a fused gate_up_proj output).

    Args:
        x: [..., 2N] float32/float16/bfloat16; the first N columns are gate, the last N up.
    Returns:
        [..., N] in x's dtype. The gradient of x is one [..., 2N] tensor.
    """
    return gated_fused("silu", x)


class SwiGLU(torch.nn.Module):
    """The gated activation of a Llama-style MLP: `forward(gate, up) = silu(gate) * up`."""

    def __init__(self, *, in_place_backward: bool = False):
        super().__init__()
        self.in_place_backward = in_place_backward

    def forward(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return swiglu(gate, up, in_place_backward=self.in_place_backward)

    def extra_repr(self) -> str:
        return f"in_place_backward={self.in_place_backward}"


class SwiGLUFused(torch.nn.Module):
    """The same on a fused gate_up_proj output: `forward(x)` with x = [gate | up]."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return swiglu_fused(x)


# --------------------------------------------------------------------------- references


def swiglu_ref(
    gate: torch.Tensor, up: torch.Tensor, *, in_place_backward: bool = False
) -> torch.Tensor:
    """fp32 reference (differentiable), no intermediate rounding."""
    del in_place_backward  # changes where gradients are written, not their values
    return F.silu(gate.float()) * up.float()


def swiglu_fused_ref(x: torch.Tensor) -> torch.Tensor:
    """fp32 reference of `swiglu_fused` (differentiable)."""
    gate, up = x.float().chunk(2, dim=-1)
    return F.silu(gate) * up


def swiglu_eager(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """Eager PyTorch as Hugging Face writes it (the `torch` provider)."""
    return F.silu(gate) * up


def swiglu_fused_eager(x: torch.Tensor) -> torch.Tensor:
    """Eager PyTorch on a fused gate_up_proj output, as Phi-3 writes it."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up
