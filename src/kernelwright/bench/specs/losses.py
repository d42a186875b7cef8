"""Benchmark specs of the losses: cross_entropy, fused_linear_cross_entropy."""

from __future__ import annotations

import math

import torch

from kernelwright.bench.models import DEFAULT_TOKENS, REFERENCE, distinct, token_counts
from kernelwright.bench.specs.base import (
    BenchSpec,
    Inputs,
    Provider,
    Shape,
    Sweep,
    call,
    op_torch_providers,
    ours,
    register,
)
from kernelwright.testing import class_targets, generator, rand

# --------------------------------------------------------------------------- losses

IGNORE_INDEX = -100
IGNORED_FRACTION = 0.05  # padding / prompt tokens masked out of the loss, as in SFT batches


def _loss_targets(m: int, v: int, gen: torch.Generator, device) -> torch.Tensor:
    # [M] int64 class indices in [0, V), ~5% of them ignore_index
    return class_targets(
        (m,), v, gen, device, ignore_fraction=IGNORED_FRACTION, ignore_index=IGNORE_INDEX
    )


def _ce_inputs(shape: Shape, dtype: torch.dtype, device, *, seed: int = 0):
    gen = generator(seed)
    m, v = shape["tokens"], shape["vocab"]
    return {
        # std 4: a trained lm-head's logits spread over several units (as softmax's inputs)
        "logits": rand((m, v), dtype, device, gen=gen, std=4.0),  # [M, V]
        "target": _loss_targets(m, v, gen, device),  # [M] int64
    }


def _ce_bytes(shape: Shape, dtype: torch.dtype, mode: str) -> int:
    logits = shape["tokens"] * shape["vocab"] * dtype.itemsize
    targets = shape["tokens"] * 8  # int64; the loss is one fp32 scalar, not counted
    # forward: read logits and targets                                    -> M*V*s + M*8
    # full: read logits and targets once, write the gradient              -> 2*M*V*s + M*8
    #   (ours reads each row twice, the second time mostly from L2: not counted)
    # backward: what a standalone backward moves, read logits (or the saved softmax) and
    #   targets, write the gradient -> as "full". Ours wrote the gradient in the forward and
    #   its backward is a multiply skipped at dy = 1: its backward GB/s means nothing.
    full = 2 * logits + targets
    return {"forward": logits + targets, "backward": full, "full": full}[mode]


def _ce_input_bytes(shape: Shape, dtype: torch.dtype) -> int:
    return shape["tokens"] * shape["vocab"] * dtype.itemsize


def _ce_providers() -> tuple[Provider, ...]:
    m, names = ours("cross_entropy"), ("logits", "target")
    liger = ("liger_kernel.ops.cross_entropy", "LigerCrossEntropyFunction.apply")
    return (
        Provider("kernelwright", call(*m, names, ignore_index=IGNORE_INDEX)),
        Provider(
            "kernelwright_inplace",
            call(*m, names, ignore_index=IGNORE_INDEX, in_place=True),
            mutates=True,
        ),
        *op_torch_providers("cross_entropy", names, ignore_index=IGNORE_INDEX),
        # (_input, target, weight, ignore_index, lse_square_scale, label_smoothing, reduction,
        #  softcap, return_z_loss, return_token_accuracy, return_predicted_tokens)
        # -> (loss, z_loss, token_accuracy, predicted_tokens); the backward runs through loss.
        # Its forward writes the gradient over the logits (always in place).
        Provider(
            "liger",
            call(*liger, names, None, IGNORE_INDEX, 0.0, 0.0, "mean", None, False, False, False),
            requires="liger_kernel",
            mutates=True,
        ),
    )


CROSS_ENTROPY = register(
    BenchSpec(
        op="cross_entropy",
        dims=("tokens", "vocab"),
        providers=_ce_providers(),
        make_inputs=_ce_inputs,
        grad_inputs=("logits",),
        bytes=_ce_bytes,
        sweeps=(
            # the models' vocabularies plus powers of two across the one-block/looped switch
            Sweep(
                "vocab",
                tuple(sorted({32768, 65536, 131072, 262144, *distinct("vocab")})),
                {"tokens": DEFAULT_TOKENS},
            ),
            Sweep("tokens", token_counts(4096, 32768), {"vocab": REFERENCE.vocab}),
        ),
        quick_sweeps=(Sweep("vocab", (REFERENCE.vocab,), {"tokens": DEFAULT_TOKENS}),),
        interpreter_sweeps=(Sweep("vocab", (512, 5000), {"tokens": 16}),),
        input_bytes=_ce_input_bytes,
        # 16 GiB of logits: 32768 x 262144 in bf16 is the largest measured. Eager PyTorch needs
        # several times the logits' size (fp32 upcast, log-softmax, gradients): where it runs
        # out of memory its rows say OOM.
        max_input_bytes=2**34,
        notes={
            "kernelwright": "reduction='mean', ignore_index=-100; the forward also writes the "
            "gradient (already divided by the token count) and the backward is a multiply "
            "skipped at dy = 1, so compare 'full'",
            "kernelwright_inplace": "in_place=True: the gradient written over the logits, as "
            "Liger does",
            "torch": "F.cross_entropy(logits.float(), target), as HF models compute it",
            "torch_compile": "the torch provider under torch.compile",
            "liger": "LigerCrossEntropyFunction: gradient computed in the forward and written "
            "over the logits; one host sync per call (.item() of the token count)",
        },
        unit_grad=True,
        backward_once=True,
    )
)


# ----------------------------------------------------------------------- fused_linear_cross_entropy


def _flce_inputs(shape: Shape, dtype: torch.dtype, device, *, seed: int = 0):
    gen = generator(seed)
    t, h, v = shape["tokens"], shape["hidden"], shape["vocab"]
    return {
        "hidden": rand((t, h), dtype, device, gen=gen),  # [T, H], normed hidden states
        # [V, H] with std 3 / sqrt(H) (0.047 at H = 4096): logits of std ~3, a trained
        # lm-head's spread, whatever H is
        "weight": rand((v, h), dtype, device, gen=gen, std=3.0 / h**0.5),
        "target": _loss_targets(t, v, gen, device),  # [T] int64
    }


def _flce_bytes(shape: Shape, dtype: torch.dtype, mode: str) -> int:
    t, h, v, s = shape["tokens"], shape["hidden"], shape["vocab"], dtype.itemsize
    hidden, weight, targets = t * h * s, v * h * s, t * 8
    # forward: read hidden, weight and targets; the [T, V] logits need never reach memory
    #   -> (T + V)*H*s + T*8
    # full: that, plus write grad_hidden and grad_weight -> 2*(T + V)*H*s + T*8
    # backward (standalone, recomputing the logits): read hidden, weight, targets, write both
    #   gradients -> as "full". Compute-bound: see the FLOP count.
    fwd = hidden + weight + targets
    full = 2 * (hidden + weight) + targets
    return {"forward": fwd, "backward": full, "full": full}[mode]


def _flce_flops(shape: Shape, dtype: torch.dtype, mode: str) -> int:
    matmul = 2 * shape["tokens"] * shape["hidden"] * shape["vocab"]  # [T, H] x [H, V]
    # forward: logits = hidden @ weight.T                                          1 matmul
    # backward: grad_hidden = dlogits @ weight, grad_weight = dlogits.T @ hidden    2 matmuls
    # full: 3 matmuls (25.8 TFLOP at 8192 x 4096 x 128256); the O(T*V) softmax is not counted
    return {"forward": 1, "backward": 2, "full": 3}[mode] * matmul


def _flce_providers() -> tuple[Provider, ...]:
    op = "fused_linear_cross_entropy"
    m, fn = ours(op)
    names = ("hidden", "weight", "target")
    liger = ("liger_kernel.ops.fused_linear_cross_entropy", "LigerFusedLinearCrossEntropyFunction")

    def liger_chunk(inp: Inputs):
        # Liger 0.8.5's rule, so the logits buffer (and the memory) is Liger's:
        # next_power_of_2(ceil(T / ceil(V / H))), 256 tokens at 8192 x 4096 x 128256
        (t, h), v = inp["hidden"].shape, inp["weight"].shape[0]
        chunk = 1 << (math.ceil(t / math.ceil(v / h)) - 1).bit_length()
        return call(m, fn, names, ignore_index=IGNORE_INDEX, chunk_size=chunk)(inp)

    return (
        # chunk_size left to the op
        Provider("kernelwright", call(m, fn, names, ignore_index=IGNORE_INDEX)),
        Provider("kernelwright_liger_chunk", liger_chunk),
        *op_torch_providers(op, names, ignore_index=IGNORE_INDEX),
        # (_input, weight, target, bias, ce_weight, ignore_index, lse_square_scale,
        #  label_smoothing, reduction, softcap, return_z_loss, accum_dtype, ...) -> (loss,
        #  z_loss, token_accuracy, predicted_tokens); the rest left at their defaults.
        Provider(
            "liger",
            call(
                liger[0],
                liger[1] + ".apply",
                names,
                *(None, None, IGNORE_INDEX, 0.0, 0.0, "mean", None, False, None),
            ),
            requires="liger_kernel",
        ),
    )


FUSED_LINEAR_CROSS_ENTROPY = register(
    BenchSpec(
        op="fused_linear_cross_entropy",
        dims=("tokens", "hidden", "vocab"),
        providers=_flce_providers(),
        make_inputs=_flce_inputs,
        grad_inputs=("hidden", "weight"),
        bytes=_flce_bytes,
        flops=_flce_flops,
        sweeps=(
            Sweep(
                "vocab",
                tuple(sorted({*distinct("vocab"), 262144})),
                {"tokens": DEFAULT_TOKENS, "hidden": REFERENCE.hidden},
            ),
            Sweep(
                "tokens",
                token_counts(4096, 32768),
                {"hidden": REFERENCE.hidden, "vocab": REFERENCE.vocab},
            ),
        ),
        quick_sweeps=(
            Sweep(
                "vocab",
                (REFERENCE.vocab,),
                {"tokens": DEFAULT_TOKENS, "hidden": REFERENCE.hidden},
            ),
        ),
        interpreter_sweeps=(Sweep("vocab", (300,), {"tokens": 64, "hidden": 32}),),
        # No input cap: the inputs are small; eager PyTorch's [T, V] logits (and their fp32
        # copies) are what runs out of memory, and its rows then say OOM.
        notes={
            "kernelwright": "chunks of >= 512 tokens; the forward runs all three matmuls "
            "and leaves the gradients ready, the backward is a multiply skipped at dy = 1: "
            "compare 'full' (its forward TFLOP/s counts one matmul of the three it runs)",
            "kernelwright_liger_chunk": "Liger's chunk size (so Liger's memory)",
            "torch": "F.linear to the full [T, V] logits, .float(), F.cross_entropy: HF's "
            "lm-head + loss",
            "torch_compile": "the torch provider under torch.compile",
            "liger": "LigerFusedLinearCrossEntropyFunction: chunked, gradients computed in "
            "the forward; one host sync per call (.item() of the token count)",
        },
        unit_grad=True,
        backward_once=True,
    )
)
