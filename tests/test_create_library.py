"""create --into-library: a verified op joins kernelwright (ops/generated, tests/generated,
benchmarks/generated, the exports), and a failed gate leaves the checkout as it was."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import written_op

from kernelwright.workflows.create import library as L
from kernelwright.workflows.create.run import understand_source

ROOT = Path(__file__).resolve().parents[1]
NAME = "kwtest_relu_sq"  # a name no real op has: the test writes into this checkout


@contextlib.contextmanager
def _library_op(example: str, name: str):
    """The profile of examples/create/<example>.py as op `name`; whatever the test did to the
    checkout with it, the checkout ends as it began."""
    p = understand_source(str(ROOT / "examples" / "create" / f"{example}.py"), name)
    with written_op(name):
        yield p


@pytest.fixture
def profile():
    with _library_op("relu_squared", NAME) as p:
        yield p


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


def test_a_failed_or_interrupted_replacement_puts_the_earlier_op_back(
    profile, tmp_path, monkeypatch
):
    def passing(cmd, **kw):  # the gate itself is tested above
        return subprocess.CompletedProcess(cmd, 0, "1 passed", "")

    monkeypatch.setattr(L.subprocess, "run", passing)
    assert L.into_library(profile, tmp_path / "log").passed
    package_dir, repo = L.checkout_paths()
    module = package_dir / "ops" / "generated" / f"{NAME}.py"
    test = repo / "tests" / "generated" / f"test_generated_{NAME}.py"
    module.write_text(module.read_text() + "# the earlier op, as the person left it\n")
    before = {p: p.read_text() for p in (module, test)}
    with pytest.raises(L.LibraryError, match="--force to replace it"):
        L.check_name(NAME, force=False)
    L.check_name(NAME, force=True)
    with pytest.raises(L.LibraryError, match="is a library op"):
        L.check_name("rms_norm", force=True)

    def failing(cmd, **kw):
        return subprocess.CompletedProcess(cmd, 1, "1 failed", "")

    def interrupted(cmd, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(L.subprocess, "run", failing)
    assert not L.into_library(profile, tmp_path / "log").passed
    assert {p: p.read_text() for p in before} == before
    monkeypatch.setattr(L.subprocess, "run", interrupted)
    with pytest.raises(KeyboardInterrupt):
        L.into_library(profile, tmp_path / "log")
    assert {p: p.read_text() for p in before} == before
    init = (package_dir / "ops" / "generated" / "__init__.py").read_text()
    assert f"kernelwright.ops.generated.{NAME} import" in init


def test_not_a_checkout_says_what_to_do(tmp_path):
    pkg = tmp_path / "site-packages" / "kernelwright"
    pkg.mkdir(parents=True)
    with pytest.raises(ValueError, match="source checkout.*--out DIR"):
        L.checkout_paths(pkg)


DYT = "kwtest_dyt"  # as NAME: a name no real op has


@pytest.fixture
def dyt_profile():
    with _library_op("dyt", DYT) as p:
        yield p


def test_a_created_op_is_found_by_kernelwright_compile(dyt_profile, tmp_path):
    """The generated pass, end to end: create --into-library writes the reference as written
    (`<op>_pattern`), and kernelwright.compile finds that computation in a model that never
    heard of the op, replacing it by the created kernel with eager's values and gradients."""
    import torch
    from conftest import DEVICE

    import kernelwright

    result = L.into_library(dyt_profile, tmp_path / "log")
    assert result.passed, result.log[-2000:]
    source = (L.checkout_paths()[0] / "ops" / "generated" / f"{DYT}.py").read_text()
    assert f"def {DYT}_pattern(x, alpha, gamma, beta):" in source

    class Block(torch.nn.Module):  # a user's own DyT, in a bigger model
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(32, 32)
            self.alpha = torch.nn.Parameter(torch.full((), 0.7))
            self.gamma = torch.nn.Parameter(torch.rand(32) + 0.5)
            self.beta = torch.nn.Parameter(torch.randn(32))

        def forward(self, x):
            h = self.proj(x)
            return self.gamma * torch.tanh(self.alpha * h) + self.beta

    torch.manual_seed(0)
    model = Block().to(DEVICE)
    x = torch.randn(3, 5, 32, device=DEVICE)
    report = kernelwright.compile.CompileReport()
    compiled = kernelwright.compile(model, report=report, backend="aot_eager")
    out = compiled(x)
    assert [(s.op, s.replaced) for s in report] == [(DYT, True)], report.summary()
    dy = torch.randn_like(out)
    got = torch.autograd.grad(out, list(model.parameters()), dy)
    want_out = model(x)
    want = torch.autograd.grad(want_out, list(model.parameters()), dy)
    torch.testing.assert_close(out, want_out)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)


def test_a_created_op_joins_bench_optimize_and_the_registry(profile, tmp_path):
    """The lifecycle chain on one created op: create --into-library, then the registry lists
    it with its launch table and benchmark, `get_spec` builds that benchmark, and the optimize
    workflow runs on it (a dry run: interpreter correctness, placeholder timings) and proposes
    a table without touching the op's module."""
    from kernelwright import registry
    from kernelwright.bench.specs import get_spec
    from kernelwright.workflows.optimize import OptimizeOptions, optimize

    result = L.into_library(profile, tmp_path / "log")
    assert result.passed, result.log[-2000:]
    entry = registry.get(NAME)
    assert entry.generated and entry.table == f"kernelwright.ops.generated.{NAME}"
    module_file = Path(entry.load().__file__)
    before = module_file.read_bytes()
    assert set(entry.load().TABLE) == {"fwd", "bwd"}
    spec = get_spec(NAME)
    assert spec.op == NAME and spec.dims == ("rows", "cols")
    assert [p.name for p in spec.providers] == ["kernelwright", "torch", "torch_compile"]

    shapes = [{"rows": 16, "cols": 256}, {"rows": 16, "cols": 1024}]
    run = optimize(OptimizeOptions(NAME, yes=True, workspace=tmp_path / "ws", max_variants=2,
                                   dry_run=True, gpu="hopper", shapes=shapes))  # fmt: skip
    assert run.stage == "done", run
    first = run.records[0]
    assert first.strategy == "launch_sweep" and first.smoke_passed  # matched its reference
    assert "rel-err" in first.smoke_detail and first.verdict == "accepted"
    # the proposal is the op's module with TABLE rewritten for the tuned architecture
    proposed = (run.workspace / "proposed_table.py").read_text()
    assert '"hopper": [' in proposed and f"def {entry.function}(" in proposed
    assert module_file.read_bytes() == before  # a dry run writes nothing into the library
