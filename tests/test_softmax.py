"""softmax / log_softmax: forward and backward against the fp32 reference, paths, properties."""

import dataclasses
import math

import pytest
import torch
import triton
from conftest import DEVICE, H100, ON_GPU

from kernelwright.ops import _split
from kernelwright.ops import softmax as softmax_module
from kernelwright.ops._held import HOLD_FROM
from kernelwright.ops._split import MAX_SPLITS, split_count
from kernelwright.ops.softmax import (
    LogSoftmax,
    Softmax,
    log_softmax,
    log_softmax_eager,
    log_softmax_ref,
    softmax,
    softmax_bwd_launch,
    softmax_eager,
    softmax_fwd_launch,
    softmax_ref,
)
from kernelwright.runtime import LaunchConfig
from kernelwright.runtime.tables.softmax import TABLE
from kernelwright.testing import (
    Tolerance,
    check_op,
    generator,
    large_offset_rows,
    poisoned,
    rand,
    rel_norm_error,
)

# Relative-norm error bounds, about 2x the worst measured under the interpreter (std-3 inputs,
# every shape below, two seeds: fp32 1.3e-6 / 1.5e-6, fp16 2.7e-4 / 3.3e-4, bf16 5.7e-3 /
# 8.7e-3). The forward rounds once (fp32 math, one cast at the store); the backward reads the
# saved output, rounded to the input dtype, and rounds dx once more. The bf16 bounds cover the
# interpreter's truncating fp32 -> bf16 cast (twice round-to-nearest's error).
TOL = {
    torch.float32: Tolerance(fwd=1e-5, bwd=2e-5),
    torch.float16: Tolerance(fwd=6e-4, bwd=8e-4),
    torch.bfloat16: Tolerance(fwd=1.2e-2, bwd=1.6e-2),
}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
OPS = [(softmax, softmax_ref), (log_softmax, log_softmax_ref)]
OP_IDS = ["softmax", "log_softmax"]

# Row lengths at the regime boundaries of the launch tables, plus odd sizes; the interpreter
# table switches to the looped kernel above 4096.
if ON_GPU:
    # (33, 20001): the one-row forward's masked rows at an odd row stride (no 16-byte
    # alignment); (17, 65535): split rows (4 chunks forward, 8 backward), the last partial;
    # (5, 262144) split, (3, 600000) looped; (129, 8191) and (65, 12289): the backward's looped
    # rows under the one-row widths (16-bit values; fp32 one-row), the last chunk partial.
    # They go last: SHAPES[2] and SHAPES[4] are the one-row and the wider widths the tests below
    # pick by index.
    SHAPES = [
        (4099, 64), (3, 1000, 257), (1023, 4096), (257, 32768), (9, 32769), (5, 262144),
        (33, 20001), (17, 65535), (3, 600000), (129, 8191), (65, 12289),
    ]  # fmt: skip
    LONG = 600000  # past the split rows: the looped kernels
else:
    SHAPES = [(37, 64), (2, 3, 257), (5, 1000), (1, 4096), (3, 4097), (2, 1, 2, 5001)]
    LONG = 70000


def _x(shape, dtype, seed, *, layout="contiguous", std=1.0):
    return rand(shape, dtype, DEVICE, gen=generator(seed), layout=layout, std=std)


def _check(op, ref, x, dtype=None):
    check_op(op, ref, {"x": x}, tolerances=TOL, dtype=dtype).assert_ok()


@pytest.mark.parametrize("op,ref", OPS, ids=OP_IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_forward_backward_matches_reference(shape, dtype, op, ref):
    _check(op, ref, _x(shape, dtype, 0, std=3.0))


@pytest.mark.parametrize("op,ref", OPS, ids=OP_IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_long_row_looped_kernel(dtype, op, ref):
    # A vocabulary-sized row through the online looped kernel (a few rows, cheap on CPU). The
    # fp32 table holds rows up to ~16K columns: the rounding of the row's sum of exponentials
    # grows as sqrt(N), and at 70,000 columns it sits at the table's edge (1.0-1.2e-5, by CPU)
    tol = dict(TOL)
    grow = math.sqrt(LONG / 16384)
    tol[torch.float32] = Tolerance(fwd=1e-5 * grow, bwd=2e-5 * grow)
    x = _x((2, LONG), dtype, 1, std=4.0)
    check_op(op, ref, {"x": x}, tolerances=tol, dtype=dtype).assert_ok()


@pytest.mark.parametrize("layout", ["row_strided", "transposed"])
@pytest.mark.parametrize("op,ref", OPS, ids=OP_IDS)
def test_non_contiguous_input(op, ref, layout):
    for shape in [SHAPES[1], SHAPES[4]]:
        _check(op, ref, _x(shape, torch.float32, 2, layout=layout))


@pytest.mark.parametrize("is_log", [False, True])
def test_every_kernel_path_agrees(is_log):
    # The same rows through the multi-row, one-row, looped and split kernels (chunks of 128,
    # with and without a partial last chunk, each L2 flag on and off) must agree.
    x = _x((13, 700), torch.float32, 3, std=5.0)
    x[2, 100:600] = float("-inf")  # a lane range that sees only -inf in the looped kernel
    dy = _x((13, 700), torch.float32, 4)
    configs = [
        LaunchConfig(block_n=1024, rows=4),
        LaunchConfig(block_n=1024, rows=1),
        LaunchConfig(block_n=HOLD_FROM, rows=1),  # the row held in its dtype (fp32 here)
        LaunchConfig(block_n=128),
        LaunchConfig(block_n=256),
        # the L2 flags: the write pass from the row's end (the partial chunk first at 256)
        LaunchConfig(block_n=128, evict_hints=True, reverse_pass=True),
        LaunchConfig(block_n=256, reverse_pass=True),
        LaunchConfig(block_n=256, evict_hints=True),
        # the row split over programs (ops/_split.py): 6 chunks of 128 (cols 128-255 of row 2
        # only -inf), 3 of 256 (a partial last chunk), 2 of 512 (row 2's -inf run across the
        # chunk edge, a last chunk of 188)
        LaunchConfig(block_n=128, split_row=True),
        LaunchConfig(block_n=256, split_row=True),
        LaunchConfig(block_n=512, split_row=True),
    ]
    results = []
    for cfg in configs:
        with poisoned():
            y = torch.full_like(x, float("nan"))
            dx = torch.full_like(x, float("nan"))
            softmax_fwd_launch(x, y, is_log, config=cfg)
            softmax_bwd_launch(dy, y, dx, is_log, config=cfg)
        results.append((y, dx))
    for y, dx in results[1:]:
        assert torch.allclose(y, results[0][0], rtol=1e-6, atol=1e-6, equal_nan=False)
        assert rel_norm_error(dx, results[0][1]) < 1e-6
    ref = (log_softmax_ref if is_log else softmax_ref)(x)
    finite = torch.isfinite(ref)
    assert torch.equal(torch.isfinite(results[0][0]), finite)
    assert rel_norm_error(results[0][0][finite], ref[finite]) < 1e-6


@pytest.mark.parametrize("n", [SHAPES[2][-1], SHAPES[4][-1]], ids=["fused", "looped"])
def test_rows_sum_to_one_and_shift_invariance(n):
    x = _x((6, n), torch.float32, 5, std=3.0)
    y = softmax(x)
    assert torch.allclose(y.sum(-1), torch.ones(6, device=DEVICE), atol=1e-5)
    assert torch.allclose(log_softmax(x).exp().sum(-1), torch.ones(6, device=DEVICE), atol=1e-5)
    # softmax(x + c) == softmax(x); log_softmax(x + c) == log_softmax(x); c per row
    c = torch.tensor([-300.0, -1.0, 0.5, 7.0, 100.0, 1000.0], device=DEVICE)[:, None]
    assert torch.allclose(softmax(x + c), y, rtol=1e-4, atol=1e-7)
    assert torch.allclose(log_softmax(x + c), log_softmax(x), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("n", [SHAPES[2][-1], SHAPES[4][-1]], ids=["fused", "looped"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_large_magnitude_inputs_do_not_overflow(dtype, n):
    # x ~ +-1e4: exp(x) overflows (or underflows to 0 / 0) without the max shift.
    for sign in (1.0, -1.0):
        x = rand((3, n), dtype, DEVICE, gen=generator(6), mean=sign * 1e4, std=30.0)
        for op, ref in OPS:
            y = op(x)
            assert torch.isfinite(y).all()
            assert rel_norm_error(y, ref(x)) < TOL[dtype].fwd


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # the all -inf row's NaN
@pytest.mark.parametrize("n", [SHAPES[2][-1], SHAPES[4][-1]], ids=["fused", "looped"])
def test_minus_inf_entries(n):
    x = _x((4, n), torch.float32, 7)
    x[0, ::3] = float("-inf")  # partially -inf: those entries get 0 / -inf
    x[1, : n - 1] = float("-inf")  # one finite entry: y = [0, ..., 0, 1]
    x[2] = float("-inf")  # all -inf: NaN, as in PyTorch
    for op, eager in [(softmax, torch.softmax), (log_softmax, torch.log_softmax)]:
        y, ref = op(x), eager(x, -1)
        assert torch.equal(torch.isnan(y), torch.isnan(ref))
        assert torch.isnan(y[2]).all()
        ok = ~torch.isnan(ref)
        assert torch.equal(y[ok] == float("-inf"), ref[ok] == float("-inf"))
        finite = torch.isfinite(ref)
        assert torch.allclose(y[finite], ref[finite], rtol=1e-5, atol=1e-6)
    # gradients of the rows that are not all -inf are finite and match PyTorch
    xs = x[[0, 1, 3]].clone()
    dy = _x(xs.shape, torch.float32, 8)
    for op, eager in [(softmax, torch.softmax), (log_softmax, torch.log_softmax)]:
        a = xs.clone().requires_grad_()
        b = xs.clone().requires_grad_()
        op(a).backward(dy)
        eager(b, -1).backward(dy)
        assert torch.isfinite(a.grad).all()
        assert rel_norm_error(a.grad, b.grad) < 1e-5


@pytest.mark.parametrize(
    "dtype",
    [torch.float16, pytest.param(torch.bfloat16, marks=pytest.mark.gpu)],
    ids=str,
)
def test_matches_torch_rounding(dtype):
    # One fp32 computation and one rounding: nearly every element must equal the fp32 result
    # rounded to the dtype, and PyTorch's softmax bit for bit (exp and summation order differ).
    # Measured with fp16 on CPU: softmax 99.99% equal to torch; log_softmax 100% equal to the
    # rounded reference but only 92-95% to torch, whose CPU fp16 log_softmax is off by up to 14
    # ulp near 0 (it is the less accurate one). bf16 runs on the GPU only: the interpreter
    # truncates fp32 -> bf16 instead of rounding.
    x = _x((64, 1000), dtype, 9, std=3.0)
    for ours, theirs, ref, vs_torch in [
        (softmax, softmax_eager, softmax_ref, 0.999),
        (log_softmax, log_softmax_eager, log_softmax_ref, 0.9),
    ]:
        a, b = ours(x), theirs(x)
        assert a.dtype == b.dtype == dtype
        assert (a == ref(x).to(dtype)).float().mean().item() > 0.999
        assert (a == b).float().mean().item() > vs_torch


@pytest.mark.parametrize("op,ref", OPS, ids=OP_IDS)
def test_expanded_upstream_gradient(op, ref):
    # y.sum().backward() hands the backward a stride-0 gradient (for softmax dx is ~0 then:
    # compared absolutely), and a broadcast weight gives one with stride-0 leading dims.
    x = _x((5, 3, 200), torch.float32, 10).requires_grad_()
    xr = x.detach().clone().requires_grad_()
    op(x).sum().backward()
    ref(xr).sum().backward()
    assert (x.grad - xr.grad).abs().max().item() < 1e-5 * xr.grad.abs().max().item() + 1e-6
    x.grad = None
    xr.grad = None
    w = torch.arange(200.0, device=DEVICE)
    op(x).expand(2, 5, 3, 200).sum(0).mul(w).sum().backward()
    ref(xr).expand(2, 5, 3, 200).sum(0).mul(w).sum().backward()
    assert rel_norm_error(x.grad, xr.grad) < 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_int64_offsets(dtype):
    # Row 2 starts past 2^31 elements: an int32 offset would wrap and read/write elsewhere.
    for n in (300, SHAPES[4][-1]):  # fused and looped kernels
        x = large_offset_rows(n, 3, dtype, DEVICE, gen=generator(11))
        for op, ref in OPS:
            _check(op, ref, x, dtype)


def _one_row_forward(x, is_log, block_n=HOLD_FROM):
    y = torch.full_like(x, float("nan"))
    with poisoned():
        softmax_fwd_launch(x, y, is_log, config=LaunchConfig(block_n=block_n, rows=1))
    return y


def _assert_one_rounding(y, x, is_log):
    # Each value within one rounding to y's dtype of the fp32 reference (the interpreter's
    # truncating cast: a full ulp), plus fp32 noise scaled by the row's magnitude.
    ref = (log_softmax_ref if is_log else softmax_ref)(x.float())
    finite = torch.isfinite(ref)
    assert torch.equal(torch.isfinite(y), finite)  # -inf entries, NaN rows where torch has them
    assert torch.equal(torch.isnan(y), torch.isnan(ref))
    ulp = torch.finfo(y.dtype).eps
    bound = ulp * ref[finite].abs() + 1e-5 * x.float().abs().amax().item() + 1e-30
    assert ((y.float()[finite] - ref[finite]).abs() <= bound).all()


@pytest.mark.parametrize("is_log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_one_row_forward_holds_16bit_rows(dtype, is_log):
    # From HOLD_FROM columns the one-row forward keeps the row in its 16-bit dtype and converts
    # it at each use (the conversions made to depend on the previous reduction, `again`):
    # every value must be the fp32 result rounded once. Rows: random, all negative (max < 0),
    # with -inf entries, all -inf (NaN, as in torch); 700 columns of the 16384-wide block.
    x = _x((6, 700), torch.float32, 21, std=4.0)
    x[1] = -x[1].abs() - 3.0
    x[2, ::3] = float("-inf")
    x[3] = float("-inf")
    x[4, 5] = 80.0  # one dominant value: the others' exp underflow
    x = x.to(dtype)
    _assert_one_rounding(_one_row_forward(x, is_log), x, is_log)


@pytest.mark.parametrize("is_log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_one_row_backward_holds_16bit_rows(dtype, is_log):
    # From HOLD_FROM columns the one-row backward keeps dy and y in their 16-bit dtype and
    # converts them again after the sum (`again`): dx must be fp32 math on the dy and y it
    # reads, rounded once. y from the forward (log_softmax: all negative), dy random of both
    # signs; 700 columns of the 16384-wide block.
    x = _x((5, 700), torch.float32, 30, std=4.0).to(dtype)
    dy = _x((5, 700), dtype, 31)
    y = _one_row_forward(x, is_log)
    dx = torch.full_like(x, float("nan"))
    with poisoned():
        softmax_bwd_launch(dy, y, dx, is_log, config=LaunchConfig(block_n=HOLD_FROM, rows=1))
    yf, dyf = y.float(), dy.float()
    s = (dyf if is_log else dyf * yf).sum(-1, keepdim=True)
    ref = dyf - yf.exp() * s if is_log else yf * (dyf - s)
    # one rounding (a full ulp: the interpreter's truncating cast; fp16's subnormal step at
    # the bottom), plus fp32 noise in the sum scaled by what multiplies it
    info = torch.finfo(dtype)
    bound = info.eps * (ref.abs() + info.smallest_normal)
    bound += 1e-5 * (s.abs() * (yf.exp() if is_log else yf))
    assert ((dx.float() - ref).abs() <= bound).all()


@pytest.mark.parametrize("is_log", [False, True], ids=["softmax", "log_softmax"])
def test_one_row_forward_int64_offsets(is_log):
    # Row 2 starts past 2^31 elements: an int32 offset would wrap and read/write elsewhere.
    x = large_offset_rows(300, 3, torch.bfloat16, DEVICE, gen=generator(12))
    y = large_offset_rows(300, 3, torch.bfloat16, DEVICE, gen=generator(13))
    y.fill_(float("nan"))
    softmax_fwd_launch(x, y, is_log, config=LaunchConfig(block_n=HOLD_FROM, rows=1))
    _assert_one_rounding(y, x, is_log)


def test_forward_holds_at_most_128_kb_of_a_row(monkeypatch):
    # A table whose one-row forward holds 65536 values: a 16-bit row (128 KB) is held, an fp32
    # row of that length would spill, so it takes the table's looped row. An explicit config is
    # taken as given.
    monkeypatch.setattr(softmax_module, "device_info", lambda device=None: H100)
    looped_row = LaunchConfig(block_n=4096, num_warps=16, evict_hints=True, reverse_pass=True)
    rows = [(65536, LaunchConfig(block_n=65536, num_warps=32)), (2**31 - 1, looped_row)]
    monkeypatch.setattr(softmax_module, "TABLE", {"fwd": {"default": rows}})

    def cfg(n, dtype, config=None):
        return softmax_module.forward_config(torch.empty(2, n, dtype=dtype), config)

    assert cfg(65536, torch.bfloat16).block_n == 65536
    assert cfg(65536, torch.float16).block_n == 65536
    assert cfg(32768, torch.float32).block_n == 65536
    assert cfg(65536, torch.float32) == looped_row
    explicit = LaunchConfig(block_n=65536, rows=1, num_warps=32)
    assert cfg(65536, torch.float32, explicit) is explicit


def test_backward_loops_16bit_rows_only(monkeypatch):
    # The table's looped backward rows under the one-row widths (4097-16384 on an H100) serve
    # 16-bit values; fp32 rows there take the table's widest one-row config (the 32768 row's
    # warps) at their power of two. Past the one-row widths fp32 rows keep the table's row
    # (split, then looped); an explicit config is taken as given.
    monkeypatch.setattr(softmax_module, "device_info", lambda device=None: H100)

    def cfg(n, dtype, config=None):
        return softmax_module.backward_config(torch.empty(1, n, dtype=dtype).expand(4, n), config)

    widest = [c for max_n, c in TABLE["bwd"]["default"] if c.block_n >= max_n][-1]
    for n in (4097, 8192, 12289, 16384):
        for dtype in (torch.bfloat16, torch.float16):
            looped = cfg(n, dtype)
            assert looped.block_n < n and looped.evict_hints and not looped.split_row
        one_row = cfg(n, torch.float32)
        assert one_row == widest.with_(block_n=triton.next_power_of_2(n))
    assert cfg(4096, torch.float32) == cfg(4096, torch.bfloat16)  # one-row in the table
    assert cfg(32768, torch.float32) == widest
    assert cfg(65536, torch.float32).split_row
    assert cfg(2**21, torch.float32) == TABLE["bwd"]["default"][-1][1]  # the looped row
    explicit = LaunchConfig(block_n=4096, num_warps=8)
    assert cfg(8192, torch.float32, explicit) is explicit


def _split_launches(x, dy, is_log, block_n, num_warps=4):
    # The split kernels (ops/_split.py) on fresh poisoned outputs and partials: on a GPU one
    # launch whose programs wait for each other, under the interpreter two launches.
    cfg = LaunchConfig(block_n=block_n, num_warps=num_warps, split_row=True)
    with poisoned():
        y = torch.full_like(x, float("nan"))
        dx = torch.full_like(x, float("nan"))
        softmax_fwd_launch(x, y, is_log, config=cfg)
        softmax_bwd_launch(dy, y, dx, is_log, config=cfg)
    return y, dx


@pytest.mark.parametrize("is_log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_split_row_holds_16bit_chunks(dtype, is_log):
    # Chunks of HOLD_FROM columns are held in their 16-bit dtype, as the one-row forward's rows:
    # every value the fp32 result rounded once. Two chunks per row, the second partial; rows
    # as in the one-row test, and a row whose second chunk is all -inf.
    n = HOLD_FROM + 300
    x = _x((5, n), torch.float32, 22, std=4.0)
    x[1] = -x[1].abs() - 3.0
    x[2, ::3] = float("-inf")
    x[3] = float("-inf")
    x[4, HOLD_FROM:] = float("-inf")
    x = x.to(dtype)
    dy = _x((5, n), dtype, 23)
    y, dx = _split_launches(x, dy, is_log, HOLD_FROM)
    _assert_one_rounding(y, x, is_log)
    # the backward against fp32 math on the y it reads, rows that are not all -inf
    rows = [0, 1, 2, 4]
    yr, dyr = y[rows].float(), dy[rows].float()
    s = (dyr if is_log else dyr * yr).sum(-1, keepdim=True)
    dx_ref = dyr - yr.exp() * s if is_log else yr * (dyr - s)
    assert rel_norm_error(dx[rows], dx_ref) < TOL[dtype].bwd


@pytest.mark.parametrize("is_log", [False, True], ids=["softmax", "log_softmax"])
def test_split_row_int64_offsets(is_log):
    # Row 2 starts past 2^31 elements: an int32 offset would wrap and read/write elsewhere.
    x = large_offset_rows(300, 3, torch.float32, DEVICE, gen=generator(24))
    y = large_offset_rows(300, 3, torch.float32, DEVICE, gen=generator(25))
    y.fill_(float("nan"))
    cfg = LaunchConfig(block_n=128, split_row=True)
    softmax_fwd_launch(x, y, is_log, config=cfg)
    _assert_one_rounding(y, x, is_log)
    dy = large_offset_rows(300, 3, torch.float32, DEVICE, gen=generator(28))
    dx = large_offset_rows(300, 3, torch.float32, DEVICE, gen=generator(29))
    dx.fill_(float("nan"))
    softmax_bwd_launch(dy, y, dx, is_log, config=cfg)
    yr, dyr = y.float(), dy.float()
    s = (dyr if is_log else dyr * yr).sum(-1, keepdim=True)
    dx_ref = dyr - yr.exp() * s if is_log else yr * (dyr - s)
    assert rel_norm_error(dx, dx_ref) < 1e-5


@pytest.mark.parametrize("is_log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_split_row_exchange_in_the_output(monkeypatch, dtype, is_log):
    # The split rows keep their slots and counters in the output's rows (ops/_split.py): no
    # workspace is allocated, and the results are bit for bit the workspace form's. 301 values
    # a row: 16-bit rows start at odd values every other row (the words one value in); three
    # chunks of 128, the last partial; poisoned outputs.
    x = _x((5, 301), torch.float32, 30, std=4.0).to(dtype)
    x[3, :128] = float("-inf")  # chunk 0, whose values hold the words, all -inf
    dy = _x((5, 301), dtype, 31)

    def no_workspace(*args, **kwargs):
        raise AssertionError("the split rows allocated a workspace")

    with monkeypatch.context() as m:
        m.setattr(_split, "workspace", no_workspace)
        y, dx = _split_launches(x, dy, is_log, 128)
    _assert_one_rounding(y, x, is_log)
    with monkeypatch.context() as m:
        m.setattr(_split, "exchange_values", lambda *args: 0)  # the workspace form
        y2, dx2 = _split_launches(x, dy, is_log, 128)
    assert torch.equal(y, y2) and torch.equal(dx, dx2)


def test_split_row_exchange_only_where_it_fits():
    # The exchange lives in the output only where it cannot touch another tensor's values or a
    # misaligned word: the values its 32 words up to the slots and 2 slots a chunk take
    # (16-bit: one more, the words may start one value in), rounded up to 16, or 0 for the
    # workspace.
    ev = _split.exchange_values
    y16, y32 = torch.empty(4, 301, dtype=torch.bfloat16), torch.empty(4, 301)
    x16 = torch.empty_like(y16)
    assert ev(y16, [x16], 128, 3, 2) == 80 and ev(y32, [y32.clone()], 128, 3, 2) == 48
    assert ev(y16, [y16], 128, 3, 2) == 0  # in place
    assert ev(y16[:, 2:], [x16], 128, 3, 2) == 80  # 4 bytes in: aligned
    assert ev(y16[:, 1:], [x16], 128, 3, 2) == 0  # 2 bytes in: misaligned words
    # 32 + 32 * 2 words = 192 values + the shift, 208 rounded: they fit in a chunk 0 of 208
    assert ev(y16, [x16], 208, 32, 2) == 208 and ev(y16, [x16], 207, 32, 2) == 0
    assert ev(y32, [x16], 96, 32, 2) == 96 and ev(y32, [x16], 95, 32, 2) == 0
    big = torch.empty(2, 4096, dtype=torch.bfloat16)
    assert ev(big[:, :2048], [big[:, 2048:]], 128, 3, 2) == 80  # interleaved halves: disjoint
    assert ev(big[:, :2048], [big[:, 1024:3072]], 128, 3, 2) == 0


def test_split_row_chosen_only_where_it_can_split(monkeypatch):
    # The table's split rows (an H100's) take rows past the one-row widths; a row of more than
    # MAX_SPLITS chunks (or than the GPU's SMs), or more programs in all than int32 tickets,
    # takes the looped row.
    monkeypatch.setattr(softmax_module, "device_info", lambda device=None: H100)

    def cfgs(n, dtype=torch.bfloat16, m=2):
        x = torch.empty(1, n, dtype=dtype).expand(m, n)  # a shape, no memory
        return softmax_module.forward_config(x), softmax_module.backward_config(x)

    for n in (65536, 131072, 262144):
        for cfg in cfgs(n):
            assert cfg.split_row and cfg.block_n < n
            assert split_count(n, cfg.block_n, 2, H100) >= 2
    assert cfgs(65536, torch.float32)[0].split_row  # no longer the looped row for fp32
    for cfg in (*cfgs(MAX_SPLITS * 2**20), *cfgs(262144, m=2**31 // 2)):
        assert not cfg.split_row and cfg.block_n < 262144  # the looped row
    assert split_count(1000, 128, 4, H100) == 8
    assert split_count(1000, 1000, 4, H100) == 0  # one chunk: nothing to split
    assert split_count(MAX_SPLITS * 128 + 1, 128, 4, H100) == 0
    assert split_count(MAX_SPLITS * 128, 128, 2**31 // MAX_SPLITS, H100) == 0
    small = dataclasses.replace(H100, sm_count=8)  # a row's programs must fit at once
    assert split_count(1000, 128, 4, small) == 8 and split_count(1100, 128, 4, small) == 0


@pytest.mark.gpu
@pytest.mark.parametrize("is_log", [False, True], ids=["softmax", "log_softmax"])
def test_split_row_waits_for_every_chunk(monkeypatch, is_log):
    # On the GPU a row's programs wait for each other's partials (one launch). 4096 rows of 8
    # chunks: every row against the fp32 reference (a program that read a sibling's slot before
    # it was written would read the poisoned workspace, NaN, or a stale value); bit for bit
    # against the two-launch form (nothing waits there) and against CUDA-graph replays (the
    # counters zeroed in the graph).
    x = _x((4096, 131072), torch.bfloat16, 26, std=4.0)
    dy = _x((4096, 131072), torch.bfloat16, 27)
    y, dx = _split_launches(x, dy, is_log, 16384, num_warps=16)
    ref = (log_softmax_ref if is_log else softmax_ref)(x)
    err = (y.float() - ref).abs().amax(dim=1) / ref.abs().amax(dim=1)
    assert err.max().item() < 1e-2
    del ref, err
    cfg = LaunchConfig(block_n=16384, num_warps=16, split_row=True)
    yg, dxg = torch.empty_like(y), torch.empty_like(dx)
    softmax_fwd_launch(x, yg, is_log, config=cfg)  # compiled before the capture
    softmax_bwd_launch(dy, yg, dxg, is_log, config=cfg)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        softmax_fwd_launch(x, yg, is_log, config=cfg)
        softmax_bwd_launch(dy, yg, dxg, is_log, config=cfg)
    for _ in range(3):
        yg.fill_(float("nan"))
        dxg.fill_(float("nan"))
        graph.replay()
        assert torch.equal(yg, y) and torch.equal(dxg, dx)
    with monkeypatch.context() as m:
        m.setattr(_split, "exchange_values", lambda *args: 0)  # the workspace form
        y3, dx3 = _split_launches(x, dy, is_log, 16384, num_warps=16)
    assert torch.equal(y3, y) and torch.equal(dx3, dx)
    monkeypatch.setattr(_split, "phases", lambda device: (1, 2))
    y2, dx2 = _split_launches(x, dy, is_log, 16384, num_warps=16)
    assert torch.equal(y2, y) and torch.equal(dx2, dx)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [131072, 65535, 152064], ids=["even", "odd", "uneven"])
def test_split_row_needs_no_memory(n):
    # The table's split rows (past 32768 columns) allocate nothing beyond the output: their
    # exchange lives in it (ops/_split.py). 65535 bf16 values a row: every other row's words
    # one value in; 152064: a last chunk of 4608 values, forward and backward.
    x = _x((256, n), torch.bfloat16, 32, std=4.0)
    dy = _x((256, n), torch.bfloat16, 33)
    y, dx = torch.empty_like(x), torch.empty_like(x)
    assert softmax_module.forward_config(x).split_row
    assert softmax_module.backward_config(y).split_row

    def both():
        softmax_fwd_launch(x, y, False)
        softmax_bwd_launch(dy, y, dx, False)

    both()  # compiled outside the measurement
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    both()
    torch.cuda.synchronize()
    assert torch.cuda.max_memory_allocated() == base
    _assert_one_rounding(y, x, False)


def test_zero_rows():
    for op in (softmax, log_softmax):
        x = torch.empty(2, 0, 64, device=DEVICE).requires_grad_()
        y = op(x)
        assert y.shape == (2, 0, 64)
        y.sum().backward()
        assert x.grad.shape == (2, 0, 64)


def test_modules():
    x = _x((4, 3, 300), torch.float32, 12)
    assert rel_norm_error(Softmax()(x), softmax_ref(x)) < 1e-6
    assert rel_norm_error(LogSoftmax(dim=2)(x), log_softmax_ref(x)) < 1e-6
    assert repr(Softmax()) == "Softmax(dim=-1)"
    with pytest.raises(ValueError, match="only the last dimension"):
        LogSoftmax(dim=0)(x)


def test_output_saved_for_backward_not_input():
    # Only y is saved: modifying x after the forward does not change the gradient; modifying y
    # in place is caught by autograd, as for torch.softmax.
    x = _x((3, 300), torch.float32, 13).requires_grad_()
    xr = x.detach().clone().requires_grad_()
    dy = _x((3, 300), torch.float32, 14)
    y = softmax(x * 1.0)
    softmax_ref(xr).backward(dy)
    y.backward(dy)
    assert rel_norm_error(x.grad, xr.grad) < 1e-5
    y = softmax(x)
    y.mul_(2.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_bad_input_errors():
    x = _x((4, 64), torch.float32, 15)
    with pytest.raises(ValueError, match=r"softmax: only the last dimension .* got dim=0"):
        softmax(x, dim=0)
    with pytest.raises(ValueError, match=r"log_softmax: only the last dimension .* got dim=-2"):
        log_softmax(x, dim=-2)
    assert torch.equal(softmax(x, dim=1), softmax(x))  # the last dim by its positive index
    with pytest.raises(TypeError, match=r"'x' must have dtype in .*got int32"):
        softmax(torch.ones(4, 64, dtype=torch.int32, device=DEVICE))
    with pytest.raises(TypeError, match="'x' must be a torch.Tensor"):
        log_softmax([1.0, 2.0])
    with pytest.raises(ValueError, match="at least 1 dimension"):
        softmax(torch.tensor(1.0, device=DEVICE))
    with pytest.raises(ValueError, match="empty last dimension"):
        softmax(torch.ones(4, 0, device=DEVICE))
    if not ON_GPU:
        with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
            softmax(torch.ones(4, 64, device="meta"))


def test_harness_catches_a_wrong_kernel():
    # A test that cannot fail is a defect: a softmax with a temperature off by 1%, one that
    # skips the last column, and log_softmax checked against softmax's reference must all fail.
    inputs = {"x": _x((5, 300), torch.float32, 16, std=3.0)}
    warm = lambda x: softmax(x * 1.01)
    assert not check_op(warm, softmax_ref, inputs, tolerances=TOL).ok
    assert not check_op(log_softmax, softmax_ref, inputs, tolerances=TOL).ok

    def skips_last_column(x):
        y = softmax(x[..., :-1])
        return torch.cat([y, torch.full_like(x[..., -1:], float("nan"))], dim=-1)

    report = check_op(skips_last_column, softmax_ref, inputs, tolerances=TOL, backward=False)
    assert not report.ok and report.rows[0].error == float("inf")


@pytest.mark.compile
def test_torch_compile_fullgraph():
    # The custom ops make the whole forward+backward one graph with opaque kernel nodes.
    torch._dynamo.reset()
    x0 = _x((6, 2, 300), torch.float32, 17)

    def block(x):
        return softmax(x * 2.0).sin() + log_softmax(x).cos()

    compiled = torch.compile(block, fullgraph=True)
    x = x0.detach().requires_grad_()
    compiled(x).sum().backward()
    xr = x0.detach().requires_grad_()
    block(xr).sum().backward()
    assert rel_norm_error(x.grad, xr.grad) < 1e-5
