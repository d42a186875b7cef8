"""Squared ReLU: y = relu(x)^2, elementwise over a tensor [..., N].

The activation of Primer and Nemotron MLPs, written there as `torch.square(torch.relu(x))`.
Numerics as eager: relu is exact, the square is computed in fp32 and rounded once (the product
of two fp16/bf16 values is exact in fp32, so the result is the correctly rounded square, bit
for bit eager's). The backward saves x only and recomputes relu from it:
    dx = 2 * relu(x) * dy    (in fp32, rounded once; 0 where x <= 0)
Eager rounds 2 * relu(x) to the input dtype first, which is exact except that in fp16 it
overflows to inf for x >= 2^15 (where y is already inf); the kernel keeps that product finite.

Not gated (one input, no up), it runs on the gated family's kernels (ops/_gated.py,
ACTIVATION="relu_squared") with the up operand absent.

Layer order: launchers → `relu_squared` → `ReLUSquared` → references.
"""

from __future__ import annotations

import torch

from kernelwright.ops._gated import (
    _gated_bwd_kernel,
    _gated_fwd_kernel,
    gated_bwd_launch,
    gated_fwd_launch,
    single,
)
from kernelwright.runtime.launch import LaunchConfig

# The family's kernels, named here too: the optimize workflow profiles the Triton kernels it
# finds in an op's module (workflows/optimize/resources.py).
KERNELS = (_gated_fwd_kernel, _gated_bwd_kernel)

# --------------------------------------------------------------------------- launchers


def relu_squared_fwd_launch(
    x: torch.Tensor,  # [M, N], stride(1) == 1
    y: torch.Tensor,  # out [M, N], stride(1) == 1
    config: LaunchConfig | None = None,
) -> None:
    gated_fwd_launch("relu_squared", x, None, y, config)


def relu_squared_bwd_launch(
    dy: torch.Tensor,  # [M, N], stride(1) == 1 (row stride may be 0: an expanded gradient)
    x: torch.Tensor,  # [M, N]
    dx: torch.Tensor,  # [M, N]
    config: LaunchConfig | None = None,
) -> None:
    gated_bwd_launch("relu_squared", dy, x, None, dx, None, config)


# --------------------------------------------------------------------------- public API


def relu_squared(x: torch.Tensor) -> torch.Tensor:
    """relu(x)^2, forward and backward in Triton, rounded as eager `torch.square(torch.relu(x))`.

    Args:
        x: [..., N] float32/float16/bfloat16 (any leading dims, any layout), on a CUDA GPU
            (CPU under TRITON_INTERPRET=1).
    Returns:
        [..., N] in x's dtype. Only x is saved for the backward.
    """
    return single("relu_squared", x)


class ReLUSquared(torch.nn.Module):
    """The activation of a Primer / Nemotron MLP: `forward(x) = relu(x)^2`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return relu_squared(x)


# --------------------------------------------------------------------------- references


def relu_squared_ref(x: torch.Tensor) -> torch.Tensor:
    """fp32 reference (differentiable)."""
    return torch.square(torch.relu(x.float()))


def relu_squared_eager(x: torch.Tensor) -> torch.Tensor:
    """Eager PyTorch as Nemotron writes it (the `torch` provider)."""
    return torch.square(torch.relu(x))
