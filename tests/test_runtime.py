"""Runtime: architecture names, launch-table lookup, backend selection, input checks."""

import dataclasses
import os
import random
import subprocess
import sys

import pytest
import torch
import triton
import triton.language as tl
from conftest import ON_GPU

from kernelwright.runtime import LaunchConfig, device_info, lookup
from kernelwright.runtime.checks import rows_view
from kernelwright.runtime.device import _arch_name

TABLE = {
    "fwd": {
        "default": [(1024, LaunchConfig(block_n=1024)), (4096, LaunchConfig(block_n=4096))],
        "hopper": [(2048, LaunchConfig(block_n=2048, num_warps=8))],
    }
}


@pytest.mark.parametrize(
    "cap,name",
    [((8, 0), "ampere"), ((8, 6), "ampere"), ((8, 9), "ada"), ((9, 0), "hopper"),
     ((10, 0), "blackwell"), ((12, 0), "blackwell"), ((7, 5), "unknown")],
)  # fmt: skip
def test_arch_names(cap, name):
    assert _arch_name(*cap) == name


def test_lookup_picks_first_row_that_fits_and_falls_back_to_default():
    info = device_info("cpu")
    assert info.arch == "interpreter" and info.sm_count > 0
    assert lookup(TABLE, "op", "fwd", info, 1).block_n == 1024
    assert lookup(TABLE, "op", "fwd", info, 1024).block_n == 1024
    assert lookup(TABLE, "op", "fwd", info, 1025).block_n == 4096
    hopper = dataclasses.replace(info, arch="hopper")
    assert lookup(TABLE, "op", "fwd", hopper, 2000) == LaunchConfig(block_n=2048, num_warps=8)
    with pytest.raises(ValueError, match="no launch config.*row length 4097.*tables/op.py"):
        lookup(TABLE, "op", "fwd", info, 4097)


def test_few_rows_override_replaces_its_row_only_at_few_rows():
    few = {"fwd": {"default": [(1024, 4096, LaunchConfig(block_n=4096, rows=2))]}}
    ampere = dataclasses.replace(device_info("cpu"), arch="ampere")  # served by "default"
    assert lookup(TABLE, "op", "fwd", ampere, 4096, 1024, few) == LaunchConfig(4096, rows=2)
    assert lookup(TABLE, "op", "fwd", ampere, 2000, 7, few) == LaunchConfig(4096, rows=2)
    assert lookup(TABLE, "op", "fwd", ampere, 4096, 1025, few) == LaunchConfig(block_n=4096)
    assert lookup(TABLE, "op", "fwd", ampere, 1000, 7, few) == LaunchConfig(block_n=1024)
    assert lookup(TABLE, "op", "fwd", ampere, 4096, None, few) == LaunchConfig(block_n=4096)
    # an arch with its own table row takes only its own overrides, never "default"'s
    hopper = dataclasses.replace(ampere, arch="hopper")
    assert lookup(TABLE, "op", "fwd", hopper, 2000, 7, few) == LaunchConfig(2048, num_warps=8)


def test_rms_norm_few_rows_override_is_looked_up_on_gpus_not_in_the_interpreter(monkeypatch):
    from kernelwright.ops import rms_norm as ops
    from kernelwright.runtime.tables import rms_norm as tables

    ((max_m, max_n, small),) = tables.FEW_ROWS["fwd"]["default"]
    gpu = dataclasses.replace(device_info("cpu"), arch="hopper")
    assert lookup(tables.TABLE, "rms_norm", "fwd", gpu, max_n, max_m, tables.FEW_ROWS) == small
    assert lookup(tables.TABLE, "rms_norm", "fwd", gpu, max_n, max_m + 1, tables.FEW_ROWS) != small
    # the launcher passes its row count: on a GPU it takes the override ...
    x = torch.empty(max_m, max_n)
    monkeypatch.setattr(ops, "device_info", lambda device: gpu)
    assert ops._config("fwd", x, None) == small
    # ... and the interpreter keeps its own table
    monkeypatch.undo()
    interp = lookup(tables.TABLE, "rms_norm", "fwd", device_info("cpu"), max_n)
    assert ops._config("fwd", x, None) == interp != small


@pytest.mark.skipif(ON_GPU, reason="checks the CPU fallback")
def test_interpreter_selected_without_gpu_and_explicit_setting_kept():
    code = "import os, kernelwright; print(os.environ['TRITON_INTERPRET'])"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "1", out.stderr
    out = subprocess.run(
        [sys.executable, "-c", code], env={**env, "TRITON_INTERPRET": "0"}, capture_output=True,
        text=True,
    )  # fmt: skip
    assert out.stdout.strip() == "0", out.stderr


def test_info_says_there_is_no_gpu_and_shows_no_gpu_figures(monkeypatch):
    from typer.testing import CliRunner

    import kernelwright.runtime as runtime
    from kernelwright.cli import app
    from kernelwright.runtime.device import _INTERPRETER

    monkeypatch.delenv("COLUMNS", raising=False)  # one table row a line
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(runtime, "device_info", lambda: _INTERPRETER)
    out = " ".join(CliRunner().invoke(app, ["info"]).output.split())
    assert "no CUDA GPU: kernels run through Triton's interpreter on the CPU" in out, out
    for figure in ("SMs", "L2", "memory", "arch", "CUDA None"):
        assert figure not in out, out
    gpu = dataclasses.replace(
        _INTERPRETER, backend="cuda", name="NVIDIA H100", arch="hopper", capability=(9, 0),
        sm_count=132, l2_bytes=50 * 2**20, total_memory_bytes=80 * 2**30,
    )  # fmt: skip
    monkeypatch.setattr(runtime, "device_info", lambda: gpu)
    out = " ".join(CliRunner().invoke(app, ["info"]).output.split())
    for figure in ("NVIDIA H100", "hopper (sm_90)", "SMs │ 132", "L2 │ 50 MiB", "80.0 GiB"):
        assert figure in out, out


def test_rows_view_keeps_row_strides_and_copies_only_when_needed():
    base = torch.randn(6, 10)
    view = rows_view("op", "x", base[:, :7])
    assert view.data_ptr() == base.data_ptr() and view.stride() == (10, 1)
    t = rows_view("op", "x", base.t())  # last dim not contiguous: a copy
    assert t.is_contiguous() and torch.equal(t, base.t())
    assert rows_view("op", "x", torch.randn(2, 3, 5)).shape == (6, 5)
    assert rows_view("op", "x", torch.randn(2, 3, 0)).shape == (6, 0)


@triton.jit
def _twice(x):
    return x * 2.0


@triton.jit
def _helper_calls_kernel(x_ptr, out_ptr, CALLS: tl.constexpr):
    offs = tl.arange(0, 16)
    x = tl.load(x_ptr + offs)
    for _ in tl.static_range(CALLS):
        x = _twice(x)
    tl.store(out_ptr + offs, x)


@pytest.mark.skipif(ON_GPU, reason="the interpreter's language patch: the CPU suite runs it")
def test_helper_calls_reuse_the_launchs_language_patch(monkeypatch):
    """A kernel that calls a jitted helper eight times patches triton.language as often as one
    that calls it once (once for the launch), computes the same, and leaves tl as it was."""
    from triton.runtime import interpreter

    scans = []
    builtin = interpreter._patch_builtin
    monkeypatch.setattr(interpreter, "_patch_builtin", lambda *a: scans.append(1) or builtin(*a))
    exp = tl.exp
    x = torch.randn(16)
    counts = {}
    for calls in (1, 8):
        out = torch.full_like(x, float("nan"))
        scans.clear()
        _helper_calls_kernel[(1,)](x, out, CALLS=calls)
        counts[calls] = len(scans)
        torch.testing.assert_close(out, x * 2.0**calls)
    assert counts[8] == counts[1] > 0
    assert tl.exp is exp


@triton.jit
def _int_add_kernel(a_ptr, b_ptr, out_ptr):
    offs = tl.arange(0, 4)
    tl.store(out_ptr + offs, tl.load(a_ptr + offs) + tl.load(b_ptr + offs))


@pytest.mark.skipif(ON_GPU, reason="the interpreter's overflow checks: the CPU suite runs it")
def test_int32_math_skips_the_overflow_checks_the_interpreter_never_reports(monkeypatch):
    """Without debug the interpreter drops device asserts, so its int32 overflow checks are work
    never reported: none is made, and an overflowing add wraps as before."""
    from triton.language.semantic import TritonSemantic

    asserts = []
    device_assert = TritonSemantic.device_assert
    monkeypatch.setattr(
        TritonSemantic, "device_assert", lambda *a: asserts.append(1) or device_assert(*a)
    )
    a = torch.tensor([2**31 - 1, 5, -7, 0], dtype=torch.int32)
    b = torch.tensor([1, 6, 7, -(2**31)], dtype=torch.int32)
    out = torch.full_like(a, 99)
    _int_add_kernel[(1,)](a, b, out)
    assert out.tolist() == [-(2**31), 11, 0, -(2**31)]
    assert asserts == []


def test_broadcast_shape_matches_torch_and_refuses_what_it_refuses():
    from kernelwright.runtime.launch import broadcast_shape

    rng = random.Random(0)
    for _ in range(2000):
        shapes = [tuple(rng.choice([0, 1, 2, 3]) for _ in range(rng.randint(0, 4)))
                  for _ in range(rng.randint(1, 3))]  # fmt: skip
        try:
            want = torch.broadcast_shapes(*shapes)
        except RuntimeError:
            with pytest.raises(RuntimeError, match="do not broadcast"):
                broadcast_shape(shapes)
            continue
        got = broadcast_shape(shapes)
        assert got == want and type(got) is torch.Size, shapes


@pytest.mark.skipif(ON_GPU, reason="the interpreter's numpy lanes")
def test_masked_lanes_raise_no_numpy_warnings():
    import warnings

    import kernelwright as kw

    x = torch.randn(4, 40)
    x[1] = float("-inf")  # a row whose max is -inf: exp(-inf - -inf) in every lane
    x[2, :5] = float("-inf")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = kw.softmax(x)
    assert not [w for w in caught if issubclass(w.category, RuntimeWarning)], caught
    torch.testing.assert_close(y, torch.softmax(x, -1), equal_nan=True)
