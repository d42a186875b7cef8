"""Benchmark specs of the norms: rms_norm, fused_add_rms_norm, layer_norm, l2_norm."""

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
)
from kernelwright.testing import generator, rand

# --------------------------------------------------------------------------- rms_norm

EPS = 1e-6


def _rms_norm_inputs(shape: Shape, dtype: torch.dtype, device, *, seed: int = 0):
    gen = generator(seed)
    m, n = shape["tokens"], shape["hidden"]
    return {
        "x": rand((m, n), dtype, device, gen=gen),  # [M, N]
        "weight": rand((n,), dtype, device, gen=gen, mean=1.0, std=0.1),  # [N], near 1 as trained
    }


def _rms_norm_bytes(shape: Shape, dtype: torch.dtype, mode: str) -> int:
    m, n, s = shape["tokens"], shape["hidden"], dtype.itemsize
    # forward: read x (M*N*s) and w (N*s); write y (M*N*s) and rstd (M fp32, saved for bwd)
    fwd = m * n * s + n * s + m * n * s + m * 4
    # backward: read dy and x (2*M*N*s), w (N*s), rstd (M*4); write dx (M*N*s), dw (N*s)
    bwd = 2 * m * n * s + n * s + m * 4 + m * n * s + n * s
    return {"forward": fwd, "backward": bwd, "full": fwd + bwd}[mode]


def _rms_norm_providers() -> tuple[Provider, ...]:
    m, names = ours("rms_norm"), ("x", "weight")
    liger = ("liger_kernel.ops.rms_norm", "LigerRMSNormFunction.apply")
    return (
        Provider("kernelwright", call(*m, names, EPS, in_place_backward=False)),
        Provider(
            "kernelwright_inplace",
            call(*m, names, EPS, in_place_backward=True),
            mutates=True,
        ),
        *op_torch_providers("rms_norm", names, EPS, casting_mode="llama"),
        # (X, W, eps, offset, casting_mode, in_place): in_place=True is Liger's default, so
        # this is Liger as users get it — dx written over dy.
        Provider(
            "liger",
            call(*liger, names, EPS, 0.0, "llama", True),
            requires="liger_kernel",
            mutates=True,
        ),
    )


# The norms' sweeps: every distinct hidden size of the model registry at the default token
# count, and token counts at Llama-3-8B's hidden size; quick runs take Llama-3-8B's and the
# widest (405B) hidden size; the interpreter two tiny widths.
NORM_SWEEPS = (
    Sweep("hidden", distinct("hidden"), {"tokens": DEFAULT_TOKENS}),
    Sweep("tokens", token_counts(1024, 32768), {"hidden": REFERENCE.hidden}),
)
NORM_QUICK_SWEEPS = (
    Sweep("hidden", (REFERENCE.hidden, distinct("hidden")[-1]), {"tokens": DEFAULT_TOKENS}),
)
NORM_INTERPRETER_SWEEPS = (Sweep("hidden", (256, 512), {"tokens": 64}),)


RMS_NORM = register(
    BenchSpec(
        op="rms_norm",
        dims=("tokens", "hidden"),
        providers=_rms_norm_providers(),
        make_inputs=_rms_norm_inputs,
        grad_inputs=("x", "weight"),
        bytes=_rms_norm_bytes,
        sweeps=NORM_SWEEPS,
        quick_sweeps=NORM_QUICK_SWEEPS,
        interpreter_sweeps=NORM_INTERPRETER_SWEEPS,
        notes={
            "kernelwright_inplace": "in_place_backward=True: dx over dy (Liger's default)",
            "liger": "LigerRMSNormFunction, in_place=True (its default)",
        },
    )
)


# --------------------------------------------------------------------------- fused_add_rms_norm


def _fused_add_inputs(shape: Shape, dtype: torch.dtype, device, *, seed: int = 0):
    gen = generator(seed)
    m, n = shape["tokens"], shape["hidden"]
    return {
        "x": rand((m, n), dtype, device, gen=gen),  # [M, N] sublayer output
        "residual": rand((m, n), dtype, device, gen=gen),  # [M, N] residual stream
        "weight": rand((n,), dtype, device, gen=gen, mean=1.0, std=0.1),  # [N]
    }


def _fused_add_bytes(shape: Shape, dtype: torch.dtype, mode: str) -> int:
    m, n, s = shape["tokens"], shape["hidden"], dtype.itemsize
    # forward: read x, residual (2*M*N*s), w; write y, s = x + residual (2*M*N*s), rstd (M*4)
    fwd = 4 * m * n * s + n * s + m * 4
    # backward: read dy, ds_out, s (3*M*N*s), w, rstd; write d(x) = d(residual) (M*N*s), dw
    bwd = 4 * m * n * s + 2 * n * s + m * 4
    return {"forward": fwd, "backward": bwd, "full": fwd + bwd}[mode]


def _fused_add_providers() -> tuple[Provider, ...]:
    m, names = ours("fused_add_rms_norm"), ("x", "residual", "weight")
    liger = ("liger_kernel.ops.fused_add_rms_norm", "LigerFusedAddRMSNormFunction.apply")
    return (
        Provider("kernelwright", call(*m, names, EPS)),
        *op_torch_providers("fused_add_rms_norm", names, EPS),
        # (X, R, W, eps, offset, casting_mode, in_place): in_place=False is its default
        Provider("liger", call(*liger, names, EPS, 0.0, "llama", False), requires="liger_kernel"),
    )


FUSED_ADD_RMS_NORM = register(
    BenchSpec(
        op="fused_add_rms_norm",
        dims=("tokens", "hidden"),
        providers=_fused_add_providers(),
        make_inputs=_fused_add_inputs,
        grad_inputs=("x", "residual", "weight"),
        bytes=_fused_add_bytes,
        backward_through=(0, 1),
        grad_through_views=True,
        sweeps=NORM_SWEEPS,
        quick_sweeps=NORM_QUICK_SWEEPS,
        interpreter_sweeps=NORM_INTERPRETER_SWEEPS,
    )
)


# --------------------------------------------------------------------------- layer_norm

LN_EPS = 1e-5


def _layer_norm_inputs(shape: Shape, dtype: torch.dtype, device, *, seed: int = 0):
    gen = generator(seed)
    m, n = shape["tokens"], shape["hidden"]
    return {
        "x": rand((m, n), dtype, device, gen=gen),  # [M, N]
        "weight": rand((n,), dtype, device, gen=gen, mean=1.0, std=0.1),  # [N], near 1 as trained
        "bias": rand((n,), dtype, device, gen=gen, std=0.1),  # [N], near 0 as trained
    }


def _layer_norm_bytes(shape: Shape, dtype: torch.dtype, mode: str) -> int:
    m, n, s = shape["tokens"], shape["hidden"], dtype.itemsize
    # forward: read x (M*N*s), w and b (2*N*s); write y (M*N*s), mean and rstd (2*M fp32, saved
    # for the backward)
    fwd = m * n * s + 2 * n * s + m * n * s + 2 * m * 4
    # backward: read dy and x (2*M*N*s), w (N*s), mean and rstd (2*M*4); write dx (M*N*s),
    # dw and db (2*N*s). The fp32 [programs, N] partial sums stay in L2 and are not counted.
    bwd = 2 * m * n * s + n * s + 2 * m * 4 + m * n * s + 2 * n * s
    return {"forward": fwd, "backward": bwd, "full": fwd + bwd}[mode]


def _layer_norm_providers() -> tuple[Provider, ...]:
    m, names = ours("layer_norm"), ("x", "weight", "bias")
    liger = ("liger_kernel.ops.layer_norm", "LigerLayerNormFunction.apply")
    return (
        Provider("kernelwright", call(*m, names, LN_EPS)),
        *op_torch_providers("layer_norm", names, LN_EPS),
        # (X, W, B, eps); Liger allocates dx, so nothing is written over the inputs or dy
        Provider("liger", call(*liger, names, LN_EPS), requires="liger_kernel"),
    )


LAYER_NORM = register(
    BenchSpec(
        op="layer_norm",
        dims=("tokens", "hidden"),
        providers=_layer_norm_providers(),
        make_inputs=_layer_norm_inputs,
        grad_inputs=("x", "weight", "bias"),
        bytes=_layer_norm_bytes,
        sweeps=NORM_SWEEPS,
        quick_sweeps=NORM_QUICK_SWEEPS,
        interpreter_sweeps=NORM_INTERPRETER_SWEEPS,
        notes={"liger": "LigerLayerNormFunction (X, W, B, eps)"},
    )
)


# --------------------------------------------------------------------------- l2_norm


def _l2_norm_inputs(shape: Shape, dtype: torch.dtype, device, *, seed: int = 0):
    t, h, d = shape["tokens"], shape["heads"], shape["head_dim"]
    return {"x": rand((t, h, d), dtype, device, gen=generator(seed))}  # [T, H, D]: q or k heads


def _l2_norm_bytes(shape: Shape, dtype: torch.dtype, mode: str) -> int:
    m = shape["tokens"] * shape["heads"]  # rows
    mn_s = m * shape["head_dim"] * dtype.itemsize
    # forward: read x, write y (M*N*s each) and rstd (M fp32, saved for the backward)
    fwd = 2 * mn_s + m * 4
    # backward: read dy, x and rstd; write dx
    bwd = 3 * mn_s + m * 4
    return {"forward": fwd, "backward": bwd, "full": fwd + bwd}[mode]


L2_NORM = register(
    BenchSpec(
        op="l2_norm",
        dims=("tokens", "heads", "head_dim"),
        providers=(
            Provider("kernelwright", call(*ours("l2_norm"), ("x",))),
            *op_torch_providers("l2_norm", ("x",)),
        ),
        make_inputs=_l2_norm_inputs,
        grad_inputs=("x",),
        bytes=_l2_norm_bytes,
        # the q heads of the reference model, as a linear-attention layer normalizes them
        sweeps=(
            Sweep(
                "tokens",
                token_counts(1024, 32768),
                {"heads": REFERENCE.heads, "head_dim": REFERENCE.head_dim},
            ),
        ),
        quick_sweeps=(
            Sweep(
                "tokens",
                (DEFAULT_TOKENS, 32768),
                {"heads": REFERENCE.heads, "head_dim": REFERENCE.head_dim},
            ),
        ),
        interpreter_sweeps=(Sweep("tokens", (16, 32), {"heads": 4, "head_dim": 64}),),
    )
)
