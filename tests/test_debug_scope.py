"""`kernelwright debug` on a plain PyTorch function given a library op's --ref: the config
axis does not apply (the function reads no launch table), a dtype whose looser tolerance
admits the error does not confine the divergence, and the repro says what diverges."""

from __future__ import annotations

import subprocess
import sys

from conftest import package_beside_cwd

from kernelwright.workflows.debug import DebugOptions, debug_op, plan
from kernelwright.workflows.debug.bisect import bisect, looser_dtypes

WRONG_EPS = """import torch


def my_norm(x, weight, eps=1e-6, **kwargs):
    # eps hard-coded to 1e-3 (the reference's is 1e-6): wrong at every dtype
    xf = x.float()
    r = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-3)
    return (xf * r * weight.float()).to(x.dtype)
"""


def test_a_plain_function_with_a_library_ref(tmp_path, monkeypatch):
    pkg = package_beside_cwd(tmp_path, monkeypatch, "kw_scope_pkg")
    (pkg / "ops.py").write_text(WRONG_EPS)
    result = debug_op(
        DebugOptions(
            "kw_scope_pkg.ops:my_norm", ref="rms_norm", yes=True, workspace=tmp_path / "ws"
        )  # fmt: skip
    )
    profile, d = result.profile, result.profile.divergence
    assert profile.launch_table is not None  # the --ref op's table is in the plan...
    config = [p for p in profile.probes if p.axis == "config"]
    assert [p.status for p in config] == ["not applicable"]  # ...but no config probe ran
    assert "read no row of" in config[0].message
    assert d is not None and d.pass_name == "forward" and d.regime["dtype"] == ["float32"]
    assert "only at dtype" not in d.summary and "dtype float32" in d.summary
    assert "not confined in dtype" in d.summary and "launch config" not in d.summary
    report = result.report.read_text()
    assert "## Not applicable" in report and "| config | not applicable |" in report
    run = subprocess.run([sys.executable, str(result.repro)], capture_output=True, text=True,
                         cwd=tmp_path, timeout=300)  # fmt: skip
    assert run.returncode != 0
    message = run.stderr.strip().splitlines()[-1]
    assert "the op differs from its fp32 reference beyond the float32 tolerance in: forward (" in (
        message
    )
    assert "expected:" not in message and "checks the forward output and every input" in message


def test_a_wrapper_of_the_library_op_keeps_the_config_axis():
    profile = plan("debug_planted:rms_norm_wrong_eps", ref="rms_norm")
    profile.dtypes, profile.shapes = ["float32"], ["pow2"]
    profile.layouts, profile.values, profile.shrink = ["contiguous"], ["normal"], False
    bisect(profile, lambda _: None)
    config = [p for p in profile.probes if p.axis == "config"]
    assert config and all(p.status == "fail" for p in config)


def test_only_a_tighter_passing_tolerance_confines_the_dtype():
    profile = plan("rms_norm")  # fwd: float32 1e-5, float16 2e-3, bfloat16 1.4e-2
    # a float32 error of 5e-4 is within both half tolerances: they cannot confine it
    assert looser_dtypes(profile, "forward", 5e-4, ["float32"]) == ["bfloat16", "float16"]
    assert looser_dtypes(profile, "forward", 5e-3, ["float32"]) == ["bfloat16"]
    # a bf16 error past float32's and float16's tolerances: passing there confines it
    assert looser_dtypes(profile, "forward", 5e-2, ["bfloat16"]) == []
    assert looser_dtypes(profile, "grad:x", 5e-5, ["bfloat16"]) == ["float32", "float16"]
