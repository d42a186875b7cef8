"""Benchmark spec of softmax."""

from __future__ import annotations

import torch

from kernelwright.bench.models import REFERENCE, distinct
from kernelwright.bench.specs.base import BenchSpec, Shape, Sweep, register, unary_providers
from kernelwright.testing import generator, rand

# --------------------------------------------------------------------------- softmax

SOFTMAX_ROWS = 4096  # rows of a logits block; 4096 x 262144 bf16 is 2 GiB (fp32: 4 GiB)


def _softmax_inputs(shape: Shape, dtype: torch.dtype, device, *, seed: int = 0):
    m, n = shape["rows"], shape["n"]
    # std 4: logits-like spread, so the max shift and the exp both matter
    return {"x": rand((m, n), dtype, device, gen=generator(seed), std=4.0)}  # [M, N]


def _softmax_bytes(shape: Shape, dtype: torch.dtype, mode: str) -> int:
    mn_s = shape["rows"] * shape["n"] * dtype.itemsize
    # forward: read x, write y                       -> 2 * M*N*s (the minimum: the looped
    #   kernel's second read of x, for rows past 65536, is not counted, so it tops out at 2/3)
    # backward: read dy and the saved y, write dx    -> 3 * M*N*s
    return {"forward": 2, "backward": 3, "full": 5}[mode] * mn_s


def _softmax_input_bytes(shape: Shape, dtype: torch.dtype) -> int:
    return shape["rows"] * shape["n"] * dtype.itemsize


SOFTMAX = register(
    BenchSpec(
        op="softmax",
        dims=("rows", "n"),
        providers=unary_providers("softmax", ("liger_kernel.ops.softmax", "LigerSoftmaxFunction")),
        make_inputs=_softmax_inputs,
        grad_inputs=("x",),
        bytes=_softmax_bytes,
        sweeps=(
            # powers of two across the fused/looped switch (65536) plus the models' vocabularies
            Sweep(
                "n",
                tuple(
                    sorted({4096, 8192, 16384, 32768, 65536, 131072, 262144, *distinct("vocab")})
                ),
                {"rows": SOFTMAX_ROWS},
            ),
        ),
        quick_sweeps=(Sweep("n", (32768, REFERENCE.vocab), {"rows": SOFTMAX_ROWS}),),
        interpreter_sweeps=(Sweep("n", (512, 5000), {"rows": 16}),),
        input_bytes=_softmax_input_bytes,
        max_input_bytes=2**32,  # 4 GiB: 4096 x 262144 in fp32 just fits
    )
)
