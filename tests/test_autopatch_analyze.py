"""autopatch analyser: the decisions for 14 architectures, evidence, checks, inputs and the CLI.

Every profile is built from a tiny CPU instance (no weights downloaded) and must round-trip
through YAML. The expectation table states the key decisions per model; the rest of the file
covers what must NOT be patched (unsupported cases), that the numerical checks catch a wrong
decision, and each kind of input (model type, config, directory, modeling file, PEFT model).
"""

import copy
import re
import textwrap
from collections import namedtuple
from pathlib import Path

import pytest
import torch
from conftest import DEVICE

transformers = pytest.importorskip("transformers")

from transformers import AutoConfig  # noqa: E402

from kernelwright.integrations.transformers.analysis import analyze  # noqa: E402
from kernelwright.integrations.transformers.analysis import checks as C  # noqa: E402
from kernelwright.integrations.transformers.analysis.load import build_tiny, resolve  # noqa: E402
from kernelwright.profiles.model import ModelProfile  # noqa: E402

SITE = Path(transformers.__file__).resolve().parent.parent

# model -> key decisions: norm (kind, casting, offset); roles {attribute: (role, in-place safe)};
# mlp (activation, layout), None for MoE-only models; moe (layout, experts, top-k);
# rope (variant, partial factor); logits (softcap, scale_op, scale); tied lm-head.
LLAMA, GEMMA = ("rms_norm", "llama", 0.0), ("rms_norm", "gemma", 1.0)
SWIGLU, GEGLU = ("swiglu", "separate"), ("geglu_tanh", "separate")
FULL, NO_LOGITS = ("half_split", 1.0), (None, None, None)
LAYER_NORM_1P, RELU2 = ("layer_norm", None, 1.0), ("relu_squared", "non_gated")
PRE = {
    "input_layernorm": ("input", True),
    "post_attention_layernorm": ("post_attention", True),
    "norm": ("final", False),
}
QK = {"q_norm": ("q_norm", True), "k_norm": ("k_norm", True)}
# Gemma2's sandwich: the post-norms join the residual sums, so their backward is not in place
SANDWICH = {
    "input_layernorm": ("input", True),
    "post_attention_layernorm": ("post_attention", False),
    "pre_feedforward_layernorm": ("pre_feedforward", True),
    "post_feedforward_layernorm": ("post_feedforward", False),
    "norm": ("final", False),
}
OLMO2 = {
    "post_attention_layernorm": ("post_attention", False),
    "post_feedforward_layernorm": ("post_feedforward", False),
    "norm": ("final", False),
    **QK,
}
Exp = namedtuple("Exp", "norm roles mlp moe rope logits tied")
EXPECTED = {
    "llama": Exp(LLAMA, PRE, SWIGLU, None, FULL, NO_LOGITS, False),
    "mistral": Exp(LLAMA, PRE, SWIGLU, None, FULL, NO_LOGITS, False),
    "qwen2": Exp(LLAMA, PRE, SWIGLU, None, FULL, NO_LOGITS, False),
    "qwen3": Exp(LLAMA, {**PRE, **QK}, SWIGLU, None, FULL, NO_LOGITS, False),
    "qwen3_moe": Exp(LLAMA, {**PRE, **QK}, None, ("stacked", 128, 8), FULL, NO_LOGITS, False),
    "gemma": Exp(GEMMA, PRE, GEGLU, None, FULL, NO_LOGITS, True),
    "gemma2": Exp(GEMMA, SANDWICH, GEGLU, None, FULL, (30.0, None, None), True),
    "gemma3_text": Exp(GEMMA, {**SANDWICH, **QK}, GEGLU, None, FULL, NO_LOGITS, True),
    "phi3": Exp(LLAMA, PRE, ("swiglu", "fused_gate_up"), None, FULL, NO_LOGITS, False),
    # Olmo2 multiplies by the weight in fp32 and casts once: "gemma" casting without offset
    "olmo2": Exp(("rms_norm", "gemma", 0.0), OLMO2, SWIGLU, None, FULL, NO_LOGITS, False),
    "granite": Exp(LLAMA, PRE, SWIGLU, None, FULL, (None, "divide", 1.0), False),
    "nemotron": Exp(LAYER_NORM_1P, PRE, RELU2, None, ("half_split", 0.5), NO_LOGITS, False),
    "mixtral": Exp(LLAMA, PRE, None, ("stacked", 8, 2), FULL, NO_LOGITS, False),
    "smollm3": Exp(LLAMA, PRE, SWIGLU, None, FULL, NO_LOGITS, True),
}

_PROFILES: dict[str, ModelProfile] = {}


def profile_of(model_type: str) -> ModelProfile:
    if model_type not in _PROFILES:
        _PROFILES[model_type] = analyze(model_type)
    return _PROFILES[model_type]


def _checked(decision) -> list[str]:
    """The module checks' evidence (the whole-model check is counted by _model_checked)."""
    return [
        e.detail
        for e in decision.evidence
        if e.source == "check" and not e.detail.startswith("model check")
    ]


def _model_checked(decision) -> list[str]:
    return [e.detail for e in decision.evidence if e.detail.startswith("model check")]


@pytest.mark.parametrize("model_type", list(EXPECTED))
def test_profile_decisions(model_type):
    exp = EXPECTED[model_type]
    p = profile_of(model_type)
    assert ModelProfile.from_yaml(p.to_yaml()) == p
    assert p.unsupported() == [], p.unsupported()

    (norm,) = p.norms
    assert (norm.kind, norm.casting_mode, norm.offset) == exp.norm
    assert norm.status == "patch" and len(_checked(norm)) == (2 if norm.kind == "rms_norm" else 1)
    # every patched decision passed the whole tiny model's check, train() and eval()
    for d in (norm, *p.mlps, p.rope, p.output, *([p.moe] if p.moe.is_moe else [])):
        assert len(_model_checked(d)) == 1 and "train and eval" in _model_checked(d)[0]
    uses = {u.attribute: (u.role, u.in_place_safe) for u in norm.uses}
    assert uses == exp.roles

    if exp.mlp is None:
        assert p.mlps == []
    else:
        (mlp,) = p.mlps
        assert (mlp.activation, mlp.layout) == exp.mlp
        assert mlp.status == "patch" and _checked(mlp)

    if exp.moe is None:
        assert p.moe.status == "absent" and not p.moe.is_moe
    else:
        assert p.moe.is_moe and p.moe.status == "patch"
        assert (p.moe.expert_layout, p.moe.num_experts, p.moe.top_k) == exp.moe
        assert p.moe.aux_loss_function == "load_balancing_loss_func"

    assert (p.rope.variant, p.rope.partial_rotary_factor) == exp.rope
    assert p.rope.call_name == "apply_rotary_pos_emb" and _checked(p.rope)
    assert (p.logits.softcap, p.logits.scale_op, p.logits.scale) == exp.logits
    # gemma3_text reads final_logit_softcapping behind `is not None` (None in its default
    # config): recorded as a patch decision with the key, so a config that sets it gets it
    keyed = p.logits.softcap_config_key is not None
    assert p.logits.status == ("absent" if exp.logits == NO_LOGITS and not keyed else "patch")
    if model_type == "gemma3_text":
        assert keyed and p.logits.softcap is None
    assert p.lm_head.tied is exp.tied and p.lm_head.bias is False
    assert p.output.base_model_attribute == "model" and p.output.lm_head_attribute == "lm_head"
    assert p.output.output_class.endswith("CausalLMOutputWithPast")
    assert p.decoder.num_layers == AutoConfig.for_model(model_type).num_hidden_layers
    assert p.components == []


def test_layouts_and_attributes():
    phi3 = profile_of("phi3").mlps[0]
    assert phi3.gate_up_attribute == "gate_up_proj" and phi3.down_attribute == "down_proj"
    nemo = profile_of("nemotron")
    assert nemo.norms[0].bias_attribute == "bias" and nemo.norms[0].eps_attribute == "eps"
    assert (nemo.mlps[0].up_attribute, nemo.mlps[0].hidden_act) == ("up_proj", "relu2")
    gemma2 = profile_of("gemma2")
    assert gemma2.logits.softcap_config_key == "final_logit_softcapping"
    assert gemma2.decoder.norm_attributes == {
        "0-25": [
            "input_layernorm",
            "post_attention_layernorm",
            "pre_feedforward_layernorm",
            "post_feedforward_layernorm",
        ]
    }
    qwen3 = profile_of("qwen3")
    (qwen3_layers,) = qwen3.decoder.norm_attributes.values()
    assert qwen3_layers[1:3] == ["self_attn.q_norm", "self_attn.k_norm"]
    assert profile_of("llama").norms[0].eps_attribute == "variance_epsilon"
    assert profile_of("granite").logits.scale_config_key == "logits_scaling"
    assert profile_of("mixtral").moe.experts_class == "MixtralExperts"


def test_evidence_points_at_real_lines():
    """File evidence quotes the stripped line at that line number; every source is typed."""
    pattern = re.compile(r"^(transformers/.+\.py:\d+|config:.+|check)$")
    for model_type in ("llama", "gemma2", "nemotron", "qwen3_moe"):
        p = profile_of(model_type)
        decisions = [d for _, d in p._decisions()] + [u for n in p.norms for u in n.uses]
        for d in decisions:
            for e in d.evidence:
                assert pattern.match(e.source), e
                if ":" in e.source and not e.source.startswith("config:"):
                    path, line = e.source.rsplit(":", 1)
                    text = (SITE / path).read_text().splitlines()[int(line) - 1].strip()
                    assert text == e.detail, e
    rope = profile_of("llama").rope.evidence
    assert any("use_kernelized_func" in e.detail for e in rope)
    assert any("use_kernel_forward_from_hub" in e.detail for e in rope)


def test_config_source_and_values():
    """A PretrainedConfig is taken as given: its non-default values are what the profile says."""
    p = analyze(AutoConfig.for_model("granite", logits_scaling=8.0), check=False)
    assert (p.logits.scale_op, p.logits.scale) == ("divide", 8.0)
    assert any(e.source == "config:logits_scaling" and e.detail == "8.0" for e in p.logits.evidence)
    assert p.config_source.startswith("config:") and "check=False" in " ".join(p.notes)


def test_unsupported_activation():
    p = analyze(AutoConfig.for_model("llama", hidden_act="gelu_new"))
    (mlp,) = p.mlps
    assert mlp.status == "unsupported" and "gelu_new" in mlp.reason
    assert p.norms[0].status == "patch"  # one unsupported part never hides the rest
    assert ("mlp LlamaMLP", mlp.reason) in p.unsupported()


CUSTOM_CONFIG = """
from transformers.models.llama.configuration_llama import LlamaConfig


class WeirdConfig(LlamaConfig):
    model_type = "weird"
"""

CUSTOM_MODELING = """
import torch
from torch import nn
from transformers.models.llama.modeling_llama import LlamaForCausalLM

from .configuration_weird import WeirdConfig


class WeirdNorm(nn.Module):
    # named like a norm, but x / ||x|| (no mean, no eps) behind a branch: not provable
    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x):
        if x.dtype == torch.float16:
            x = x.float()
        return self.weight * x / x.norm(dim=-1, keepdim=True)


class Scaler(nn.Module):
    # an RMSNorm under another name: found from its forward, not its name
    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.gain = nn.Parameter(torch.ones(hidden_size))
        self.tiny = eps

    def forward(self, h):
        dtype = h.dtype
        h = h.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.tiny)
        return self.gain * h.to(dtype)


class WeirdForCausalLM(LlamaForCausalLM):
    config_class = WeirdConfig

    def __init__(self, config):
        super().__init__(config)
        for layer in self.model.layers:
            layer.input_layernorm = WeirdNorm(config.hidden_size, config.rms_norm_eps)
            layer.post_attention_layernorm = Scaler(config.hidden_size, config.rms_norm_eps)
"""


def test_modeling_file_outside_transformers(tmp_path):
    (tmp_path / "configuration_weird.py").write_text(CUSTOM_CONFIG)
    modeling = tmp_path / "modeling_weird.py"
    modeling.write_text(textwrap.dedent(CUSTOM_MODELING))
    p = analyze(modeling)
    assert p.architecture == "WeirdForCausalLM" and p.modeling_file == str(modeling.resolve())
    norms = {n.class_name: n for n in p.norms}
    weird = norms["WeirdNorm"]
    assert weird.status == "unsupported" and "not proven" in weird.reason
    scaler = norms["Scaler"]
    assert scaler.status == "patch" and scaler.casting_mode == "llama"
    assert (scaler.weight_attribute, scaler.eps_attribute) == ("gain", "tiny")
    assert len(_checked(scaler)) == 2
    assert scaler.uses[0].attribute == "post_attention_layernorm"
    assert norms["LlamaRMSNorm"].status == "patch"  # the final norm is still Llama's
    assert str(modeling.resolve()) in weird.evidence[0].source


class UpGateMLP(torch.nn.Module):
    """A fused projection whose activation takes the SECOND half: [up | gate]."""

    def __init__(self):
        super().__init__()
        self.gate_up_proj = torch.nn.Linear(16, 64, bias=False)
        self.down_proj = torch.nn.Linear(32, 16, bias=False)
        self.act = torch.nn.SiLU()

    def forward(self, x):
        up, gate = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(up * self.act(gate))


def test_fused_mlp_gate_half():
    """swiglu_fused takes [gate | up]: the other order is unsupported, and the check agrees."""
    from kernelwright.integrations.transformers.analysis.mlp import analyze_mlp_class

    module = UpGateMLP()
    d = analyze_mlp_class(module, AutoConfig.for_model("llama"))
    assert (d.status, d.layout, d.activation) == ("unsupported", "fused_gate_up", "swiglu")
    assert "[up | gate]" in d.reason
    forced = d.model_copy(update={"status": "patch", "reason": ""})
    assert not C.check_mlp(forced, module).passed


def test_directory_and_config_json(tmp_path):
    AutoConfig.for_model("qwen3").save_pretrained(tmp_path)
    by_dir = analyze(tmp_path, check=False)
    by_file = analyze(tmp_path / "config.json", check=False)
    assert by_dir.model_type == by_file.model_type == "qwen3"
    assert by_file.config_source == str(tmp_path / "config.json")
    assert by_dir.norms == by_file.norms


def test_a_config_json_that_is_not_json_names_the_file(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text('{"model_type": "llama", "hidden_size": 64,}')  # a trailing comma
    for target in (tmp_path, bad):
        with pytest.raises(ValueError, match=f"{bad} is not valid JSON: .*line 1"):
            analyze(target, check=False)
    bad.write_text('["llama"]')
    with pytest.raises(ValueError, match=f"{bad} holds a JSON list, not a config object"):
        analyze(bad, check=False)


def test_transformers_modeling_file():
    path = SITE / "transformers/models/mistral/modeling_mistral.py"
    p = analyze(path, check=False)
    assert p.model_type == "mistral" and p.architecture == "MistralForCausalLM"


def test_unknown_model_type():
    with pytest.raises(ValueError, match="modeling_\\*.py") as e:
        analyze("llamma")
    assert "'llama'" in str(e.value)  # the close match is suggested
    with pytest.raises(ValueError) as e:
        analyze("lama")
    assert str(e.value).count("'mllama'") == 1  # a type registered twice is suggested once


def test_a_profile_reads_in_one_line():
    text = repr(analyze("llama"))  # what `patch(model)` returns, shown at a prompt
    assert text.startswith("ModelProfile(llama: LlamaForCausalLM, ") and "\n" not in text
    assert len(text) < 120


def test_a_hub_id_or_a_missing_path_is_named_as_such(tmp_path):
    with pytest.raises(ValueError, match="reads like a Hub id: download its config.json"):
        analyze("meta-llama/Llama-3-8B")
    for missing in (tmp_path / "nope" / "config.json", "./nope", "nope.json"):
        with pytest.raises(ValueError, match=f"There is no file or directory {missing}"):
            analyze(str(missing))


# ----------------------------------------------------------------------------- numerical checks


@pytest.fixture(scope="module")
def tiny_llama():
    t = resolve("llama")
    model, _, _ = build_tiny(t.model_cls, t.config)
    return model


def test_check_catches_wrong_norm_decisions(tiny_llama):
    d = profile_of("llama").norms[0]
    norm = tiny_llama.model.norm
    assert C.check_norm(d, norm).passed
    wrong_offset = d.model_copy(update={"offset": 1.0}, deep=True)
    result = C.check_norm(wrong_offset, norm)
    assert not result.passed and result.max_abs_diff > 0.1
    C.record(wrong_offset, result)
    assert wrong_offset.status == "unsupported" and "numerical check failed" in wrong_offset.reason
    # fp32 cannot see the casting mode; the fp16 check can
    wrong_cast = d.model_copy(update={"casting_mode": "gemma"}, deep=True)
    assert C.check_norm(wrong_cast, norm).passed
    assert not C.check_norm_casting(wrong_cast, norm).passed


def test_check_catches_wrong_mlp_and_rope(tiny_llama):
    p = profile_of("llama")
    mlp = tiny_llama.model.layers[0].mlp
    swap = {"gate_attribute": "up_proj", "up_attribute": "gate_proj"}
    swapped = p.mlps[0].model_copy(update=swap)
    assert not C.check_mlp(swapped, mlp).passed
    erf = p.mlps[0].model_copy(update={"activation": "geglu_erf"})
    assert not C.check_mlp(erf, mlp).passed

    from transformers.models.llama import modeling_llama

    pos = torch.arange(5).unsqueeze(0)
    cos, sin = tiny_llama.model.rotary_emb(torch.zeros(1, 5, 64), pos)
    kwargs = dict(heads=4, kv_heads=2, head_dim=16)
    fn = modeling_llama.apply_rotary_pos_emb
    assert C.check_rope(p.rope, fn, cos, sin, **kwargs).passed
    interleaved = p.rope.model_copy(update={"variant": "interleaved"})
    assert not C.check_rope(interleaved, fn, cos, sin, **kwargs).passed


def test_check_exception_is_recorded(tiny_llama):
    d = profile_of("llama").norms[0].model_copy(update={"weight_attribute": "nope"}, deep=True)
    C.run_check(d, C.check_norm, tiny_llama.model.norm)
    assert d.status == "unsupported" and "raised" in d.reason and "nope" in d.reason


def test_caller_default_device_does_not_leak():
    # Found on the GPU: under a caller's `with torch.device("cuda")` the checks' CPU-seeded
    # inputs failed and every decision went unsupported. The meta device shows the same here.
    with torch.device("meta"):
        profile = analyze("llama")
    assert not profile.unsupported() and profile.norms[0].status == "patch"


# ----------------------------------------------------------------------------- PEFT and CLI


def test_peft_wrapped_model(tiny_llama):
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(r=2, target_modules=["q_proj", "v_proj", "gate_proj", "down_proj"])
    wrapped = peft.get_peft_model(tiny_llama, config)
    p = analyze(wrapped)
    bare = profile_of("llama")
    assert p.architecture == "LlamaForCausalLM" and p.config_source.startswith("instance:")
    assert any("unwrapped" in n for n in p.notes)
    assert p.norms[0].casting_mode == bare.norms[0].casting_mode
    assert p.norms[0].uses == bare.norms[0].uses
    assert p.mlps[0].status == "patch" and p.rope.status == "patch"
    # layer facts come from the instance itself: its 2 layers, its (untied) head
    assert p.decoder.norm_attributes == {"0-1": ["input_layernorm", "post_attention_layernorm"]}
    assert p.decoder.num_layers == 2 and p.lm_head.tied is False


def test_cli_writes_profile(tmp_path):
    from typer.testing import CliRunner

    from kernelwright.cli import app

    out = tmp_path / "llama.yaml"
    result = CliRunner().invoke(app, ["autopatch", "llama", "--out", str(out), "--no-check"])
    assert result.exit_code == 0, result.output
    assert ModelProfile.load(out).architecture == "LlamaForCausalLM"
    assert "LlamaRMSNorm" in result.output and "--no-check" in result.output
    # a line before the analysis (seconds of building and checking) says what is under way
    assert result.output.startswith("autopatch llama: a tiny instance built and analysed ...")
    # the review hint gives the whole edit: an unsupported decision without a reason is refused
    hint = " ".join(result.output.split())
    assert "set its `status: unsupported` and fill in `reason:`" in hint

    bad = CliRunner().invoke(app, ["autopatch", "not-a-model", "--no-check"])
    assert bad.exit_code != 0


def test_cli_emit(tmp_path):
    pytest.importorskip("kernelwright.workflows.autopatch.emit")
    from typer.testing import CliRunner

    from kernelwright.cli import app

    out, test = tmp_path / "p.yaml", tmp_path / "test_convergence_llama.py"
    args = ["autopatch", "llama", "--out", str(out), "--no-check", "--emit", str(test)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert test.exists()


def test_cli_out_a_directory_holds_the_profile_and_a_file_is_refused(tmp_path, monkeypatch):
    # --out an existing directory: its profile.yaml; --out under a file: one usage line (exit 2)
    # before the analysis runs, not a traceback after it
    from typer.testing import CliRunner

    import kernelwright.workflows.autopatch as workflow
    from kernelwright.cli import app

    result = CliRunner().invoke(app, ["autopatch", "llama", "--no-check", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert ModelProfile.load(tmp_path / "profile.yaml").architecture == "LlamaForCausalLM"
    ran = []
    monkeypatch.setattr(workflow, "analyze", lambda *a, **k: ran.append(a))
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    cases = [
        (["--out", str(a_file / "p.yaml")], "--out", "is a file, not a directory"),
        (["--emit", str(a_file)], "--emit", "is a file, not a .py file or a directory"),
        (["--emit", str(tmp_path / "d.py")], "--emit", None),  # made a directory below
        (["--dtype", "bf16"], "--dtype", "applies with --sweep only"),
        (["--only", "qwen3"], "--only", "applies with --sweep only"),
    ]
    (tmp_path / "d.py").mkdir()
    for args, flag, why in cases:
        got = CliRunner().invoke(app, ["autopatch", "llama", *args], env={"COLUMNS": "300"})
        assert got.exit_code == 2 and f"Invalid value for {flag}" in got.output, got.output
        assert why is None or why in got.output, got.output
    assert ran == [] and a_file.read_text() == "mine"


def test_cli_emit_keeps_a_file_it_did_not_write(tmp_path):
    # a test of the user's own at the --emit path is kept (exit 2, before the analysis); one
    # kernelwright emitted is regenerated; --force overwrites either
    from typer.testing import CliRunner

    from kernelwright.cli import app

    mine, out = tmp_path / "test_mine.py", tmp_path / "p.yaml"
    mine.write_text("def test_mine():\n    pass\n")
    args = ["autopatch", "llama", "--no-check", "--out", str(out), "--emit", str(mine)]
    got = CliRunner().invoke(app, args, env={"COLUMNS": "300"})
    assert got.exit_code == 2 and "not a test kernelwright emitted" in got.output, got.output
    assert mine.read_text() == "def test_mine():\n    pass\n" and not out.exists()
    got = CliRunner().invoke(app, [*args, "--force"])
    assert got.exit_code == 0 and "Generated by kernelwright autopatch" in mine.read_text()
    mine.write_text(mine.read_text() + "# stale\n")  # an emitted file: regenerated as it is
    got = CliRunner().invoke(app, args)
    assert got.exit_code == 0 and "# stale" not in mine.read_text(), got.output


def test_in_place_decisions_keep_gradients():
    """Gemma2's sandwich: the patched model with the analyser's in-place decisions has the
    original's gradients; forcing the post-norms (residual-sum inputs) in place corrupts them."""
    patch = pytest.importorskip("kernelwright.integrations.transformers.patch").patch
    profile = profile_of("gemma2")
    t = resolve("gemma2")
    ref, _, _ = build_tiny(t.model_cls, t.config)
    ref = ref.to(DEVICE)
    ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(0)).to(DEVICE)

    def grads(model):
        model.train()
        model(input_ids=ids, labels=ids).loss.backward()
        return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}

    def worst(profile):
        model = copy.deepcopy(ref)
        patch(model, profile)
        got, want = grads(model), grads(copy.deepcopy(ref))
        return max(((got[n] - want[n]).norm() / want[n].norm()).item() for n in want)

    assert worst(profile) < 1e-5
    forced = profile.model_copy(deep=True)
    for use in forced.norms[0].uses:
        use.in_place_safe = True
    assert worst(forced) > 1e-2
