"""kernelwright debug MODEL: a patched model against the same model unpatched, module by module.

The localisation is checked on planted patches that need no kernel (a wrong eps on one norm, a
norm whose backward halves its input gradient), so it runs fast; the real `kernelwright.patch`
of a tiny Llama (through the interpreter) must show no divergence, with its plot and report.
A bf16 run is judged in two views (against the unpatched model in bf16, and in fp32 with the
unpatched bf16 model's own error as an allowance): both localise the wrong eps, and a patch
that is closer to fp32 than eager bf16 diverges in the first view only.
"""

from __future__ import annotations

import torch
from typer.testing import CliRunner

from kernelwright.cli import app
from kernelwright.profiles.debug import ModelDebugProfile, ModuleCheck, TolSpec, VsFp32
from kernelwright.profiles.workspace import owned
from kernelwright.workflows.debug.model import debug_model, first_divergence, is_model
from kernelwright.workflows.debug.run import KINDS


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


def mlp_halves_gate_grad(model):
    # one MLP whose backward halves the gradient of its gate branch (as a wrong SwiGLU backward)
    mlp = model.model.layers[1].mlp
    mlp.forward = lambda x: mlp.down_proj(
        mlp.act_fn(_HalfGrad.apply(mlp.gate_proj(x))) * mlp.up_proj(x)
    )


def test_a_module_sharing_its_input_with_a_wrong_branch_is_not_named(tmp_path):
    # up_proj's output gradient agrees and the gradient of its input (x, also gate_proj's) does
    # not: gate_proj's branch put the error there; the MLP holding both is named
    result = debug_model("llama", workspace=tmp_path, patch_fn=mlp_halves_gate_grad, batch=1,
                         seq=8)  # fmt: skip
    d = result.profile.divergence
    assert d is not None and (d.module, d.pass_name) == ("model.layers.1.mlp", "backward"), d
    up = next(m for m in result.profile.modules if m.name == "model.layers.1.mlp.up_proj")
    gate = next(m for m in result.profile.modules if m.name == "model.layers.1.mlp.gate_proj")
    assert up.input == gate.input is not None and up.input_grad_error > 0.1


def loss_head_halves_grad(model):
    # the causal LM's own forward computes the logits and the loss (as a fused loss does, with
    # no lm_head call) and halves the gradient it sends back into the hidden states
    from transformers.loss.loss_utils import ForCausalLMLoss
    from transformers.modeling_outputs import CausalLMOutputWithPast

    def forward(input_ids=None, labels=None, **kwargs):
        h = model.model(input_ids=input_ids).last_hidden_state
        logits = torch.nn.functional.linear(_HalfGrad.apply(h), model.lm_head.weight)
        loss = ForCausalLMLoss(logits, labels, model.config.vocab_size)
        return CausalLMOutputWithPast(loss=loss, logits=logits)

    model.forward = forward


def test_a_wrong_gradient_from_the_loss_head_is_its_owners(tmp_path):
    # the first wrong gradient of the backward arrives at the base model's output: no module's
    # backward made it (a deeper module whose errors straddle the bound must not be named)
    result = debug_model("llama", workspace=tmp_path, patch_fn=loss_head_halves_grad, batch=1,
                         seq=8)  # fmt: skip
    d = result.profile.divergence
    assert d is not None and (d.module, d.pass_name) == ("(model)", "backward"), d
    assert "model's output" in d.evidence and d.cls == "LlamaForCausalLM"


def test_a_checkpoint_is_debugged_with_its_weights_on_the_given_batch(tmp_path):
    # a directory with weights beside its config.json: those weights, not a fresh init
    from transformers import AutoModelForCausalLM

    from kernelwright.testing.model_configs import tiny_config

    torch.manual_seed(1)
    model = AutoModelForCausalLM.from_config(tiny_config("llama"))
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1 + 0.5 * torch.rand(p.shape))  # nothing like an initialisation
    model.save_pretrained(tmp_path / "ckpt")
    ids = torch.randint(0, 256, (1, 8))
    labels = ids.clone()
    labels[0, 2] = -100
    with torch.no_grad():
        expected = float(model(input_ids=ids, labels=labels).loss)
    result = debug_model(str(tmp_path / "ckpt"), workspace=tmp_path / "ws", patch_fn=wrong_eps,
                         inputs=(ids, labels))  # fmt: skip
    profile = result.profile
    assert profile.weights == str(tmp_path / "ckpt") and (profile.batch, profile.seq) == (1, 8)
    assert abs(profile.loss_reference - expected) < 1e-5
    assert profile.divergence.module == "model.layers.1.post_attention_layernorm"
    assert "Weights: loaded from" in (tmp_path / "ws" / "report.md").read_text()


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
    # the workspace is debug's own now: a later run may replace its outputs there
    assert owned(tmp_path, KINDS)


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


def test_bf16_both_views_localise_a_wrong_eps(tmp_path):
    result = debug_model(
        "llama", workspace=tmp_path, dtype="bfloat16", patch_fn=wrong_eps, batch=1, seq=8
    )
    profile = result.profile
    assert profile.reference_dtype == "float32" and profile.loss_fp32 is not None
    norm = "model.layers.1.post_attention_layernorm"
    for view in ("same", "float32"):
        d = profile.divergences[view]
        assert d is not None and (d.module, d.pass_name, d.view) == (norm, "forward", view)
    d = profile.divergence
    assert d.view == "float32" and d.tol > profile.tolerance.fwd  # the bf16 model's own error
    first = next(m for m in profile.modules if m.name == "model.layers.0.input_layernorm")
    assert first.fp32.forward == first.fp32.forward_unpatched > 0  # unpatched: bf16's own error
    text = (tmp_path / "report.md").read_text()
    assert "against bfloat16: diverged" in text and "against fp32: diverged" in text


def _one_module(same: float, fp32: float, unpatched: float) -> ModelDebugProfile:
    vs = VsFp32(forward=fp32, forward_unpatched=unpatched)
    m = ModuleCheck(index=0, name="model.layers.0.mlp", cls="LlamaMLP", forward_error=same,
                    patched=True, fp32=vs)  # fmt: skip
    return ModelDebugProfile(
        name="m", target="llama", model_type="llama", architecture="LlamaForCausalLM",
        device="cpu", dtype="bfloat16", batch=1, seq=8, tolerance_source="test",
        tolerance=TolSpec(fwd=0.008, bwd=0.016), loss_reference=1.0, loss_patched=1.0,
        loss_fp32=1.0, modules=[m],
    )  # fmt: skip


def test_the_fp32_view_allows_what_bf16_costs_already():
    # closer to fp32 than eager bf16 (fused kernels keeping fp32 intermediates): only the
    # bf16 view flags it
    more_precise = _one_module(same=0.012, fp32=0.004, unpatched=0.010)
    assert first_divergence(more_precise, "same").error == 0.012
    assert first_divergence(more_precise, "float32") is None
    # far from fp32 where eager bf16 is close: both
    worse = _one_module(same=0.05, fp32=0.05, unpatched=0.003)
    d = first_divergence(worse, "float32")
    assert d is not None and d.tol == 0.008 + 0.003 and "own error" in d.summary
    assert first_divergence(worse, "same") is not None


def test_reference_dtype_is_checked():
    result = CliRunner().invoke(app, ["debug", "llama", "--reference-dtype", "fp16"])
    assert result.exit_code == 2 and "reference dtype" in result.output


def test_cli_dtype_takes_every_spelling(monkeypatch):
    from kernelwright.workflows.debug import compiled, model

    class Stop(Exception):
        pass

    seen = []

    def run(target, *, dtype, **kwargs):  # the dtype the workflow would run in, then stop
        seen.append(dtype)
        raise Stop

    monkeypatch.setattr(model, "debug_model", run)
    monkeypatch.setattr(compiled, "debug_compiled", run)
    runner = CliRunner()
    for args in (["--dtype", "bf16"], ["--dtype", "fp32"], ["--dtype", "bf16", "--compiled"]):
        result = runner.invoke(app, ["debug", "llama", *args])
        assert isinstance(result.exception, Stop), result.output
    assert seen == ["bfloat16", "float32", "bfloat16"]  # the workflows' names
    result = runner.invoke(app, ["debug", "llama", "--dtype", "fp16"])
    assert result.exit_code == 2 and "bf16/bfloat16" in result.output


def test_a_config_json_is_read_as_the_file_it_is(tmp_path):
    # a .json beside another model's config.json is its own config, not the one beside it;
    # a file that is not a JSON object is a ValueError naming it (a usage error on the CLI)
    from transformers import LlamaConfig, Qwen2Config

    from kernelwright.workflows.debug.model import build_config

    LlamaConfig(hidden_size=64, num_hidden_layers=1).save_pretrained(tmp_path)
    Qwen2Config(hidden_size=64, num_hidden_layers=1).to_json_file(tmp_path / "qwen.json")
    assert build_config(str(tmp_path / "qwen.json")).model_type == "qwen2"
    assert build_config(str(tmp_path)).model_type == "llama"
    for text, why in (("{bad", "is not valid JSON"), ("[1, 2]", "holds a JSON list")):
        (tmp_path / "bad.json").write_text(text)
        result = CliRunner().invoke(app, ["debug", str(tmp_path / "bad.json")],
                                    env={"COLUMNS": "300"})  # fmt: skip
        assert result.exit_code == 2 and why in result.output, result.output


def test_options_a_model_run_cannot_use_are_refused_before_it_runs(tmp_path, monkeypatch):
    # an --out that is a file (or under one), and an op's flags given to a model: one usage
    # line (exit 2) before anything is built, never a traceback after the run or a flag ignored
    from kernelwright.workflows.debug import compiled, model

    ran = []
    monkeypatch.setattr(model, "debug_model", lambda *a, **k: ran.append(a))
    monkeypatch.setattr(compiled, "debug_compiled", lambda *a, **k: ran.append(a))
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    cases = [
        (["llama", "--out", str(a_file)], "is a file"),
        (["llama", "--compiled", "--out", str(a_file)], "is a file"),
        (["llama", "--out", str(a_file / "ws")], "cannot be made under it"),
        (["rms_norm", "--out", str(a_file), "--yes"], "is a file"),
        (["llama", "--ref", "rms_norm"], "--ref applies to an op"),
        (["llama", "--resume"], "--resume applies to an op"),
        (["llama", "--compiled", "--inputs", "x"], "--inputs applies to an op"),
        (["rms_norm", "--reference-dtype", "same"], "--reference-dtype applies to a model"),
    ]
    for args, why in cases:
        result = CliRunner().invoke(app, ["debug", *args], env={"COLUMNS": "300"})
        assert result.exit_code == 2 and why in result.output, (args, result.output)
    assert ran == [] and a_file.read_text() == "mine"
