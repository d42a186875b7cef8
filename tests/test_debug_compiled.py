"""kernelwright debug MODEL --compiled: a model through kernelwright.compile against eager, a
divergence bisected to the first replaced site whose replacement diverges.

The planted bugs (tests/debug_planted.py: a wrong eps in the fused add + RMSNorm match, a
LayerNorm match that drops the weight, a SwiGLU whose backward halves up's gradient) are each
localised to their site, its module and pass, on a six-site toy model through Dynamo's eager
backend (the bisection's runs cost no AOT trace); the clean model through aot_eager, the
command's default, agrees with eager.
"""

from __future__ import annotations

import debug_planted as planted
import pytest
import torch
from typer.testing import CliRunner

from kernelwright.cli import app
from kernelwright.profiles.debug import CompiledDebugProfile
from kernelwright.workflows.debug.compiled import debug_compiled

pytestmark = [pytest.mark.compile, pytest.mark.usefixtures("fresh_dynamo")]

MODEL = "debug_planted:tiny_compiled_model"


@pytest.mark.parametrize("bug", planted.COMPILE_BUGS, ids=lambda b: b.name)
def test_a_planted_bug_is_localised_to_its_site(bug, tmp_path):
    with bug.plant():
        result = debug_compiled(MODEL, workspace=tmp_path, backend="eager")
    d = result.profile.divergence
    assert d is not None and d.site is not None, result.profile.runs
    assert (d.site.op, d.site.module, d.pass_name) == (bug.op, bug.module, bug.pass_name), d
    assert d.alone is True and d.site.key in d.summary
    runs = result.profile.runs
    assert runs[0].diverged and not runs[1].diverged  # every site; no site
    assert len(runs) <= 6  # every, none, a binary search over 6 sites, alone
    assert f"**{d.site.key}**" in (tmp_path / "report.md").read_text()


def test_the_clean_compiled_model_agrees_with_eager(tmp_path):
    args = ["debug", MODEL, "--compiled", "--out", str(tmp_path)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    profile = CompiledDebugProfile.load(tmp_path / "profile.yaml")
    assert profile.verdict == "no divergence" and profile.backend == "aot_eager"
    assert [s.op for s in profile.sites if s.replaced] == [
        "rms_norm", "swiglu", "fused_add_rms_norm", "swiglu", "layer_norm",
        "fused_linear_cross_entropy",
    ]  # fmt: skip
    assert {c.name for c in profile.checks} >= {"output:output", "grad:blocks.0.norm.weight"}
    assert all(c.error < c.bound for c in profile.checks)


def test_compile_replaces_only_the_sites_asked_for():
    import torch.nn.functional as F

    import kernelwright

    def fn(x):
        return F.relu(torch.softmax(x, -1)) ** 2

    device = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.randn(2, 8, device=device, requires_grad=True)
    report = kernelwright.compile.CompileReport()
    compiled = kernelwright.compile(fn, report=report, backend="eager", only={"0:pow_1"})
    torch.testing.assert_close(compiled(x), fn(x))
    assert [(s.op, s.key, s.replaced) for s in report] == [
        ("softmax", "0:softmax", False), ("relu_squared", "0:pow_1", True)
    ]  # fmt: skip
    assert "only=" in report[0].reason


def test_compiled_targets_are_checked():
    runner = CliRunner()
    result = runner.invoke(app, ["debug", "no/such/dir", "--compiled"])
    assert result.exit_code == 2 and "--compiled takes" in result.output
    result = runner.invoke(app, ["debug", "llama", "--compiled", "--reference-dtype", "fp16"])
    assert result.exit_code == 2 and "reference dtype" in result.output
    # a backend Dynamo does not know: refused before the model is built, not a traceback
    result = runner.invoke(app, ["debug", "llama", "--compiled", "--backend", "foo"])
    assert result.exit_code == 2 and "'foo': one of" in result.output
    assert "aot_eager" in result.output
