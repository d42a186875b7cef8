"""kernelwright debug's huge shape regime (inputs past 2^31 elements): its shapes, where it runs
and why not elsewhere, the chunked comparison it runs by, the shrinker at its threshold; on a
GPU, the planted int32-offset bug (tests/debug_planted.py: GPU_BUGS) localised to it, and the
clean library passing it."""

from __future__ import annotations

import dataclasses
import math
import runpy
import subprocess
import sys
from types import SimpleNamespace

import debug_planted as planted
import pytest
import torch
import yaml
from test_debug import TESTS, fixed_copy, localised

from kernelwright.ops.relu_squared import relu_squared_ref
from kernelwright.profiles.debug import DebugProfile
from kernelwright.runtime.alloc import poisoned
from kernelwright.testing.inputs import generator, large_offset_rows
from kernelwright.workflows.debug import DebugOptions, debug_op, huge, numerics, plan
from kernelwright.workflows.debug import shapes as S
from kernelwright.workflows.debug.bisect import Point, Runner, bisect, probed_values, shrink
from kernelwright.workflows.debug.repro import write_repro
from kernelwright.workflows.debug.target import decode, load, maker_of

ON_GPU = torch.cuda.is_available()
DEVICE = torch.device("cuda" if ON_GPU else "cpu")
needs_gpu = pytest.mark.skipif(not ON_GPU, reason="the huge regime runs on a CUDA device only")


def _huge_plan(target: str, dtype: str = "float32") -> huge.Plan:
    profile = plan(target)
    runner = Runner(profile, lambda _: None)
    return runner.huge_plan(Point(0, dtype, "huge", tuple(profile.cases[0].shapes["huge"])))


# --------------------------------------------------------------------------- CPU


@pytest.mark.parametrize(
    "target, rows",
    [("relu_squared", ("x",)), ("rms_norm", ("x",)), ("rope", ("q", "k")),
     ("fused_linear_cross_entropy", ())],
)  # fmt: skip
def test_the_huge_shape_passes_2_31_elements(target, rows):
    # one family each: rows [M, 4096], rope by its batch, hidden [T, H] (a scalar loss: the
    # whole reference, no chunks)
    got = _huge_plan(target)
    assert got.largest > S.HUGE
    assert got.rows == rows
    assert got.device_bytes > 2 * got.largest  # at least the input and its output
    assert S.regime_shapes("rows", 1500)["huge"] == [S.HUGE_ROWS, S.HUGE_ROW]
    assert S.HUGE_ROWS * S.HUGE_ROW > S.HUGE


@pytest.mark.skipif(ON_GPU, reason="under the interpreter the huge regime is not tried")
def test_the_huge_regime_is_not_tried_on_the_cpu_with_its_reason(tmp_path):
    target = "relu_squared"
    opts = DebugOptions(target, workspace=tmp_path)
    assert debug_op(opts).stage == "review"
    path = tmp_path / "profile.yaml"
    data = yaml.safe_load(path.read_text())
    assert "huge" in data["shapes"]  # planned, like every other regime
    data.update(dtypes=["float32"], shapes=["pow2", "huge"], layouts=["contiguous"],
                values=["normal"], configs=[])  # fmt: skip
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    result = debug_op(dataclasses.replace(opts, resume=True))
    profile = DebugProfile.load(path)
    assert profile.verdict == "no divergence"
    (probe,) = [p for p in profile.probes if p.shape_regime == "huge"]
    assert probe.status == "not tried" and not probe.passes
    assert "needs a CUDA device with >= " in probe.message and "interpreter" in probe.message
    assert probe.shape == [S.HUGE_ROWS, S.HUGE_ROW]
    # no probe of its axis: a bug failing at every other shape is not "confined" by it
    assert "huge" not in probed_values(profile, profile.probes)["shape"]
    report = result.report.read_text()
    assert "## Not tried" in report and probe.message in report and "1 not tried" in report


@pytest.mark.parametrize(
    "target, ref, kwargs",
    [("rms_norm", None, {}), ("rope", None, {}), ("cross_entropy", None, {"reduction": "none"}),
     ("debug_planted:rms_norm_dw_race", "rms_norm", {}),
     ("debug_planted:relu_squared_tail_tiles", "relu_squared", {})],
)  # fmt: skip
def test_the_chunked_comparison_agrees_with_the_whole_one(monkeypatch, target, ref, kwargs):
    # chunk by chunk of rows (a weight's gradient summed over the chunks), on clean ops and on
    # planted bugs (dW wrong past 16 rows; the tail tile never written): the forward errors
    # are the whole comparison's; the gradients, under output gradients of their own (drawn
    # by chunk on the device), agree or fail alike
    profile = plan(target, ref=ref)
    spec = profile.cases[0]
    fn, reference, maker = load(spec.function), load(spec.reference), maker_of(spec)
    shape = {"rows": (37, 19), "rope": (6, 4, 4, 2, 8, 8)}[spec.family]
    kw = {**decode(spec.kwargs), **kwargs}
    got = huge.plan(maker, reference, kw, spec.inputs, spec.grad_inputs, shape, torch.float32, 0)
    assert got.chunked
    inputs = maker(shape, torch.float32, DEVICE, 0)
    tol = profile.tolerances["float32"].model_dump()
    args = (fn, reference, inputs, kw, spec.grad_inputs, tol, 0, poisoned)
    whole, skipped = numerics.compare(*args)
    assert not skipped
    monkeypatch.setattr(numerics, "CHUNK", 40)  # a few rows a chunk: many chunks
    chunked, skipped = numerics.compare(*args, rows=list(got.rows))
    assert not skipped
    assert [(r["name"], r["ok"]) for r in whole] == [(r["name"], r["ok"]) for r in chunked]
    for a, b in zip(whole, chunked, strict=True):
        if math.isinf(a["error"]) or a["name"] != "forward":
            assert math.isinf(b["error"]) == math.isinf(a["error"]), a["name"]
        else:
            assert b["error"] == pytest.approx(a["error"], rel=1e-6, abs=1e-12), a["name"]
    if "planted" in target:
        assert not all(r["ok"] for r in chunked)


def test_a_huge_divergence_carries_its_chunks_into_the_repro(tmp_path, monkeypatch):
    # the huge regime's path end to end at a small shape (its check for a GPU lifted): the
    # probe compares by chunks of rows, the shrink halves within the regime, the divergence
    # names the chunked inputs and the repro compares as the probe did, and fails
    monkeypatch.setattr(huge, "not_tried", lambda *a: "")
    profile = plan("debug_planted:rms_norm_dw_race", ref="rms_norm")
    profile.cases = profile.cases[:1]
    profile.cases[0].shapes["huge"] = [40, 24]
    profile.dtypes, profile.shapes = ["float32"], ["pow2", "huge"]
    profile.layouts, profile.values, profile.configs = ["contiguous"], ["normal"], []
    bisect(profile, lambda _: None)
    probe = profile.probes[-1]
    assert probe.shape_regime == "huge" and "chunks of rows (inputs x)" in probe.message
    d = profile.divergence
    assert d.pass_name == "grad:weight" and d.shape_regime == "huge" and d.rows == ["x"]
    assert d.minimal_shape == [20, 1]  # more than one program of 16 rows: still racing
    repro = write_repro(profile, tmp_path / "repro.py", [], 0)
    assert "ROWS = ['x']" in repro.read_text()
    with pytest.raises(AssertionError, match=r"tolerance in: grad:weight \(rel-err"):
        runpy.run_path(str(repro), run_name="__main__")


def test_a_shrink_stops_at_the_2_31_threshold():
    # a runner whose probes fail while the shape has 2^31 elements or more
    def run(point, axis, value, quiet=False):
        return SimpleNamespace(failing=["forward"] if math.prod(point.shape) >= S.HUGE else [])

    runner = SimpleNamespace(profile=SimpleNamespace(cases=[SimpleNamespace(family="rows")]),
                             progress=lambda _: None, run=run)  # fmt: skip
    # four times past the threshold: halved twice, to exactly 2^31 elements, and no further
    start = Point(0, "float32", "huge", (4 * S.HUGE // S.HUGE_ROW, S.HUGE_ROW))
    minimal, steps = shrink(runner, start, "forward")
    assert math.prod(minimal) == S.HUGE and len(steps) == 2
    # just past it (the regime's own shape): no halving still fails, the shape is kept
    start = dataclasses.replace(start, shape=(S.HUGE_ROWS, S.HUGE_ROW))
    assert shrink(runner, start, "forward") == ((S.HUGE_ROWS, S.HUGE_ROW), [])


def test_the_planted_int32_kernel_wraps_onto_an_earlier_row_in_bounds():
    # three rows whose stride puts the last one past 2^31 elements (only what is written is
    # ever touched): row 2's offset 2 * (2^30 + 64) wraps in int32, and the planted kernel reads
    # and writes at its low 31 bits, element 128 of the same storage: in bounds, the wrong row
    from debug_planted_kernels import _relu2_int32_rows_kernel

    x = large_offset_rows(64, 3, torch.float32, DEVICE, gen=generator(0))
    wrapped = x.as_strided((64,), (1,), x.storage_offset() + 128)
    wrapped.copy_(torch.randn(64, generator=generator(1)).to(DEVICE))
    y = torch.full((3, 64), math.nan, device=DEVICE)
    _relu2_int32_rows_kernel[(3,)](x, y, 64, x.stride(0), y.stride(0), BLOCK=64)
    ref = relu_squared_ref(x)
    assert torch.equal(y[:2], ref[:2])
    assert torch.equal(y[2], relu_squared_ref(wrapped)) and not torch.equal(y[2], ref[2])


# --------------------------------------------------------------------------- GPU


@needs_gpu
@pytest.mark.large_memory
@pytest.mark.parametrize("bug", planted.GPU_BUGS, ids=lambda b: b.name)
def test_debug_localises_the_int32_offsets_to_the_huge_regime(tmp_path, bug):
    opts = DebugOptions(f"debug_planted:{bug.name}", ref=bug.ref, yes=True, workspace=tmp_path)
    result = debug_op(opts, print)
    d = result.profile.divergence
    assert result.diverged, result.profile.verdict
    assert localised(bug, result.profile) == [], d.summary
    assert d.pass_name == "forward" and d.shape_regime == "huge"
    assert d.regime["shape"] == ["huge"]  # every smaller shape agrees
    assert math.prod(d.minimal_shape) > S.HUGE  # a shrink below 2^31 elements passes
    assert d.rows == ["x"]
    fixed = fixed_copy(result.repro, bug)
    for script, fails in ((result.repro, True), (fixed, False)):
        proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                              timeout=600, cwd=TESTS.parent)  # fmt: skip
        assert (proc.returncode != 0) == fails, proc.stdout + proc.stderr[-3000:]
        if fails:
            assert "tolerance in: forward (rel-err" in proc.stderr


@needs_gpu
@pytest.mark.large_memory
@pytest.mark.parametrize("target", ["relu_squared", "rms_norm"])
def test_the_clean_library_passes_the_huge_regime(tmp_path, target):
    profile = plan(target)
    profile.dtypes, profile.shapes = ["float32", "bfloat16"], ["pow2", "huge"]
    profile.layouts, profile.values, profile.configs = ["contiguous"], ["normal"], []
    need = _huge_plan(target).device_bytes
    free = huge.free_device_memory(torch.device("cuda"))
    if free < need:
        pytest.skip(f"needs {huge.gib(need)} free on the GPU, {huge.gib(free)} free")
    bisect(profile, print)
    probes = [p for p in profile.probes if p.shape_regime == "huge"]
    assert [p.dtype for p in probes] == ["float32", "bfloat16"]
    assert all(p.status == "pass" for p in probes), [(p.status, p.message) for p in probes]
    assert profile.verdict == "no divergence"
