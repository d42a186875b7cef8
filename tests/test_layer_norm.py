"""layer_norm: forward and backward against the fp32 reference, layouts, soundness, errors."""

import pytest
import torch
from conftest import DEVICE, ON_GPU

from kernelwright.ops import _split
from kernelwright.ops import layer_norm as ln
from kernelwright.ops.layer_norm import (
    LayerNorm,
    layer_norm,
    layer_norm_bwd_launch,
    layer_norm_eager,
    layer_norm_fwd_launch,
    layer_norm_ref,
)
from kernelwright.runtime import LaunchConfig
from kernelwright.runtime.tables import layer_norm as ln_table
from kernelwright.runtime.tables.layer_norm import TABLE
from kernelwright.testing import (
    Tolerance,
    check_op,
    generator,
    large_offset_rows,
    poisoned,
    rand,
    rel_norm_error,
)
from kernelwright.testing.gpu_compile import check_compiles

# Relative-norm error bounds. Every output and gradient is rounded once from fp32 (measured on
# the interpreter: fp32 ~1e-7, fp16 ~2.2e-4, bf16 ~3.5e-3). The bf16 bound covers the
# interpreter truncating fp32 -> bf16 instead of rounding to nearest (twice the GPU's error).
# fp32 keeps room for inputs with a large mean (see test_large_mean_is_numerically_sound).
TOL = {
    torch.float32: Tolerance(fwd=1e-5, bwd=1e-4),
    torch.float16: Tolerance(fwd=5e-4, bwd=5e-4),
    torch.bfloat16: Tolerance(fwd=6e-3, bwd=6e-3),
}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
AFFINE = [(True, True), (True, False), (False, True), (False, False)]  # (weight, bias)

# Row lengths at the regime boundaries of the launch tables, plus odd sizes; the interpreter
# table switches to the looped kernels above 1024.
if ON_GPU:
    SHAPES = [(4099, 64), (3, 1000, 257), (1023, 4096), (257, 8192), (31, 16384), (9, 65537)]
else:
    SHAPES = [(37, 64), (2, 3, 257), (5, 1000), (1, 1024), (3, 1025), (2, 1, 2, 1537)]


def _inputs(shape, dtype, seed, *, layout="contiguous", weight=True, bias=True, mean=0.0):
    gen = generator(seed)
    x = rand(shape, dtype, DEVICE, gen=gen, layout=layout, mean=mean)
    w = rand(shape[-1:], dtype, DEVICE, gen=gen, mean=1.0, std=0.5) if weight else None
    b = rand(shape[-1:], dtype, DEVICE, gen=gen, std=0.5) if bias else None
    return {"x": x, "weight": w, "bias": b}


def _check(inputs, dtype, **kwargs):
    check_op(
        layer_norm, layer_norm_ref, inputs, kwargs=kwargs, tolerances=TOL, dtype=dtype
    ).assert_ok()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_forward_backward_matches_reference(shape, dtype):
    for seed in (0, 1):
        _check(_inputs(shape, dtype, seed), dtype, eps=1e-5)


@pytest.mark.parametrize("has_weight,has_bias", AFFINE)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_with_and_without_weight_and_bias(has_weight, has_bias, dtype):
    for shape in [SHAPES[0], SHAPES[4]]:  # fused and looped
        _check(_inputs(shape, dtype, 2, weight=has_weight, bias=has_bias), dtype, eps=1e-6)


@pytest.mark.parametrize("has_weight,has_bias", AFFINE)
def test_wide_rows_split_dw_db(monkeypatch, has_weight, has_bias):
    # From SPLIT_DWDB_FROM columns the backward computes dx alone and leaves dW and dB to the
    # dwdb kernel; lowered here so the interpreter's short rows take that path (fused kernel).
    monkeypatch.setattr(ln_table, "SPLIT_DWDB_FROM", 1)
    for shape in [SHAPES[0], SHAPES[2]]:
        for dtype in (torch.float32, torch.bfloat16):
            _check(_inputs(shape, dtype, 3, weight=has_weight, bias=has_bias), dtype, eps=1e-5)


@pytest.mark.parametrize("has_weight,has_bias", [(True, True), (True, False), (False, True)])
def test_wide_rows_corun_backward(monkeypatch, has_weight, has_bias):
    # From SPLIT_DWDB_FROM columns and CORUN_MIN_ROWS rows, dx programs and dW/dB column programs
    # share one launch; lowered here so the interpreter's short rows take it. Against the fp32
    # reference (check_op: poisoned outputs, every gradient), and taken.
    calls = []
    real = ln.layer_norm_bwd_corun_launch
    monkeypatch.setattr(
        ln, "layer_norm_bwd_corun_launch", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    monkeypatch.setattr(ln_table, "SPLIT_DWDB_FROM", 1)
    monkeypatch.setattr(ln_table, "CORUN_MIN_ROWS", 1)
    monkeypatch.setattr(ln_table, "CORUN_MIN_SMS", 1)
    monkeypatch.setattr(ln_table, "CORUN", {"col_programs": 3, "col_rows": 4, "col_stages": 2})
    for shape in [SHAPES[0], SHAPES[2]]:
        for dtype in (torch.float32, torch.bfloat16):
            _check(_inputs(shape, dtype, 3, weight=has_weight, bias=has_bias), dtype, eps=1e-5)
    assert len(calls) == 4


@pytest.mark.gpu
def test_corun_backward_matches_the_two_kernels(monkeypatch):
    # At 16384 columns from CORUN_MIN_ROWS rows the backward is the co-running kernel; fewer rows
    # keep dx then dwdb. Both forms on the same inputs agree up to summation order (dx's row
    # sums are reduced in another layout, dW's and dB's over other tiles); poisoned outputs.
    m, n = ln_table.CORUN_MIN_ROWS, 16384
    x, w, b = _inputs((m, n), torch.bfloat16, 31).values()
    dy = rand((m, n), torch.bfloat16, DEVICE, gen=generator(32))
    xf = x.float()
    mean, rstd = xf.mean(-1), torch.rsqrt(xf.var(-1, unbiased=False) + 1e-5)
    calls = []
    real = ln.layer_norm_bwd_corun_launch
    monkeypatch.setattr(
        ln, "layer_norm_bwd_corun_launch", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    outs = []
    for min_rows in (ln_table.CORUN_MIN_ROWS, m + 1):
        monkeypatch.setattr(ln_table, "CORUN_MIN_ROWS", min_rows)
        with poisoned():
            dx, dw, db = (torch.full_like(t, float("nan")) for t in (x, w, b))
            layer_norm_bwd_launch(dy, x, w, mean, rstd, dx, dw, db)
        outs.append((dx, dw, db))
    assert calls == [1]
    (dx, dw, db), (dx2, dw2, db2) = outs
    for a, b in ((dx, dx2), (dw, dw2), (db, db2)):
        assert rel_norm_error(a, b) < TOL[torch.bfloat16].fwd


@pytest.mark.parametrize("layout", ["row_strided", "transposed"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_non_contiguous_input(layout, dtype):
    for shape in [SHAPES[1], SHAPES[4]]:
        _check(_inputs(shape, dtype, 3, layout=layout), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_large_mean_is_numerically_sound(dtype):
    # mean 100, std 1: E[x^2] - E[x]^2 would cancel ~4 of fp32's 7 digits (a ~1e-3 error in
    # the variance); the two-pass form is limited only by rounding the mean to fp32 (half an
    # ulp of 100 = 4e-6; measured 5e-6 in y). Compared with an fp64 reference.
    for shape in [SHAPES[2], SHAPES[4]]:  # fused and looped
        inputs = _inputs(shape, dtype, 4, mean=100.0)
        check_op(
            layer_norm, layer_norm_ref, inputs, tolerances=TOL, ref_dtype=torch.float64
        ).assert_ok()
    # mean 1000: the naive variance is off by up to 13% here; two-pass measured 5e-5 in y
    x = _inputs((4, 1000), torch.float32, 5, mean=1000.0)["x"]
    assert rel_norm_error(layer_norm(x), layer_norm_ref(x.double())) < 1e-4


@pytest.mark.parametrize("n", [1000, 4097])
def test_looped_statistics_at_large_mean(n):
    # The looped forward's per-lane Welford sums and their exact merge, at mean 1000 and std 1
    # (E[x^2] - E[x]^2 would lose the variance entirely): mean and rstd against fp64.
    x = _inputs((3, n), torch.float32, 15, mean=1000.0)["x"]
    y = torch.full_like(x, float("nan"))
    mean = torch.full((3,), float("nan"), device=DEVICE)
    rstd = torch.full((3,), float("nan"), device=DEVICE)
    layer_norm_fwd_launch(x, None, None, y, mean, rstd, 1e-5, config=LaunchConfig(block_n=128))
    xd = x.double()
    var = xd.var(-1, unbiased=False)
    assert rel_norm_error(mean, xd.mean(-1)) < 1e-7
    assert rel_norm_error(rstd, (var + 1e-5).rsqrt()) < 1e-4
    assert rel_norm_error(y, layer_norm_ref(xd)) < 1e-4


@pytest.mark.parametrize("split", [False, True], ids=["fused_dw_db", "split_dw_db"])
def test_every_kernel_path_agrees(monkeypatch, split):
    # The same rows through the multi-row, one-row and looped kernels must agree; with split,
    # the row-in-registers backward leaves dW and dB to the dwdb kernel (SPLIT_DWDB_FROM).
    if split:
        monkeypatch.setattr(ln_table, "SPLIT_DWDB_FROM", 1)
    else:  # 13 rows are "few" (_partials.few_rows): keep dW and dB in the fused kernels
        monkeypatch.setattr(ln_table, "PARTIALS_SHARE", float("inf"))
    gen = generator(6)
    x = rand((13, 700), torch.float32, DEVICE, gen=gen)
    w = rand((700,), torch.float32, DEVICE, gen=gen)
    b = rand((700,), torch.float32, DEVICE, gen=gen)
    dy = rand((13, 700), torch.float32, DEVICE, gen=gen)
    results = []
    configs = [LaunchConfig(block_n=1024, rows=4), LaunchConfig(block_n=1024, rows=1)]
    # block_n 16384: the long-row variants (w and b loaded late, w re-read in the backward
    # loop), with and without the backward's prefetch
    configs += [LaunchConfig(block_n=16384, rows=1), LaunchConfig(block_n=8192, rows=2)]
    configs += [LaunchConfig(block_n=16384, rows=1, num_stages=2)]
    # num_stages=2: the backward prefetches the next row block; 4 programs (the interpreter's
    # SM count) walk 7 and 13 blocks, so every program prefetches real rows and a masked tail.
    configs += [LaunchConfig(block_n=1024, rows=r, num_stages=2) for r in (2, 1)]
    # the split-row backward (ops/_split.py): 3, 6 and 2 chunks (a partial last one), one to
    # four rows per block (13 rows: a masked last block); the forward runs looped at block_n
    configs += [
        LaunchConfig(block_n=256, rows=1, split_row=True),
        LaunchConfig(block_n=128, rows=2, split_row=True, programs_per_sm=3),
        LaunchConfig(block_n=512, rows=4, split_row=True),
    ]
    # the looped forward (chunks of 128 and 256, a partial last chunk) with each L2 flag
    configs += [
        LaunchConfig(block_n=128, evict_hints=True, reverse_pass=True),
        LaunchConfig(block_n=256, reverse_pass=True),
        LaunchConfig(block_n=256, evict_hints=True),
    ]
    for cfg in [*configs, LaunchConfig(block_n=128)]:
        with poisoned():
            y = torch.full_like(x, float("nan"))
            mean = torch.full((13,), float("nan"), device=DEVICE)
            rstd = torch.full((13,), float("nan"), device=DEVICE)
            dx = torch.full_like(x, float("nan"))
            dw = torch.full_like(w, float("nan"))
            db = torch.full_like(b, float("nan"))
            layer_norm_fwd_launch(x, w, b, y, mean, rstd, 1e-5, config=cfg)
            layer_norm_bwd_launch(dy, x, w, mean, rstd, dx, dw, db, config=cfg)
        results.append((y, mean, rstd, dx, dw, db))
    for other in results[1:]:
        for a, c in zip(results[0], other, strict=True):
            assert rel_norm_error(a, c) < 1e-6
    assert rel_norm_error(results[0][0], layer_norm_ref(x, w, b)) < 1e-6
    assert rel_norm_error(results[0][1], x.mean(-1)) < 1e-6


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("has_weight,has_bias", AFFINE)
def test_few_rows_backward_has_no_partials(monkeypatch, has_weight, has_bias, dtype):
    # Few rows (_partials.few_rows): dx alone, then the dwdb kernel (one program per
    # column block through every row) stores dW and dB in their own dtype; no partial rows.
    # Poisoned outputs, against the fp32 reference; odd sizes (a partial last column block and
    # a masked last row block).
    calls = []
    real = ln.layer_norm_dwdb_launch

    def spy(*args, **kwargs):
        calls.append(args[0].shape)
        return real(*args, **kwargs)

    real_partials = ln._partial_rows

    def no_partials(rows, x, dw, db, **kwargs):
        assert dw is None and db is None, "the few-rows backward allocated partial rows"
        return real_partials(rows, x, dw, db, **kwargs)

    monkeypatch.setattr(ln, "layer_norm_dwdb_launch", spy)
    monkeypatch.setattr(ln, "_partial_rows", no_partials)
    m, n = (257, 4097) if ON_GPU else (2, 333)  # "few" for every dtype with one gradient too
    inputs = _inputs((m, n), dtype, 16, weight=has_weight, bias=has_bias)
    if has_weight or has_bias:
        _check(inputs, dtype, eps=1e-5)
    assert calls == ([(m, n)] if has_weight or has_bias else [])
    # the launcher itself: poisoned dW, dB and dx, every one written
    x, w, b = inputs["x"], inputs["weight"], inputs["bias"]
    dy = rand((m, n), dtype, DEVICE, gen=generator(17))
    y, mean, rstd = torch.empty_like(x), *(torch.empty(m, device=DEVICE) for _ in "mr")
    layer_norm_fwd_launch(x, w, b, y, mean, rstd, 1e-5)
    monkeypatch.setattr(ln, "empty", lambda *a, **k: pytest.fail("the launcher allocated"))
    with poisoned():
        dx = torch.full_like(x, float("nan"))
        dw = torch.full_like(w, float("nan")) if has_weight else None
        db = torch.full_like(b, float("nan")) if has_bias else None
        layer_norm_bwd_launch(dy, x, w, mean, rstd, dx, dw, db)
    xf, dyf = x.float().requires_grad_(), dy.float()
    wf = w.float().requires_grad_() if has_weight else None
    bf = b.float().requires_grad_() if has_bias else None
    layer_norm_ref(xf, wf, bf).backward(dyf)
    assert rel_norm_error(dx, xf.grad) < TOL[dtype].bwd
    for got, ref in ((dw, wf), (db, bf)):
        if got is not None:
            assert got.dtype == dtype and rel_norm_error(got, ref.grad) < TOL[dtype].bwd


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("has_weight,has_bias", AFFINE)
def test_split_row_backward(monkeypatch, has_weight, has_bias, dtype):
    # Rows split over programs that exchange their chunk sums (on the GPU in one launch that
    # waits; here in two launches): dx, dW and dB against the fp32 reference, and the split path
    # must be the one that ran.
    calls = []
    real = ln._bwd_split_launch
    monkeypatch.setattr(ln, "_bwd_split_launch", lambda *a: calls.append(a[-1]) or real(*a))
    m, n = (517, 16390) if ON_GPU else (11, 1000)
    cfg = LaunchConfig(block_n=4096 if ON_GPU else 256, rows=2, split_row=True, programs_per_sm=2)
    gen = generator(8)
    x = rand((m, n), dtype, DEVICE, gen=gen, mean=0.5)
    w = rand((n,), dtype, DEVICE, gen=gen, mean=1.0, std=0.5) if has_weight else None
    b = rand((n,), dtype, DEVICE, gen=gen, std=0.5) if has_bias else None
    dy = rand((m, n), dtype, DEVICE, gen=gen)
    y, mean, rstd = torch.empty_like(x), *(torch.empty(m, device=DEVICE) for _ in "mr")
    layer_norm_fwd_launch(x, w, b, y, mean, rstd, 1e-5)
    with poisoned():
        dx = torch.full_like(x, float("nan"))
        dw = torch.full_like(w, float("nan")) if has_weight else None
        db = torch.full_like(b, float("nan")) if has_bias else None
        layer_norm_bwd_launch(dy, x, w, mean, rstd, dx, dw, db, config=cfg)
    assert calls == [5 if ON_GPU else 4]  # chunks per row
    leaves = [t.float().requires_grad_() if t is not None else None for t in (x, w, b)]
    layer_norm_ref(*leaves).backward(dy.float())
    tol = TOL[dtype].bwd
    assert rel_norm_error(dx, leaves[0].grad) < tol
    for got, leaf in ((dw, leaves[1]), (db, leaves[2])):
        if got is not None:
            assert rel_norm_error(got, leaf.grad) < tol


@pytest.mark.gpu
def test_split_row_waits_for_every_chunk(monkeypatch):
    # The waiting form (one launch, programs take tickets and spin on each row block's counter)
    # against the two-launch form, bit for bit: the same sums in the same order. 8192 rows of
    # 16384 columns: many groups, every program through ~60 row blocks of waits.
    m, n = 8192, 16384
    gen = generator(9)
    x = rand((m, n), torch.bfloat16, DEVICE, gen=gen)
    w = rand((n,), torch.bfloat16, DEVICE, gen=gen, mean=1.0, std=0.5)
    dy = rand((m, n), torch.bfloat16, DEVICE, gen=gen)
    y, mean, rstd = torch.empty_like(x), *(torch.empty(m, device=DEVICE) for _ in "mr")
    layer_norm_fwd_launch(x, w, w, y, mean, rstd, 1e-5)
    cfg = LaunchConfig(block_n=4096, rows=1, num_warps=8, split_row=True, programs_per_sm=2)
    outs = []
    for two_launches in (False, True):
        if two_launches:
            monkeypatch.setattr(_split, "phases", lambda device: (1, 2))
        dx, dw, db = torch.empty_like(x), torch.empty_like(w), torch.empty_like(w)
        layer_norm_bwd_launch(dy, x, w, mean, rstd, dx, dw, db, config=cfg)
        outs.append((dx, dw, db))
    for a, c in zip(*outs, strict=True):
        assert torch.equal(a, c)
    leaves = [t.float().requires_grad_() for t in (x, w, w.clone())]
    layer_norm_ref(*leaves).backward(dy.float())
    assert rel_norm_error(outs[0][0], leaves[0].grad) < TOL[torch.bfloat16].bwd


@pytest.mark.parametrize(
    "dtype,min_equal",
    [
        (torch.float16, 0.999),
        pytest.param(torch.bfloat16, 0.99, marks=pytest.mark.gpu),
    ],
)
def test_matches_torch_layer_norm_rounding(dtype, min_equal):
    # One rounding from fp32, as F.layer_norm: nearly every element must equal PyTorch's bit for
    # bit (only fp32 summation order differs). Measured on the interpreter over 4 seeds:
    # 99.969-99.975% of fp16 elements equal. bf16 runs on the GPU only (the interpreter
    # truncates fp32 -> bf16); its bound is a guess until measured there.
    inputs = _inputs((64, 1000), dtype, 7)
    ours = layer_norm(**inputs, eps=1e-5)
    theirs = layer_norm_eager(**inputs, eps=1e-5)
    assert ours.dtype == theirs.dtype == dtype
    assert (ours == theirs).float().mean().item() > min_equal


def test_mixed_dtype_parameters_gradient_dtype():
    # bf16 activations with fp32 parameters: y in x's dtype, each gradient in its input's dtype.
    inputs = _inputs((6, 300), torch.bfloat16, 8)
    inputs["weight"] = inputs["weight"].float()
    inputs["bias"] = inputs["bias"].float()
    assert layer_norm(**inputs).dtype == torch.bfloat16
    check_op(layer_norm, layer_norm_ref, inputs, tolerances=TOL, dtype=torch.bfloat16).assert_ok()


def test_expanded_upstream_gradient():
    # y.sum().backward() hands the kernel a stride-0 gradient.
    inputs = _inputs((5, 3, 200), torch.float32, 9)
    leaves = [t.detach().clone().requires_grad_() for t in inputs.values()]
    refs = [t.detach().clone().requires_grad_() for t in inputs.values()]
    (layer_norm(*leaves) * 1.0).sum().backward()
    (layer_norm_ref(*refs) * 1.0).sum().backward()
    # d/dx of sum(y) is ~0 (x_hat sums to zero per row): compare with an absolute bound
    assert (leaves[0].grad - refs[0].grad).abs().max().item() < 1e-5
    for ours, ref in zip(leaves[1:], refs[1:], strict=True):
        assert rel_norm_error(ours.grad, ref.grad) < 1e-5


def test_frozen_parameters_no_grads():
    inputs = _inputs((7, 300), torch.float32, 10)
    x = inputs["x"].detach().requires_grad_()
    dy = rand((7, 300), torch.float32, DEVICE, gen=generator(11))
    layer_norm(x, inputs["weight"], inputs["bias"]).backward(dy)
    xr = inputs["x"].detach().requires_grad_()
    layer_norm_ref(xr, inputs["weight"], inputs["bias"]).backward(dy)
    assert inputs["weight"].grad is None and inputs["bias"].grad is None
    assert rel_norm_error(x.grad, xr.grad) < 1e-5


def test_int64_offsets():
    # Row 2 starts past 2^31 elements: an int32 offset would wrap and read/write elsewhere.
    for dtype in (torch.float32, torch.bfloat16):
        x = large_offset_rows(300, 3, dtype, DEVICE, gen=generator(12))
        inputs = _inputs((300,), dtype, 13)
        _check({**inputs, "x": x}, dtype)


def test_zero_rows():
    x = torch.empty(0, 64, device=DEVICE).requires_grad_()
    w = torch.ones(64, device=DEVICE).requires_grad_()
    b = torch.zeros(64, device=DEVICE).requires_grad_()
    y = layer_norm(x, w, b)
    assert y.shape == (0, 64)
    y.sum().backward()
    assert torch.equal(w.grad, torch.zeros(64, device=DEVICE))
    assert torch.equal(b.grad, torch.zeros(64, device=DEVICE))


def test_module():
    m = LayerNorm(300, eps=1e-6).to(DEVICE)
    assert torch.equal(m.weight, torch.ones(300, device=DEVICE))
    assert torch.equal(m.bias, torch.zeros(300, device=DEVICE))
    assert LayerNorm(8, bias=False).bias is None
    assert LayerNorm(8, elementwise_affine=False).weight is None
    assert LayerNorm((8,)).normalized_shape == (8,)
    torch_m = torch.nn.LayerNorm(300, eps=1e-6, device=DEVICE)
    with torch.no_grad():
        m.weight.copy_(rand((300,), torch.float32, DEVICE, gen=generator(14)))
        m.bias.copy_(rand((300,), torch.float32, DEVICE, gen=generator(15)))
        torch_m.load_state_dict(m.state_dict())  # same parameter names as torch.nn.LayerNorm
    x = rand((2, 4, 300), torch.float32, DEVICE, gen=generator(16))
    assert rel_norm_error(m(x), torch_m(x)) < 1e-5
    assert "(300,), eps=1e-06" in repr(m)
    with pytest.raises(ValueError, match="last dimension only"):
        LayerNorm((4, 8))
    with pytest.raises(ValueError, match="expected input with last dimension 300"):
        m(torch.ones(2, 299, device=DEVICE))


def test_bad_input_errors():
    x = rand((4, 64), torch.float32, DEVICE, gen=generator(17))
    with pytest.raises(ValueError, match=r"'weight' must have shape \(64,\).*got \(63,\)"):
        layer_norm(x, torch.ones(63, device=DEVICE))
    with pytest.raises(ValueError, match=r"'bias' must have shape \(64,\).*got \(2, 32\)"):
        layer_norm(x, None, torch.ones(2, 32, device=DEVICE))
    with pytest.raises(TypeError, match=r"'x' must have dtype in .*got int32"):
        layer_norm(torch.ones(4, 64, dtype=torch.int32, device=DEVICE))
    with pytest.raises(TypeError, match="'bias' must be a torch.Tensor"):
        layer_norm(x, None, [0.0] * 64)
    with pytest.raises(ValueError, match="at least 1 dimension"):
        layer_norm(torch.tensor(1.0, device=DEVICE))
    with pytest.raises(ValueError, match="empty last dimension"):
        layer_norm(torch.ones(4, 0, device=DEVICE))
    if not ON_GPU:
        with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
            layer_norm(torch.ones(4, 64, device="meta"))


def test_harness_catches_a_wrong_kernel():
    # A test that cannot fail is a defect: a kernel with the wrong eps, one that drops the bias,
    # and one that skips the last column must all fail the comparison.
    inputs = _inputs((5, 300), torch.float32, 18)
    wrong_eps = lambda x, weight, bias, **kw: layer_norm(x, weight, bias, eps=1e-1)
    assert not check_op(wrong_eps, layer_norm_ref, inputs, tolerances=TOL).ok
    no_bias = lambda x, weight, bias, **kw: layer_norm(x, weight, None) + 0.0 * bias
    assert not check_op(no_bias, layer_norm_ref, inputs, tolerances=TOL).ok

    def skips_last_column(x, weight, bias, **kw):
        y = layer_norm(x[..., :-1], weight[:-1], bias[:-1])
        out = torch.full_like(x, float("nan"))
        return torch.cat([y, out[..., -1:]], dim=-1)

    report = check_op(skips_last_column, layer_norm_ref, inputs, tolerances=TOL, backward=False)
    assert not report.ok and report.rows[0].error == float("inf")


@pytest.mark.compile
def test_torch_compile_fullgraph():
    # The custom ops make the whole forward+backward one graph with opaque kernel nodes.
    torch._dynamo.reset()
    inputs = _inputs((6, 2, 300), torch.float32, 19)

    def block(x, w, b):
        return layer_norm(x * 2.0, w, b, 1e-6).sin()

    compiled = torch.compile(block, fullgraph=True)
    ours = [t.detach().clone().requires_grad_() for t in inputs.values()]
    refs = [t.detach().clone().requires_grad_() for t in inputs.values()]
    compiled(*ours).sum().backward()
    block(*refs).sum().backward()
    for a, r in zip(ours, refs, strict=True):
        assert rel_norm_error(a.grad, r.grad) < 1e-5


def test_output_can_be_modified_in_place():
    # Returned as allocated, not as a view made inside the autograd Function.
    inputs = _inputs((3, 5, 300), torch.float32, 20)
    x = inputs["x"].detach().requires_grad_()
    xr = inputs["x"].detach().requires_grad_()
    dy = rand((3, 5, 300), torch.float32, DEVICE, gen=generator(21))
    layer_norm(x, inputs["weight"], inputs["bias"]).mul_(3.0).backward(dy)
    layer_norm_ref(xr, inputs["weight"], inputs["bias"]).mul_(3.0).backward(dy)
    assert rel_norm_error(x.grad, xr.grad) < 1e-5


@pytest.mark.slow
@pytest.mark.skipif(ON_GPU, reason="the GPU run compiles these for real")
def test_kernels_compile_for_hopper(monkeypatch):
    # Every "default" table config, with and without weight/bias, compiles for sm_90.
    def run():
        for kernel in ("fwd", "bwd"):
            rows = TABLE[kernel]["default"]
            bounds = [max_n for max_n, _ in rows]
            for max_n, cfg in rows:
                n = min(max_n, bounds[-2] + 7)  # the looped row gets a length past the last
                for affine in (True, False):
                    x = torch.randn(2, n, dtype=torch.bfloat16)
                    w = torch.randn(n, dtype=torch.bfloat16) if affine else None
                    b = torch.randn(n, dtype=torch.bfloat16) if affine else None
                    y, mean, rstd = torch.empty_like(x), torch.zeros(2), torch.ones(2)
                    if kernel == "fwd":
                        ln.layer_norm_fwd_launch(x, w, b, y, mean, rstd, 1e-5, config=cfg)
                    else:
                        dw = torch.empty_like(w) if affine else None
                        db = torch.empty_like(b) if affine else None
                        dy = torch.randn_like(x)
                        ln.layer_norm_bwd_launch(dy, x, w, mean, rstd, y, dw, db, config=cfg)
                        if n == ln_table.SPLIT_DWDB_FROM:  # the co-running form, as the GPU runs it
                            ln.layer_norm_bwd_corun_launch(
                                dy, x, w, mean, rstd, y, dw, db, cfg, **ln_table.CORUN
                            )

    # Two rows are "few" (_partials.few_rows) from 4096 columns: once with dW and dB in the
    # fused kernels everywhere, once as the table has it (the dwdb kernel there).
    monkeypatch.setattr(ln_table, "PARTIALS_SHARE", float("inf"))
    results = check_compiles(run)
    monkeypatch.undo()
    few = check_compiles(run)
    failures = [
        f"{r.launch.name} {dict(r.launch.constexprs)}: {r.error}" for r in results + few if not r.ok
    ]
    assert not failures, "\n".join(failures)
    assert len(results) >= 30
    assert any(r.launch.name == "_norm_dw_kernel" for r in few)
    assert any(r.launch.name == "_layer_norm_bwd_corun_kernel" for r in results)
