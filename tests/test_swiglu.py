"""swiglu / swiglu_fused: forward and backward against the fp32 reference, agreement with
eager PyTorch, layouts, the in-place backward, int64 offsets, errors and torch.compile."""

import math

import pytest
import torch
from conftest import ON_GPU

from kernelwright.ops import _gated as family
from kernelwright.ops import swiglu as S
from kernelwright.ops._elementwise import elementwise_grid
from kernelwright.ops.swiglu import (
    SwiGLU,
    SwiGLUFused,
    swiglu,
    swiglu_eager,
    swiglu_fused,
    swiglu_fused_ref,
    swiglu_ref,
)
from kernelwright.runtime import LaunchConfig
from kernelwright.runtime.launch import PlanCache
from kernelwright.runtime.tables.swiglu import TABLE
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

# Relative-norm error bounds vs the unrounded fp32 reference. The forward rounds twice
# (silu(gate), then the product), the backward three times (dh = dc * up, silu(gate), each
# gradient). fp32 differs from the reference only by exp's last bit. The bf16 bounds cover the
# interpreter's truncation of fp32 -> bf16 (about twice the error of rounding to nearest).
# Measured under the interpreter: fp32 3e-8, fp16 3.2e-4, bf16 6.4e-3 (truncating).
TOL = {
    torch.float32: Tolerance(fwd=1e-6, bwd=1e-6),
    torch.float16: Tolerance(fwd=1e-3, bwd=1e-3),
    torch.bfloat16: Tolerance(fwd=1e-2, bwd=1.2e-2),
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


def _pair(shape, dtype, seed, layouts=("contiguous", "contiguous"), device=None):
    gen = generator(seed)
    gate = rand(shape, dtype, device, gen=gen, layout=layouts[0])
    up = rand(shape, dtype, device, gen=gen, layout=layouts[1])
    return {"gate": gate, "up": up}


def _fused(shape, dtype, seed, device, layout="contiguous"):
    return {"x": rand(shape, dtype, device, gen=generator(seed), layout=layout)}


# --------------------------------------------------------------------------- vs the reference


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_forward_backward_matches_reference(shape, dtype, device):
    check_op_seeds(
        swiglu, swiglu_ref, lambda seed: _pair(shape, dtype, seed, device=device),
        seeds=(0, 1, 2), tolerances=TOL, dtype=dtype,
    )  # fmt: skip


@pytest.mark.parametrize(
    "layouts",
    [("row_strided", "row_strided"), ("transposed", "transposed"), ("row_strided", "transposed")],
    ids=str,
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_non_contiguous_inputs(layouts, dtype, device):
    for shape in [(37, 300), (2, 3, 515)]:
        inputs = _pair(shape, dtype, 3, layouts, device=device)
        check_op(swiglu, swiglu_ref, inputs, tolerances=TOL, dtype=dtype).assert_ok()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(37, 600), (2, 3, 1030), (1, 2000), (5, 2, 192)], ids=str)
def test_fused_matches_reference(shape, dtype, device):
    check_op_seeds(
        swiglu_fused, swiglu_fused_ref, lambda seed: _fused(shape, dtype, seed, device),
        seeds=(0, 1), tolerances=TOL, dtype=dtype,
    )  # fmt: skip


@pytest.mark.parametrize("layout", ["row_strided", "transposed", "column_slice"])
def test_fused_non_contiguous_input(layout, device):
    # "column_slice": x is a window [:, 3:3+2N] of a wider activation buffer, so gate and up are
    # two views with x's row stride, and neither starts on an aligned address.
    if layout == "column_slice":
        x = rand((37, 607), torch.float16, device, gen=generator(4))[:, 3:603]
    else:
        x = rand((37, 600), torch.float16, device, gen=generator(4), layout=layout)
    assert not x.is_contiguous()
    check_op(swiglu_fused, swiglu_fused_ref, {"x": x}, tolerances=TOL).assert_ok()


def test_fused_equals_split_form(device):
    # Same numbers through both forms: the fused gradient is [d gate | d up].
    x = rand((9, 2, 600), torch.bfloat16, device, gen=generator(5)).requires_grad_()
    gate, up = (t.detach().clone().requires_grad_() for t in x.detach().chunk(2, dim=-1))
    dc = rand((9, 2, 300), torch.bfloat16, device, gen=generator(6))
    out_fused, out_split = swiglu_fused(x), swiglu(gate, up)
    assert torch.equal(out_fused, out_split)
    out_fused.backward(dc)
    out_split.backward(dc)
    assert torch.equal(x.grad, torch.cat([gate.grad, up.grad], dim=-1))


@pytest.mark.parametrize("kernel", ["fwd", "bwd"])
def test_every_table_config(kernel, device):
    # Each launch config the GPU tables hold (and a deliberately odd one) must give the same
    # result: tiles narrower than the row, more rows per program than there are rows.
    inputs = _pair((5, 2100), torch.float32, 7, device=device)
    a, b = inputs["gate"], inputs["up"]
    dc = rand(a.shape, a.dtype, device, gen=generator(8))
    configs = [cfg for _, cfg in TABLE[kernel]["default"]] + [LaunchConfig(block_n=64, rows=2)]
    results = []
    for cfg in configs:
        with poisoned():
            outs = [torch.full_like(a, math.nan) for _ in range(2)]
            if kernel == "fwd":
                S.swiglu_fwd_launch(a, b, outs[0], config=cfg)
                outs[1].zero_()
            else:
                S.swiglu_bwd_launch(dc, a, b, outs[0], outs[1], config=cfg)
        results.append(outs)
    for outs, cfg in zip(results[1:], configs[1:], strict=True):
        for got, first in zip(outs, results[0], strict=True):
            assert torch.equal(got, first), cfg
    if kernel == "fwd":
        assert rel_norm_error(results[0][0], swiglu_ref(a, b)) < TOL[torch.float32].fwd


# --------------------------------------------------------------------------- agreement with eager


def _every_value(dtype, device):
    # Every finite value of a 16-bit float, as a [rows, 1024] tensor (-0.0 and subnormals too).
    bits = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(dtype)
    values = bits[torch.isfinite(bits)]
    values = values[: values.numel() // 1024 * 1024]
    return values.reshape(-1, 1024).to(device)


def _assert_agrees_with_eager(dtype, device):
    # PyTorch's silu rounds once from fp32, as the kernel does; the kernel's fp32 sigmoid (fast
    # exp and division) differs from PyTorch's in the last fp32 bits, which flips the rounding
    # of silu for a few values — 1 ulp of silu, up to 2 ulp of out = silu * up. Over every
    # finite value of the dtype for gate (random up and gradient): out, d up and d gate each
    # differ from eager by at most 2 ulp, on at most 1 in 10^4 elements. A formula or
    # rounding-point error would change far more.
    gate = _every_value(dtype, device)
    gen = generator(9)
    up = rand(gate.shape, dtype, device, gen=gen)
    dc = rand(gate.shape, dtype, device, gen=gen)
    results = []
    for fn in (swiglu, swiglu_eager):
        g, u = gate.clone().requires_grad_(), up.clone().requires_grad_()
        out = fn(g, u)
        out.backward(dc)
        results.append((out, u.grad, g.grad))
    for name, ours, theirs in zip(("out", "d up", "d gate"), *results, strict=True):
        assert ours.dtype == theirs.dtype == dtype
        differ = (ours != theirs) & ~(ours.isnan() & theirs.isnan())
        ulps = (ours.view(torch.int16).int() - theirs.view(torch.int16).int()).abs()[differ]
        assert differ.float().mean().item() <= 1e-4, f"{name}: {int(differ.sum())} differ"
        assert (ulps <= 2).all(), f"{name}: differences of {ulps.max()} ulp"
    x = torch.cat([gate, up], dim=-1)
    assert torch.equal(swiglu_fused(x), swiglu(gate, up))


@pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning")  # exp(-a) = inf: silu(a) = -0
def test_agrees_with_eager_fp16(device):
    _assert_agrees_with_eager(torch.float16, device)


@pytest.mark.gpu
@pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning")
def test_agrees_with_eager_bf16(device):
    # The interpreter truncates fp32 -> bf16 instead of rounding: bf16 agreement is GPU-only.
    _assert_agrees_with_eager(torch.bfloat16, device)


# --------------------------------------------------------------------------- in-place backward


def _in_place_inputs(case, device):
    gen = generator(10)
    if case == "chunks":  # gate, up = gate_up_proj(x).chunk(2, -1): interleaved rows, disjoint
        x = rand((3, 13, 600), torch.float16, device, gen=gen)
        return [t.detach() for t in x.chunk(2, dim=-1)]
    if case == "aliased":  # swiglu(t, t): gate and up share every element
        t = rand((13, 300), torch.float16, device, gen=gen)
        return [t.detach(), t.detach()]
    layout = {"transposed": "transposed", "row_strided": "row_strided"}.get(case, "contiguous")
    return [rand((3, 13, 300), torch.float16, device, gen=gen, layout=layout) for _ in range(2)]


@pytest.mark.parametrize(
    "case", ["contiguous", "row_strided", "chunks", "gate_only", "transposed", "aliased"]
)
def test_in_place_backward(case, device):
    # Same gradients either way; in place they are written into gate/up's own storage, unless
    # the kernel cannot write through the inputs (a copy was made, or gate and up overlap).
    dc = rand((3, 13, 300) if case != "aliased" else (13, 300), torch.float16, device,
              gen=generator(11))  # fmt: skip
    results = []
    for in_place in (False, True):
        gate, up = _in_place_inputs(case, device)
        before = gate.clone(), up.clone()
        gate.requires_grad_()
        up.requires_grad_(case != "gate_only")
        wanted = [gate] if case == "gate_only" else [gate, up]
        with poisoned():
            out = swiglu(gate, up, in_place_backward=in_place)
            grads = torch.autograd.grad(out, wanted, dc)
        results.append((out, grads, gate, up, before))
    (out0, grads0, *_), (out1, grads1, gate, up, before) = results
    assert torch.equal(out0, out1)
    for g0, g1 in zip(grads0, grads1, strict=True):
        assert torch.equal(g0, g1)
    writes = case in ("contiguous", "row_strided", "chunks", "gate_only")
    assert torch.equal(gate.detach(), grads0[0] if writes else before[0])
    if case == "gate_only":
        assert torch.equal(up.detach(), before[1])  # no gradient wanted: up left alone
    elif case != "aliased":
        assert torch.equal(up.detach(), grads0[1] if writes else before[1])


def test_in_place_forward_leaves_inputs_alone(device):
    # Only the backward overwrites gate/up (under torch.compile not even that: see
    # test_torch_compile_fullgraph); a forward without backward must leave them intact.
    gate, up = _in_place_inputs("contiguous", device)
    ref_gate, ref_up = gate.clone(), up.clone()
    swiglu(gate.requires_grad_(), up.requires_grad_(), in_place_backward=True)  # no backward
    assert torch.equal(gate.detach(), ref_gate) and torch.equal(up.detach(), ref_up)


# --------------------------------------------------------------------------- gradients, offsets


def test_expanded_upstream_gradient(device):
    # out.sum().backward() hands the backward a stride-0 gradient.
    inputs = _pair((5, 3, 200), torch.float32, 12, device=device)
    x = _fused((5, 3, 400), torch.float32, 13, device)["x"]
    for fn, ref, args in [
        (swiglu, swiglu_ref, inputs.values()),
        (swiglu_fused, swiglu_fused_ref, [x]),
    ]:
        ours = [t.detach().clone().requires_grad_() for t in args]
        theirs = [t.detach().clone().requires_grad_() for t in args]
        with poisoned():
            fn(*ours).sum().backward()
        ref(*theirs).sum().backward()
        for o, t in zip(ours, theirs, strict=True):
            assert rel_norm_error(o.grad, t.grad) < TOL[torch.float32].bwd


def test_int64_offsets(device):
    # Row 2 starts 2^31 + 128 elements in: int32 offsets would wrap and read/write elsewhere.
    # In place, the gradients are stored at those offsets too.
    gen = generator(14)
    dtype = torch.float16
    inputs = {"gate": large_offset_rows(77, 3, dtype, device, gen=gen),
              "up": large_offset_rows(77, 3, dtype, device, gen=gen)}  # fmt: skip
    check_op(swiglu, swiglu_ref, inputs, tolerances=TOL).assert_ok()
    x = large_offset_rows(154, 3, dtype, device, gen=gen)
    check_op(swiglu_fused, swiglu_fused_ref, {"x": x}, tolerances=TOL).assert_ok()

    dc = rand((3, 77), dtype, device, gen=gen)
    gate, up = (inputs[k].detach().requires_grad_() for k in ("gate", "up"))
    expected = torch.autograd.grad(swiglu(gate, up), (gate, up), dc)  # out of place
    grads = torch.autograd.grad(swiglu(gate, up, in_place_backward=True), (gate, up), dc)
    for g, e, t in zip(grads, expected, (gate, up), strict=True):
        assert torch.equal(g, e) and torch.equal(t.detach(), e)


@pytest.mark.parametrize("shape", [(0, 8), (4, 0), (2, 0, 3), (0,)], ids=str)
def test_zero_size(shape, device):
    gate = torch.empty(shape, device=device).requires_grad_()
    up = torch.empty(shape, device=device).requires_grad_()
    out = swiglu(gate, up)
    assert out.shape == shape
    out.sum().backward()
    assert gate.grad.shape == shape and up.grad.shape == shape
    x = torch.empty(*shape[:-1], 2 * shape[-1], device=device).requires_grad_()
    out = swiglu_fused(x)
    assert out.shape == shape
    out.sum().backward()
    assert x.grad.shape == x.shape


def test_modules(device):
    inputs = _pair((4, 300), torch.float32, 15, device=device)
    x = torch.cat([inputs["gate"], inputs["up"]], dim=-1)
    assert torch.equal(SwiGLU()(**inputs), swiglu(**inputs))
    assert torch.equal(SwiGLUFused()(x), swiglu(**inputs))
    assert "in_place_backward=True" in repr(SwiGLU(in_place_backward=True))


# --------------------------------------------------------------------------- errors


def _bad_inputs(device):
    other = "cpu" if ON_GPU else "meta"  # a device the kernels cannot use here
    t = lambda *shape, dtype=torch.float32, dev=device: torch.ones(*shape, dtype=dtype, device=dev)
    return [
        (lambda: swiglu(t(4, 8), t(4, 9)), ValueError,
         r"swiglu: argument 'up' must have shape \(4, 8\) \(the shape of gate\), got \(4, 9\)"),
        (lambda: swiglu(t(4, 8), t(4, 8, dtype=torch.float16)), TypeError,
         r"swiglu: argument 'up' has dtype float16 but 'gate' has dtype float32"),
        (lambda: swiglu(t(4, 8, dtype=torch.int32), t(4, 8, dtype=torch.int32)), TypeError,
         r"swiglu: argument 'gate' must have dtype in \(float32, float16, bfloat16\), got int32"),
        (lambda: swiglu(t(4, 8), [1.0] * 8), TypeError,
         r"swiglu: argument 'up' must be a torch.Tensor, got list"),
        (lambda: swiglu(t(4, 8), t(4, 8, dev=other)), RuntimeError,
         rf"swiglu: argument 'up' is on {'the CPU' if ON_GPU else 'meta'}"),
        (lambda: swiglu(torch.tensor(1.0, device=device), torch.tensor(1.0, device=device)),
         ValueError, r"swiglu: argument 'gate' must have at least 1 dimension"),
        (lambda: swiglu_fused(t(4, 9)), ValueError,
         r"swiglu_fused: argument 'x' must have an even last dimension .*got shape \(4, 9\)"),
        (lambda: swiglu_fused(t(4, 8, dtype=torch.int64)), TypeError,
         r"swiglu_fused: argument 'x' must have dtype in .*got int64"),
        (lambda: swiglu_fused(t(4, 8, dev=other)), RuntimeError,
         r"swiglu_fused: argument 'x' is on"),
    ]  # fmt: skip


@pytest.mark.parametrize("case", range(9))
def test_bad_input_errors(case, device):
    call, exc, message = _bad_inputs(device)[case]
    with pytest.raises(exc, match=message):
        call()


# --------------------------------------------------------------------------- the harness itself


def test_harness_catches_a_wrong_kernel(device, monkeypatch):
    # A test that cannot fail is a defect: a grid that floor-divides (drops the last, partial
    # row block and column tile) and a backward that swaps the two gradients must both fail.
    inputs = _pair((37, 300), torch.float16, 16, device=device)
    assert check_op(swiglu, swiglu_ref, inputs, tolerances=TOL).ok

    real_bwd = family.gated_bwd_launch
    swapped = lambda act, dc, a, b, da, db, config=None, **kw: real_bwd(
        act, dc, a, b, db, da, config, **kw
    )
    monkeypatch.setattr(family, "gated_bwd_launch", swapped)
    report = check_op(swiglu, swiglu_ref, inputs, tolerances=TOL)
    assert [r.ok for r in report.rows] == [True, False, False], report.table()
    monkeypatch.undo()

    # one program short of the grid: the last tile is never written
    short_grid = lambda op, m, n, cfg: (elementwise_grid(op, m, n, cfg)[0] - 1,)
    monkeypatch.setattr(family, "elementwise_grid", short_grid)
    # launch plans are memoized: fresh ones with the short grid, dropped with the patch
    monkeypatch.setattr(family, "_PLANS", PlanCache())
    report = check_op(swiglu, swiglu_ref, inputs, tolerances=TOL, backward=False)
    assert not report.ok and report.rows[0].error == math.inf, report.table()


# --------------------------------------------------------------------------- torch.compile


@pytest.mark.compile
def test_torch_compile_fullgraph(device):
    # Both forms in one graph, forward and backward through the custom ops, with an upstream
    # op on each side so the kernels sit inside a fused graph. in_place_backward is ignored
    # under compile: the inputs must come back untouched.
    torch._dynamo.reset()
    pair = _pair((3, 5, 300), torch.float32, 17, device=device)
    x = _fused((3, 5, 600), torch.float32, 18, device)["x"]

    def block(gate, up, x):
        return swiglu(gate * 2.0, up, in_place_backward=True).sin() + swiglu_fused(x).cos()

    compiled = torch.compile(block, fullgraph=True)
    results = []
    for fn in (compiled, block):
        args = [t.detach().clone().requires_grad_() for t in (pair["gate"], pair["up"], x)]
        out = fn(*args)
        out.sum().backward()
        results.append((out, *(a.grad for a in args)))
        if fn is compiled:
            assert torch.equal(args[1].detach(), pair["up"])  # not overwritten under compile
    for ours, theirs in zip(*results, strict=True):
        assert rel_norm_error(ours, theirs) < 1e-6


@pytest.mark.compile
def test_torch_compile_module_bf16(device):
    # The modules under compile, in bf16, match eager exactly (same kernels, same roundings).
    torch._dynamo.reset()
    gate_up = rand((2, 7, 600), torch.bfloat16, device, gen=generator(19))

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.act, self.fused = SwiGLU(), SwiGLUFused()

        def forward(self, x):
            x = x * 0.5  # exact in bf16: any rounding difference below is the kernels'
            gate, up = x.chunk(2, dim=-1)  # two row-strided views into the custom op
            return self.act(gate, up) + self.fused(x)

    results = []
    for fn in (torch.compile(Block(), fullgraph=True), Block()):
        x = gate_up.detach().clone().requires_grad_()
        out = fn(x)
        out.backward(torch.ones_like(out))
        results.append((out, x.grad))
    for ours, theirs in zip(*results, strict=True):
        assert torch.equal(ours, theirs)
