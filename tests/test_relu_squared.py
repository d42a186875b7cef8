"""relu_squared: forward and backward against the fp32 reference, agreement with eager PyTorch,
layouts, int64 offsets, errors, launch configs and torch.compile."""

import math

import pytest
import torch
from conftest import ON_GPU

from kernelwright.ops import _gated as family
from kernelwright.ops import relu_squared as R
from kernelwright.ops._elementwise import elementwise_grid
from kernelwright.ops.relu_squared import (
    ReLUSquared,
    relu_squared,
    relu_squared_eager,
    relu_squared_ref,
)
from kernelwright.runtime import LaunchConfig
from kernelwright.runtime.launch import PlanCache
from kernelwright.runtime.tables.relu_squared import TABLE
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

# Relative-norm error bounds vs the fp32 reference. The forward rounds once (the square), the
# backward once (2 * relu(x) * dy): fp32 is exact but for that rounding. The bf16 bounds cover
# the interpreter's truncation of fp32 -> bf16 (about twice the error of rounding to nearest).
# Measured under the interpreter over SHAPES (fwd / bwd): fp32 0 / 0 (the reference's fp32
# products are the kernel's), fp16 2.2e-4 / 2.5e-4, bf16 2.9e-3 / 3.4e-3.
TOL = {
    torch.float32: Tolerance(fwd=1e-7, bwd=1e-7),
    torch.float16: Tolerance(fwd=5e-4, bwd=5e-4),
    torch.bfloat16: Tolerance(fwd=6e-3, bwd=6e-3),
}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]

# Odd row lengths around the tiles (interpreter: 512 columns x 16 rows per program; GPU:
# 256 / 1024 / 2048 columns), a single row, and leading dims of rank 1 to 3. The last shape
# has M*N divisible by the tile but N not: the launcher re-tiles dense tensors to full tiles.
if ON_GPU:
    SHAPES = [(37, 300), (2, 3, 515), (1, 1000), (2, 3, 5, 96), (4099, 1025), (257, 14336)]
    SHAPES += [(1024, 1000)]
else:
    SHAPES = [(37, 300), (2, 3, 515), (1, 1000), (2, 3, 5, 96), (17, 1100), (64, 200)]


def _x(shape, dtype, seed, device, layout="contiguous"):
    return {"x": rand(shape, dtype, device, gen=generator(seed), layout=layout)}


# --------------------------------------------------------------------------- vs the reference


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_forward_backward_matches_reference(shape, dtype, device):
    check_op_seeds(
        relu_squared, relu_squared_ref, lambda seed: _x(shape, dtype, seed, device),
        seeds=(0, 1, 2), tolerances=TOL, dtype=dtype,
    )  # fmt: skip


@pytest.mark.parametrize("layout", ["row_strided", "transposed"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_non_contiguous_input(layout, dtype, device):
    for shape in [(37, 300), (2, 3, 515)]:
        x = _x(shape, dtype, 3, device, layout)["x"]
        assert not x.is_contiguous()
        check_op(relu_squared, relu_squared_ref, {"x": x}, tolerances=TOL).assert_ok()


def test_relu_squared_properties(device):
    # y >= 0, y = 0 exactly where x <= 0 (and so is dx), y = x^2 exactly where x > 0 in fp32
    # for values whose square is exact (small integers).
    x = torch.arange(-40, 41, dtype=torch.float32, device=device).reshape(3, 27)
    x = x.requires_grad_()
    y = relu_squared(x)
    y.backward(torch.ones_like(y))
    assert torch.equal(y, torch.where(x > 0, x * x, 0.0))
    assert torch.equal(x.grad, torch.where(x > 0, 2 * x, 0.0))


@pytest.mark.parametrize("kernel", ["fwd", "bwd"])
def test_every_table_config(kernel, device):
    # Each launch config the GPU tables hold (and a deliberately odd one) must give the same
    # result: tiles narrower than the row, more rows per program than there are rows.
    x = _x((5, 2100), torch.float32, 7, device)["x"]
    dy = rand(x.shape, x.dtype, device, gen=generator(8))
    configs = [cfg for _, cfg in TABLE[kernel]["default"]] + [LaunchConfig(block_n=64, rows=2)]
    results = []
    for cfg in configs:
        with poisoned():
            out = torch.full_like(x, math.nan)
            if kernel == "fwd":
                R.relu_squared_fwd_launch(x, out, config=cfg)
            else:
                R.relu_squared_bwd_launch(dy, x, out, config=cfg)
        results.append(out)
    for got, cfg in zip(results[1:], configs[1:], strict=True):
        assert torch.equal(got, results[0]), cfg
    if kernel == "fwd":
        assert rel_norm_error(results[0], relu_squared_ref(x)) < TOL[torch.float32].fwd


# --------------------------------------------------------------------------- agreement with eager


def _every_value(dtype, device):
    # Every finite value of a 16-bit float, as a [rows, 1024] tensor (-0.0 and subnormals too).
    bits = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(dtype)
    values = bits[torch.isfinite(bits)]
    values = values[: values.numel() // 1024 * 1024]
    return values.reshape(-1, 1024).to(device)


def _assert_agrees_with_eager(dtype, device):
    # Every rounding sits where eager's does and each product of two 16-bit values is exact in
    # fp32, so y and dx equal eager's bit for bit over every finite x (random dy), with one
    # exception: eager rounds 2 * x to fp16 before multiplying by dy, which overflows to inf for
    # x >= 2^15 (y is inf there already); the kernel's fp32 product stays finite.
    x = _every_value(dtype, device)
    dy = rand(x.shape, dtype, device, gen=generator(9))
    results = []
    for fn in (relu_squared, relu_squared_eager):
        xx = x.clone().requires_grad_()
        out = fn(xx)
        out.backward(dy)
        results.append((out, xx.grad))
    (y, dx), (y_eager, dx_eager) = results
    assert y.dtype == dx.dtype == dtype
    assert torch.equal(y, y_eager)
    overflow = (2 * x).isinf() & (x > 0)  # x >= 2^15 in fp16; never in bf16
    assert torch.equal(dx[~overflow], dx_eager[~overflow])
    assert dx_eager[overflow].isinf().all()
    assert torch.equal(dx[overflow], (2 * x.float() * dy.float()).to(dtype)[overflow])


@pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning")  # y = x^2 = inf in fp16
def test_agrees_with_eager_fp16(device):
    _assert_agrees_with_eager(torch.float16, device)


@pytest.mark.gpu
def test_agrees_with_eager_bf16(device):
    # The interpreter truncates fp32 -> bf16 instead of rounding: bf16 agreement is GPU-only.
    _assert_agrees_with_eager(torch.bfloat16, device)


# --------------------------------------------------------------------------- gradients, offsets


def test_expanded_upstream_gradient(device):
    # out.sum().backward() hands the backward a stride-0 gradient.
    x = _x((5, 3, 200), torch.float32, 12, device)["x"]
    ours, theirs = (x.detach().clone().requires_grad_() for _ in range(2))
    with poisoned():
        relu_squared(ours).sum().backward()
    relu_squared_ref(theirs).sum().backward()
    assert rel_norm_error(ours.grad, theirs.grad) < TOL[torch.float32].bwd


def test_int64_offsets(device):
    # Row 2 starts 2^31 + 128 elements in: int32 offsets would wrap and read/write elsewhere.
    x = large_offset_rows(77, 3, torch.float16, device, gen=generator(14))
    check_op(relu_squared, relu_squared_ref, {"x": x}, tolerances=TOL).assert_ok()


@pytest.mark.parametrize("shape", [(0, 8), (4, 0), (2, 0, 3), (0,)], ids=str)
def test_zero_size(shape, device):
    x = torch.empty(shape, device=device).requires_grad_()
    out = relu_squared(x)
    assert out.shape == shape
    out.sum().backward()
    assert x.grad.shape == shape


def test_module(device):
    x = _x((4, 300), torch.float32, 15, device)["x"]
    assert torch.equal(ReLUSquared()(x), relu_squared(x))


# --------------------------------------------------------------------------- errors


def _bad_inputs(device):
    other = "cpu" if ON_GPU else "meta"  # a device the kernels cannot use here
    return [
        (lambda: relu_squared(torch.ones(4, 8, dtype=torch.int32, device=device)), TypeError,
         r"relu_squared: argument 'x' must have dtype in \(float32, float16, bfloat16\), "
         r"got int32"),
        (lambda: relu_squared([1.0] * 8), TypeError,
         r"relu_squared: argument 'x' must be a torch.Tensor, got list"),
        (lambda: relu_squared(torch.ones(4, 8, device=other)), RuntimeError,
         rf"relu_squared: argument 'x' is on {'the CPU' if ON_GPU else 'meta'}"),
        (lambda: relu_squared(torch.tensor(1.0, device=device)), ValueError,
         r"relu_squared: argument 'x' must have at least 1 dimension"),
    ]  # fmt: skip


@pytest.mark.parametrize("case", range(4))
def test_bad_input_errors(case, device):
    call, exc, message = _bad_inputs(device)[case]
    with pytest.raises(exc, match=message):
        call()


# --------------------------------------------------------------------------- the harness itself


def test_harness_catches_a_wrong_kernel(device, monkeypatch):
    # A test that cannot fail is a defect: a backward missing the factor 2 (d/dx x^2 = x) and a
    # grid that floor-divides (drops the last, partial row block and column tile) must fail.
    inputs = _x((37, 300), torch.float16, 16, device)
    assert check_op(relu_squared, relu_squared_ref, inputs, tolerances=TOL).ok

    real_bwd = family._bwd_launch  # the launch behind relu_squared's backward, whatever the layout

    def half_bwd(activation, dy, x, up, dx, dup, *args):
        real_bwd(activation, dy, x, up, dx, dup, *args)
        dx.mul_(0.5)

    monkeypatch.setattr(family, "_bwd_launch", half_bwd)
    report = check_op(relu_squared, relu_squared_ref, inputs, tolerances=TOL)
    assert [r.ok for r in report.rows] == [True, False], report.table()
    monkeypatch.undo()

    # one program short of the grid: the last tile is never written
    short_grid = lambda op, m, n, cfg: (elementwise_grid(op, m, n, cfg)[0] - 1,)
    monkeypatch.setattr(family, "elementwise_grid", short_grid)
    # launch plans are memoized: fresh ones with the short grid, dropped with the patch
    monkeypatch.setattr(family, "_PLANS", PlanCache())
    report = check_op(relu_squared, relu_squared_ref, inputs, tolerances=TOL, backward=False)
    assert not report.ok and report.rows[0].error == math.inf, report.table()


# --------------------------------------------------------------------------- GPU compilation


@pytest.mark.slow
@pytest.mark.skipif(ON_GPU, reason="the GPU run compiles these for real")
def test_kernels_compile_for_hopper():
    # The interpreter accepts code the GPU compiler rejects: compile every "default" config of
    # both kernels, bf16 and fp32, for sm_90 (no GPU needed).
    def run():
        for kernel in ("fwd", "bwd"):
            bounds = [max_n for max_n, _ in TABLE[kernel]["default"]]
            for max_n, cfg in TABLE[kernel]["default"]:
                n = min(max_n, bounds[-2] + 7)  # the open-ended row: just past the previous
                for dtype in (torch.bfloat16, torch.float32):
                    x = torch.randn(2, n, dtype=dtype)
                    if kernel == "fwd":
                        R.relu_squared_fwd_launch(x, torch.empty_like(x), cfg)
                    else:
                        R.relu_squared_bwd_launch(x.clone(), x, torch.empty_like(x), cfg)

    results = check_compiles(run)
    failures = [
        f"{r.launch.name} {dict(r.launch.constexprs)}: {r.error}" for r in results if not r.ok
    ]
    assert not failures, "\n".join(failures)
    assert len(results) >= 8


# --------------------------------------------------------------------------- torch.compile


@pytest.mark.compile
def test_torch_compile_fullgraph(device):
    # Forward and backward through the custom ops, with an upstream op on each side so the
    # kernels sit inside a fused graph.
    torch._dynamo.reset()
    x = _x((3, 5, 300), torch.float32, 17, device)["x"]

    def block(x):
        return relu_squared(x * 2.0).sin()

    results = []
    for fn in (torch.compile(block, fullgraph=True), block):
        xx = x.detach().clone().requires_grad_()
        out = fn(xx)
        out.sum().backward()
        results.append((out, xx.grad))
    for ours, theirs in zip(*results, strict=True):
        assert rel_norm_error(ours, theirs) < 1e-6
