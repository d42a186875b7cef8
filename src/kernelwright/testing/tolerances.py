"""Per-dtype tolerances on the relative-norm error ||out - ref|| / ||ref||.

These are defaults; a test module states its own table at its top when an op needs another.
The fp32 bounds hold for the GPU's fp32 arithmetic (not TF32: no matmul here); the half-precision
bounds cover rounding of inputs, intermediates the model itself rounds, and the output.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Tolerance:
    fwd: float  # bound on the forward outputs' relative-norm error
    bwd: float  # bound on every input gradient's relative-norm error


DEFAULT_TOLERANCES: dict[torch.dtype, Tolerance] = {
    torch.float32: Tolerance(fwd=1e-5, bwd=1e-4),
    torch.float16: Tolerance(fwd=2e-3, bwd=4e-3),
    torch.bfloat16: Tolerance(fwd=8e-3, bwd=1.6e-2),
}
