"""l2_norm: forward and backward against the fp32 reference, layouts, properties, int64
offsets, errors, the harness's power to fail, GPU compilation and torch.compile."""

import math

import pytest
import torch
from conftest import ON_GPU

from kernelwright import registry
from kernelwright.ops import l2_norm as L
from kernelwright.ops.l2_norm import L2Norm, l2_norm, l2_norm_ref, launch_config
from kernelwright.testing import (
    Tolerance,
    check_op,
    check_op_seeds,
    generator,
    large_offset_rows,
    poisoned,
    rand,
    rel_norm_error,
)
from kernelwright.testing.gpu_compile import check_compiles

# Relative-norm error bounds vs the fp32 reference. fp32 differs only by the order of the
# row sums; fp16/bf16 round y and dx once (the bf16 bound covers the interpreter's truncation
# of fp32 -> bf16, about twice the error of rounding to nearest).
TOL = {
    torch.float32: Tolerance(fwd=1e-6, bwd=1e-5),
    torch.float16: Tolerance(fwd=1e-3, bwd=1e-3),
    torch.bfloat16: Tolerance(fwd=8e-3, bwd=8e-3),
}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]

# The registry's test shapes (odd widths, a single element, leading dims of rank 1 and 2); on
# the GPU also head-dim rows by the thousand and a row past one program's 4K elements.
SHAPES = list(registry.get("l2_norm").test_shapes)
if ON_GPU:
    SHAPES += [(4096, 128), (3, 1000, 96), (17, 8191), (5, 16384)]


def _x(shape, dtype, seed, device, layout="contiguous"):
    return {"x": rand(shape, dtype, device, gen=generator(seed), layout=layout)}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_forward_backward_matches_reference(shape, dtype, device):
    check_op_seeds(
        l2_norm, l2_norm_ref, lambda seed: _x(shape, dtype, seed, device),
        seeds=(0, 1), tolerances=TOL, dtype=dtype,
    )  # fmt: skip


@pytest.mark.parametrize("layout", ["row_strided", "transposed"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_non_contiguous_input(layout, dtype, device):
    for shape in [(37, 300), (2, 3, 65)]:
        x = _x(shape, dtype, 3, device, layout)["x"]
        assert not x.is_contiguous()
        check_op(l2_norm, l2_norm_ref, {"x": x}, tolerances=TOL).assert_ok()


def test_unit_rows_and_scale_invariance(device):
    # Each output row has norm 1 (eps aside), and y(c * x) = y(x) for c > 0.
    x = _x((9, 130), torch.float32, 4, device)["x"] * 10
    y = l2_norm(x)
    torch.testing.assert_close(y.norm(dim=-1), torch.ones(9, device=device), rtol=1e-5, atol=0)
    torch.testing.assert_close(l2_norm(x * 8.0), y, rtol=1e-5, atol=1e-7)


def test_zero_rows_stay_finite(device):
    # eps keeps an all-zero row finite: y = 0 and dx = dy / sqrt(eps)
    x = torch.zeros(3, 40, device=device, requires_grad=True)
    y = l2_norm(x, eps=1e-6)
    y.backward(torch.ones_like(y))
    assert torch.equal(y, torch.zeros_like(y))
    torch.testing.assert_close(x.grad, torch.full_like(x, 1e3), rtol=1e-6, atol=0)


def test_expanded_upstream_gradient(device):
    # out.sum().backward() hands the backward a stride-0 gradient.
    x = _x((5, 3, 200), torch.float32, 12, device)["x"]
    ours, theirs = (x.detach().clone().requires_grad_() for _ in range(2))
    with poisoned():
        l2_norm(ours).sum().backward()
    l2_norm_ref(theirs).sum().backward()
    assert rel_norm_error(ours.grad, theirs.grad) < TOL[torch.float32].bwd


def test_int64_offsets(device):
    # Row 2 starts 2^31 + 128 elements in: int32 offsets would wrap and read/write elsewhere.
    x = large_offset_rows(77, 3, torch.float16, device, gen=generator(14))
    check_op(l2_norm, l2_norm_ref, {"x": x}, tolerances=TOL).assert_ok()


@pytest.mark.parametrize("shape", [(0, 8), (4, 0), (0,)], ids=str)
def test_zero_size(shape, device):
    x = torch.empty(shape, device=device).requires_grad_()
    out = l2_norm(x)
    assert out.shape == shape
    out.sum().backward()
    assert x.grad.shape == shape


def test_module(device):
    x = _x((4, 64), torch.float32, 15, device)["x"]
    assert torch.equal(L2Norm(eps=1e-5)(x), l2_norm(x, 1e-5))


def test_errors(device):
    with pytest.raises(TypeError, match=r"l2_norm: argument 'x' must have dtype in"):
        l2_norm(torch.ones(4, 8, dtype=torch.int32, device=device))
    with pytest.raises(ValueError, match=r"l2_norm: the last dim is 16385; at most 16384"):
        l2_norm(torch.empty(1, 16385, device=device))


def test_harness_catches_a_wrong_kernel(device, monkeypatch):
    # A test that cannot fail is a defect: a backward missing its projection term and a forward
    # that skips the last row must both fail.
    inputs = _x((37, 300), torch.float16, 16, device)
    assert check_op(l2_norm, l2_norm_ref, inputs, tolerances=TOL).ok

    def no_projection(dy, x, rstd, dx, config=None):  # dx = rstd * dy
        dx.copy_(dy.float() * rstd[:, None])

    monkeypatch.setattr(L, "l2_norm_bwd_launch", no_projection)
    report = check_op(l2_norm, l2_norm_ref, inputs, tolerances=TOL)
    assert [r.ok for r in report.rows] == [True, False], report.table()
    monkeypatch.undo()

    real_fwd = L.l2_norm_fwd_launch
    monkeypatch.setattr(L, "l2_norm_fwd_launch", lambda x, y, r, eps: real_fwd(x[:-1], y, r, eps))
    report = check_op(l2_norm, l2_norm_ref, inputs, tolerances=TOL, backward=False)
    assert not report.ok and report.rows[0].error == math.inf, report.table()


@pytest.mark.slow
@pytest.mark.skipif(ON_GPU, reason="the GPU run compiles these for real")
def test_kernels_compile_for_hopper():
    # The GPU configs of both kernels, bf16 and fp32, compiled for sm_90 (no GPU needed).
    def run():
        for n in (64, 128, 1000, 8192, 16384):
            cfg = launch_config(n)
            for dtype in (torch.bfloat16, torch.float32):
                x, rstd = torch.randn(2, n, dtype=dtype), torch.ones(2)
                L.l2_norm_fwd_launch(x, torch.empty_like(x), rstd, 1e-6, cfg)
                L.l2_norm_bwd_launch(x.clone(), x, rstd, torch.empty_like(x), cfg)

    results = check_compiles(run)
    failures = [
        f"{r.launch.name} {dict(r.launch.constexprs)}: {r.error}" for r in results if not r.ok
    ]
    assert not failures, "\n".join(failures)
    assert len(results) == 20


@pytest.mark.compile
def test_torch_compile_fullgraph(device):
    torch._dynamo.reset()
    x = _x((3, 5, 64), torch.float32, 17, device)["x"]

    def block(x):
        return l2_norm(x * 2.0).sin()

    results = []
    for fn in (torch.compile(block, fullgraph=True), block):
        xx = x.detach().clone().requires_grad_()
        out = fn(xx)
        out.sum().backward()
        results.append((out, xx.grad))
    for ours, theirs in zip(*results, strict=True):
        assert rel_norm_error(ours, theirs) < 1e-6
