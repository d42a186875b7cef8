"""create's benchmark stage: the spec a generated bench file builds, its byte model, the
comparison table and the soft findings. Timings under the interpreter mean nothing: these tests
check the plumbing (providers, shapes, rows, ratios), not speed."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import ON_GPU

from kernelwright.bench.harness import BenchRow, run_spec
from kernelwright.workflows.create import bench as B
from kernelwright.workflows.create.verify import benchmark

DYT = "examples/create/dyt.py"
INPUTS = [
    B.BenchInput("x", "full", (4, 8, 96), True),
    B.BenchInput("alpha", "scalar", (), True),
    B.BenchInput("gamma", "col", (96,), True),
    B.BenchInput("beta", "col", (1, 96), True),
]
POINTS = [{"rows": r, "cols": 4096} for r in (1024, 8192)] + [{"rows": 8192, "cols": 2048}]


def test_input_shapes_follow_the_broadcast_kind():
    assert [B.input_shape(i, 5, 7) for i in INPUTS] == [(5, 7), (), (7,), (1, 7)]
    assert B.input_shape(B.BenchInput("r", "row", (4, 8, 1), False), 5, 7) == (5, 1)


def test_a_row_of_other_dims_runs_at_the_traced_rank():
    # a channel norm: [N, C, H, W] reduced over C; a loss: every dim reduced
    chan = B.Layout((2, 12, 6, 10), (1,), ("full",), long_rows=True)
    assert chan.full(600, 12) == (10, 12, 6, 10) and chan.row_len(chan.full(600, 12)) == 12
    w = B.BenchInput("w", "col", (12, 1, 1), True)
    assert B.input_shape(w, 600, 12, chan) == (12, 1, 1)
    assert B.input_shape(B.BenchInput("x", "full", (2, 12, 6, 10), True), 600, 12, chan) == (
        10, 12, 6, 10)  # fmt: skip
    loss = B.Layout((4, 8, 96), (0, 1, 2), ("row",))
    assert math.prod(loss.full(8, 4096)) == 8 * 4096  # one row of every element
    spec = B.make_spec("mse", lambda *a: a[0], None, [B.BenchInput("x", "full", (4, 8, 96), True)],
                       1, POINTS, layout=loss)  # fmt: skip
    # forward: read x, write one scalar
    assert spec.bytes({"rows": 8, "cols": 4096}, torch.bfloat16, "forward") == 8 * 4096 * 2 + 2
    # a per-row target index traced as [rows] (cross-entropy's): int64, drawn within the row
    ce = B.Layout((32, 96), (1,), ("row",))
    t = B.BenchInput("target", "row", (32,), False, "int")
    assert B.input_shape(t, 5, 7, ce) == (5,)
    spec = B.make_spec("ce", lambda *a: a[0], None, [B.BenchInput("x", "full", (32, 96), True), t],
                       1, POINTS, layout=ce)  # fmt: skip
    got = spec.make_inputs({"rows": 50, "cols": 7}, torch.float32, "cpu")["target"]
    assert got.dtype == torch.int64 and got.shape == (50,) and got.min() >= 0 and got.max() < 7
    # row kernels that take long rows get a long-row point in the quick sweep
    assert [s.values for s in B._quick(POINTS, long_rows=True)][1] == (B.LONG_ROW,)


def test_profile_points_become_sweeps():
    sweeps = B._sweeps(POINTS)
    assert [(s.name, s.values, dict(s.fixed)) for s in sweeps] == [
        ("rows", (1024, 8192), {"cols": 4096}),
        ("cols", (2048,), {"rows": 8192}),
    ]
    (quick,) = B._quick(POINTS)
    assert quick.values == B.QUICK_ROWS and quick.fixed == {"cols": 4096}


def test_byte_model_counts_every_tensor_once():
    spec = B.make_spec("dyt", lambda *a: a[0], None, INPUTS, 1, POINTS)
    shape = {"rows": 10, "cols": 6}
    ins = (60 + 1 + 6 + 6) * 2  # x, alpha, gamma, beta in bf16
    out = 60 * 2
    fwd = ins + out
    bwd = ins + out + ins  # inputs again, dy, one gradient per input
    assert spec.bytes(shape, torch.bfloat16, "forward") == fwd
    assert spec.bytes(shape, torch.bfloat16, "backward") == bwd
    assert spec.bytes(shape, torch.bfloat16, "full") == fwd + bwd
    assert spec.grad_inputs == ("x", "alpha", "gamma", "beta")


def test_spec_runs_the_reference_and_the_generated_function_side_by_side():
    reference, error = B.load_user_reference(DYT)
    assert error == "" and reference is not None
    calls = []

    def fake_kernel(*xs):  # stands in for the generated function: the reference, counted
        calls.append([tuple(x.shape) for x in xs])
        return reference(*xs)

    spec = B.make_spec("dyt", fake_kernel, reference, INPUTS, 1, POINTS)
    rows = run_spec(spec, providers=["kernelwright", "torch"], modes=["forward", "full"])
    assert {(r.provider, r.mode) for r in rows} == {
        (p, m) for p in ("kernelwright", "torch") for m in ("forward", "full")
    }
    assert not any(r.error for r in rows), [r.error for r in rows]
    # the first shape of the sweep: the profile's points on a GPU, the interpreter's on the CPU
    r, c = (1024, 4096) if ON_GPU else (4, 96)
    assert calls[0] == [(r, c), (), (c,), (1, c)]
    shapes = ("1024x4096", "8192x4096", "8192x2048") if ON_GPU else ("4x96", "9x96")
    comps = B.compare(rows)
    assert {(c.shape, c.mode) for c in comps} == {(s, m) for s in shapes
                                                 for m in ("forward", "full")}  # fmt: skip


def test_a_reference_that_cannot_load_gives_error_rows(tmp_path):
    reference, error = B.load_user_reference(str(tmp_path / "missing.py"))
    assert reference is None and "does not exist" in error
    spec = B.make_spec("dyt", lambda *a: a[0] * 2, None, INPUTS[:1], 1, POINTS,
                       reference_error=error)  # fmt: skip
    rows = run_spec(spec, providers=["kernelwright", "torch"], modes=["forward"])
    torch_rows = [r for r in rows if r.provider == "torch"]
    assert torch_rows and all("could not be loaded" in r.error for r in torch_rows)
    assert all(not r.error for r in rows if r.provider == "kernelwright")


def _row(provider, mode, ms, mb, shape="8x8"):
    return BenchRow(op="t", mode=mode, provider=provider, x_name="rows", x_value=8,
                    shape=shape, dtype="bfloat16", ms_p50=ms, peak_mem_mb=mb)  # fmt: skip


def test_compare_ratios_and_soft_findings():
    rows = [
        _row("kernelwright", "forward", 1.0, 10),
        _row("torch", "forward", 2.0, 20),
        _row("torch_compile", "forward", 0.8, 10),
        _row("kernelwright", "full", 2.0, 30),
        _row("torch", "full", 1.5, 20),
        _row("torch_compile", "full", 2.1, 20),
    ]
    fwd, full = B.compare(rows)
    assert (fwd.vs_eager, fwd.vs_compile) == (2.0, 0.8)
    assert math.isclose(full.vs_eager, 0.75) and math.isclose(full.vs_compile, 1.05)
    found = B.soft_findings([fwd, full])
    assert any("forward: 0.80x of torch.compile" in f for f in found)
    assert any("full: slower than eager" in f for f in found)
    assert any("full: peak memory 30 MB > eager's 20 MB" in f for f in found)
    assert not any("forward: slower than eager" in f for f in found)
    assert "| 8x8 | forward | 1.0000 | 2.0000 | 0.8000 | 2.00x | 0.80x |" in B.markdown([fwd])
    assert math.isclose(B.geomean([2.0, 0.5, float("nan")]), 1.0)


def test_benchmark_stage_without_a_gpu_says_so(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the stage really runs")
    from kernelwright.profiles.kernel import KernelProfile

    profile = KernelProfile(name="t", function_name="t", module_name="T", source="t.py",
                            input_form="function", tier=1, tier_reason="r")  # fmt: skip
    assert "GPU only" in benchmark(profile, tmp_path, "quick").note
    assert "skipped" in benchmark(profile, tmp_path, "none").note
    with pytest.raises(ValueError, match="quick, full, none|one of"):
        benchmark(profile, tmp_path, "fast")
