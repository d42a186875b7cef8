"""Benchmark harness: byte models, bandwidth and ratio arithmetic, CSV, plots, errors, CLI.

Timings are faked (an injected timer) wherever the number matters, so these tests check the
arithmetic and the plumbing, not the machine. The end-to-end runs use the interpreter's tiny
shapes.
"""

import functools
import json
import math
import time
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from conftest import DEVICE

from kernelwright.bench import (
    COLUMNS,
    BenchRow,
    BenchSpec,
    Provider,
    Sweep,
    make_context,
    read_csv,
    run_spec,
    select_providers,
    summarize,
    summary_markdown,
    write_csv,
    write_plots,
)
from kernelwright.bench.db import ResultsDB
from kernelwright.bench.harness import (
    RunContext,
    cuda_timer,
    default_flush,
    interpreter_timer,
    measure_copy_bandwidth,
)
from kernelwright.bench.models import MODELS, distinct, token_counts
from kernelwright.bench.specs import (
    CROSS_ENTROPY,
    FUSED_LINEAR_CROSS_ENTROPY,
    JAGGED_MEAN,
    RMS_NORM,
    SPECS,
    SWIGLU,
)
from kernelwright.ops.rms_norm import rms_norm
from kernelwright.testing import generator, rand

# fmt: off
REQUIRED = [
    "op", "mode", "provider", "x_name", "x_value", "shape", "dtype", "ms_p20", "ms_p50", "ms_p80",
    "peak_mem_mb", "gbps", "pct_copy_bw", "gpu", "torch", "triton", "commit", "timestamp",
    "copy_gbps", "error", "flops", "tflops", "dims", "arch",
]
# fmt: on


def fake_timer(p20=1.0, p50=2.0, p80=3.0):
    """A timer that runs setup and fn once (so errors still surface), reports fixed times."""
    calls = []

    def timer(fn, setup):
        setup()
        fn()
        calls.append(fn)
        return p20, p50, p80

    timer.calls = calls
    return timer


def fake_context(copy_gbps=1000.0) -> RunContext:
    return make_context(DEVICE, timer=fake_timer(), copy_gbps=copy_gbps)


def _scale_spec(providers, **overrides) -> BenchSpec:
    """A toy op (y = 2x) on plain torch: exercises the harness without Triton."""

    def inputs(shape, dtype, device, *, seed=0):
        return {"x": rand((shape["m"], shape["n"]), dtype, device, gen=generator(seed))}

    fields = dict(
        op="scale",
        dims=("m", "n"),
        providers=tuple(providers),
        make_inputs=inputs,
        grad_inputs=("x",),
        # forward: read x, write y; backward: read dy, write dx -> 2*M*N*s each
        bytes=lambda shape, dtype, mode: (
            (4 if mode == "full" else 2) * shape["m"] * shape["n"] * dtype.itemsize
        ),
        sweeps=(Sweep("n", (16, 32), {"m": 8}),),
        quick_sweeps=(Sweep("n", (16,), {"m": 8}),),
        interpreter_sweeps=(Sweep("n", (16, 32), {"m": 8}),),
    )
    fields.update(overrides)
    return BenchSpec(**fields)


def _double(inp):
    x = inp["x"]
    return lambda: x * 2


# --------------------------------------------------------------------------- registry, specs


def test_sweeps_come_from_the_model_registry():
    assert distinct("hidden") == (2048, 3584, 4096, 8192, 16384)
    assert distinct("intermediate") == (8192, 14336, 18944, 28672, 53248)
    assert token_counts(1024, 32768) == (1024, 2048, 4096, 8192, 16384, 32768)
    assert len({m.name for m in MODELS}) == len(MODELS) == 7
    assert RMS_NORM.sweep("hidden").values == distinct("hidden")
    assert SWIGLU.sweep("intermediate").values == distinct("intermediate")
    assert {"rms_norm", "swiglu"} <= set(SPECS)
    assert set(RMS_NORM.provider_names) == {
        "kernelwright",
        "kernelwright_inplace",
        "torch",
        "torch_compile",
        "liger",
    }


def test_rms_norm_bytes_count_each_tensor_once():
    shape = {"tokens": 6, "hidden": 40}
    for dtype in (torch.bfloat16, torch.float32):
        inp = RMS_NORM.make_inputs(shape, dtype, DEVICE)
        x, w = inp["x"].requires_grad_(), inp["weight"].requires_grad_()
        y = rms_norm(x, w)
        dy = torch.ones_like(y)
        y.backward(dy)
        rstd = 6 * 4  # one fp32 per row, saved by the forward and read by the backward
        fwd = x.nbytes + w.nbytes + y.nbytes + rstd
        bwd = dy.nbytes + x.nbytes + w.nbytes + rstd + x.grad.nbytes + w.grad.nbytes
        assert RMS_NORM.bytes(shape, dtype, "forward") == fwd
        assert RMS_NORM.bytes(shape, dtype, "backward") == bwd
        assert RMS_NORM.bytes(shape, dtype, "full") == fwd + bwd


def test_swiglu_bytes_count_each_tensor_once():
    shape = {"tokens": 6, "intermediate": 40}
    dtype = torch.bfloat16
    inp = SWIGLU.make_inputs(shape, dtype, DEVICE)
    g, u = inp["gate"].requires_grad_(), inp["up"].requires_grad_()
    out = F.silu(g) * u
    out.backward(torch.ones_like(out))
    fwd = g.nbytes + u.nbytes + out.nbytes
    bwd = out.nbytes + g.nbytes + u.nbytes + g.grad.nbytes + u.grad.nbytes  # dout, gate, up in
    assert SWIGLU.bytes(shape, dtype, "forward") == fwd
    assert SWIGLU.bytes(shape, dtype, "backward") == bwd
    assert SWIGLU.bytes(shape, dtype, "full") == fwd + bwd


def test_loss_specs_count_bytes_and_flops():
    shape = {"tokens": 6, "vocab": 40}
    dtype = torch.bfloat16
    inp = CROSS_ENTROPY.make_inputs(shape, dtype, DEVICE)
    logits, target = inp["logits"], inp["target"]
    assert target.dtype == torch.int64
    assert bool(((target == -100) | ((target >= 0) & (target < 40))).all())
    many = CROSS_ENTROPY.make_inputs({"tokens": 4000, "vocab": 8}, dtype, DEVICE)["target"]
    assert 0.03 < float((many == -100).float().mean()) < 0.07  # ~5% ignored, as in SFT batches
    # forward: logits and targets read; full (and a standalone backward): + the gradient
    assert CROSS_ENTROPY.bytes(shape, dtype, "forward") == logits.nbytes + target.nbytes
    assert CROSS_ENTROPY.bytes(shape, dtype, "full") == 2 * logits.nbytes + target.nbytes
    assert CROSS_ENTROPY.too_large({"tokens": 32768, "vocab": 262144}, dtype) is None
    assert CROSS_ENTROPY.too_large({"tokens": 32768, "vocab": 262144}, torch.float32)
    # three [T, H] x [H, V] matmuls: 25.8 TFLOP at Llama-3-8B's lm-head and 8192 tokens
    big = {"tokens": 8192, "hidden": 4096, "vocab": 128256}
    flops = FUSED_LINEAR_CROSS_ENTROPY.flops
    assert flops(big, dtype, "full") == 3 * 2 * 8192 * 4096 * 128256
    assert flops(big, dtype, "full") == pytest.approx(25.8e12, rel=1e-3)
    assert flops(big, dtype, "forward") + flops(big, dtype, "backward") == flops(big, dtype, "full")
    assert CROSS_ENTROPY.unit_grad and FUSED_LINEAR_CROSS_ENTROPY.unit_grad
    assert CROSS_ENTROPY.flops is None


def test_inputs_are_random_not_zeros():
    inp = RMS_NORM.make_inputs({"tokens": 4, "hidden": 64}, torch.float32, DEVICE)
    assert bool((inp["x"] != 0).all()) and inp["x"].std() > 0.5


def test_swiglu_memory_cap_skips_huge_shapes():
    assert SWIGLU.too_large({"tokens": 8192, "intermediate": 53248}, torch.bfloat16) is None
    why = SWIGLU.too_large({"tokens": 131072, "intermediate": 53248}, torch.bfloat16)
    assert why and why.startswith("skipped")


def test_cpu_defaults_leave_out_compile_and_missing_peers():
    names = [p.name for p in select_providers(RMS_NORM, device=torch.device("cpu"))]
    assert "torch_compile" not in names and "kernelwright" in names and "torch" in names
    spec = _scale_spec(
        [Provider("ours", _double), Provider("peer", _double, requires="no_such_pkg")]
    )
    assert [p.name for p in select_providers(spec, device=torch.device("cpu"))] == ["ours"]


def test_quick_gpu_runs_leave_out_slow_providers_unless_named(monkeypatch):
    # jagged_mean's Python loop takes seconds a call at the real shapes (its backward 0.6-8.6 s
    # on an H200): the demo's quick run on a GPU must not wait on it; full sweeps keep it.
    import kernelwright.bench.harness as harness

    monkeypatch.setattr(harness, "interpreter_mode", lambda: False)
    gpu = torch.device("cuda")

    def chosen(**kw):
        return [p.name for p in select_providers(JAGGED_MEAN, device=gpu, **kw)]

    assert "loop" not in chosen(quick=True) and "kernelwright" in chosen(quick=True)
    assert "loop" in chosen() and "loop" in chosen(names=["loop"], quick=True)
    cpu = [p.name for p in select_providers(JAGGED_MEAN, device=torch.device("cpu"), quick=True)]
    assert "loop" in cpu  # tiny shapes under the interpreter


# --------------------------------------------------------------------------- arithmetic


def test_bandwidth_and_percent_of_copy_use_the_byte_model_and_p50():
    spec = _scale_spec([Provider("kernelwright", _double)])
    ctx = fake_context(copy_gbps=1000.0)
    rows = run_spec(spec, ctx=ctx, timer=fake_timer(1.0, 2.0, 3.0))
    assert len(rows) == 2 * 3  # two shapes x three modes
    for r in rows:
        assert (r.ms_p20, r.ms_p50, r.ms_p80) == (1.0, 2.0, 3.0)
        expected = spec.bytes({"m": 8, "n": r.x_value}, torch.bfloat16, r.mode)
        assert r.bytes == expected
        assert r.gbps == pytest.approx(expected / 2e-3 / 1e9)
        assert r.pct_copy_bw == pytest.approx(r.gbps / 1000.0 * 100)
        assert r.copy_gbps == 1000.0 and r.error == ""
        assert json.loads(r.dims) == {"m": 8, "n": r.x_value} and r.arch == ctx.arch != ""


def test_flop_model_gives_tflops_and_a_summary_column():
    flops = lambda shape, dtype, mode: 10**9 * shape["n"]  # noqa: E731
    spec = _scale_spec([Provider("kernelwright", _double)], flops=flops)
    rows = run_spec(spec, ctx=fake_context(), timer=fake_timer(1.0, 2.0, 3.0))
    for r in rows:
        assert r.flops == 10**9 * r.x_value
        assert r.tflops == pytest.approx(r.flops / 2e-3 / 1e12)
    assert "TFLOP/s" in summary_markdown(rows)
    (s, *_) = summarize(rows)
    assert s.tflops == pytest.approx(rows[0].tflops)
    # without a FLOP model: no count, NaN throughput, no column
    plain = run_spec(_scale_spec([Provider("kernelwright", _double)]), ctx=fake_context(),
                     timer=fake_timer())  # fmt: skip
    assert all(r.flops == 0 and math.isnan(r.tflops) for r in plain)
    assert "TFLOP/s" not in summary_markdown(plain)


def test_copy_bandwidth_counts_read_plus_write():
    nbytes = 2**20
    gbps = measure_copy_bandwidth(DEVICE, timer=fake_timer(p50=0.5), nbytes=nbytes)
    assert gbps == pytest.approx(2 * nbytes / 0.5e-3 / 1e9)


def _row(provider, ms, mem, *, mode="full", shape="8x16", pct=50.0, host_ms=0.01):
    return BenchRow(
        op="scale", mode=mode, provider=provider, x_name="n", x_value=16, shape=shape,
        dtype="bfloat16", ms_p20=ms, ms_p50=ms, ms_p80=ms, peak_mem_mb=mem, host_ms=host_ms,
        pct_copy_bw=pct, gpu="fake", timing="cuda_events",
    )  # fmt: skip


def test_speedup_is_best_peer_over_ours_and_memory_ratio_likewise():
    rows = [
        _row("kernelwright", 1.0, 100.0, pct=80.0),
        _row("torch", 10.0, 300.0),  # eager is not a peer for the ratio
        _row("torch_compile", 2.0, 250.0),
        _row("liger", 1.5, 50.0),
    ]
    (s,) = summarize(rows)
    assert s.best_peer == "liger"
    assert s.speedup == pytest.approx(1.5)  # min(2.0, 1.5) / 1.0
    assert s.mem_ratio == pytest.approx(0.5)  # min(250, 50) / 100: Liger uses less here
    assert s.pct_copy_bw == 80.0
    # A failed peer drops out of the comparison; with no peer the ratio is NaN, not a crash.
    rows[3] = _row("liger", math.nan, math.nan)
    (s,) = summarize(rows)
    assert s.best_peer == "torch_compile" and s.speedup == pytest.approx(2.0)
    (s,) = summarize(rows[:2])
    assert math.isnan(s.speedup) and math.isnan(s.mem_ratio)
    md = summary_markdown(rows)
    assert "| 8x16 |" in md and "2.00" in md and "†" not in md
    # A provider whose CPU issue time is near its GPU time is marked launch-bound.
    rows[0] = _row("kernelwright", 1.0, 100.0, host_ms=0.9)
    md = summary_markdown(rows)
    assert "1.000† / 100" in md and "launch-bound" in md
    assert "not speeds" not in md
    # Interpreter rows say so above the tables too, not only in the plots' titles.
    interp = [replace(r, timing="interpreter") for r in rows]
    assert "**Interpreter timings, not speeds**" in summary_markdown(interp)


# --------------------------------------------------------------------------- failures


def test_failing_providers_give_error_rows_and_the_run_goes_on():
    def build_fails(inp):
        raise ImportError("no module named fancy_kernels")

    def call_fails(inp):
        def fn():
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

        return fn

    spec = _scale_spec(
        [
            Provider("kernelwright", _double),
            Provider("broken_build", build_fails),
            Provider("broken_call", call_fails),
            Provider("peer", _double, requires="no_such_pkg"),
        ]
    )
    names = ["kernelwright", "broken_build", "broken_call", "peer"]
    rows = run_spec(spec, providers=names, ctx=fake_context(), timer=fake_timer())
    by = {}
    for r in rows:
        by.setdefault(r.provider, []).append(r)
    assert all(r.ok for r in by["kernelwright"]) and len(by["kernelwright"]) == 6
    assert all("ImportError: no module named fancy_kernels" in r.error for r in by["broken_build"])
    assert all(r.error.startswith("RuntimeError: CUDA error") for r in by["broken_call"])
    assert all("no_such_pkg is not installed" in r.error for r in by["peer"])
    for r in by["broken_build"] + by["broken_call"] + by["peer"]:
        assert math.isnan(r.ms_p50) and math.isnan(r.gbps)


class _GradIntoInput(torch.autograd.Function):
    """y = 2x whose backward writes dx into x's own storage, as Liger's SwiGLU does."""

    @staticmethod
    def forward(ctx, x):
        x2 = x.view(-1, x.shape[-1])  # a view made in no-grad mode, saved (as Liger does)
        ctx.save_for_backward(x2)
        return x * 2

    @staticmethod
    def backward(ctx, dy):
        (x2,) = ctx.saved_tensors
        x2.data.copy_(dy * 2)  # a raw write, like a Triton kernel's: no version bump
        return x2.view(dy.shape)


def test_timers_run_setup_before_every_call():
    events = []
    interpreter_timer(reps=4)(lambda: events.append("fn"), lambda: events.append("setup"))
    assert events == ["setup", "fn"] * 4


@pytest.mark.gpu
def test_cuda_timer_times_host_overhead_unless_hidden():
    x = torch.randn(2**20, device=DEVICE)

    def fn():
        time.sleep(2e-3)  # 2 ms of host work before one tiny kernel: launch-bound
        x.add_(1)

    # A small flush: on a GPU shared with other test workers a 256 MiB flush can outlast the
    # host's sleep, and the start event would then wait for the kernel already queued.
    timer = functools.partial(cuda_timer, warmup_ms=5, rep_ms=40, flush_bytes=2**16)
    _, with_host, _ = timer()(fn, lambda: None)
    _, gpu_only, _ = timer(hide_host=True)(fn, lambda: None)
    assert with_host > 1.5, with_host
    assert gpu_only < 0.1, gpu_only


def test_timer_flush_choices_are_checked():
    with pytest.raises(ValueError, match="flush"):
        cuda_timer(flush="none")
    with pytest.raises(ValueError, match="flush"):
        make_context(copy_gbps=1.0, flush="zero")


def test_default_flush_is_demote_where_the_gpu_has_applypriority():
    # demote needs sm_80+; the CPU interpreter flushes nothing, and a row must not claim a flush
    assert default_flush(torch.device("cpu")) == "read"
    ctx = make_context(torch.device(DEVICE), copy_gbps=1.0)
    if torch.device(DEVICE).type == "cuda":
        sm80 = torch.cuda.get_device_capability() >= (8, 0)
        assert ctx.flush == ("demote" if sm80 else "read")
        assert ctx.timing.endswith(f"_{ctx.flush}_flush"), ctx.timing
    else:
        assert ctx.timing == "interpreter"
    assert make_context(torch.device(DEVICE), copy_gbps=1.0, flush="read").flush == "read"


@pytest.mark.gpu
def test_demote_flush_clears_lines_loaded_with_evict_last():
    # A buffer read with evict_last survives a plain read flush (NOTES 51: the next provider on
    # the same addresses read it from L2). After the "demote" flush, reading it must cost what
    # reading an untouched buffer of the same size costs.
    from kernelwright.bench._l2 import _read_evict_last_kernel

    n = 2**22  # 16 MB of fp32, well under L2
    hot, cold = torch.ones(n, device=DEVICE), torch.ones(n, device=DEVICE)
    out = torch.zeros((), device=DEVICE)

    def load_hot():
        _read_evict_last_kernel[(n // 4096,)](hot, out, n, 4096)

    def read(x):
        return lambda: torch.sum(x, dim=0, out=out)

    times = {}
    for flush in ("read", "demote"):
        timer = cuda_timer(warmup_ms=5, rep_ms=30, hide_host=True, flush=flush)
        times[flush] = (timer(read(hot), load_hot)[1], timer(read(cold), lambda: None)[1])
    hot_ms, cold_ms = times["demote"]
    assert hot_ms > 0.85 * cold_ms, times
    print(times)  # the plain read's hot/cold ratio, for the log


def test_providers_that_write_their_inputs_get_them_back_every_rep():
    # A provider whose backward writes dx into x (as Liger's SwiGLU does): every rep, warm-up
    # and memory runs included, must start from the original x, and the retained graph of
    # "backward" mode must stay usable.
    seen = []

    class GradIntoInput(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            x2 = x.view(-1, x.shape[-1])  # a view made in no-grad mode, saved, as Liger does
            ctx.save_for_backward(x2)
            return x * 2

        @staticmethod
        def backward(ctx, dy):
            (x2,) = ctx.saved_tensors
            seen.append(float(x2.double().sum()))
            x2.data.copy_(dy * 3)  # a raw write like a Triton kernel's: no version bump
            return x2.view(dy.shape)

    def build(inp):
        x = inp["x"]
        return lambda: GradIntoInput.apply(x)

    spec = _scale_spec([Provider("aliasing", build, mutates=True)])
    rows = run_spec(spec, modes=["backward", "full"], ctx=fake_context(), timer=interpreter_timer())
    assert all(r.ok for r in rows), [r.error for r in rows]
    assert len(seen) > 8
    originals = {
        n: float(spec.make_inputs({"m": 8, "n": n}, torch.bfloat16, DEVICE)["x"].double().sum())
        for n in (16, 32)
    }
    assert set(seen) <= set(originals.values()), (seen, originals)


def test_backward_once_gives_every_rep_a_fresh_graph():
    # An op whose graph takes one backward (as ours losses: the gradient is computed in the
    # forward and scaled in place by the backward): "backward" mode must not re-walk a graph.
    class OneShot(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.used = False
            return x * 2

        @staticmethod
        def backward(ctx, dy):
            if ctx.used:
                raise RuntimeError("backward ran twice through the same graph")
            ctx.used = True
            return dy * 2

    def build(inp):
        x = inp["x"]
        return lambda: OneShot.apply(x)

    once = _scale_spec([Provider("kernelwright", build)], backward_once=True)
    rows = run_spec(once, ctx=fake_context(), timer=interpreter_timer())
    assert all(r.ok for r in rows), [r.error for r in rows]
    retained = _scale_spec([Provider("kernelwright", build)])
    rows = run_spec(retained, modes=["backward"], ctx=fake_context(), timer=interpreter_timer())
    assert all("twice" in r.error for r in rows)


def test_a_gradient_shared_by_two_inputs_is_not_copied_through_views():
    # fused_add_rms_norm's backward returns one tensor for x and residual. With both inputs
    # leaves, AccumulateGrad copies it for one of them (time and memory no model spends);
    # `grad_through_views` feeds non-leaf views, so both leaves get the tensor itself.
    class SharedGrad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, r):
            return x + r

        @staticmethod
        def backward(ctx, dy):
            g = dy * 1.0
            return g, g

    leaves = []

    def build(inp):
        x, r = inp["x"], inp["r"]
        leaves[:] = [x._base if x._base is not None else x, r._base if r._base is not None else r]
        return lambda: SharedGrad.apply(x, r)

    def inputs(shape, dtype, device, *, seed=0):
        gen = generator(seed)
        return {k: rand((shape["m"], shape["n"]), dtype, device, gen=gen) for k in "xr"}

    shared = {}
    for views in (False, True):
        spec = _scale_spec(
            [Provider("kernelwright", build)],
            make_inputs=inputs,
            grad_inputs=("x", "r"),
            grad_through_views=views,
        )
        rows = run_spec(spec, modes=["backward"], ctx=fake_context(), timer=fake_timer())
        assert all(r.ok for r in rows), [r.error for r in rows]
        x, r = leaves
        assert x.is_leaf and r.is_leaf and x.grad is not None and r.grad is not None
        shared[views] = x.grad.data_ptr() == r.grad.data_ptr()
    assert shared == {False: False, True: True}


def test_oversized_shapes_are_skipped_with_a_reason():
    spec = _scale_spec(
        [Provider("kernelwright", _double)],
        input_bytes=lambda shape, dtype: shape["m"] * shape["n"] * dtype.itemsize,
        max_input_bytes=8 * 16 * 2,  # n=16 fits in bf16, n=32 does not
    )
    rows = run_spec(spec, ctx=fake_context(), timer=fake_timer())
    assert all(r.ok for r in rows if r.x_value == 16)
    assert all(r.error.startswith("skipped") for r in rows if r.x_value == 32)


def test_a_shape_on_two_sweeps_is_measured_once():
    spec = _scale_spec(
        [Provider("kernelwright", _double)],
        **dict.fromkeys(
            ("sweeps", "quick_sweeps", "interpreter_sweeps"),
            (Sweep("n", (16, 32), {"m": 8}), Sweep("m", (8, 4), {"n": 16})),
        ),
    )
    timer = fake_timer()
    rows = run_spec(spec, modes=["forward"], ctx=fake_context(), timer=timer)
    assert [(r.x_name, r.x_value, r.shape) for r in rows] == [
        ("n", 16, "8x16"), ("n", 32, "8x32"), ("m", 8, "8x16"), ("m", 4, "4x16"),
    ]  # fmt: skip
    assert len(timer.calls) == 3


# --------------------------------------------------------------------------- CSV and plots


def test_csv_has_every_column_parses_back_and_appends(tmp_path):
    assert set(REQUIRED) <= set(COLUMNS)
    spec = _scale_spec([Provider("kernelwright", _double), Provider("torch", _double)])
    rows = run_spec(spec, ctx=fake_context(), timer=fake_timer())
    rows[0].error = "OOM: tried to allocate, with a comma"
    rows[0].ms_p50 = math.nan
    path = write_csv(rows, tmp_path / "scale.csv")
    back = read_csv(path)
    assert len(back) == len(rows)
    for a, b in zip(rows, back, strict=True):
        for col in COLUMNS:
            va, vb = getattr(a, col), getattr(b, col)
            if isinstance(va, float) and math.isnan(va):
                assert math.isnan(vb)
            else:
                assert va == vb, col
    write_csv(rows, path, append=True)
    assert len(read_csv(path)) == 2 * len(rows)
    # a CSV of the schema before the FLOP columns still reads (they take their defaults)
    old = tmp_path / "old.csv"
    old_cols = list(COLUMNS[: COLUMNS.index("flops")])
    lines = [",".join(old_cols), ",".join(str(getattr(rows[1], c)) for c in old_cols)]
    old.write_text("\n".join(lines) + "\n")
    (r,) = read_csv(old)
    assert r.ms_p50 == rows[1].ms_p50 and r.flops == 0 and math.isnan(r.tflops)
    assert r.dims == "" and r.arch == ""
    (tmp_path / "other.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="columns differ"):
        write_csv(rows, tmp_path / "other.csv", append=True)


def test_plots_are_written(tmp_path):
    spec = _scale_spec([Provider("kernelwright", _double), Provider("torch", _double)])
    rows = run_spec(spec, ctx=fake_context(), timer=fake_timer())
    paths = write_plots(rows, tmp_path)
    assert sorted(p.name for p in paths) == [
        "scale_n_backward.png",
        "scale_n_forward.png",
        "scale_n_full.png",
    ]
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --------------------------------------------------------------------------- end to end


def test_rms_norm_end_to_end_through_the_kernels():
    # Real providers, real (interpreter) timer on the smallest shape: the in-place backward
    # and the retained graph of "backward" mode must survive repeated reps.
    providers = ["kernelwright", "kernelwright_inplace", "torch"]
    rows = run_spec(RMS_NORM, providers=providers, quick=True, ctx=fake_context())
    assert rows and all(r.ok for r in rows), [r.error for r in rows if r.error]
    assert {r.provider for r in rows} == set(providers)


@pytest.mark.parametrize(
    "spec, providers, shape",
    [
        (CROSS_ENTROPY, ["kernelwright", "kernelwright_inplace", "torch"], {"tokens": 8}),
        (FUSED_LINEAR_CROSS_ENTROPY, ["kernelwright", "torch"], {"tokens": 16, "hidden": 16}),
    ],
    ids=["cross_entropy", "fused_linear_cross_entropy"],
)
def test_loss_specs_end_to_end_through_the_kernels(spec, providers, shape):
    # Every mode of the real providers at one tiny shape: the one-backward-per-graph losses
    # and the in-place provider (logits restored every rep) must give no error row.
    # both sweep sets: on a GPU the harness takes `sweeps` (real model shapes), not the tiny ones
    one = (Sweep("vocab", (96,), shape),)
    tiny = replace(spec, sweeps=one, interpreter_sweeps=one)
    rows = run_spec(tiny, providers=providers, ctx=fake_context(), timer=fake_timer())
    assert len(rows) == 3 * len(providers)
    assert all(r.ok for r in rows), [(r.provider, r.mode, r.error) for r in rows if r.error]


def test_an_interrupted_bench_keeps_the_rows_it_measured(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from kernelwright.bench import harness
    from kernelwright.cli import app

    real = harness.run_plan

    def ctrl_c_after_two_rows(p, *, on_row, **kwargs):
        seen = []

        def row_then_maybe_stop(row):
            on_row(row)
            seen.append(row)
            if len(seen) == 2:
                raise KeyboardInterrupt

        return real(p, on_row=row_then_maybe_stop, **kwargs)

    monkeypatch.setattr(harness, "run_plan", ctrl_c_after_two_rows)
    db = tmp_path / "results.db"
    args = ["bench", "relu_squared", "--quick", "--providers", "kernelwright,torch"]
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path), "--db", str(db)])
    assert result.exit_code == 130, result.output
    assert "Kept: the 2 rows measured before the interrupt" in result.output
    assert len(read_csv(tmp_path / "relu_squared.csv")) == 2
    assert len(ResultsDB.existing(db).query()) == 2
    assert not (tmp_path / "summary.md").exists()


def test_cli_bench_quick_writes_the_csv(tmp_path):
    from typer.testing import CliRunner

    from kernelwright.cli import app

    args = ["bench", "rms_norm", "--quick", "--providers", "kernelwright,torch"]
    db = tmp_path / "results.db"
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path), "--db", str(db)])
    assert result.exit_code == 0, result.output
    rows = read_csv(tmp_path / "rms_norm.csv")
    assert rows and all(r.op == "rms_norm" and not r.error for r in rows)
    # the named dims spell the row's shape (tiny shapes on the CPU, the quick sweep's on a GPU)
    assert all(
        json.loads(r.dims)[r.x_name] == r.x_value
        and sorted(str(v) for v in json.loads(r.dims).values()) == sorted(r.shape.split("x"))
        for r in rows
    )
    assert len(ResultsDB.existing(db).query()) == len(rows)  # the same rows, in the database
    assert {r.mode for r in rows} == {"forward", "backward", "full"}
    assert (tmp_path / "summary.md").exists()
    assert list(tmp_path.glob("rms_norm_*_full.png"))
    assert "speedup" in result.output
    # a second op into the same folder: summary.md covers both (a CSV of another kind is left out)
    (tmp_path / "notes.csv").write_text("a,b\n1,2\n")
    args = ["bench", "relu_squared", "--quick", "--mode", "forward", "--providers", "kernelwright"]
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path), "--db", str(db), "--no-plots"])
    assert result.exit_code == 0, result.output
    summary = (tmp_path / "summary.md").read_text()
    assert "rms_norm" in summary and "relu_squared" in summary and "notes" not in summary


def test_cli_bench_takes_every_dtype_spelling(tmp_path, monkeypatch):
    import types

    from typer.testing import CliRunner

    import kernelwright.bench
    from kernelwright import cli_bench
    from kernelwright.cli import app

    class Stop(Exception):
        pass

    seen = []

    def run(console, p, measured, *, dtype, ctx):  # the dtype the bench would run in, then stop
        seen.append(dtype)
        raise Stop

    ctx = types.SimpleNamespace(gpu="g", torch="t", triton="t", commit="c", copy_gbps=1.0,
                                hide_host=False, interpreter=False)  # fmt: skip
    monkeypatch.setattr(kernelwright.bench, "make_context", lambda **kw: ctx)
    monkeypatch.setattr(cli_bench, "_run_with_progress", run)
    runner = CliRunner()
    for spelling in ("bf16", "bfloat16", "float32", "fp32", "half"):
        args = ["bench", "rms_norm", "--quick", "--dtype", spelling, "--out", str(tmp_path)]
        result = runner.invoke(app, [*args, "--db", str(tmp_path / "r.db")])
        assert isinstance(result.exception, Stop), result.output
    assert seen == [torch.bfloat16, torch.bfloat16, torch.float32, torch.float32, torch.float16]
    result = runner.invoke(app, ["bench", "rms_norm", "--dtype", "fp64", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "bf16/bfloat16" in result.output


def test_cli_rejects_unknown_names(tmp_path):
    from typer.testing import CliRunner

    from kernelwright.cli import app

    runner = CliRunner()
    assert runner.invoke(app, ["bench", "no_such_op", "--out", str(tmp_path)]).exit_code != 0
    res = runner.invoke(app, ["bench", "rms_norm", "--providers", "nope", "--out", str(tmp_path)])
    assert res.exit_code != 0
    res = runner.invoke(app, ["bench", "rms_norm", "--flush", "zero", "--out", str(tmp_path)])
    assert res.exit_code != 0 and "flush" in res.output
    assert runner.invoke(app, ["info"]).exit_code == 0
