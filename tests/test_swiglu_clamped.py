"""swiglu_clamped / swiglu_clamped_fused (GPT-OSS's expert gate): forward and backward against
the fp32 reference with inputs on both sides of the clamp, interleaved (column-stride-2) and
halved layouts, the silu form (alpha 1, offset 0), clamp's gradient at its bounds and NaN,
agreement with eager, and errors."""

import pytest
import torch
from conftest import DEVICE

from kernelwright.ops import swiglu_clamped as SC
from kernelwright.ops.swiglu_clamped import (
    SwiGLUClamped,
    swiglu_clamped,
    swiglu_clamped_eager,
    swiglu_clamped_fused,
    swiglu_clamped_fused_ref,
    swiglu_clamped_ref,
)
from kernelwright.testing import Tolerance, check_op_seeds, generator, rand

# Relative-norm error bounds vs the unrounded fp32 reference. The forward rounds three times
# (the glu g * sigmoid(alpha g), up + offset, the product), the backward four (dh, the glu,
# each gradient); fp32 differs only by exp's last bit. bf16 covers the interpreter's truncating
# fp32 -> bf16 conversion. Measured under the interpreter (std 4, limit 7): fp32 5e-8,
# fp16 3.5e-4, bf16 8e-3.
TOL = {
    torch.float32: Tolerance(fwd=1e-6, bwd=1e-6),
    torch.float16: Tolerance(fwd=1.5e-3, bwd=1.5e-3),
    torch.bfloat16: Tolerance(fwd=1.2e-2, bwd=1.5e-2),
}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
SHAPES = [(5, 37), (2, 3, 65), (1, 7)]  # odd widths, a rank-3 input, one short row
STD = 4.0  # with limit 7, ~8% of the inputs lie beyond +-limit
FORMS = {  # GPT-OSS / MiniMax-M3, and the silu gate of DeepSeek-V4 / GLM-5-Next / HY-V4
    "gpt_oss": {"alpha": 1.702, "limit": 7.0, "up_offset": 1.0},
    "silu": {"alpha": 1.0, "limit": 7.0, "up_offset": 0.0},
}


def _gate_up(shape, dtype, seed, interleaved):
    *lead, n = shape
    gen = generator(seed)
    if interleaved:  # the two column-stride-2 halves of one [..., 2N] tensor
        x = rand((*lead, 2 * n), dtype, DEVICE, gen=gen, std=STD)
        return {"gate": x[..., 0::2], "up": x[..., 1::2]}
    return {
        "gate": rand(shape, dtype, DEVICE, gen=gen, std=STD, layout="row_strided"),
        "up": rand(shape, dtype, DEVICE, gen=gen, std=STD),
    }


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "separate"])
def test_separate_matches_reference(shape, dtype, interleaved):
    check_op_seeds(
        swiglu_clamped, swiglu_clamped_ref,
        lambda seed: _gate_up(shape, dtype, seed, interleaved),
        seeds=(0, 1), tolerances=TOL, dtype=dtype, kwargs=FORMS["gpt_oss"],
    )  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("form", FORMS, ids=str)
@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "halves"])
def test_fused_matches_reference(form, dtype, interleaved):
    def inputs(seed):
        return {"x": rand((2, 3, 2 * 37), dtype, DEVICE, gen=generator(seed), std=STD)}

    check_op_seeds(
        swiglu_clamped_fused, swiglu_clamped_fused_ref, inputs, seeds=(0, 1), tolerances=TOL,
        dtype=dtype, kwargs={**FORMS[form], "interleaved": interleaved},
    )  # fmt: skip


def test_interleaved_views_are_read_in_place_and_agree_with_fused():
    x = rand((4, 2 * 33), torch.float32, DEVICE, gen=generator(3), std=STD).requires_grad_()
    dc = torch.randn(4, 33, device=DEVICE)
    out = swiglu_clamped(x[:, 0::2], x[:, 1::2])
    (g_sep,) = torch.autograd.grad(out, x, dc)
    fused = swiglu_clamped_fused(x)
    (g_fused,) = torch.autograd.grad(fused, x, dc)
    assert torch.equal(out, fused) and torch.equal(g_sep, g_fused)
    ref = swiglu_clamped_fused_ref(x)
    (g_ref,) = torch.autograd.grad(ref, x, dc)
    torch.testing.assert_close(fused, ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(g_fused, g_ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_clamp_gradient_at_the_bounds_and_nan_is_torchs(dtype):
    # gate at +limit passes its gradient (clamp's bounds are inclusive), above it gets 0; up at
    # +-limit passes, beyond gets 0; NaN propagates forward and gets a 0 gradient
    lim = 7.0
    gate = torch.tensor(
        [[lim, lim + 0.5, -9.0, 1.0, float("nan"), 2.0, -lim, 0.5]], dtype=dtype, device=DEVICE
    )
    up = torch.tensor(
        [[1.0, 2.0, 3.0, lim, 1.0, -lim, -lim - 1, float("nan")]], dtype=dtype, device=DEVICE
    )
    dc = torch.ones(1, 8, dtype=dtype, device=DEVICE)
    outs, grads = [], []
    for fn in (swiglu_clamped, swiglu_clamped_eager):
        g, u = gate.clone().requires_grad_(), up.clone().requires_grad_()
        out = fn(g, u, alpha=1.702, limit=lim) if fn is swiglu_clamped else fn(g, u, 1.702, lim)
        out.backward(dc)
        outs.append(out.float())
        grads.append((g.grad.float(), u.grad.float()))
    torch.testing.assert_close(outs[0], outs[1], equal_nan=True, rtol=2e-2, atol=1e-2)
    for ours, eager in zip(grads[0], grads[1], strict=True):
        assert torch.equal(ours == 0, eager == 0), (ours, eager)  # same zero pattern
        assert torch.equal(ours.isnan(), eager.isnan())
        torch.testing.assert_close(ours, eager, equal_nan=True, rtol=2e-2, atol=1e-2)
    assert grads[0][0][0, 1] == 0 and grads[0][0][0, 0] != 0  # above / at the gate's bound
    assert grads[0][1][0, 6] == 0 and grads[0][1][0, 5] != 0  # below / at up's lower bound


def test_fp32_matches_eager_gpt_oss_gate():
    gen = generator(5)
    x = rand((6, 2 * 40), torch.float32, DEVICE, gen=gen, std=STD)
    gate, up = x[:, ::2], x[:, 1::2]
    torch.testing.assert_close(
        swiglu_clamped(gate, up), swiglu_clamped_eager(gate, up), rtol=2e-6, atol=2e-6
    )


def test_module_and_errors():
    gate = rand((3, 9), torch.float32, DEVICE, gen=generator(1), std=STD)
    up = rand((3, 9), torch.float32, DEVICE, gen=generator(2), std=STD)
    m = SwiGLUClamped(alpha=1.0, limit=2.0, up_offset=0.0)
    assert "limit=2.0" in repr(m)
    torch.testing.assert_close(
        m(gate, up), swiglu_clamped_ref(gate, up, alpha=1.0, limit=2.0, up_offset=0.0)
    )
    with pytest.raises(ValueError, match="limit >= 0"):
        swiglu_clamped(gate, up, limit=-1.0)
    with pytest.raises(ValueError, match="even last dimension"):
        swiglu_clamped_fused(gate)
    with pytest.raises(ValueError, match="column strides"):
        SC.swiglu_clamped_fwd_launch(gate[:, ::3], up[:, ::3], torch.empty(3, 3, device=DEVICE))


def test_a_wrong_clamp_gradient_is_caught(monkeypatch):
    # the reference with the gate's clamp gradient passed through everywhere must fail the check
    def wrong(gate, up, **kw):
        g = gate.float()
        g = g + (g.clamp(max=kw["limit"]) - g).detach()  # clamp's value, identity gradient
        u = up.float().clamp(-kw["limit"], kw["limit"])
        return g * torch.sigmoid(g * kw["alpha"]) * (u + kw["up_offset"])

    with pytest.raises(AssertionError):
        check_op_seeds(
            swiglu_clamped, wrong, lambda seed: _gate_up((4, 40), torch.float32, seed, True),
            seeds=(0,), tolerances=TOL, dtype=torch.float32, kwargs=FORMS["gpt_oss"],
        )  # fmt: skip
