"""rope's half_table pairing (GPT-OSS): half-split pairs by cos/sin [.., R/2] that hold one
angle a pair, against the fp32 reference (partial rotary, both layouts, fp32 and bf16) and
against GPT-OSS's own apply_rotary_pos_emb, forward and backward."""

import functools

import pytest
import torch
from conftest import rope_agrees

from kernelwright.ops.rope import rope, rope_ref
from kernelwright.testing import Tolerance, check_op, generator, rand

# as test_rope.py: one fp32 rounding at the end; the interpreter truncates fp32 -> bf16
TOL = {torch.float32: Tolerance(fwd=1e-6, bwd=1e-6), torch.bfloat16: Tolerance(fwd=6e-3, bwd=6e-3)}


@pytest.mark.parametrize(
    ("shape", "unsqueeze_dim"),
    [((1, 9, 4, 1, 80, 24), 1), ((2, 6, 3, 3, 96, 48), 2)],
    ids=["mqa_partial", "half_not_pow2"],
)
def test_half_table_matches_reference(shape, unsqueeze_dim, device):
    # (B, S, Hq, Hk, D, table width): R = 48 of 80 dims (partial, pairs padded to 32), then all
    # 96 (48 pairs padded to 64). Random tables, so a kernel reading past the table's width or
    # a pairing other than (i, i + R/2) fails.
    b, s, hq, hk, d, w = shape
    for dtype in (torch.float32, torch.bfloat16):
        gen = generator(11)
        if unsqueeze_dim == 1:  # HF's transposed view of a [B, S, H, D] projection
            q, k = (rand((b, s, h, d), dtype, device, gen=gen).transpose(1, 2) for h in (hq, hk))
        else:
            q, k = (rand((b, s, h, d), dtype, device, gen=gen) for h in (hq, hk))
        cos, sin = (rand((b, s, w), torch.float32, device, gen=gen) for _ in range(2))
        check_op(
            rope, rope_ref, {"q": q, "k": k, "cos": cos, "sin": sin},
            kwargs=dict(unsqueeze_dim=unsqueeze_dim, half_table=True), grad_inputs=("q", "k"),
            tolerances=TOL,
        ).assert_ok()  # fmt: skip


def test_half_table_is_gpt_oss_function(device):
    # GptOssRotaryEmbedding's cos/sin [B, S, D/2] through its apply_rotary_pos_emb (torch.chunk
    # halves): forward and backward bit for bit under the interpreter.
    modeling = pytest.importorskip("transformers.models.gpt_oss.modeling_gpt_oss")
    gen = generator(12)
    q = rand((2, 7, 3, 16), torch.float32, device, gen=gen).transpose(1, 2)
    k = rand((2, 7, 1, 16), torch.float32, device, gen=gen).transpose(1, 2)
    cos, sin = (rand((2, 7, 8), torch.float32, device, gen=gen) for _ in range(2))
    ours = functools.partial(rope, half_table=True)
    rope_agrees(modeling.apply_rotary_pos_emb, ours, q, k, cos, sin, gen)
    with pytest.raises(ValueError, match="at most one"):
        rope(q, k, cos, sin, deinterleave=True, half_table=True)
    with pytest.raises(ValueError, match="R/2"):  # a [f, f] table is twice too wide here
        rope(q, k, torch.cat((cos, cos), -1), torch.cat((sin, sin), -1), half_table=True)
