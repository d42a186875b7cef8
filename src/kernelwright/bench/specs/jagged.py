"""Benchmark spec of jagged_mean."""

from __future__ import annotations

import torch

from kernelwright.bench.specs.base import (
    BenchSpec,
    Provider,
    Shape,
    Sweep,
    call,
    ours,
    register,
    torch_providers,
)
from kernelwright.testing import generator, rand

# --------------------------------------------------------------------------- jagged_mean


def _jagged_lengths(shape: Shape, *, seed: int = 0) -> torch.Tensor:
    # Segment lengths uniform in 1..max_len, from a seeded CPU generator: make_inputs and the
    # byte count draw the same lengths, so the byte count knows the total row count.
    gen = generator(seed + 77)
    return torch.randint(1, shape["max_len"] + 1, (shape["segments"],), generator=gen)


def _jagged_inputs(shape: Shape, dtype: torch.dtype, device, *, seed: int = 0):
    lengths = _jagged_lengths(shape, seed=seed)
    offsets = torch.zeros(shape["segments"] + 1, dtype=torch.int64)
    offsets[1:] = lengths.cumsum(0)
    total = int(offsets[-1])
    return {
        "values": rand((total, shape["d"]), dtype, device, gen=generator(seed)),  # [total, D]
        "offsets": offsets.to(device),  # [B + 1] int64
    }


def _jagged_total(shape: Shape) -> dict[str, int]:
    """The rows the shape's lengths draw holds: what a call site's values [total, D] measure
    (about segments x (max_len + 1) / 2, not segments x max_len)."""
    return {"total": int(_jagged_lengths(shape).sum())}


def _jagged_bytes(shape: Shape, dtype: torch.dtype, mode: str) -> int:
    b, d, s = shape["segments"], shape["d"], dtype.itemsize
    total = int(_jagged_lengths(shape).sum())
    offsets = (b + 1) * 8  # int64
    # forward: read values (total*D*s) and offsets; write out (B*D*s)
    fwd = total * d * s + offsets + b * d * s
    # backward: read dout (B*D*s) and offsets; write dvalues (total*D*s)
    bwd = b * d * s + offsets + total * d * s
    return {"forward": fwd, "backward": bwd, "full": fwd + bwd}[mode]


def _jagged_providers() -> tuple[Provider, ...]:
    (m, fn), names = ours("jagged_mean"), ("values", "offsets")
    return (
        Provider("kernelwright", call(m, fn, names, validate=False)),
        Provider("kernelwright_validate", call(m, fn, names, validate=True)),
        Provider("loop", call(m, "jagged_mean_loop", names), slow=True),
        *torch_providers(m, "jagged_mean_vectorized", names),
        Provider("torch_segment_reduce", call(m, "jagged_mean_segment_reduce", names)),
        Provider(
            "torch_segment_reduce_compile",
            call(m, "jagged_mean_segment_reduce", names, compile_it=True),
            compiled=True,
        ),
    )


JAGGED_MEAN = register(
    BenchSpec(
        op="jagged_mean",
        dims=("segments", "max_len", "d"),
        providers=_jagged_providers(),
        make_inputs=_jagged_inputs,
        grad_inputs=("values",),
        bytes=_jagged_bytes,
        derived_dims=_jagged_total,
        # The sweep: 4096 segments of random lengths 1..512 (~1.05M rows), D varies.
        sweeps=(Sweep("d", (64, 256, 1024), {"segments": 4096, "max_len": 512}),),
        quick_sweeps=(Sweep("d", (256, 1024), {"segments": 4096, "max_len": 512}),),
        interpreter_sweeps=(Sweep("d", (64,), {"segments": 8, "max_len": 8}),),
        notes={
            "kernelwright": "validate=False: the kernels alone, no offsets check",
            "kernelwright_validate": "validate=True (the default): one device sync per call",
            "loop": "per-segment .mean(0) in a Python loop: B launches, one host sync (not"
            " compiled: its data-dependent slices would graph-break or recompile per length)",
            "torch": "searchsorted segment ids + fp32 index_add_",
            "torch_segment_reduce": "torch.segment_reduce(values, 'mean', offsets=...)",
        },
    )
)
