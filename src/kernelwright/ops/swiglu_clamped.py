"""Clamped SwiGLU (GPT-OSS's expert gate), elementwise over tensors of identical shape [..., N]:

    g = min(gate, limit),  u = clamp(up, -limit, limit) + up_offset
    c = g * sigmoid(alpha * g) * u

GPT-OSS (and MiniMax-M3) write it with alpha = 1.702, limit = 7.0, up_offset = 1; alpha = 1 and
up_offset = 0 give silu(clamp(gate)) * clamp(up), the gate of DeepSeek-V4, GLM-5-Next and HY-V4.
alpha, limit and up_offset are runtime scalars: one compiled kernel serves every value.

Numerics: the kernel computes in fp32 and rounds where the tensors of eager's code live that
matter most: h = round(g * sigmoid(alpha * g)) (the `glu` tensor), u rounded (eager's `up + 1`),
then c = round(h * u). Eager rounds alpha * g and the sigmoid too; the kernel keeps them in
fp32, so in fp16/bf16 it is closer to the fp32 reference than eager is. With up_offset = 0 and
alpha = 1 the roundings are exactly eager's `F.silu(gate) * up`. The backward recomputes from
gate and up (only they are saved):
    dh = round(dc * u),  da = dh * s * (1 + alpha * g * (1 - s))  where gate <= limit, else 0
    db = dc * h                                      where -limit <= up <= limit, else 0
with s = sigmoid(alpha * g): clamp's gradient as torch's (bounds included, 0 for NaN).

Two forms share the gated family's kernels (ops/_gated.py, ACTIVATION="silu_clamped"):
- `swiglu_clamped(gate, up)`: separate tensors, or interleaved views `x[..., ::2]`,
  `x[..., 1::2]` (column stride 2), read and differentiated in place without a copy.
- `swiglu_clamped_fused(x, interleaved=...)`: x [..., 2N] holding gate and up, either as
  halves [gate | up] or interleaved [g0, u0, g1, u1, ...] (GPT-OSS's gate_up_proj layout); its
  gradient is one [..., 2N] tensor in x's layout.

Layer order: launchers → public functions → modules → references.
"""

from __future__ import annotations

import math

import torch

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

ALPHA, LIMIT = 1.702, 7.0  # GPT-OSS's constants (GptOssExperts.alpha / .limit)


def _scalars(op: str, alpha, limit, up_offset) -> tuple[float, float, float]:
    values = (float(alpha), float(limit), float(up_offset))
    if not all(math.isfinite(v) for v in (values[0], values[2])) or not limit >= 0:
        raise ValueError(
            f"{op}: alpha and up_offset must be finite and limit >= 0 (inf: no clamp), got "
            f"alpha={alpha!r}, limit={limit!r}, up_offset={up_offset!r}"
        )
    return values


# --------------------------------------------------------------------------- launchers


def swiglu_clamped_fwd_launch(
    a: torch.Tensor,  # gate [M, N], column stride 1 or 2
    b: torch.Tensor,  # up [M, N], a's column stride
    c: torch.Tensor,  # out [M, N], stride(1) == 1
    alpha: float = ALPHA,
    limit: float = LIMIT,
    up_offset: float = 1.0,
    config: LaunchConfig | None = None,
) -> None:
    gated_fwd_launch("silu_clamped", a, b, c, config, (alpha, limit, up_offset))


def swiglu_clamped_bwd_launch(
    dc: torch.Tensor,  # [M, N], stride(1) == 1
    a: torch.Tensor,  # gate [M, N]
    b: torch.Tensor,  # up [M, N]
    da: torch.Tensor,  # [M, N], a's column stride
    db: torch.Tensor,  # [M, N]
    alpha: float = ALPHA,
    limit: float = LIMIT,
    up_offset: float = 1.0,
    config: LaunchConfig | None = None,
) -> None:
    gated_bwd_launch("silu_clamped", dc, a, b, da, db, config, (alpha, limit, up_offset))


def swiglu_clamped_fused_fwd_launch(
    x: torch.Tensor,  # [M, 2N], stride(1) == 1
    c: torch.Tensor,  # [M, N]
    alpha: float = ALPHA,
    limit: float = LIMIT,
    up_offset: float = 1.0,
    interleaved: bool = True,
    config: LaunchConfig | None = None,
) -> None:
    scalars = (alpha, limit, up_offset)
    gated_fused_fwd_launch("silu_clamped", x, c, config, scalars, interleaved)


def swiglu_clamped_fused_bwd_launch(
    dc: torch.Tensor,  # [M, N]
    x: torch.Tensor,  # [M, 2N]
    dx: torch.Tensor,  # [M, 2N], x's layout
    alpha: float = ALPHA,
    limit: float = LIMIT,
    up_offset: float = 1.0,
    interleaved: bool = True,
    config: LaunchConfig | None = None,
) -> None:
    scalars = (alpha, limit, up_offset)
    gated_fused_bwd_launch("silu_clamped", dc, x, dx, config, scalars, interleaved)


# --------------------------------------------------------------------------- public API


def swiglu_clamped(
    gate: torch.Tensor,
    up: torch.Tensor,
    *,
    alpha: float = ALPHA,
    limit: float = LIMIT,
    up_offset: float = 1.0,
) -> torch.Tensor:
    """min(gate, limit) * sigmoid(alpha * min(gate, limit)) * (clamp(up, +-limit) + up_offset),
    forward and backward in Triton (GPT-OSS's expert gate at the defaults).

    Args:
        gate: [..., N] float32/float16/bfloat16, on a CUDA GPU (CPU under TRITON_INTERPRET=1).
            Contiguous rows, or a column-stride-2 view (`gate_up[..., ::2]`), read in place.
        up: same shape, dtype and device as gate (`gate_up[..., 1::2]` for GPT-OSS).
        alpha: the sigmoid's scale (1 gives silu). limit: the clamp bound, >= 0 (inf: none).
        up_offset: added to the clamped up (GPT-OSS: 1; DeepSeek-V4 / GLM-5-Next / HY-V4: 0).
    """
    scalars = _scalars("swiglu_clamped", alpha, limit, up_offset)
    return gated("silu_clamped", gate, up, False, scalars)


def swiglu_clamped_fused(
    x: torch.Tensor,
    *,
    alpha: float = ALPHA,
    limit: float = LIMIT,
    up_offset: float = 1.0,
    interleaved: bool = True,
) -> torch.Tensor:
    """`swiglu_clamped` on one gate_up tensor x [..., 2N]: gate and up interleaved (even and
    odd columns, GPT-OSS's layout) or, with interleaved=False, its halves [gate | up].

    Returns [..., N] in x's dtype. The gradient of x is one [..., 2N] tensor in x's layout.
    """
    scalars = _scalars("swiglu_clamped_fused", alpha, limit, up_offset)
    return gated_fused("silu_clamped", x, scalars, interleaved)


class SwiGLUClamped(torch.nn.Module):
    """GPT-OSS's expert gate on separate tensors: `forward(gate, up)`."""

    def __init__(self, *, alpha: float = ALPHA, limit: float = LIMIT, up_offset: float = 1.0):
        super().__init__()
        _scalars("SwiGLUClamped", alpha, limit, up_offset)
        self.alpha, self.limit, self.up_offset = alpha, limit, up_offset

    def forward(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return swiglu_clamped(
            gate, up, alpha=self.alpha, limit=self.limit, up_offset=self.up_offset
        )

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}, limit={self.limit}, up_offset={self.up_offset}"


# --------------------------------------------------------------------------- references


def swiglu_clamped_ref(
    gate: torch.Tensor,
    up: torch.Tensor,
    *,
    alpha: float = ALPHA,
    limit: float = LIMIT,
    up_offset: float = 1.0,
) -> torch.Tensor:
    """fp32 reference (differentiable), no intermediate rounding; torch's clamp gradients."""
    g = gate.float().clamp(max=limit)
    u = up.float().clamp(min=-limit, max=limit)
    return g * torch.sigmoid(g * alpha) * (u + up_offset)


def swiglu_clamped_fused_ref(
    x: torch.Tensor,
    *,
    alpha: float = ALPHA,
    limit: float = LIMIT,
    up_offset: float = 1.0,
    interleaved: bool = True,
) -> torch.Tensor:
    """fp32 reference of `swiglu_clamped_fused` (differentiable)."""
    x = x.float()
    gate, up = (x[..., ::2], x[..., 1::2]) if interleaved else x.chunk(2, dim=-1)
    return swiglu_clamped_ref(gate, up, alpha=alpha, limit=limit, up_offset=up_offset)


def swiglu_clamped_eager(
    gate: torch.Tensor,
    up: torch.Tensor,
    alpha: float = ALPHA,
    limit: float = LIMIT,
    up_offset: float = 1.0,
) -> torch.Tensor:
    """Eager PyTorch as GPT-OSS's `_apply_gate` writes it (the `torch` provider)."""
    gate = gate.clamp(min=None, max=limit)
    up = up.clamp(min=-limit, max=limit)
    return (up + up_offset) * (gate * torch.sigmoid(gate * alpha))
