"""create --into-library: a verified op joins kernelwright (ops/generated, tests/generated,
benchmarks/generated, the exports), and a failed gate leaves the checkout as it was."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernelwright.workflows.create import library as L
from kernelwright.workflows.create.run import understand_source

ROOT = Path(__file__).resolve().parents[1]
NAME = "kwtest_relu_sq"  # a name no real op has: the test writes into this checkout


@pytest.fixture
def profile():
    p = understand_source(str(ROOT / "examples" / "create" / "relu_squared.py"), NAME)
    package_dir, repo = L.checkout_paths()
    paths = [package_dir / "ops" / "generated" / f"{NAME}.py",
             repo / "tests" / "generated" / f"test_generated_{NAME}.py",
             repo / "benchmarks" / "generated" / f"bench_{NAME}.py"]  # fmt: skip
    init = package_dir / "ops" / "generated" / "__init__.py"
    before = init.read_text()
    yield p
    for path in paths:  # whatever happened, the checkout ends as it began
        path.unlink(missing_ok=True)
    init.write_text(before)


def test_into_library_adds_exports_and_runs_its_tests(profile, tmp_path):
    result = L.into_library(profile, tmp_path / "log")
    assert result.passed, result.log[-2000:]
    names = {p.name for p in result.files}
    assert {f"{NAME}.py", f"test_generated_{NAME}.py", f"bench_{NAME}.py"} <= names
    init = (L.checkout_paths()[0] / "ops" / "generated" / "__init__.py").read_text()
    assert f"from kernelwright.ops.generated.{NAME} import (" in init
    # the new op imports from the library in a fresh process, exported by name; the checkout's
    # src first on its path, as where kernelwright is not installed (the GPU machine runs the
    # suite with PYTHONPATH=src)
    code = f"from kernelwright.ops.generated import {NAME}, {NAME}_ref; print('ok')"
    path = os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"TRITON_INTERPRET": "1", "PATH": "", "PYTHONPATH": path})  # fmt: skip
    assert out.stdout.strip() == "ok", out.stderr[-1500:]


def test_a_failing_gate_removes_everything(profile, tmp_path, monkeypatch):
    init = L.checkout_paths()[0] / "ops" / "generated" / "__init__.py"
    before = init.read_text()

    def failing(cmd, **kw):
        return subprocess.CompletedProcess(cmd, 1, "1 failed", "")

    monkeypatch.setattr(L.subprocess, "run", failing)
    result = L.into_library(profile, tmp_path / "log")
    assert not result.passed and result.files == []
    package_dir, repo = L.checkout_paths()
    assert not (package_dir / "ops" / "generated" / f"{NAME}.py").exists()
    assert not (repo / "tests" / "generated" / f"test_generated_{NAME}.py").exists()
    assert init.read_text() == before


def test_not_a_checkout_says_what_to_do(tmp_path):
    pkg = tmp_path / "site-packages" / "kernelwright"
    pkg.mkdir(parents=True)
    with pytest.raises(ValueError, match="source checkout.*--out DIR"):
        L.checkout_paths(pkg)
