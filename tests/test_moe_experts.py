"""moe_experts vs Hugging Face's own grouped_mm experts forward/backward and the fp32 reference.

fp32: against HF's `grouped_mm_experts_forward` on the same module, forward and every gradient,
to fp32 rounding. bf16 (GPU): the error of ours vs the fp32 reference stays under twice HF's own
bf16 error vs that reference, plus a small epsilon (STYLE 4: matmul-like ops).
"""

from __future__ import annotations

import pytest
import torch
from conftest import DEVICE, ON_GPU

transformers = pytest.importorskip("transformers")

from transformers.integrations.moe import grouped_mm_experts_forward  # noqa: E402
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts  # noqa: E402

from kernelwright.ops.moe_experts import grouped_mm, moe_experts, moe_experts_ref  # noqa: E402
from kernelwright.runtime.alloc import poisoned  # noqa: E402

# fp32: relative to the largest reference entry; bf16: (factor over HF's error, epsilon)
RTOL_FP32 = 2e-6
BF16_BOUND = (2.0, 1e-3)

# (tokens, hidden, moe intermediate, experts, top_k); experts >= 2 beyond the routed range get
# no tokens. GPU shapes are a scaled-down Qwen3-30B-A3B layer.
SHAPES = (
    [(13, 32, 24, 6, 2), (7, 16, 8, 5, 3)]
    if not ON_GPU
    else [(13, 32, 24, 6, 2), (2048, 1024, 384, 32, 8), (1000, 512, 200, 20, 4)]
)


def _experts(shape, dtype, seed=0):
    T, H, I, E, k = shape  # noqa: E741
    cfg = transformers.Qwen3MoeConfig(
        hidden_size=H, moe_intermediate_size=I, num_experts=E, num_experts_per_tok=k
    )
    torch.manual_seed(seed)
    ex = Qwen3MoeExperts(cfg).to(device=DEVICE, dtype=dtype)
    with torch.no_grad():
        ex.gate_up_proj.normal_(0.0, H**-0.5)
        ex.down_proj.normal_(0.0, I**-0.5)
    return ex


def _inputs(shape, dtype, seed=1):
    T, H, I, E, k = shape  # noqa: E741
    g = torch.Generator().manual_seed(seed)
    # a non-contiguous x (every other column of a wider tensor)
    x = torch.randn(T, 2 * H, generator=g)[:, ::2].to(DEVICE, dtype).requires_grad_()
    # distinct experts per token out of the first E - 2: the last two experts get no tokens
    idx = torch.rand(T, E - 2, generator=g).argsort(-1)[:, :k].to(DEVICE)
    w = torch.rand(T, k, generator=g).softmax(-1).to(DEVICE, dtype).requires_grad_()
    dout = torch.randn(T, H, generator=g).to(DEVICE, dtype)
    return x, idx, w, dout


def _run(fn, ex, x, idx, w, dout):
    params = [x, ex.gate_up_proj, ex.down_proj, w]
    out = fn(x, idx, w)
    return [out, *torch.autograd.grad(out, params, dout)]


def _ours(ex):
    return lambda x, idx, w: moe_experts(x, ex.gate_up_proj, ex.down_proj, idx, w)


def _hf(ex):
    return lambda x, idx, w: grouped_mm_experts_forward(ex, x, idx, w)


def _ref(ex):
    return lambda x, idx, w: moe_experts_ref(x, ex.gate_up_proj, ex.down_proj, idx, w)


NAMES = ("out", "dx", "dgate_up", "ddown", "dweights")


@pytest.mark.parametrize("shape", SHAPES)
def test_matches_hf_fp32(shape):
    ex = _experts(shape, torch.float32)
    x, idx, w, dout = _inputs(shape, torch.float32)
    with poisoned():
        ours = _run(_ours(ex), ex, x, idx, w, dout)
    want = _run(_hf(ex), ex, x, idx, w, dout)
    ref = _run(_ref(ex), ex, x, idx, w, dout)
    for name, a, b, r in zip(NAMES, ours, want, ref, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        scale = b.abs().max().item()
        assert (a - b).abs().max().item() <= RTOL_FP32 * scale, name
        assert (a - r).abs().max().item() <= 5 * RTOL_FP32 * scale, name
    # experts that no token chose get exactly zero weight gradients
    assert ours[2][-2:].abs().max() == 0 and ours[3][-2:].abs().max() == 0


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES[1:])
def test_bf16_within_hf_error(shape):
    ex = _experts(shape, torch.bfloat16)
    x, idx, w, dout = _inputs(shape, torch.bfloat16)
    ours = _run(_ours(ex), ex, x, idx, w, dout)
    hf = _run(_hf(ex), ex, x, idx, w, dout)
    ref = _run(_ref(ex), ex, x, idx, w, dout)  # fp32 math on the same bf16 inputs
    factor, eps = BF16_BOUND
    for name, a, b, r in zip(NAMES, ours, hf, ref, strict=True):
        assert a.dtype == b.dtype, name
        err = (a.float() - r.float()).abs().max().item()
        hf_err = (b.float() - r.float()).abs().max().item()
        scale = r.float().abs().max().item()
        assert err <= factor * hf_err + eps * scale, f"{name}: {err} vs HF {hf_err}"


def test_deterministic():
    shape = SHAPES[-1]
    dtype = torch.bfloat16 if ON_GPU else torch.float32
    ex = _experts(shape, dtype)
    x, idx, w, dout = _inputs(shape, dtype)
    a = _run(_ours(ex), ex, x, idx, w, dout)
    b = _run(_ours(ex), ex, x, idx, w, dout)
    for name, u, v in zip(NAMES, a, b, strict=True):
        assert torch.equal(u, v), name


def test_no_grad_and_partial_grads():
    shape = SHAPES[0]
    ex = _experts(shape, torch.float32)
    x, idx, w, dout = _inputs(shape, torch.float32)
    with torch.no_grad():
        out = moe_experts(x, ex.gate_up_proj, ex.down_proj, idx, w)
    assert not out.requires_grad
    # only the routing weights need a gradient (frozen experts, frozen input)
    ex.requires_grad_(False)
    out = moe_experts(x.detach(), ex.gate_up_proj, ex.down_proj, idx, w)
    (dw,) = torch.autograd.grad(out, [w], dout)
    ref = moe_experts_ref(x.detach(), ex.gate_up_proj, ex.down_proj, idx, w)
    (dw_ref,) = torch.autograd.grad(ref, [w], dout)
    torch.testing.assert_close(dw, dw_ref, rtol=1e-5, atol=1e-5)


def test_grouped_mm_loop_both_forms():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(10, 8, generator=g)
    b = torch.randn(3, 8, 6, generator=g)
    offs = torch.tensor([4, 4, 10], dtype=torch.int32)
    out = grouped_mm(a, b, offs)
    torch.testing.assert_close(out, torch.cat([a[:4] @ b[0], a[4:] @ b[2]]))
    c = torch.randn(10, 5, generator=g)
    dw = grouped_mm(a.t(), c, offs)  # [3, 8, 5]
    torch.testing.assert_close(dw[0], a[:4].t() @ c[:4])
    assert dw[1].abs().max() == 0
    torch.testing.assert_close(dw[2], a[4:].t() @ c[4:])


def test_errors():
    shape = SHAPES[0]
    ex = _experts(shape, torch.float32)
    x, idx, w, _ = _inputs(shape, torch.float32)
    gu, down = ex.gate_up_proj, ex.down_proj
    with pytest.raises(ValueError, match="activation"):
        moe_experts(x, gu, down, idx, w, activation="geglu")
    with pytest.raises(ValueError, match="down_proj must have shape"):
        moe_experts(x, gu, down[:, :, :-1], idx, w)
    with pytest.raises(ValueError, match="top_k_index"):
        moe_experts(x, gu, down, idx.float(), w)
    with pytest.raises(ValueError, match="top_k_weights"):
        moe_experts(x, gu, down, idx, w[:, :1])
