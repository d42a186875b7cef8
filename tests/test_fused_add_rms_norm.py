"""fused_add_rms_norm: both outputs and every gradient against the fp32 reference, casting
modes, both kernel paths, unused outputs, layouts, HF rounding, errors, compile."""

import pytest
import torch
from conftest import DEVICE, ON_GPU

from kernelwright.ops import fused_add_rms_norm as far
from kernelwright.ops.fused_add_rms_norm import (
    FusedAddRMSNorm,
    fused_add_rms_norm,
    fused_add_rms_norm_bwd_launch,
    fused_add_rms_norm_eager,
    fused_add_rms_norm_fwd_launch,
    fused_add_rms_norm_ref,
)
from kernelwright.runtime import LaunchConfig, device_info
from kernelwright.runtime.tables import fused_add_rms_norm as far_table
from kernelwright.runtime.tables.fused_add_rms_norm import TABLE
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

# Relative-norm error bounds, rms_norm's: the sum adds one rounding to residual_out (measured
# 2.7e-3 in bf16 under the interpreter, which truncates; 2.3e-4 in fp16) and y sees that
# rounded sum; y's bf16 bound covers three further roundings in casting mode "none" (measured
# up to 9.6e-3). ds is one rounding of dres + the norm's gradient.
TOL = {
    torch.float32: Tolerance(fwd=1e-5, bwd=1e-4),
    torch.float16: Tolerance(fwd=2e-3, bwd=4e-3),
    torch.bfloat16: Tolerance(fwd=1.4e-2, bwd=1.6e-2),
}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
MODES = [("llama", 0.0), ("gemma", 1.0), ("none", 0.0), ("llama", 1.0)]

# Row lengths at the regime boundaries of the launch tables, plus odd sizes and leading ranks;
# the interpreter table switches to the looped kernels above 1024.
if ON_GPU:
    SHAPES = [(4099, 64), (3, 1000, 257), (1023, 4096), (257, 8192), (31, 16384), (9, 65537)]
else:
    SHAPES = [(37, 64), (2, 3, 257), (5, 1000), (1, 1024), (3, 1025), (2, 1, 2, 1537)]
FUSED, LOOPED = SHAPES[1], SHAPES[4]  # one shape per kernel path under the current table


def _inputs(shape, dtype, seed, *, layouts=("contiguous", "contiguous"), weight=True):
    gen = generator(seed)
    x = rand(shape, dtype, DEVICE, gen=gen, layout=layouts[0])
    r = rand(shape, dtype, DEVICE, gen=gen, layout=layouts[1])
    w = rand(shape[-1:], dtype, DEVICE, gen=gen, mean=1.0, std=0.5) if weight else None
    return {"x": x, "residual": r, "weight": w}


def _check(inputs, dtype, **kwargs):
    check_op(
        fused_add_rms_norm,
        fused_add_rms_norm_ref,
        inputs,
        kwargs=kwargs,
        tolerances=TOL,
        dtype=dtype,
        label=f"fused_add_rms_norm {tuple(inputs['x'].shape)} {dtype} {kwargs}",
    ).assert_ok()


def _grads(fn, inputs, dy, dres, **kwargs):
    # (y, s, dx, dresidual, dw) of fn, backpropagating dy into y and dres into s (None: unused).
    leaves = {k: v.detach().clone().requires_grad_() for k, v in inputs.items()}
    y, s = fn(**leaves, **kwargs)
    outs = [o for o, g in ((y, dy), (s, dres)) if g is not None]
    grads = [g.to(o.dtype) for o, g in ((y, dy), (s, dres)) if g is not None]
    dx, dr, dw = torch.autograd.grad(outs, list(leaves.values()), grads, allow_unused=True)
    return y, s, dx, dr, dw


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_forward_backward_matches_reference(shape, dtype):
    for seed in (0, 1):
        _check(_inputs(shape, dtype, seed), dtype, eps=1e-6)


@pytest.mark.parametrize("mode,offset", MODES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_casting_modes_and_offset(mode, offset, dtype):
    for shape in [FUSED, LOOPED]:
        _check(_inputs(shape, dtype, 3), dtype, eps=1e-5, casting_mode=mode, offset=offset)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_without_weight(dtype):
    for shape in [SHAPES[0], LOOPED]:
        _check(_inputs(shape, dtype, 4, weight=False), dtype)


@pytest.mark.parametrize(
    "layouts", [("row_strided", "transposed"), ("transposed", "row_strided")], ids=str
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_non_contiguous_inputs(layouts, dtype):
    for shape in [FUSED, LOOPED]:
        _check(_inputs(shape, dtype, 5, layouts=layouts), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_every_kernel_path_agrees(monkeypatch, dtype):
    # The same rows through the multi-row, one-row and looped kernels, with and without the
    # residual gradient: residual_out is elementwise and must be bit-identical on every path;
    # the rest agrees up to summation order and matches the reference. 13 rows are "few"
    # (_partials.few_rows): dW kept in the fused kernels here.
    monkeypatch.setattr(far_table, "PARTIALS_SHARE", float("inf"))
    m, n = 13, 700
    gen = generator(6)
    x, r, dy, dres = (rand((m, n), dtype, DEVICE, gen=gen) for _ in range(4))
    w = rand((n,), dtype, DEVICE, gen=gen, mean=1.0, std=0.5)
    configs = [
        LaunchConfig(block_n=1024, rows=4, programs_per_sm=1),
        LaunchConfig(block_n=1024, rows=1, programs_per_sm=2),
        LaunchConfig(block_n=128, programs_per_sm=1),  # looped: 6 chunks per row
        # num_stages=2: the backward prefetches the next row block; 4 and 8 programs (the
        # interpreter has 4 SMs) walk 7 and 13 blocks: real rows and a masked tail prefetched.
        LaunchConfig(block_n=1024, rows=2, num_stages=2),
        LaunchConfig(block_n=1024, rows=1, programs_per_sm=2, num_stages=2),
    ]
    ref_in = {"x": x.float(), "residual": r.float(), "weight": w.float()}
    _, _, ref_ds, _, ref_dw = _grads(fused_add_rms_norm_ref, ref_in, dy.float(), dres.float())
    ref_ds_y_only = _grads(fused_add_rms_norm_ref, ref_in, dy.float(), None)[2]
    results = []
    for cfg in configs:
        with poisoned():
            # outputs with four different row strides: each store must use its own
            y, s, ds, ds_y_only = (
                torch.full((m, n + pad), float("nan"), dtype=dtype, device=DEVICE)[:, :n]
                for pad in (1, 2, 3, 4)
            )
            dw = torch.full_like(w, float("nan"))
            rstd = torch.full((m,), float("nan"), device=DEVICE)
            fused_add_rms_norm_fwd_launch(x, r, w, y, s, rstd, 1e-6, 0.0, "llama", config=cfg)
            fused_add_rms_norm_bwd_launch(dy, dres, s, w, rstd, ds, dw, 0.0, "llama", config=cfg)
            fused_add_rms_norm_bwd_launch(
                dy, None, s, w, rstd, ds_y_only, None, 0.0, "llama", config=cfg
            )
        results.append((y, s, ds, ds_y_only, dw))
    tol = TOL[dtype]
    ref_y, ref_s = fused_add_rms_norm_ref(x, r, w)
    same = 1e-6 if dtype == torch.float32 else tol.fwd  # paths differ in summation order only
    for y, s, ds, ds_y_only, dw in results:
        assert torch.equal(s, results[0][1])
        assert rel_norm_error(y, ref_y) < tol.fwd and rel_norm_error(s, ref_s) < tol.fwd
        assert rel_norm_error(ds, ref_ds) < tol.bwd
        assert rel_norm_error(ds_y_only, ref_ds_y_only) < tol.bwd
        assert rel_norm_error(dw, ref_dw) < tol.bwd
        for i, a in ((0, y), (2, ds), (3, ds_y_only), (4, dw)):
            assert rel_norm_error(a, results[0][i]) < same


@pytest.mark.parametrize("dres", [True, False], ids=["dres", "no_dres"])
@pytest.mark.parametrize("mode,offset", [("llama", 0.0), ("gemma", 1.0)])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_few_rows_backward_has_no_partials(monkeypatch, dtype, mode, offset, dres):
    # Few rows (_partials.few_rows): dW from rms_norm's dw kernel over s (one program per column
    # block, stored in the weight's dtype), before ds; no fp32 partial rows. Poisoned outputs,
    # an odd width, against the fp32 reference.
    calls = []
    real = far.rms_norm_dw_launch
    monkeypatch.setattr(far, "rms_norm_dw_launch", lambda *a, **k: calls.append(1) or real(*a, **k))
    m, n = (257, 4097) if ON_GPU else (2, 333)
    inputs = _inputs((m, n), dtype, 19)
    gen = generator(20)
    dy = rand((m, n), dtype, DEVICE, gen=gen)
    d_res = rand((m, n), dtype, DEVICE, gen=gen) if dres else None
    x, r, w = inputs["x"], inputs["residual"], inputs["weight"]
    y, s, rstd = torch.empty_like(x), torch.empty_like(x), torch.empty(m, device=DEVICE)
    fused_add_rms_norm_fwd_launch(x, r, w, y, s, rstd, 1e-6, offset, mode)
    monkeypatch.setattr(far, "empty", lambda *a, **k: pytest.fail("the launcher allocated"))
    with poisoned():
        ds = torch.full_like(x, float("nan"))
        dw = torch.full_like(w, float("nan"))
        fused_add_rms_norm_bwd_launch(dy, d_res, s, w, rstd, ds, dw, offset, mode)
    assert calls == [1]
    ref_in = {"x": x.float(), "residual": r.float(), "weight": w.float()}
    kwargs = dict(eps=1e-6, offset=offset, casting_mode=mode)
    dres_f = d_res.float() if dres else None
    _, _, ref_ds, _, ref_dw = _grads(fused_add_rms_norm_ref, ref_in, dy.float(), dres_f, **kwargs)
    assert rel_norm_error(ds, ref_ds) < TOL[dtype].bwd
    assert dw.dtype == dtype and rel_norm_error(dw, ref_dw) < TOL[dtype].bwd


# (rows, columns, config or None for the table's): configs whose row blocks hold an fp32 row
# of dW, widths that 4 programs (the interpreter's SMs) or 128 (an H100's or H200's 132) split
# into whole 32-word slices; 13 blocks give programs of 3 and 4 blocks. 266 rows are "few"
# (_partials.few_rows): the call asks to park.
if ON_GPU:
    PARK_CASES = [(2048, 4096, None), (4096, 4096, None), (266, 4096, None)]
else:
    PARK_CASES = [
        (26, 256, LaunchConfig(block_n=256, rows=2, programs_per_sm=1, num_stages=2)),
        (48, 128, LaunchConfig(block_n=128, rows=4, programs_per_sm=1)),
        (64, 128, None),  # the interpreter table's 16-row blocks: four programs of one block
    ]


@pytest.mark.parametrize("dres", [True, False], ids=["dres", "no_dres"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", PARK_CASES, ids=lambda c: f"{c[0]}x{c[1]}")
def test_backward_parks_dw_in_ds(monkeypatch, case, dtype, dres):
    # dW without fp32 partial rows (park_programs): program j's last row block of ds takes
    # column slice j of every program's dW sum, summed after a grid barrier (two launches under
    # the interpreter), then that block is recomputed and written over it. Against the
    # partial-row form on the same inputs: ds bit for bit, dW up to summation order; both
    # against the reference; poisoned outputs; nothing allocated but the barrier's counter.
    m, n, cfg = case
    inputs = _inputs((m, n), dtype, 23)
    gen = generator(24)
    dy = rand((m, n), dtype, DEVICE, gen=gen)
    d_res = rand((m, n), dtype, DEVICE, gen=gen) if dres else None
    x, r, w = inputs["x"], inputs["residual"], inputs["weight"]
    y, s, rstd = torch.empty_like(x), torch.empty_like(x), torch.empty(m, device=DEVICE)
    fused_add_rms_norm_fwd_launch(x, r, w, y, s, rstd, 1e-6, 0.0, "llama")
    outs = {}
    for park in (True, False):
        with poisoned(), monkeypatch.context() as patch:
            if park:
                patch.setattr(far, "empty", lambda *a, **k: pytest.fail("allocated partials"))
                patch.setattr(far, "sum_partials", lambda *a, **k: pytest.fail("summed partials"))
            ds = torch.full_like(x, float("nan"))
            dw = torch.full_like(w, float("nan"))
            fused_add_rms_norm_bwd_launch(dy, d_res, s, w, rstd, ds, dw, 0.0, "llama", cfg, park)
        outs[park] = ds, dw
    (ds, dw), (ds_partials, dw_partials) = outs[True], outs[False]
    assert torch.equal(ds, ds_partials)
    same = 1e-6 if dtype == torch.float32 else TOL[dtype].fwd  # summation order only
    assert rel_norm_error(dw, dw_partials) < same
    ref_in = {"x": x.float(), "residual": r.float(), "weight": w.float()}
    dres_f = d_res.float() if dres else None
    _, _, ref_ds, _, ref_dw = _grads(fused_add_rms_norm_ref, ref_in, dy.float(), dres_f)
    assert rel_norm_error(ds, ref_ds) < TOL[dtype].bwd
    assert rel_norm_error(dw, ref_dw) < TOL[dtype].bwd


@pytest.mark.parametrize("dres", [True, False], ids=["dres", "no_dres"])
@pytest.mark.parametrize("mode,offset", [("llama", 0.0), ("gemma", 1.0), ("none", 0.0)])
def test_corun_backward(monkeypatch, mode, offset, dres):
    # From CORUN_FROM columns and CORUN_MIN_ROWS rows, ds programs and dW column programs share
    # one launch (lowered here so that small rows take it). Against the fused kernel on the same
    # inputs: ds bit for bit (the same row math), dW up to summation order; against the
    # reference; poisoned outputs; taken.
    calls = []
    real = far.fused_add_rms_norm_bwd_corun_launch
    spy = lambda *a, **k: calls.append(1) or real(*a, **k)  # noqa: E731
    m, n = (4096, 16384) if ON_GPU else (37, 300)
    dtype = torch.bfloat16
    inputs = _inputs((m, n), dtype, 33)
    gen = generator(34)
    dy = rand((m, n), dtype, DEVICE, gen=gen)
    d_res = rand((m, n), dtype, DEVICE, gen=gen) if dres else None
    x, r, w = inputs["x"], inputs["residual"], inputs["weight"]
    y, s, rstd = torch.empty_like(x), torch.empty_like(x), torch.empty(m, device=DEVICE)
    fused_add_rms_norm_fwd_launch(x, r, w, y, s, rstd, 1e-6, offset, mode)
    outs = []
    for corun in (True, False):
        with poisoned(), monkeypatch.context() as patch:
            patch.setattr(far, "fused_add_rms_norm_bwd_corun_launch", spy)
            if not ON_GPU:
                patch.setattr(far_table, "CORUN_FROM", 1)
                patch.setattr(far_table, "CORUN_MIN_ROWS", 1)
                patch.setattr(far_table, "CORUN_MIN_SMS", 1)
                corun_cfg = {"col_programs": 3, "col_rows": 4, "col_stages": 2}
                patch.setattr(far_table, "CORUN", corun_cfg)
            if not corun:
                patch.setattr(far_table, "CORUN_MIN_ROWS", m + 1)
            ds, dw = torch.full_like(x, float("nan")), torch.full_like(w, float("nan"))
            fused_add_rms_norm_bwd_launch(dy, d_res, s, w, rstd, ds, dw, offset, mode, park=False)
        outs.append((ds, dw))
    assert calls == [1]
    (ds, dw), (ds_fused, dw_fused) = outs
    assert torch.equal(ds, ds_fused) and rel_norm_error(dw, dw_fused) < TOL[dtype].fwd
    ref_in = {"x": x.float(), "residual": r.float(), "weight": w.float()}
    kwargs = dict(eps=1e-6, offset=offset, casting_mode=mode)
    dres_f = d_res.float() if dres else None
    _, _, ref_ds, _, ref_dw = _grads(fused_add_rms_norm_ref, ref_in, dy.float(), dres_f, **kwargs)
    assert (
        rel_norm_error(ds, ref_ds) < TOL[dtype].bwd and rel_norm_error(dw, ref_dw) < TOL[dtype].bwd
    )


@pytest.mark.gpu
def test_park_barrier_across_launches_streams_and_graphs():
    # The barrier's counter is never reset (_split.grid_counter): each launch must find it at a
    # multiple of GENERATION whatever ran before — other program counts (128 and 124 programs
    # here), another stream with its own counter, a CUDA graph replayed. Every parked result
    # equals the partial-row form's ds bit for bit, and the first parked dW bit for bit.
    cases = []
    for m, n in ((2048, 4096), (2048, 3968)):
        x, r, w = _inputs((m, n), torch.bfloat16, 27).values()
        y, s, rstd = torch.empty_like(x), torch.empty_like(x), torch.empty(m, device=DEVICE)
        fused_add_rms_norm_fwd_launch(x, r, w, y, s, rstd, 1e-6, 0.0, "llama")
        dy, dres = (rand((m, n), torch.bfloat16, DEVICE, gen=generator(28)) for _ in range(2))
        args = (dy, dres, s, w, rstd)

        def run(park, args=args, x=x, w=w):
            ds, dw = torch.full_like(x, float("nan")), torch.full_like(w, float("nan"))
            fused_add_rms_norm_bwd_launch(*args, ds, dw, 0.0, "llama", park=park)
            return ds, dw

        cases.append((run, run(False)[0], run(True)[1]))
    side = torch.cuda.Stream()
    for stream in (torch.cuda.current_stream(), side, torch.cuda.current_stream()):
        with torch.cuda.stream(stream):
            for _ in range(10):
                for run, ds_ref, dw_ref in cases:
                    ds, dw = run(None)
                    assert torch.equal(ds, ds_ref) and torch.equal(dw, dw_ref)
        torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [run(None) for run, _, _ in cases]
    for _ in range(5):
        for ds, dw in outs:
            ds.fill_(float("nan"))
            dw.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        for (ds, dw), (_, ds_ref, dw_ref) in zip(outs, cases, strict=True):
            assert torch.equal(ds, ds_ref) and torch.equal(dw, dw_ref)
    from kernelwright.ops import _split

    for counter in _split._COUNTERS.values():
        assert counter.item() % _split.GENERATION.value == 0


def test_backward_parks_only_where_it_can(monkeypatch):
    # An odd row count (a last block half full), a row block narrower than an fp32 row (one bf16
    # row), padded ds rows, ds sharing dy's storage and a width that the programs do not split
    # into whole 32-word slices all keep the partial rows: park=True is refused.
    m, n = (2 * 132 + 1, 4096) if ON_GPU else (27, 256)
    blocks = LaunchConfig(block_n=n, rows=2, programs_per_sm=1)
    one_row = LaunchConfig(block_n=n, rows=1, programs_per_sm=1)
    x, r, w = _inputs((m + 1, n), torch.bfloat16, 25).values()
    y, s, rstd = torch.empty_like(x), torch.empty_like(x), torch.empty(m + 1, device=DEVICE)
    fused_add_rms_norm_fwd_launch(x, r, w, y, s, rstd, 1e-6, 0.0, "llama")
    dy = rand((m + 1, n), torch.bfloat16, DEVICE, gen=generator(26))
    padded = torch.empty(m + 1, n + 8, dtype=torch.bfloat16, device=DEVICE)[:, :n]
    narrow = 3200 if ON_GPU else 200  # 100 x 32 (too few programs); 200 / 4 = 50 (not 32k)
    calls = (
        (dy[:m], s[:m], rstd[:m], torch.empty_like(x[:m]), w, blocks),  # odd rows
        (dy, s, rstd, torch.empty_like(x), w, one_row),  # 2 bytes per column per block
        (dy, s, rstd, padded, w, blocks),  # ds rows not contiguous
        (dy, s, rstd, dy, w, blocks),  # ds over dy
        (
            dy[:, :narrow],
            s[:, :narrow].contiguous(),
            rstd,
            torch.empty_like(x[:, :narrow]),
            w[:narrow],
            blocks,
        ),  # fmt: skip
    )
    for dy_, s_, rstd_, ds, w_, cfg in calls:
        with pytest.raises(ValueError, match="cannot park"):
            fused_add_rms_norm_bwd_launch(
                dy_, None, s_, w_, rstd_, ds, w_.clone(), 0.0, "llama", cfg, True
            )
    device = device_info(x.device)
    inputs = (dy, None, s, rstd)
    assert far.park_programs(m + 1, n, blocks, torch.empty_like(x), inputs, device) == (
        128 if ON_GPU else 4  # the most programs up to the SMs (132 on an H100 or H200; 4)
    )
    if ON_GPU:
        # Left to itself the launcher parks where the partial rows would pass PARK_SHARE of
        # ds (2048 rows of 4096: 12.9%), not where they are less (8192 rows: 3.2%).
        parked = []
        real = far.park_programs
        monkeypatch.setattr(far, "park_programs", lambda *a: parked.append(real(*a)) or real(*a))
        for rows in (2048, 8192):
            x, r, w = _inputs((rows, n), torch.bfloat16, 29).values()
            y, s, rstd = torch.empty_like(x), torch.empty_like(x), torch.empty(rows, device=DEVICE)
            fused_add_rms_norm_fwd_launch(x, r, w, y, s, rstd, 1e-6, 0.0, "llama")
            ds, dw = torch.empty_like(x), torch.empty_like(w)
            fused_add_rms_norm_bwd_launch(x, None, s, w, rstd, ds, dw, 0.0, "llama")
        assert parked == [128]


@pytest.mark.parametrize("shape", [FUSED, LOOPED], ids=str)
def test_one_output_unused(shape):
    # residual_out unused: its gradient arrives as None (HAS_DRES off). y unused: dy is None,
    # the residual gradient passes straight through and the weight gets none.
    inputs = _inputs(shape, torch.float32, 7)
    gen = generator(8)
    dy, dres = (rand(shape, torch.float32, DEVICE, gen=gen) for _ in range(2))
    for dy_, dres_ in ((dy, None), (None, dres)):
        with poisoned():
            ours = _grads(fused_add_rms_norm, inputs, dy_, dres_)
        ref = _grads(fused_add_rms_norm_ref, inputs, dy_, dres_)
        for a, b in zip(ours[2:4], ref[2:4], strict=True):
            assert rel_norm_error(a, b) < TOL[torch.float32].bwd
        if dy_ is not None:
            assert rel_norm_error(ours[4], ref[4]) < TOL[torch.float32].bwd
    assert torch.equal(ours[2], dres) and ours[4] is None and ref[4] is None


def test_expanded_upstream_gradients():
    # (y.sum() + s.sum()).backward() hands the kernel stride-0 gradients for both outputs.
    inputs = _inputs((5, 3, 200), torch.float32, 9)
    grads = []
    for fn in (fused_add_rms_norm, fused_add_rms_norm_ref):
        leaves = [v.detach().clone().requires_grad_() for v in inputs.values()]
        y, s = fn(*leaves)
        (y.sum() + s.sum()).backward()
        grads.append([t.grad for t in leaves])
    for a, b in zip(*grads, strict=True):
        assert rel_norm_error(a, b) < 1e-5


def test_partial_input_grads():
    # Only x trainable (residual and weight frozen): no dW is computed, x's gradient is ds.
    x, r, w = _inputs((7, 300), torch.float32, 10).values()
    x.requires_grad_()
    y, s = fused_add_rms_norm(x, r, w)
    (y * 2 + s).sum().backward()
    xr = x.detach().clone().requires_grad_()
    yr, sr = fused_add_rms_norm_ref(xr, r, w)
    (yr * 2 + sr).sum().backward()
    assert w.grad is None and r.grad is None
    assert rel_norm_error(x.grad, xr.grad) < 1e-5


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
    # residual_out is one rounded add: bit-equal to torch's. y must equal the eager HF-style
    # result bit for bit almost everywhere (only fp32 summation order may differ). bf16 runs on
    # the GPU only: the interpreter truncates fp32 -> bf16 instead of rounding.
    for shape in [(64, 1000), (8, LOOPED[-1])]:  # both kernel paths under the interpreter
        inputs = _inputs(shape, dtype, 11)
        y, s = fused_add_rms_norm(**inputs, eps=1e-6, casting_mode=mode, offset=offset)
        y_hf, s_hf = fused_add_rms_norm_eager(**inputs, eps=1e-6, casting_mode=mode, offset=offset)
        assert y.dtype == y_hf.dtype and s.dtype == s_hf.dtype
        assert torch.equal(s, s_hf)
        assert (y == y_hf).float().mean().item() > 0.999


@pytest.mark.parametrize("n", [FUSED[-1], LOOPED[-1]])
def test_int64_offsets(n):
    # Row 2 starts past 2^31 elements in x, residual, dy and dres: an int32 offset would wrap.
    m = 3
    for dtype in (torch.float32, torch.bfloat16):
        gen = generator(12)
        x, r = (large_offset_rows(n, m, dtype, DEVICE, gen=gen) for _ in range(2))
        w = rand((n,), dtype, DEVICE, gen=gen, mean=1.0, std=0.5)
        _check({"x": x, "residual": r, "weight": w}, dtype)
    # The backward reads the upstream gradients with their own row strides (not copied).
    x, r, w = _inputs((m, n), torch.bfloat16, 13).values()
    dy = large_offset_rows(n, m, torch.bfloat16, DEVICE, gen=generator(14))
    ours = _grads(fused_add_rms_norm, {"x": x, "residual": r, "weight": w}, dy, dy)
    del dy
    dy = rand((m, n), torch.bfloat16, DEVICE, gen=generator(14)).float()
    ref = _grads(
        fused_add_rms_norm_ref, {"x": x.float(), "residual": r.float(), "weight": w.float()}, dy, dy
    )
    for a, b in zip(ours[2:], ref[2:], strict=True):
        assert rel_norm_error(a, b) < TOL[torch.bfloat16].bwd


def test_zero_rows():
    x, r = (torch.empty(0, 64, device=DEVICE).requires_grad_() for _ in range(2))
    w = torch.ones(64, device=DEVICE).requires_grad_()
    y, s = fused_add_rms_norm(x, r, w)
    assert y.shape == s.shape == (0, 64)
    (y.sum() + s.sum()).backward()
    assert torch.equal(w.grad, torch.zeros(64, device=DEVICE))
    assert x.grad.shape == r.grad.shape == (0, 64)


def test_outputs_are_not_views():
    # A decoder may update the residual stream in place; autograd forbids that on views made
    # inside a Function, so the outputs are allocated in the input's shape.
    x, r, w = _inputs((2, 3, 64), torch.float32, 15).values()
    y, s = fused_add_rms_norm(x.requires_grad_(), r, w)
    assert not y._is_view() and not s._is_view()
    s2 = s.clone()
    s2 += y  # usable as the next residual


def test_module():
    m = FusedAddRMSNorm(300, eps=1e-5).to(DEVICE)
    assert torch.equal(m.weight, torch.ones(300, device=DEVICE))
    assert torch.equal(FusedAddRMSNorm(8, offset=1.0).weight, torch.zeros(8))  # Gemma's init
    assert FusedAddRMSNorm(8, elementwise_affine=False).weight is None
    with torch.no_grad():
        m.weight.copy_(rand((300,), torch.float32, DEVICE, gen=generator(16)))
    x, r, _ = _inputs((4, 300), torch.float32, 17).values()
    for a, b in zip(m(x, r), fused_add_rms_norm_ref(x, r, m.weight, 1e-5), strict=True):
        assert rel_norm_error(a, b) < 1e-5
    assert "casting_mode='llama'" in repr(m)


def test_bad_input_errors():
    x = rand((4, 64), torch.float32, DEVICE, gen=generator(18))
    with pytest.raises(ValueError, match=r"'residual' must have shape \(4, 64\).*got \(4, 63\)"):
        fused_add_rms_norm(x, x[:, :63])
    with pytest.raises(TypeError, match=r"'residual' must have x's dtype"):
        fused_add_rms_norm(x, x.half())
    with pytest.raises(ValueError, match=r"'weight' must have shape \(64,\).*got \(63,\)"):
        fused_add_rms_norm(x, x, torch.ones(63, device=DEVICE))
    with pytest.raises(TypeError, match=r"'x' must have dtype in .*got int32"):
        ints = torch.ones(4, 64, dtype=torch.int32, device=DEVICE)
        fused_add_rms_norm(ints, ints)
    with pytest.raises(TypeError, match="'residual' must be a torch.Tensor"):
        fused_add_rms_norm(x, None)
    with pytest.raises(TypeError, match="'weight' must be a torch.Tensor"):
        fused_add_rms_norm(x, x, [1.0] * 64)
    with pytest.raises(ValueError, match="casting_mode must be one of"):
        fused_add_rms_norm(x, x, casting_mode="llama3")
    with pytest.raises(ValueError, match="at least 1 dimension"):
        fused_add_rms_norm(torch.tensor(1.0, device=DEVICE), torch.tensor(1.0, device=DEVICE))
    with pytest.raises(ValueError, match="empty last dimension"):
        fused_add_rms_norm(torch.ones(4, 0, device=DEVICE), torch.ones(4, 0, device=DEVICE))
    if not ON_GPU:
        with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
            meta = torch.ones(4, 64, device="meta")
            fused_add_rms_norm(meta, meta)


def test_harness_catches_a_wrong_kernel():
    # A test that cannot fail is a defect: a wrong eps, a backward that loses the
    # d_residual_out term of ds (residual_out cut off from the graph, still requiring grad, as
    # check_op only differentiates through outputs that do), and a skipped last column must
    # each fail.
    inputs = _inputs((5, 300), torch.float32, 19)

    def wrong_eps(x, residual, weight, **kw):
        return fused_add_rms_norm(x, residual, weight, eps=1e-1)

    def detached_residual(x, residual, weight, **kw):
        y, s = fused_add_rms_norm(x, residual, weight)
        return y, s.detach().requires_grad_()

    def skips_last_column(x, residual, weight, **kw):
        y, s = fused_add_rms_norm(x[..., :-1], residual[..., :-1], weight[:-1])
        nan = torch.full_like(x[..., -1:], float("nan"))
        return torch.cat([y, nan], dim=-1), torch.cat([s, nan], dim=-1)

    ref = fused_add_rms_norm_ref
    assert not check_op(wrong_eps, ref, inputs, tolerances=TOL).ok
    report = check_op(detached_residual, ref, inputs, tolerances=TOL)
    assert not report.ok and report.rows[0].ok and report.rows[1].ok  # outputs fine, grads not
    report = check_op(skips_last_column, ref, inputs, tolerances=TOL, backward=False)
    assert not report.ok and report.rows[0].error == report.rows[1].error == float("inf")


@pytest.mark.compile
def test_torch_compile_fullgraph():
    # The custom ops make forward+backward one graph with opaque kernel nodes, including the
    # backward with residual_out unused (its gradient None).
    torch._dynamo.reset()
    inputs = _inputs((6, 2, 300), torch.float32, 20)

    def both(x, r, w):
        y, s = fused_add_rms_norm(x * 2.0, r, w, casting_mode="gemma", offset=1.0)
        return y.sin() + s.cos()

    def y_only(x, r, w):
        return fused_add_rms_norm(x, r, w)[0].sin()

    for block in (both, y_only):
        compiled = torch.compile(block, fullgraph=True)
        grads = []
        for fn in (compiled, block):
            leaves = [v.detach().clone().requires_grad_() for v in inputs.values()]
            fn(*leaves).sum().backward()
            grads.append([t.grad for t in leaves])
        for a, b in zip(*grads, strict=True):
            assert rel_norm_error(a, b) < 1e-5


@pytest.mark.slow
@pytest.mark.skipif(ON_GPU, reason="the GPU run compiles these for real")
def test_kernels_compile_for_hopper(monkeypatch):
    # The interpreter runs code the GPU compiler rejects: compile every "default" config, every
    # casting mode, with and without the residual gradient, for sm_90.
    def row_lengths(kernel):
        rows = TABLE[kernel]["default"]
        # each row's upper bound, capped so the host tensors stay small (the last, looped
        # row gets a length past the previous bound)
        return [(min(n, rows[-2][0] + 7), cfg) for n, cfg in rows]

    def run():
        for kernel in ("fwd", "bwd"):
            for n, cfg in row_lengths(kernel):
                for mode in far.CASTING_MODES:
                    x = torch.randn(2, n, dtype=torch.bfloat16)
                    w = torch.randn(n, dtype=torch.bfloat16) if mode != "none" else None
                    y, s, rstd = torch.empty_like(x), torch.empty_like(x), torch.ones(2)
                    if kernel == "fwd":
                        far.fused_add_rms_norm_fwd_launch(
                            x, x, w, y, s, rstd, 1e-6, 0.0, mode, config=cfg
                        )
                        continue
                    dw = torch.empty_like(w) if w is not None else None
                    for dres in (x, None):
                        far.fused_add_rms_norm_bwd_launch(
                            x, dres, x, w, rstd, y, dw, 0.0, mode, config=cfg
                        )
                        if n == far_table.CORUN_FROM and w is not None:  # as the GPU runs it
                            far.fused_add_rms_norm_bwd_corun_launch(
                                x, dres, x, w, rstd, y, dw, 0.0, mode, cfg, **far_table.CORUN
                            )

    # Two rows are "few" (_partials.few_rows) from 4096 columns: once with dW in the fused
    # kernels everywhere, once as the table has it (rms_norm's dw kernel there). The 4096
    # row's two-row blocks park dW in ds (park_programs): there in the GPU's one launch that
    # waits (PHASE 0; two rows make one program, which passes its own barrier here).
    monkeypatch.setattr(far_table, "PARTIALS_SHARE", float("inf"))
    monkeypatch.setattr(far, "park_phases", lambda device: (0,))
    monkeypatch.setattr(far_table, "PARK_MIN_SHARE", 0.0)
    results = check_compiles(run)
    monkeypatch.undo()
    few = check_compiles(run)
    failures = [
        f"{r.launch.name} {dict(r.launch.constexprs)}: {r.error}" for r in results + few if not r.ok
    ]
    assert not failures, "\n".join(failures)
    # 8 configs x 3 modes, forward + backward with and without dres; plus the dW reduction
    corun = "_fused_add_rms_norm_bwd_corun_kernel"
    others = ("_sum_partials_kernel", corun)
    assert len([r for r in results if r.launch.name not in others]) == 72
    assert len([r for r in results if r.launch.name == corun]) == 4  # the modes with w, dres
    assert any(r.launch.name == "_sum_partials_kernel" for r in results)
    park = "_fused_add_rms_norm_bwd_park_kernel"
    parked = [dict(r.launch.constexprs) for r in results if r.launch.name == park]
    # the two casting modes with a weight, with and without dres
    assert len(parked) == 4 and all(c["PHASE"] == 0 for c in parked)
    assert {r.launch.name for r in few} >= {"_norm_dw_kernel", "_rms_norm_bwd_kernel"}
