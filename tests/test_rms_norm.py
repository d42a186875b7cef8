"""rms_norm: forward and backward against the fp32 reference, casting modes, layouts, errors."""

import pytest
import torch
from conftest import DEVICE, ON_GPU

from kernelwright.ops import rms_norm as rn
from kernelwright.ops.rms_norm import (
    RMSNorm,
    rms_norm,
    rms_norm_bwd_launch,
    rms_norm_eager,
    rms_norm_fwd_launch,
    rms_norm_ref,
)
from kernelwright.runtime import LaunchConfig
from kernelwright.runtime.tables import rms_norm as rms_table
from kernelwright.testing import (
    Tolerance,
    check_op,
    generator,
    large_offset_rows,
    poisoned,
    rand,
    rel_norm_error,
)

# Relative-norm error bounds. "none" rounds three times (rstd, x_hat, y) and "llama" twice;
# the bf16 forward bound covers three roundings (the interpreter also truncates instead of
# rounding to nearest, which doubles the bf16 error on CPU).
TOL = {
    torch.float32: Tolerance(fwd=1e-5, bwd=1e-4),
    torch.float16: Tolerance(fwd=2e-3, bwd=4e-3),
    torch.bfloat16: Tolerance(fwd=1.4e-2, bwd=1.6e-2),
}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
MODES = [("llama", 0.0), ("gemma", 1.0), ("none", 0.0), ("llama", 1.0)]

# Row lengths at the regime boundaries of the launch tables, plus odd sizes; the interpreter
# table switches to the looped kernel above 1024.
if ON_GPU:
    SHAPES = [(4099, 64), (3, 1000, 257), (1023, 4096), (257, 8192), (31, 16384), (9, 65537)]
else:
    SHAPES = [(37, 64), (2, 3, 257), (5, 1000), (1, 1024), (3, 1025), (2, 1, 2, 1537)]


def _inputs(shape, dtype, seed, *, layout="contiguous", weight=True):
    gen = generator(seed)
    x = rand(shape, dtype, DEVICE, gen=gen, layout=layout)
    w = rand(shape[-1:], dtype, DEVICE, gen=gen, mean=1.0, std=0.5) if weight else None
    return {"x": x, "weight": w}


def _check(inputs, dtype, **kwargs):
    check_op(rms_norm, rms_norm_ref, inputs, kwargs=kwargs, tolerances=TOL, dtype=dtype).assert_ok()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_forward_backward_matches_reference(shape, dtype):
    for seed in (0, 1):
        _check(_inputs(shape, dtype, seed), dtype, eps=1e-6)


@pytest.mark.parametrize("mode,offset", MODES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_casting_modes_and_offset(mode, offset, dtype):
    for shape in [SHAPES[1], SHAPES[4]]:
        _check(_inputs(shape, dtype, 3), dtype, eps=1e-5, casting_mode=mode, offset=offset)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_without_weight(dtype):
    for shape in [SHAPES[0], SHAPES[4]]:
        _check(_inputs(shape, dtype, 4, weight=False), dtype)


@pytest.mark.parametrize("layout", ["row_strided", "transposed"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_non_contiguous_input(layout, dtype):
    for shape in [SHAPES[1], SHAPES[4]]:
        _check(_inputs(shape, dtype, 5, layout=layout), dtype)


def test_every_kernel_path_agrees(monkeypatch):
    # The same rows through the multi-row, one-row and looped kernels must agree (13 rows are
    # "few", _partials.few_rows: kept in the fused kernels here).
    monkeypatch.setattr(rms_table, "PARTIALS_SHARE", float("inf"))
    gen = generator(6)
    x = rand((13, 700), torch.float32, DEVICE, gen=gen)
    w = rand((700,), torch.float32, DEVICE, gen=gen)
    dy = rand((13, 700), torch.float32, DEVICE, gen=gen)
    results = []
    configs = [LaunchConfig(block_n=1024, rows=4), LaunchConfig(block_n=1024, rows=1)]
    # num_stages=2: the backward prefetches the next row block; 4 programs (the interpreter's
    # SM count) walk 7 and 13 blocks, so every program prefetches real rows and a masked tail.
    configs += [LaunchConfig(block_n=1024, rows=r, num_stages=2) for r in (2, 1)]
    for cfg in [*configs, LaunchConfig(block_n=128)]:
        with poisoned():
            y = torch.full_like(x, float("nan"))
            rstd = torch.full((13,), float("nan"), device=DEVICE)
            dx = torch.full_like(x, float("nan"))
            dw = torch.full_like(w, float("nan"))
            rms_norm_fwd_launch(x, w, y, rstd, 1e-6, 0.0, "llama", config=cfg)
            rms_norm_bwd_launch(dy, x, w, rstd, dx, dw, 0.0, "llama", config=cfg)
        results.append((y, dx, dw))
    ref_y = rms_norm_ref(x, w)
    for other in results[1:]:
        for a, b in zip(results[0], other, strict=True):
            assert rel_norm_error(a, b) < 1e-6
    assert rel_norm_error(results[0][0], ref_y) < 1e-6


@pytest.mark.parametrize(
    "dtype,mode,offset",
    [
        (torch.float16, "llama", 0.0),
        (torch.float16, "gemma", 1.0),
        pytest.param(torch.bfloat16, "llama", 0.0, marks=pytest.mark.gpu),
        pytest.param(torch.bfloat16, "gemma", 1.0, marks=pytest.mark.gpu),
    ],
)
def test_matches_hugging_face_rounding(dtype, mode, offset):
    # The casting modes exist to reproduce the model's own roundings: nearly every element must
    # equal the eager HF-style result bit for bit (only fp32 summation order may differ). bf16
    # runs on the GPU only: the interpreter truncates fp32 -> bf16 instead of rounding.
    inputs = _inputs((64, 1000), dtype, 7)
    ours = rms_norm(**inputs, eps=1e-6, casting_mode=mode, offset=offset)
    theirs = rms_norm_eager(**inputs, eps=1e-6, casting_mode=mode, offset=offset)
    assert ours.dtype == theirs.dtype
    assert (ours == theirs).float().mean().item() > 0.999


def test_output_dtype_follows_hugging_face():
    x = rand((4, 64), torch.bfloat16, DEVICE, gen=generator(8))
    w32 = rand((64,), torch.float32, DEVICE, gen=generator(9))
    assert rms_norm(x, w32, casting_mode="llama").dtype == torch.float32  # weight * x.to(bf16)
    assert rms_norm(x, w32, casting_mode="gemma").dtype == torch.bfloat16  # .type_as(x)
    assert rms_norm(x, None).dtype == torch.bfloat16


def test_mixed_dtype_weight_gradient_dtype():
    inputs = _inputs((6, 300), torch.bfloat16, 10)
    inputs["weight"] = inputs["weight"].float()
    check_op(rms_norm, rms_norm_ref, inputs, tolerances=TOL, dtype=torch.bfloat16).assert_ok()


def test_in_place_backward_matches_and_reuses_dy():
    inputs = _inputs((9, 300), torch.float32, 11)
    dy = rand((9, 300), torch.float32, DEVICE, gen=generator(12))
    grads = []
    for in_place in (False, True):
        x = inputs["x"].clone().requires_grad_()
        w = inputs["weight"].clone().requires_grad_()
        y = rms_norm(x, w, in_place_backward=in_place)
        g = dy.clone()
        y.backward(g)
        grads.append((x.grad, w.grad, g))
    (dx0, dw0, g0), (dx1, dw1, g1) = grads
    assert torch.equal(dx0, dx1) and torch.equal(dw0, dw1)
    assert torch.equal(g0, dy)  # out of place: the incoming gradient is untouched
    assert torch.equal(g1, dx1)  # in place: dx was written over it


@pytest.mark.parametrize("in_place", [False, True], ids=["out_of_place", "in_place"])
@pytest.mark.parametrize("mode,offset", [("llama", 0.0), ("gemma", 1.0), ("none", 0.0)])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_few_rows_backward_has_no_partials(monkeypatch, dtype, mode, offset, in_place):
    # Few rows (_partials.few_rows): dW from the dw kernel (one program per column block
    # through every row, stored in the weight's dtype), run before dx so an in-place dx (dy's
    # storage) cannot change what it reads; no fp32 partial rows. Poisoned outputs, an odd
    # width (partial last column block), against the fp32 reference.
    calls = []
    real = rn.rms_norm_dw_launch
    monkeypatch.setattr(rn, "rms_norm_dw_launch", lambda *a, **k: calls.append(1) or real(*a, **k))
    m, n = (257, 4097) if ON_GPU else (2, 333)
    gen = generator(18)
    x = rand((m, n), dtype, DEVICE, gen=gen)
    w = rand((n,), dtype, DEVICE, gen=gen, mean=1.0, std=0.5)
    dy = rand((m, n), dtype, DEVICE, gen=gen)
    y, rstd = torch.empty_like(x), torch.empty(m, device=DEVICE)
    rms_norm_fwd_launch(x, w, y, rstd, 1e-6, offset, mode)
    monkeypatch.setattr(rn, "empty", lambda *a, **k: pytest.fail("the launcher allocated"))
    with poisoned():
        g = dy.clone()
        dx = g if in_place else torch.full_like(x, float("nan"))
        dw = torch.full_like(w, float("nan"))
        rms_norm_bwd_launch(g, x, w, rstd, dx, dw, offset, mode)
    assert calls == [1]
    xf, wf = x.float().requires_grad_(), w.float().requires_grad_()
    rms_norm_ref(xf, wf, eps=1e-6, offset=offset, casting_mode=mode).backward(dy.float())
    assert rel_norm_error(dx, xf.grad) < TOL[dtype].bwd
    assert dw.dtype == dtype and rel_norm_error(dw, wf.grad) < TOL[dtype].bwd


def test_expanded_upstream_gradient():
    # y.sum().backward() hands the kernel a stride-0 gradient.
    x = rand((5, 3, 200), torch.float32, DEVICE, gen=generator(13)).requires_grad_()
    w = rand((200,), torch.float32, DEVICE, gen=generator(14)).requires_grad_()
    rms_norm(x, w).sum().backward()
    xr = x.detach().clone().requires_grad_()
    wr = w.detach().clone().requires_grad_()
    rms_norm_ref(xr, wr).sum().backward()
    assert rel_norm_error(x.grad, xr.grad) < 1e-5
    assert rel_norm_error(w.grad, wr.grad) < 1e-5


def test_weight_frozen_no_dw():
    x = rand((7, 300), torch.float32, DEVICE, gen=generator(15)).requires_grad_()
    w = rand((300,), torch.float32, DEVICE, gen=generator(16))
    rms_norm(x, w).backward(torch.ones(7, 300, device=DEVICE))
    xr = x.detach().clone().requires_grad_()
    rms_norm_ref(xr, w).backward(torch.ones(7, 300, device=DEVICE))
    assert w.grad is None
    assert rel_norm_error(x.grad, xr.grad) < 1e-5


def test_int64_offsets():
    # Row 2 starts past 2^31 elements: an int32 offset would wrap and read/write elsewhere.
    for dtype in (torch.float32, torch.bfloat16):
        x = large_offset_rows(300, 3, dtype, DEVICE, gen=generator(17))
        w = rand((300,), dtype, DEVICE, gen=generator(18))
        _check({"x": x, "weight": w}, dtype)


@pytest.mark.gpu
def test_more_than_2_31_elements():
    # A real tensor over 2^31 elements (4.3 GB in bf16): forward and backward, spot-checked.
    n = 4096
    m = 2**31 // n + 3
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, device="cuda", dtype=torch.bfloat16).requires_grad_()
    x.requires_grad_()
    y = rms_norm(x, w)
    rows = torch.tensor([0, m // 2, m - 2, m - 1], device="cuda")
    ref = rms_norm_ref(x.detach()[rows], w.detach())
    assert rel_norm_error(y.detach()[rows], ref) < TOL[torch.bfloat16].fwd
    y.backward(y.detach())
    del y
    xr = x.detach()[rows].float().requires_grad_()
    rms_norm_ref(xr, w.detach()).backward(rms_norm_ref(xr.detach(), w.detach()))
    assert rel_norm_error(x.grad[rows], xr.grad) < TOL[torch.bfloat16].bwd
    assert torch.isfinite(w.grad).all()


def test_zero_rows():
    x = torch.empty(0, 64, device=DEVICE).requires_grad_()
    w = torch.ones(64, device=DEVICE).requires_grad_()
    y = rms_norm(x, w)
    assert y.shape == (0, 64)
    y.sum().backward()
    assert torch.equal(w.grad, torch.zeros(64, device=DEVICE))


def test_module():
    m = RMSNorm(300, eps=1e-5).to(DEVICE)
    assert torch.equal(m.weight, torch.ones(300, device=DEVICE))
    assert torch.equal(RMSNorm(8, offset=1.0).weight, torch.zeros(8))  # Gemma's init
    assert RMSNorm(8, elementwise_affine=False).weight is None
    with torch.no_grad():
        m.weight.copy_(rand((300,), torch.float32, DEVICE, gen=generator(19)))
    x = rand((4, 300), torch.float32, DEVICE, gen=generator(20))
    assert rel_norm_error(m(x), rms_norm_ref(x, m.weight, 1e-5)) < 1e-5
    assert "casting_mode='llama'" in repr(m)


def test_bad_input_errors():
    x = rand((4, 64), torch.float32, DEVICE, gen=generator(21))
    with pytest.raises(ValueError, match=r"'weight' must have shape \(64,\).*got \(63,\)"):
        rms_norm(x, torch.ones(63, device=DEVICE))
    with pytest.raises(TypeError, match=r"'x' must have dtype in .*got int32"):
        rms_norm(torch.ones(4, 64, dtype=torch.int32, device=DEVICE))
    with pytest.raises(TypeError, match="'weight' must be a torch.Tensor"):
        rms_norm(x, [1.0] * 64)
    with pytest.raises(ValueError, match="casting_mode must be one of"):
        rms_norm(x, casting_mode="llama3")
    with pytest.raises(ValueError, match="at least 1 dimension"):
        rms_norm(torch.tensor(1.0, device=DEVICE))
    with pytest.raises(ValueError, match="empty last dimension"):
        rms_norm(torch.ones(4, 0, device=DEVICE))
    if not ON_GPU:
        with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
            rms_norm(torch.ones(4, 64, device="meta"))


def test_harness_catches_a_wrong_kernel():
    # A test that cannot fail is a defect: a kernel with the wrong eps, and one that skips the
    # last column, must both fail the comparison.
    inputs = _inputs((5, 300), torch.float32, 22)
    wrong_eps = lambda x, weight, **kw: rms_norm(x, weight, eps=1e-1)
    assert not check_op(wrong_eps, rms_norm_ref, inputs, tolerances=TOL).ok

    def skips_last_column(x, weight, **kw):
        y = rms_norm(x[..., :-1], weight[:-1])
        out = torch.full_like(x, float("nan"))
        return torch.cat([y, out[..., -1:]], dim=-1)

    report = check_op(skips_last_column, rms_norm_ref, inputs, tolerances=TOL, backward=False)
    assert not report.ok and report.rows[0].error == float("inf")


@pytest.mark.compile
def test_torch_compile_fullgraph():
    # The custom ops make the whole forward+backward one graph with opaque kernel nodes.
    torch._dynamo.reset()
    inputs = _inputs((6, 2, 300), torch.float32, 23)

    def block(x, w):
        return rms_norm(x * 2.0, w, casting_mode="gemma", offset=1.0).sin()

    compiled = torch.compile(block, fullgraph=True)
    x = inputs["x"].detach().requires_grad_()
    w = inputs["weight"].detach().requires_grad_()
    compiled(x, w).sum().backward()
    xr = inputs["x"].detach().requires_grad_()
    wr = inputs["weight"].detach().requires_grad_()
    block(xr, wr).sum().backward()
    assert rel_norm_error(x.grad, xr.grad) < 1e-5
    assert rel_norm_error(w.grad, wr.grad) < 1e-5


def test_output_can_be_modified_in_place():
    # Returned as allocated, not as a view made inside the autograd Function (which autograd
    # forbids modifying in place): `y.mul_()` after the norm must work and differentiate.
    inputs = _inputs((3, 5, 300), torch.float32, 24)
    x = inputs["x"].detach().requires_grad_()
    xr = inputs["x"].detach().requires_grad_()
    rms_norm(x, inputs["weight"]).mul_(3.0).sum().backward()
    rms_norm_ref(xr, inputs["weight"]).mul_(3.0).sum().backward()
    assert rel_norm_error(x.grad, xr.grad) < 1e-5


def test_harness_catches_a_detached_output():
    inputs = _inputs((5, 300), torch.float32, 25)
    detached = lambda x, weight, **kw: rms_norm(x, weight).detach()
    report = check_op(detached, rms_norm_ref, inputs, tolerances=TOL)
    assert not report.ok and any("detached" in r.name for r in report.rows)
