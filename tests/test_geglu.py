"""geglu / geglu_fused: forward and backward against the fp32 reference in both gelu forms,
agreement with eager PyTorch, layouts, int64 offsets, errors, launch configs and torch.compile."""

import math

import pytest
import torch
from conftest import ON_GPU

from kernelwright.ops import _gated as family
from kernelwright.ops import geglu as G
from kernelwright.ops._elementwise import elementwise_grid
from kernelwright.ops.geglu import (
    GeGLU,
    GeGLUFused,
    geglu,
    geglu_eager,
    geglu_fused,
    geglu_fused_ref,
    geglu_ref,
)
from kernelwright.runtime import LaunchConfig
from kernelwright.runtime.launch import PlanCache
from kernelwright.runtime.tables.geglu import TABLE
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

# Relative-norm error bounds vs the unrounded fp32 reference. The forward rounds twice
# (gelu(gate), then the product), the backward three times (dh = dc * up, gelu(gate), each
# gradient). The bf16 bounds cover the interpreter's truncation of fp32 -> bf16 (about twice
# the error of rounding to nearest). Measured under the interpreter over SHAPES, worst of both
# forms (fwd / bwd): fp32 1.0e-7 / 4.0e-7 (tanh' through 2 * sigmoid(2u) - 1), fp16 2.8e-4 /
# 3.3e-4, bf16 7.5e-3 / 7.4e-3.
TOL = {
    torch.float32: Tolerance(fwd=1e-6, bwd=1e-6),
    torch.float16: Tolerance(fwd=1e-3, bwd=1e-3),
    torch.bfloat16: Tolerance(fwd=1e-2, bwd=1.2e-2),
}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
APPROX = ["tanh", "none"]

# Odd row lengths around the tiles (interpreter: 512 columns x 16 rows per program; GPU:
# 256 / 1024 / 2048 columns), a single row, and leading dims of rank 1 to 3. The last shape
# has M*N divisible by the tile but N not: the launcher re-tiles dense tensors to full tiles.
if ON_GPU:
    SHAPES = [(37, 300), (2, 3, 515), (1, 1000), (2, 3, 5, 96), (4099, 1025), (257, 14336)]
    SHAPES += [(1024, 1000)]
else:
    SHAPES = [(37, 300), (2, 3, 515), (1, 1000), (2, 3, 5, 96), (17, 1100), (64, 200)]


def _pair(shape, dtype, seed, layouts=("contiguous", "contiguous"), device=None):
    # std 2: gate reaches gelu's curved region and its negative tail, not just gelu ~ x / 2.
    gen = generator(seed)
    gate = rand(shape, dtype, device, gen=gen, layout=layouts[0], std=2.0)
    up = rand(shape, dtype, device, gen=gen, layout=layouts[1])
    return {"gate": gate, "up": up}


def _fused(shape, dtype, seed, device, layout="contiguous"):
    return {"x": rand(shape, dtype, device, gen=generator(seed), layout=layout, std=2.0)}


# --------------------------------------------------------------------------- vs the reference


@pytest.mark.parametrize("approximate", APPROX)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_forward_backward_matches_reference(shape, dtype, approximate, device):
    check_op_seeds(
        geglu, geglu_ref, lambda seed: _pair(shape, dtype, seed, device=device),
        kwargs={"approximate": approximate}, seeds=(0, 1), tolerances=TOL, dtype=dtype,
    )  # fmt: skip


@pytest.mark.parametrize(
    "layouts",
    [("row_strided", "row_strided"), ("transposed", "transposed"), ("row_strided", "transposed")],
    ids=str,
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_non_contiguous_inputs(layouts, dtype, device):
    for shape, approximate in [((37, 300), "tanh"), ((2, 3, 515), "none")]:
        inputs = _pair(shape, dtype, 3, layouts, device=device)
        check_op(
            geglu, geglu_ref, inputs, kwargs={"approximate": approximate}, tolerances=TOL,
            dtype=dtype,
        ).assert_ok()  # fmt: skip


@pytest.mark.parametrize("approximate", APPROX)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(37, 600), (2, 3, 1030), (5, 2, 192)], ids=str)
def test_fused_matches_reference(shape, dtype, approximate, device):
    check_op_seeds(
        geglu_fused, geglu_fused_ref, lambda seed: _fused(shape, dtype, seed, device),
        kwargs={"approximate": approximate}, seeds=(0,), tolerances=TOL, dtype=dtype,
    )  # fmt: skip


@pytest.mark.parametrize("layout", ["row_strided", "transposed", "column_slice"])
def test_fused_non_contiguous_input(layout, device):
    # "column_slice": x is a window [:, 3:3+2N] of a wider activation buffer, so gate and up are
    # two views with x's row stride, and neither starts on an aligned address.
    if layout == "column_slice":
        x = rand((37, 607), torch.float16, device, gen=generator(4), std=2.0)[:, 3:603]
    else:
        x = rand((37, 600), torch.float16, device, gen=generator(4), layout=layout, std=2.0)
    assert not x.is_contiguous()
    for approximate in APPROX:
        check_op(
            geglu_fused, geglu_fused_ref, {"x": x}, kwargs={"approximate": approximate},
            tolerances=TOL,
        ).assert_ok()  # fmt: skip


def test_fused_equals_split_form(device):
    # Same numbers through both forms: the fused gradient is [d gate | d up].
    x = rand((9, 2, 600), torch.bfloat16, device, gen=generator(5), std=2.0).requires_grad_()
    gate, up = (t.detach().clone().requires_grad_() for t in x.detach().chunk(2, dim=-1))
    dc = rand((9, 2, 300), torch.bfloat16, device, gen=generator(6))
    out_fused, out_split = geglu_fused(x, approximate="none"), geglu(gate, up, approximate="none")
    assert torch.equal(out_fused, out_split)
    out_fused.backward(dc)
    out_split.backward(dc)
    assert torch.equal(x.grad, torch.cat([gate.grad, up.grad], dim=-1))


def test_approximations_differ(device):
    # The IS_TANH switch reaches the kernels: tanh-gelu and erf-gelu differ by up to ~3e-4
    # (at |x| ~ 2), far above fp32 rounding, and each matches its own reference.
    inputs = _pair((4, 300), torch.float32, 20, device=device)
    tanh, erf = (geglu(**inputs, approximate=a) for a in APPROX)
    assert (tanh - erf).abs().max().item() > 1e-5
    assert rel_norm_error(tanh, geglu_ref(**inputs, approximate="tanh")) < 1e-6
    assert rel_norm_error(erf, geglu_ref(**inputs, approximate="none")) < 1e-6


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
                G.geglu_fwd_launch(a, b, outs[0], "tanh", config=cfg)
                G.geglu_fwd_launch(a, b, outs[1], "none", config=cfg)
            else:
                G.geglu_bwd_launch(dc, a, b, outs[0], outs[1], "tanh", config=cfg)
        results.append(outs)
    for outs, cfg in zip(results[1:], configs[1:], strict=True):
        for got, first in zip(outs, results[0], strict=True):
            assert torch.equal(got, first), cfg
    if kernel == "fwd":
        for out, approximate in zip(results[0], APPROX, strict=True):
            ref = geglu_ref(a, b, approximate=approximate)
            assert rel_norm_error(out, ref) < TOL[torch.float32].fwd


# --------------------------------------------------------------------------- agreement with eager


def _every_value(dtype, device):
    # Every finite value of a 16-bit float, as a [rows, 1024] tensor (-0.0 and subnormals too).
    bits = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(dtype)
    values = bits[torch.isfinite(bits)]
    values = values[: values.numel() // 1024 * 1024]
    return values.reshape(-1, 1024).to(device)


def _ordered(t):
    # 16-bit floats as integers in value order (-0 and +0 both 0): a difference of these is the
    # number of representable values between two results, sign changes included.
    i = t.view(torch.int16).int()
    return torch.where(i < 0, -(i & 0x7FFF), i)


# Bounds on the fraction of elements that differ from eager, per form and output (out, d up,
# d gate), measured on fp16 under the interpreter over every finite fp16 gate (random up and
# gradient): tanh 3.9e-4, 3.9e-4, 7.1e-4; erf 4.9e-3, 5.2e-3, 1.0e-3. The 1e-4 of swiglu is
# too tight here because of gelu's negative tail: for gate < -2, 1 + tanh(u) and 1 + erf(x)
# cancel in fp32 (to a few fp32 ulps of 1), so one ulp of tanh/erf moves the tiny result by
# several fp16 ulps. Eager's CPU erf is a polynomial, the interpreter's math.erf is correctly
# rounded (ours matches an fp64 gelu, rounded to fp16, on 328 values where eager misses 576).
# Outside that tail (gate >= -2) every difference is within 2 ulp.
EAGER_DIFF_RATE = {"tanh": (5e-4, 5e-4, 1e-3), "none": (6e-3, 6e-3, 1.3e-3)}


def _assert_agrees_with_eager(dtype, approximate, device):
    gate = _every_value(dtype, device)
    gen = generator(9)
    up = rand(gate.shape, dtype, device, gen=gen)
    dc = rand(gate.shape, dtype, device, gen=gen)
    results = []
    for fn in (geglu, geglu_eager):
        g, u = gate.clone().requires_grad_(), up.clone().requires_grad_()
        out = fn(g, u, approximate=approximate)
        out.backward(dc)
        results.append((out, u.grad, g.grad))
    names = ("out", "d up", "d gate")
    for name, rate, ours, theirs in zip(names, EAGER_DIFF_RATE[approximate], *results, strict=True):
        assert ours.dtype == theirs.dtype == dtype
        differ = (ours != theirs) & ~(ours.isnan() & theirs.isnan())
        ulps = (_ordered(ours) - _ordered(theirs)).abs()
        assert differ.float().mean().item() <= rate, f"{name}: {int(differ.sum())} differ"
        body = ulps[differ & (gate >= -2)]  # away from the cancelling tail
        assert (body <= 2).all(), f"{name}: differences of {body.max()} ulp at gate >= -2"
    x = torch.cat([gate, up], dim=-1)
    assert torch.equal(geglu_fused(x, approximate=approximate), results[0][0])


@pytest.mark.parametrize("approximate", APPROX)
@pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning")  # exp(-2u) = inf: tanh(u) = -1
def test_agrees_with_eager_fp16(approximate, device):
    _assert_agrees_with_eager(torch.float16, approximate, device)


@pytest.mark.gpu
@pytest.mark.parametrize("approximate", APPROX)
@pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning")
def test_agrees_with_eager_bf16(approximate, device):
    # The interpreter truncates fp32 -> bf16 instead of rounding: bf16 agreement is GPU-only.
    # On the GPU, tl.erf is libdevice's erff, PyTorch's CUDA erf; the fp16 rate bounds apply.
    _assert_agrees_with_eager(torch.bfloat16, approximate, device)


# --------------------------------------------------------------------------- in-place backward


@pytest.mark.parametrize("case", ["contiguous", "chunks", "transposed"])
def test_in_place_backward(case, device):
    # Same gradients either way; in place they land in gate/up's own storage, unless the kernel
    # cannot write through the inputs (a transposed input is copied first).
    gen = generator(10)
    if case == "chunks":  # gate, up = gate_up_proj(x).chunk(2, -1): interleaved rows, disjoint
        x = rand((3, 13, 600), torch.float16, device, gen=gen, std=2.0)
        make = lambda: [t.detach() for t in x.clone().chunk(2, dim=-1)]
    else:
        pair = [rand((3, 13, 300), torch.float16, device, gen=gen, layout=case) for _ in "ab"]
        make = lambda: [t.clone() if case == "contiguous" else t.detach() for t in pair]
    dc = rand((3, 13, 300), torch.float16, device, gen=generator(11))
    results = []
    for in_place in (False, True):
        gate, up = make()
        before = gate.clone(), up.clone()
        gate.requires_grad_()
        up.requires_grad_()
        out = geglu(gate, up, approximate="none", in_place_backward=in_place)
        grads = torch.autograd.grad(out, (gate, up), dc)
        results.append((out, grads, gate, up, before))
    (out0, grads0, *_), (out1, grads1, gate, up, before) = results
    assert torch.equal(out0, out1)
    for g0, g1 in zip(grads0, grads1, strict=True):
        assert torch.equal(g0, g1)
    writes = case != "transposed"
    assert torch.equal(gate.detach(), grads0[0] if writes else before[0])
    assert torch.equal(up.detach(), grads0[1] if writes else before[1])


# --------------------------------------------------------------------------- gradients, offsets


def test_expanded_upstream_gradient(device):
    # out.sum().backward() hands the backward a stride-0 gradient.
    inputs = _pair((5, 3, 200), torch.float32, 12, device=device)
    x = _fused((5, 3, 400), torch.float32, 13, device)["x"]
    for fn, ref, args in [(geglu, geglu_ref, inputs.values()), (geglu_fused, geglu_fused_ref, [x])]:
        ours = [t.detach().clone().requires_grad_() for t in args]
        theirs = [t.detach().clone().requires_grad_() for t in args]
        with poisoned():
            fn(*ours).sum().backward()
        ref(*theirs).sum().backward()
        for o, t in zip(ours, theirs, strict=True):
            assert rel_norm_error(o.grad, t.grad) < TOL[torch.float32].bwd


def test_int64_offsets(device):
    # Row 2 starts 2^31 + 128 elements in: int32 offsets would wrap and read/write elsewhere.
    gen = generator(14)
    dtype = torch.float16
    inputs = {"gate": large_offset_rows(77, 3, dtype, device, gen=gen),
              "up": large_offset_rows(77, 3, dtype, device, gen=gen)}  # fmt: skip
    check_op(geglu, geglu_ref, inputs, tolerances=TOL).assert_ok()
    x = large_offset_rows(154, 3, dtype, device, gen=gen)
    check_op(geglu_fused, geglu_fused_ref, {"x": x}, tolerances=TOL).assert_ok()

    dc = rand((3, 77), dtype, device, gen=gen)
    gate, up = (inputs[k].detach().requires_grad_() for k in ("gate", "up"))
    expected = torch.autograd.grad(geglu(gate, up), (gate, up), dc)  # out of place
    grads = torch.autograd.grad(geglu(gate, up, in_place_backward=True), (gate, up), dc)
    for g, e, t in zip(grads, expected, (gate, up), strict=True):
        assert torch.equal(g, e) and torch.equal(t.detach(), e)


@pytest.mark.parametrize("shape", [(0, 8), (4, 0), (2, 0, 3), (0,)], ids=str)
def test_zero_size(shape, device):
    gate = torch.empty(shape, device=device).requires_grad_()
    up = torch.empty(shape, device=device).requires_grad_()
    out = geglu(gate, up)
    assert out.shape == shape
    out.sum().backward()
    assert gate.grad.shape == shape and up.grad.shape == shape
    x = torch.empty(*shape[:-1], 2 * shape[-1], device=device).requires_grad_()
    out = geglu_fused(x, approximate="none")
    assert out.shape == shape
    out.sum().backward()
    assert x.grad.shape == x.shape


def test_modules(device):
    inputs = _pair((4, 300), torch.float32, 15, device=device)
    x = torch.cat([inputs["gate"], inputs["up"]], dim=-1)
    assert torch.equal(GeGLU()(**inputs), geglu(**inputs))
    assert torch.equal(GeGLUFused()(x), geglu(**inputs))
    exact = geglu(**inputs, approximate="none")
    assert torch.equal(GeGLU(approximate="none")(**inputs), exact)
    assert torch.equal(GeGLUFused(approximate="none")(x), exact)
    assert "approximate='none', in_place_backward=True" in repr(
        GeGLU(approximate="none", in_place_backward=True)
    )


# --------------------------------------------------------------------------- errors


def _bad_inputs(device):
    other = "cpu" if ON_GPU else "meta"  # a device the kernels cannot use here
    t = lambda *shape, dtype=torch.float32, dev=device: torch.ones(*shape, dtype=dtype, device=dev)
    return [
        (lambda: geglu(t(4, 8), t(4, 9)), ValueError,
         r"geglu: argument 'up' must have shape \(4, 8\) \(the shape of gate\), got \(4, 9\)"),
        (lambda: geglu(t(4, 8), t(4, 8, dtype=torch.float16)), TypeError,
         r"geglu: argument 'up' has dtype float16 but 'gate' has dtype float32"),
        (lambda: geglu(t(4, 8, dtype=torch.int32), t(4, 8, dtype=torch.int32)), TypeError,
         r"geglu: argument 'gate' must have dtype in \(float32, float16, bfloat16\), got int32"),
        (lambda: geglu(t(4, 8), [1.0] * 8), TypeError,
         r"geglu: argument 'up' must be a torch.Tensor, got list"),
        (lambda: geglu(t(4, 8), t(4, 8, dev=other)), RuntimeError,
         rf"geglu: argument 'up' is on {'the CPU' if ON_GPU else 'meta'}"),
        (lambda: geglu(torch.tensor(1.0, device=device), torch.tensor(1.0, device=device)),
         ValueError, r"geglu: argument 'gate' must have at least 1 dimension"),
        (lambda: geglu(t(4, 8), t(4, 8), approximate="erf"), ValueError,
         r"geglu: argument 'approximate' must be one of \('tanh', 'none'\).*got 'erf'"),
        (lambda: geglu_fused(t(4, 9)), ValueError,
         r"geglu_fused: argument 'x' must have an even last dimension .*got shape \(4, 9\)"),
        (lambda: geglu_fused(t(4, 8, dtype=torch.int64)), TypeError,
         r"geglu_fused: argument 'x' must have dtype in .*got int64"),
        (lambda: geglu_fused(t(4, 8), approximate=None), ValueError,
         r"geglu_fused: argument 'approximate' must be one of .*got None"),
        (lambda: GeGLU(approximate="gelu"), ValueError,
         r"GeGLU: argument 'approximate' must be one of .*got 'gelu'"),
    ]  # fmt: skip


@pytest.mark.parametrize("case", range(11))
def test_bad_input_errors(case, device):
    call, exc, message = _bad_inputs(device)[case]
    with pytest.raises(exc, match=message):
        call()


# --------------------------------------------------------------------------- the harness itself


def test_harness_catches_a_wrong_kernel(device, monkeypatch):
    # A test that cannot fail is a defect: the wrong gelu form (tanh where erf was asked), a
    # backward that swaps the two gradients, and a grid that floor-divides must all fail.
    inputs = _pair((37, 300), torch.float32, 16, device=device)
    exact = {"approximate": "none"}
    assert check_op(geglu, geglu_ref, inputs, kwargs=exact, tolerances=TOL).ok

    real_fwd, real_bwd = family.gated_fwd_launch, family.gated_bwd_launch
    tanh_fwd = lambda activation, a, b, c, config=None, **kw: real_fwd(
        "gelu_tanh", a, b, c, config, **kw
    )
    monkeypatch.setattr(family, "gated_fwd_launch", tanh_fwd)
    report = check_op(geglu, geglu_ref, inputs, kwargs=exact, tolerances=TOL)
    assert [r.ok for r in report.rows] == [False, True, True], report.table()
    monkeypatch.undo()

    swapped = lambda activation, dc, a, b, da, db, config=None, **kw: real_bwd(
        activation, dc, a, b, db, da, config, **kw
    )
    monkeypatch.setattr(family, "gated_bwd_launch", swapped)
    report = check_op(geglu, geglu_ref, inputs, tolerances=TOL)
    assert [r.ok for r in report.rows] == [True, False, False], report.table()
    monkeypatch.undo()

    # one program short of the grid: the last tile is never written
    short_grid = lambda op, m, n, cfg: (elementwise_grid(op, m, n, cfg)[0] - 1,)
    monkeypatch.setattr(family, "elementwise_grid", short_grid)
    # launch plans are memoized: fresh ones with the short grid, dropped with the patch
    monkeypatch.setattr(family, "_PLANS", PlanCache())
    report = check_op(geglu, geglu_ref, inputs, tolerances=TOL, backward=False)
    assert not report.ok and report.rows[0].error == math.inf, report.table()


# --------------------------------------------------------------------------- GPU compilation


@pytest.mark.slow
@pytest.mark.skipif(ON_GPU, reason="the GPU run compiles these for real")
def test_kernels_compile_for_hopper():
    # The interpreter accepts code the GPU compiler rejects: compile every "default" config of
    # both kernels, both gelu forms, bf16 and fp32, for sm_90 (no GPU needed).
    def run():
        for kernel in ("fwd", "bwd"):
            bounds = [max_n for max_n, _ in TABLE[kernel]["default"]]
            for max_n, cfg in TABLE[kernel]["default"]:
                n = min(max_n, bounds[-2] + 7)  # the open-ended row: just past the previous
                for dtype in (torch.bfloat16, torch.float32):
                    a, b = torch.randn(2, n, dtype=dtype), torch.randn(2, n, dtype=dtype)
                    for approximate in APPROX:
                        if kernel == "fwd":
                            G.geglu_fwd_launch(a, b, torch.empty_like(a), approximate, cfg)
                        else:
                            da, db = torch.empty_like(a), torch.empty_like(a)
                            G.geglu_bwd_launch(a.clone(), a, b, da, db, approximate, cfg)

    results = check_compiles(run)
    failures = [
        f"{r.launch.name} {dict(r.launch.constexprs)}: {r.error}" for r in results if not r.ok
    ]
    assert not failures, "\n".join(failures)
    assert len(results) >= 16


# --------------------------------------------------------------------------- torch.compile


@pytest.mark.compile
@pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning")
def test_torch_compile_fullgraph(device):
    # Both forms (and both gelu forms) in one graph, forward and backward through the custom
    # ops, with an upstream op on each side so the kernels sit inside a fused graph.
    # in_place_backward is ignored under compile: the inputs must come back untouched.
    torch._dynamo.reset()
    pair = _pair((3, 5, 300), torch.float32, 17, device=device)
    x = _fused((3, 5, 600), torch.float32, 18, device)["x"]

    def block(gate, up, x):
        out = geglu(gate * 2.0, up, in_place_backward=True).sin()
        return out + geglu_fused(x, approximate="none").cos()

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
