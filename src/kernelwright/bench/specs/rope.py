"""Benchmark spec of rope, swept over token counts and the models' attention head configs."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernelwright import registry
from kernelwright.bench.models import DEFAULT_TOKENS, MODELS, REFERENCE, token_counts
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

# --------------------------------------------------------------------------- rope

ROPE_THETA = 500000.0  # Llama 3's rope_theta: the cos/sin tables' values do not change the cost


@dataclass(frozen=True)
class HeadConfigSweep(Sweep):
    """One point per attention head config (heads, kv_heads, head_dim), the other dims fixed.

    Head configs vary three dims at once, so x is one number that names each: its `values`,
    here (heads + kv_heads) * head_dim, the q and k elements per token (distinct per config).
    """

    configs: tuple[tuple[int, int, int], ...] = ()  # (heads, kv_heads, head_dim), as `values`

    def shapes(self) -> list[tuple[int, dict[str, int]]]:
        return [
            (x, {**self.fixed, "heads": h, "kv_heads": kv, "head_dim": d})
            for x, (h, kv, d) in zip(self.values, self.configs, strict=True)
        ]


def _head_config_sweep(tokens: int) -> HeadConfigSweep:
    # The registry's distinct head configs, ordered by q+k width.
    configs = sorted({(m.heads, m.kv_heads, m.head_dim) for m in MODELS},
                     key=lambda c: (c[0] + c[1]) * c[2])  # fmt: skip
    widths = tuple((h + kv) * d for h, kv, d in configs)
    return HeadConfigSweep("qk_width", widths, {"tokens": tokens}, tuple(configs))


_REFERENCE_HEADS = {
    "heads": REFERENCE.heads, "kv_heads": REFERENCE.kv_heads, "head_dim": REFERENCE.head_dim
}  # fmt: skip


def _rope_inputs(shape: Shape, dtype: torch.dtype, device, *, seed: int = 0):
    rope_tables = registry.get("rope").attr("rope_tables")
    gen = generator(seed)
    s, d = shape["tokens"], shape["head_dim"]  # batch 1: one sequence of `tokens` positions
    # q, k as HF attention hands them over: proj(x).view(1, S, H, D).transpose(1, 2), a
    # non-contiguous [1, H, S, D] view; cos/sin [1, S, D] in q's dtype, as HF's rotary
    # embedding returns them.
    cos, sin = rope_tables(s, d, base=ROPE_THETA, dtype=dtype, device=device)
    return {
        "q": rand((1, s, shape["heads"], d), dtype, device, gen=gen).transpose(1, 2),
        "k": rand((1, s, shape["kv_heads"], d), dtype, device, gen=gen).transpose(1, 2),
        "cos": cos,
        "sin": sin,
    }


def _rope_bytes(shape: Shape, dtype: torch.dtype, mode: str) -> int:
    t, d, s = shape["tokens"], shape["head_dim"], dtype.itemsize
    qk = t * (shape["heads"] + shape["kv_heads"]) * d * s  # q and k, [1, H, S, D] each
    tables = 2 * t * d * s  # cos and sin [1, S, D]: each row read once, for all heads
    # forward: read q, k and cos, sin; write q_out, k_out         -> 2 * qk + tables
    # backward: read dq_out, dk_out and cos, sin; write dq, dk    -> 2 * qk + tables
    per_pass = 2 * qk + tables
    return {"forward": per_pass, "backward": per_pass, "full": 2 * per_pass}[mode]


def _rope_providers() -> tuple[Provider, ...]:
    m, names = ours("rope"), ("q", "k", "cos", "sin")
    return (
        Provider("kernelwright", call(*m, names, in_place=False)),
        # writes q and k in place (rope(..., in_place=True)), as Liger does
        Provider("kernelwright_inplace", call(*m, names, in_place=True), mutates=True),
        *op_torch_providers("rope", names),
        # (q, k, cos, sin, position_ids=None, unsqueeze_dim=1); half-split, full rotary only.
        # Liger rotates q and k in place when q.transpose(1, 2) is contiguous (HF's layout),
        # and the gradients in place over dq_out / dk_out.
        Provider(
            "liger",
            call("liger_kernel.transformers.rope", "liger_rotary_pos_emb", names),
            requires="liger_kernel",
            mutates=True,
        ),
    )


ROPE = register(
    BenchSpec(
        op="rope",
        dims=("tokens", "heads", "kv_heads", "head_dim"),
        providers=_rope_providers(),
        make_inputs=_rope_inputs,
        grad_inputs=("q", "k"),
        bytes=_rope_bytes,
        backward_through=(0, 1),
        sweeps=(
            Sweep("tokens", token_counts(1024, 32768), _REFERENCE_HEADS),
            _head_config_sweep(DEFAULT_TOKENS),
        ),
        quick_sweeps=(Sweep("tokens", (DEFAULT_TOKENS, 32768), _REFERENCE_HEADS),),
        interpreter_sweeps=(Sweep("tokens", (8, 16), {"heads": 4, "kv_heads": 2, "head_dim": 32}),),
        notes={
            "torch": "HF apply_rotary_pos_emb (rotate_half) in the input dtype",
            "liger": "liger_rotary_pos_emb: rotates q/k (and the gradients) in place",
        },
    )
)
