"""kernelwright debug MODEL: a patched model against the same model unpatched, module by module.

The localisation is checked on planted patches that need no kernel (a wrong eps on one norm, a
norm whose backward halves its input gradient), so it runs fast; the real `kernelwright.patch`
of a tiny Llama (through the interpreter) must show no divergence, with its plot and report.
"""

from __future__ import annotations

import torch
from typer.testing import CliRunner

from kernelwright.cli import app
from kernelwright.profiles.debug import ModelDebugProfile
from kernelwright.workflows.debug.model import debug_model, is_model


def wrong_eps(model):
    # one norm's epsilon 1e-2 instead of the config's: its output leaves the reference
    model.model.layers[1].post_attention_layernorm.variance_epsilon = 1e-2


class _HalfGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g * 0.5


def half_input_grad(model):
    # one norm whose forward is right and whose backward halves the gradient of its input
    norm = model.model.layers[1].input_layernorm
    forward = type(norm).forward
    norm.forward = lambda x: forward(norm, _HalfGrad.apply(x))


def test_model_targets():
    assert is_model("llama") and is_model("qwen3")
    assert not is_model("rms_norm") and not is_model("pkg.mod:fn")


def test_a_forward_divergence_is_the_first_module_whose_output_leaves(tmp_path):
    result = debug_model("llama", workspace=tmp_path, patch_fn=wrong_eps, batch=1, seq=8)
    d = result.profile.divergence
    assert d is not None and d.pass_name == "forward"
    assert d.module == "model.layers.1.post_attention_layernorm"
    before = [m for m in result.profile.modules if m.index < 21 and m.forward_error is not None]
    assert all(m.forward_error == 0.0 for m in before)
    assert result.plot is not None and result.plot.stat().st_size > 10_000
    assert ModelDebugProfile.load(tmp_path / "profile.yaml").divergence.module == d.module


def test_a_backward_divergence_is_the_module_whose_input_gradient_leaves(tmp_path):
    result = debug_model("llama", workspace=tmp_path, patch_fn=half_input_grad, batch=1, seq=8)
    d = result.profile.divergence
    assert d is not None and d.pass_name == "backward", d
    assert d.module == "model.layers.1.input_layernorm"
    assert "input" in d.evidence
    assert result.profile.loss_patched == result.profile.loss_reference
    bad = [p.name for p in result.profile.params if not p.ok]
    assert bad and not any(p.startswith("model.layers.1.") for p in bad)


def test_the_patched_model_agrees_with_the_unpatched_one(tmp_path):
    result = CliRunner().invoke(app, ["debug", "llama", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    profile = ModelDebugProfile.load(tmp_path / "profile.yaml")
    assert profile.verdict == "no divergence"
    assert "model.layers.0.input_layernorm" in profile.patched
    assert (tmp_path / "error_growth.png").is_file()
    assert "No divergence" in (tmp_path / "report.md").read_text()
