"""jagged_mean: forward and backward against the fp32 reference, the PyTorch baselines, segment
lengths 0 / 1 / longer than several row chunks, offsets dtypes, layouts, int64 row offsets,
empty batches, launch configs, errors, the harness itself and torch.compile."""

import math

import pytest
import torch
from conftest import ON_GPU

from kernelwright.ops import jagged_mean as J
from kernelwright.ops.jagged_mean import (
    JaggedMean,
    jagged_mean,
    jagged_mean_loop,
    jagged_mean_ref,
    jagged_mean_vectorized,
)
from kernelwright.runtime import LaunchConfig
from kernelwright.runtime.tables.jagged_mean import TABLE
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

# Relative-norm error bounds vs the fp32 reference. The forward sums in fp32 and rounds once
# (the mean); the backward scales dout by 1/n in fp32 and rounds once. fp32 differs from the
# reference only by summation order. The bf16 bounds cover the interpreter's truncation of
# fp32 -> bf16 (about twice the error of rounding to nearest).
# Measured under the interpreter over DIMS, seeds 0-1 (fwd / bwd): fp32 4.5e-8 / 0, fp16
# 1.8e-4 / 1.2e-4, bf16 2.6e-3 / 1.9e-3 (truncating).
TOL = {
    torch.float32: Tolerance(fwd=1e-6, bwd=1e-6),
    torch.float16: Tolerance(fwd=5e-4, bwd=5e-4),
    torch.bfloat16: Tolerance(fwd=6e-3, bwd=6e-3),
}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
DIMS = [1, 7, 64, 300]

# The longest row chunk any table row uses: the long segment takes several chunks of it.
MAX_ROWS = max(cfg.rows for per_arch in TABLE.values() for rows in per_arch.values()
               for _, cfg in rows)  # fmt: skip
LONG = 4 * MAX_ROWS + 5
# Short segments: under the interpreter every program instance costs milliseconds.
B, MAX_LEN = (200, 512) if ON_GPU else (50, 6)


def _offsets(lengths, dtype, device):
    zero = torch.zeros(1, dtype=torch.int64)
    return torch.cat([zero, torch.as_tensor(lengths, dtype=torch.int64).cumsum(0)]).to(
        dtype=dtype, device=device
    )


def _lengths(b, gen, *, long=True):
    # Random lengths 0..MAX_LEN, with a 0 and a 1 at the front and one long segment mid-batch.
    lengths = torch.randint(0, MAX_LEN + 1, (b,), generator=gen)
    lengths[: min(b, 2)] = torch.tensor([0, 1])[: min(b, 2)]
    if long and b >= 3:
        lengths[b // 2] = LONG
    return lengths


def _jagged(
    b, d, dtype, seed, device, *, offsets_dtype=torch.int64, layout="contiguous", long=True
):
    gen = generator(seed)
    lengths = _lengths(b, gen, long=long)
    values = rand((int(lengths.sum()), d), dtype, device, gen=gen, layout=layout)
    return {"values": values, "offsets": _offsets(lengths, offsets_dtype, device)}


def _check(inputs, **options):
    # offsets is an input like values but gets no gradient; check_op hands the reference an
    # fp32 copy of it, exact for offsets below 2^24.
    return check_op(
        jagged_mean, jagged_mean_ref, inputs, grad_inputs=("values",), tolerances=TOL, **options
    )


# --------------------------------------------------------------------------- vs the reference


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("d", DIMS)
def test_forward_backward_matches_reference(d, dtype, device):
    check_op_seeds(
        jagged_mean, jagged_mean_ref, lambda seed: _jagged(B, d, dtype, seed, device),
        seeds=(0, 1), grad_inputs=("values",), tolerances=TOL, dtype=dtype,
    )  # fmt: skip


@pytest.mark.parametrize("d", [7, 300])
def test_int32_offsets(d, device):
    for dtype in (torch.float32, torch.bfloat16):
        inputs = _jagged(B, d, dtype, 2, device, offsets_dtype=torch.int32)
        assert inputs["offsets"].dtype == torch.int32
        _check(inputs).assert_ok()


@pytest.mark.parametrize("layout", ["row_strided", "transposed"])
def test_non_contiguous_values(layout, device):
    # row_strided: rows padded (a column slice of a wider buffer), passed by row stride;
    # transposed: last dim not contiguous, copied once by rows_view.
    for d, dtype in [(300, torch.float16), (7, torch.float32)]:
        inputs = _jagged(B, d, dtype, 3, device, layout=layout)
        assert not inputs["values"].is_contiguous()
        _check(inputs).assert_ok()


def test_only_long_and_single_row_segments(device):
    # Every segment spans several row chunks, or exactly one row (no short random ones).
    lengths = [LONG, 1, 3 * MAX_ROWS, MAX_ROWS, MAX_ROWS + 1, 1]
    values = rand((sum(lengths), 64), torch.float32, device, gen=generator(4))
    _check({"values": values, "offsets": _offsets(lengths, torch.int64, device)}).assert_ok()


def test_mean_of_constant_segments_is_exact(device):
    # Segment b filled with the value b: its mean is b exactly (0 for the empty segment 1), and
    # the gradient of out.sum() is 1/n on each of its n rows.
    lengths = [3, 0, 1, LONG, 2]
    seg = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    values = seg[:, None].expand(-1, 5).float().to(device).requires_grad_()
    offsets = _offsets(lengths, torch.int64, device)
    out = jagged_mean(values, offsets)
    expected = torch.tensor([float(b) if n else 0.0 for b, n in enumerate(lengths)])
    assert torch.equal(out, expected[:, None].expand(-1, 5).to(device))
    out.sum().backward()
    per_row = torch.cat([torch.full((n, 5), 1.0 / n) for n in lengths if n]).to(device)
    assert torch.equal(values.grad, per_row)


@pytest.mark.parametrize("kernel", ["fwd", "bwd"])
def test_every_table_config(kernel, device):
    # Every GPU table config (column tiles narrower than D, several tiles per segment) and an
    # odd one give the same result: the sums' order over rows changes, so compare to 1e-6.
    inputs = _jagged(6, 300, torch.float32, 5, device)
    v, offsets = inputs["values"], inputs["offsets"]
    dout = rand((6, 300), torch.float32, device, gen=generator(6))
    configs = [cfg for _, cfg in TABLE[kernel]["default"]] + [LaunchConfig(block_n=128, rows=2)]
    results = []
    for cfg in configs:
        with poisoned():
            if kernel == "fwd":
                out = torch.full((6, 300), math.nan, device=device)
                J.jagged_mean_fwd_launch(v, offsets, out, config=cfg)
            else:
                out = torch.full_like(v, math.nan)
                J.jagged_mean_bwd_launch(dout, offsets, out, config=cfg)
        results.append(out)
    for got, cfg in zip(results, configs, strict=True):
        if kernel == "fwd":
            assert rel_norm_error(got, jagged_mean_ref(v, offsets)) < TOL[torch.float32].fwd, cfg
        else:
            assert torch.equal(got, results[0]), cfg  # one division per element: exact


# --------------------------------------------------------------------------- the baselines


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_baselines_match_reference(dtype, device):
    # The benchmark's `loop` and `torch` providers compute the same thing, gradients included.
    inputs = _jagged(B, 7, dtype, 7, device)
    for fn in (jagged_mean_loop, jagged_mean_vectorized):
        report = check_op(fn, jagged_mean_ref, inputs, grad_inputs=("values",), tolerances=TOL)
        report.assert_ok()


def test_baselines_on_empty_batches(device):
    for lengths in ([], [0, 0, 0]):
        values = torch.ones(0, 4, device=device)
        offsets = _offsets(lengths, torch.int64, device)
        for fn in (jagged_mean_ref, jagged_mean_loop, jagged_mean_vectorized):
            assert torch.equal(fn(values, offsets), torch.zeros(len(lengths), 4, device=device))


# --------------------------------------------------------------------------- gradients, offsets


def test_expanded_upstream_gradient(device):
    # out.sum().backward() hands the backward a stride-0 gradient.
    inputs = _jagged(9, 64, torch.float32, 8, device)
    ours = inputs["values"].detach().clone().requires_grad_()
    theirs = inputs["values"].detach().clone().requires_grad_()
    with poisoned():
        jagged_mean(ours, inputs["offsets"]).sum().backward()
    jagged_mean_ref(theirs, inputs["offsets"]).sum().backward()
    assert rel_norm_error(ours.grad, theirs.grad) < TOL[torch.float32].bwd


def test_int64_row_offsets(device):
    # Row 2 starts 2^31 + 128 elements in: an int32 row * stride would wrap. The gradient is
    # allocated dense, so only the forward's loads reach those offsets.
    values = large_offset_rows(77, 3, torch.float16, device, gen=generator(9))
    offsets = _offsets([1, 2], torch.int32, device)
    _check({"values": values, "offsets": offsets}).assert_ok()


@pytest.mark.parametrize("case", ["no_segments", "no_rows", "no_columns"])
def test_empty(case, device):
    # B = 0 (offsets = [0]), total = 0 (every segment empty: zeros), D = 0.
    lengths, d = {"no_segments": ([], 5), "no_rows": ([0, 0, 0], 5), "no_columns": ([2, 0, 1], 0)}[
        case
    ]
    values = torch.ones(sum(lengths), d, device=device).requires_grad_()
    offsets = _offsets(lengths, torch.int64, device)
    with poisoned():
        out = jagged_mean(values, offsets)
        assert torch.equal(out, torch.zeros(len(lengths), d, device=device))
        out.sum().backward()
    assert values.grad.shape == values.shape


def test_offsets_get_no_gradient(device):
    inputs = _jagged(5, 7, torch.float32, 10, device)
    values = inputs["values"].requires_grad_()
    out = jagged_mean(values, inputs["offsets"])
    (grad,) = torch.autograd.grad(out.sum(), [values])
    assert grad.shape == values.shape and not inputs["offsets"].requires_grad


def test_module_and_validate_flag(device):
    inputs = _jagged(7, 64, torch.float32, 11, device)
    expected = jagged_mean(**inputs)
    assert torch.equal(JaggedMean()(**inputs), expected)
    assert torch.equal(JaggedMean(validate=False)(**inputs), expected)
    assert torch.equal(jagged_mean(**inputs, validate=False), expected)
    assert "validate=False" in repr(JaggedMean(validate=False))


# --------------------------------------------------------------------------- errors


def _bad_inputs(device):
    other = "cpu" if ON_GPU else "meta"  # a device the kernels cannot use here
    v = torch.ones(6, 4, device=device)
    off = lambda *xs, dtype=torch.int64, dev=device: torch.tensor(xs, dtype=dtype, device=dev)
    return [
        (lambda: jagged_mean(torch.ones(6, device=device), off(0, 6)), ValueError,
         r"jagged_mean: argument 'values' must be 2-D \[total, D\], got shape \(6,\)"),
        (lambda: jagged_mean(torch.ones(2, 3, 4, device=device), off(0, 2)), ValueError,
         r"argument 'values' must be 2-D"),
        (lambda: jagged_mean(v.int(), off(0, 6)), TypeError,
         r"jagged_mean: argument 'values' must have dtype in \(float32, float16, bfloat16\)"),
        (lambda: jagged_mean(v, off(0, 6, dtype=torch.float32)), TypeError,
         r"jagged_mean: argument 'offsets' must have dtype int32 or int64, got float32"),
        (lambda: jagged_mean(v, off(0, 6, dtype=torch.int16)), TypeError,
         r"argument 'offsets' must have dtype int32 or int64, got int16"),
        (lambda: jagged_mean(v, [0, 6]), TypeError,
         r"jagged_mean: argument 'offsets' must be a torch.Tensor, got list"),
        (lambda: jagged_mean(v, off(0, 6)[None]), ValueError,
         r"jagged_mean: argument 'offsets' must be 1-D with B \+ 1 >= 1 entries .*\(1, 2\)"),
        (lambda: jagged_mean(v, off()), ValueError, r"argument 'offsets' must be 1-D .*\(0,\)"),
        (lambda: jagged_mean(v, off(0, 6, dev=other)), RuntimeError,
         rf"jagged_mean: argument 'offsets' is on {other} but 'values' is on"),
        (lambda: jagged_mean(v, off(0, 2, 5)), ValueError,
         r"jagged_mean: offsets\[-1\] must equal the number of rows of values \(6\), got 5"),
        (lambda: jagged_mean(v, off(0, 2, 7)), ValueError, r"offsets\[-1\] must equal .* got 7"),
        (lambda: jagged_mean(v, off(1, 2, 6)), ValueError,
         r"jagged_mean: offsets\[0\] must be 0, got 1"),
        (lambda: jagged_mean(v, off(0, 4, 2, 6, dtype=torch.int32)), ValueError,
         r"jagged_mean: offsets must be non-decreasing, got offsets\[1\] = 4 > offsets\[2\] = 2"),
    ]  # fmt: skip


@pytest.mark.parametrize("case", range(13))
def test_bad_input_errors(case, device):
    call, exc, message = _bad_inputs(device)[case]
    with pytest.raises(exc, match=message):
        call()


# --------------------------------------------------------------------------- the harness itself


def test_harness_catches_a_wrong_kernel(device, monkeypatch):
    # A test that cannot fail is a defect: a grid that floor-divides D into tiles (dropping the
    # last, partial tile: its outputs stay NaN) and a backward that hands each segment another
    # segment's gradient must both fail.
    inputs = _jagged(B, 7, torch.float16, 12, device)
    assert _check(inputs).ok

    real_bwd = J.jagged_mean_bwd_launch
    shifted = lambda dout, offsets, dv, config=None: real_bwd(dout.roll(1, 0), offsets, dv, config)
    monkeypatch.setattr(J, "jagged_mean_bwd_launch", shifted)
    report = _check(inputs)
    assert [r.ok for r in report.rows] == [True, False], report.table()
    monkeypatch.undo()

    floor_grid = lambda b, d, cfg: (b * max(1, d // cfg.block_n),)
    monkeypatch.setattr(J, "_grid", floor_grid)
    small_tiles = LaunchConfig(block_n=4, rows=2)
    real_fwd = J.jagged_mean_fwd_launch
    monkeypatch.setattr(
        J, "jagged_mean_fwd_launch", lambda v, o, out, config=None: real_fwd(v, o, out, small_tiles)
    )
    report = _check(inputs, backward=False)
    assert not report.ok and report.rows[0].error == math.inf, report.table()


# --------------------------------------------------------------------------- torch.compile


@pytest.mark.compile
def test_torch_compile_fullgraph(device):
    # Forward and backward through the custom ops inside one graph, with ops on both sides;
    # the offsets check (a host sync) is skipped under compile.
    torch._dynamo.reset()
    inputs = _jagged(9, 64, torch.float32, 13, device, offsets_dtype=torch.int32)

    def block(values, offsets):
        return jagged_mean(values * 2.0, offsets).sin()

    compiled = torch.compile(block, fullgraph=True)
    results = []
    for fn in (compiled, block):
        values = inputs["values"].detach().clone().requires_grad_()
        out = fn(values, inputs["offsets"])
        out.sum().backward()
        results.append((out, values.grad))
    for ours, theirs in zip(*results, strict=True):
        assert rel_norm_error(ours, theirs) < 1e-6


# --------------------------------------------------------------------------- sm_90 compile


@pytest.mark.slow
@pytest.mark.skipif(ON_GPU, reason="the GPU run compiles these for real")
def test_kernels_compile_for_hopper():
    # Every "default" config of both kernels, bf16 with int64 offsets and fp32 with int32.
    def run():
        for kernel in ("fwd", "bwd"):
            for max_n, cfg in TABLE[kernel]["default"]:
                d = min(max_n, 1030)
                for dtype, odt in ((torch.bfloat16, torch.int64), (torch.float32, torch.int32)):
                    offsets = _offsets([2, 0, 3], odt, "cpu")
                    values = torch.randn(5, d, dtype=dtype)
                    if kernel == "fwd":
                        J.jagged_mean_fwd_launch(values, offsets, torch.empty(3, d, dtype=dtype),
                                                 config=cfg)  # fmt: skip
                    else:
                        dout = torch.randn(3, d, dtype=dtype)
                        J.jagged_mean_bwd_launch(dout, offsets, values, config=cfg)

    results = check_compiles(run)
    failures = [
        f"{r.launch.name} {dict(r.launch.constexprs)}: {r.error}" for r in results if not r.ok
    ]
    assert not failures, "\n".join(failures)
    # the staged forward's chunks fit the shared memory set aside for them, fp32 included
    too_big = [r for r in results if r.shared > J.STAGED_BYTES + 4096]
    assert not too_big, [(dict(r.launch.constexprs), r.shared) for r in too_big]
    assert any(dict(r.launch.constexprs).get("STAGES", 1) > 1 for r in results)
    # one compile per distinct config, kernel and (dtype, offsets dtype) pair at least
    distinct = sum(len({cfg for _, cfg in TABLE[k]["default"]}) for k in ("fwd", "bwd"))
    assert len(results) >= 2 * distinct
