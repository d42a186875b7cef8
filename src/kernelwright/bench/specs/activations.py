"""Benchmark specs of the MLP activations: swiglu, geglu, swiglu_clamped (gated), relu_squared."""

from __future__ import annotations

import torch

from kernelwright.bench.models import DEFAULT_TOKENS, REFERENCE, distinct, token_counts
from kernelwright.bench.specs.base import (
    BenchSpec,
    Provider,
    Shape,
    Sweep,
    call,
    op_torch_providers,
    ours,
    register,
    unary_providers,
)
from kernelwright.testing import generator, rand

# --------------------------------------------------------------------------- gated MLP activations


def _gated_inputs(shape: Shape, dtype: torch.dtype, device, *, seed: int = 0):
    gen = generator(seed)
    m, n = shape["tokens"], shape["intermediate"]
    return {
        "gate": rand((m, n), dtype, device, gen=gen),  # [M, N] = x @ W_gate^T
        "up": rand((m, n), dtype, device, gen=gen),  # [M, N] = x @ W_up^T
    }


def _gated_bytes(shape: Shape, dtype: torch.dtype, mode: str) -> int:
    mn_s = shape["tokens"] * shape["intermediate"] * dtype.itemsize
    # forward: read gate, up; write out = act(gate) * up              -> 3 * M*N*s
    # backward: read dout, gate, up (act recomputed); write dgate, dup -> 5 * M*N*s
    per_mode = {"forward": 3, "backward": 5, "full": 8}
    return per_mode[mode] * mn_s


def _gated_input_bytes(shape: Shape, dtype: torch.dtype) -> int:
    return 2 * shape["tokens"] * shape["intermediate"] * dtype.itemsize


def _gated_providers(op: str, liger: tuple[str, str], **kwargs) -> tuple[Provider, ...]:
    names, m = ("gate", "up"), ours(op)
    return (
        Provider("kernelwright", call(*m, names, in_place_backward=False, **kwargs)),
        Provider(
            "kernelwright_inplace",
            call(*m, names, in_place_backward=True, **kwargs),
            mutates=True,
        ),
        *op_torch_providers(op, names, **kwargs),
        # Liger's backward writes dgate/dup into the saved gate/up buffers (in place, always).
        Provider(
            "liger",
            call(liger[0], liger[1] + ".apply", names),
            requires="liger_kernel",
            mutates=True,
        ),
    )


def _gated_spec(op: str, providers: tuple[Provider, ...], liger_note: str) -> BenchSpec:
    return BenchSpec(
        op=op,
        dims=("tokens", "intermediate"),
        providers=providers,
        make_inputs=_gated_inputs,
        grad_inputs=("gate", "up"),
        bytes=_gated_bytes,
        sweeps=(
            Sweep("tokens", token_counts(1024, 16384), {"intermediate": REFERENCE.intermediate}),
            Sweep("intermediate", distinct("intermediate"), {"tokens": DEFAULT_TOKENS}),
        ),
        quick_sweeps=(
            Sweep("tokens", (DEFAULT_TOKENS, 16384), {"intermediate": REFERENCE.intermediate}),
        ),
        interpreter_sweeps=(Sweep("intermediate", (256, 512), {"tokens": 64}),),
        input_bytes=_gated_input_bytes,
        # Full mode holds inputs, output, saved tensors and both grads at once (~3.5x inputs);
        # past 8 GB of inputs the run is about memory capacity, not the kernel.
        max_input_bytes=8 * 10**9,
        notes={"liger": liger_note},
    )


SWIGLU = register(
    _gated_spec(
        "swiglu",
        _gated_providers("swiglu", ("liger_kernel.ops.swiglu", "LigerSiLUMulFunction")),
        "LigerSiLUMulFunction: grads written in place into gate/up",
    )
)

# Gemma's gelu_pytorch_tanh, the form Liger implements.
GEGLU = register(
    _gated_spec(
        "geglu",
        _gated_providers(
            "geglu", ("liger_kernel.ops.geglu", "LigerGELUMulFunction"), approximate="tanh"
        ),
        "LigerGELUMulFunction (tanh approximation): grads written in place into gate/up",
    )
)


# --------------------------------------------------------------------------- relu_squared


def _relu_squared_inputs(shape: Shape, dtype: torch.dtype, device, *, seed: int = 0):
    m, n = shape["tokens"], shape["intermediate"]
    return {"x": rand((m, n), dtype, device, gen=generator(seed))}  # [M, N] = x @ W_up^T


def _relu_squared_bytes(shape: Shape, dtype: torch.dtype, mode: str) -> int:
    mn_s = shape["tokens"] * shape["intermediate"] * dtype.itemsize
    # forward: read x, write y = relu(x)^2     -> 2 * M*N*s
    # backward: read dy and x, write dx        -> 3 * M*N*s
    return {"forward": 2, "backward": 3, "full": 5}[mode] * mn_s


RELU_SQUARED = register(
    BenchSpec(
        op="relu_squared",
        dims=("tokens", "intermediate"),
        providers=unary_providers(
            "relu_squared", ("liger_kernel.ops.relu_squared", "LigerReLUSquaredFunction")
        ),
        make_inputs=_relu_squared_inputs,
        grad_inputs=("x",),
        bytes=_relu_squared_bytes,
        sweeps=(
            Sweep("tokens", token_counts(1024, 16384), {"intermediate": REFERENCE.intermediate}),
            Sweep("intermediate", distinct("intermediate"), {"tokens": DEFAULT_TOKENS}),
        ),
        quick_sweeps=(
            Sweep("tokens", (DEFAULT_TOKENS, 16384), {"intermediate": REFERENCE.intermediate}),
        ),
        interpreter_sweeps=(Sweep("intermediate", (256, 512), {"tokens": 64}),),
    )
)

# GPT-OSS's expert gate at its constants (alpha 1.702, limit 7); Liger has no clamped form.
SWIGLU_CLAMPED = register(
    _gated_spec(
        "swiglu_clamped",
        (
            Provider("kernelwright", call(*ours("swiglu_clamped"), ("gate", "up"))),
            *op_torch_providers("swiglu_clamped", ("gate", "up")),
        ),
        "no clamped SwiGLU in Liger",
    )
)
