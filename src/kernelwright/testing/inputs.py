"""Random input factories for kernel tests: never zeros, odd sizes, non-contiguous layouts.

Values are drawn on the CPU from a seeded generator and then moved, so a seed gives the same
numbers on every device. Layouts:
- "contiguous": a plain tensor.
- "row_strided": a slice [..., :n] of a wider tensor; the last dim stays contiguous, rows
  are padded (an odd pad, so rows are also misaligned for vector loads).
- "transposed": the last dimension is not contiguous (a transposed view).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

LAYOUTS = ("contiguous", "row_strided", "transposed")


def generator(seed: int) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed(seed)


def _nonzero(t: torch.Tensor) -> torch.Tensor:
    # A kernel that never writes still "passes" on zeros; shift exact zeros off zero.
    return torch.where(t == 0, torch.full_like(t, 0.0625), t)


def rand(
    shape: Sequence[int],
    dtype: torch.dtype,
    device: torch.device | str,
    *,
    gen: torch.Generator,
    layout: str = "contiguous",
    mean: float = 0.0,
    std: float = 1.0,
) -> torch.Tensor:
    """A normal(mean, std) tensor of `shape` in `layout`, no exact zeros, values exact in dtype."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    shape = tuple(int(s) for s in shape)
    if layout == "row_strided":
        full = shape[:-1] + (shape[-1] + 3,)
        base = torch.randn(full, generator=gen, dtype=torch.float32) * std + mean
        t = _nonzero(base.to(dtype)).to(device)[..., : shape[-1]]
    elif layout == "transposed":
        if len(shape) < 2:
            raise ValueError("layout 'transposed' needs at least 2 dimensions")
        tshape = shape[:-2] + (shape[-1], shape[-2])
        base = torch.randn(tshape, generator=gen, dtype=torch.float32) * std + mean
        t = _nonzero(base.to(dtype)).to(device).transpose(-1, -2)
    else:
        base = torch.randn(shape, generator=gen, dtype=torch.float32) * std + mean
        t = _nonzero(base.to(dtype)).to(device)
    assert tuple(t.shape) == shape
    return t


def large_offset_rows(
    n: int, rows: int, dtype: torch.dtype, device: torch.device | str, *, gen: torch.Generator
) -> torch.Tensor:
    """A [rows, n] view whose row stride makes row * stride pass 2^31 elements.

    Only the rows themselves are written (pages in between are never touched), so this costs a
    few KB of real memory while an int32 offset computation in a kernel would wrap and fail.
    """
    stride = 2**30 + 64  # rows >= 3 put the last row past 2^31 elements
    storage = torch.empty(stride * (rows - 1) + n, dtype=dtype, device=device)
    view = storage.as_strided((rows, n), (stride, 1))
    view.copy_(rand((rows, n), dtype, device, gen=gen))
    return view


def class_targets(
    shape: Sequence[int],
    num_classes: int,
    gen: torch.Generator,
    device,
    *,
    ignore_fraction: float,
    ignore_index: int = -100,
) -> torch.Tensor:
    """int64 class indices in [0, num_classes) of `shape`, about `ignore_fraction` of them
    `ignore_index` (masked tokens, as padding and prompts are in a training batch)."""
    t = torch.randint(0, num_classes, tuple(shape), generator=gen)
    t[torch.rand(tuple(shape), generator=gen) < ignore_fraction] = ignore_index
    return t.to(device)
