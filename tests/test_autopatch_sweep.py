"""The autopatch sweep and the model check: a type ends patched with parity, left alone with a
reason, or unbuildable, and a planted difference is never reported as patched.

The planted model is a tiny HF-style causal LM whose only patchable part is its loss (no norm,
no gated MLP, no RoPE), so "left alone" is the only right answer when that loss is not the
one the fused forward reproduces. Its forward computes the loss on UNSHIFTED labels, the
difference that is invisible in eval() under no_grad and changes every training step.
"""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import kernelwright  # noqa: F401  (the Triton interpreter without a GPU)

transformers = pytest.importorskip("transformers")

from transformers import (  # noqa: E402
    AutoConfig,
    AutoModelForCausalLM,
    GenerationMixin,
    PretrainedConfig,
    PreTrainedModel,
)
from transformers.modeling_outputs import (  # noqa: E402
    BaseModelOutputWithPast,
    CausalLMOutputWithPast,
)
from typer.testing import CliRunner  # noqa: E402

from kernelwright.cli import app  # noqa: E402
from kernelwright.integrations.transformers import forward as fwd  # noqa: E402
from kernelwright.integrations.transformers import parity  # noqa: E402
from kernelwright.integrations.transformers.analysis import analyze  # noqa: E402
from kernelwright.runtime import interpreter_mode  # noqa: E402
from kernelwright.workflows.autopatch import sweep as S  # noqa: E402

# The sweep runs its tiny models on the CPU through the interpreter (it says so and stops
# otherwise); on a GPU machine the CPU suite's run of this file is the one that counts.
pytestmark = pytest.mark.skipif(not interpreter_mode(), reason="the sweep runs on the CPU")

# --------------------------------------------------------------------------- the planted model


class PlantedConfig(PretrainedConfig):
    model_type = "kw_planted"

    def __init__(self, vocab_size=96, hidden_size=32, loss="unshifted", **kwargs):
        self.vocab_size, self.hidden_size, self.loss = vocab_size, hidden_size, loss
        super().__init__(**kwargs)


class PlantedModel(PreTrainedModel):
    config_class = PlantedConfig

    def __init__(self, config):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.proj = nn.Linear(config.hidden_size, config.hidden_size)
        self.post_init()

    def get_input_embeddings(self):
        return self.embed_tokens

    def forward(self, input_ids=None, **kwargs):
        if self.config.loss == "broken":
            raise RuntimeError("planted: this model does not run")
        return BaseModelOutputWithPast(
            last_hidden_state=torch.tanh(self.proj(self.embed_tokens(input_ids)))
        )


class PlantedForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = PlantedConfig

    def __init__(self, config):
        super().__init__(config)
        self.model = PlantedModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def get_output_embeddings(self):
        return self.lm_head

    def forward(self, input_ids=None, labels=None, **kwargs):
        outputs = self.model(input_ids=input_ids, **kwargs)
        hidden_states = outputs.last_hidden_state
        logits = self.lm_head(hidden_states)
        loss = None
        if labels is not None:
            # the planted difference: position t is trained on token t, not t + 1
            loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits)


class HiddenShiftForCausalLM(PlantedForCausalLM):
    """The same unshifted loss, written so that it reads like the standard one: the labels are
    shifted right first, and ForCausalLMLoss's own left shift cancels it."""

    def forward(self, input_ids=None, labels=None, **kwargs):
        outputs = self.model(input_ids=input_ids, **kwargs)
        hidden_states = outputs.last_hidden_state
        logits = self.lm_head(hidden_states)
        loss = None
        if labels is not None:
            labels = F.pad(labels, (1, 0), value=-100)[..., :-1]
            loss = self.loss_function(
                logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs
            )
        return CausalLMOutputWithPast(loss=loss, logits=logits)


class MeanLossForCausalLM(PlantedForCausalLM):
    """Reduction: the loss ignores num_items_in_batch (a mean over this batch, always)."""

    def forward(self, input_ids=None, labels=None, **kwargs):
        outputs = self.model(input_ids=input_ids, **kwargs)
        hidden_states = outputs.last_hidden_state
        logits = self.lm_head(hidden_states)
        loss = None
        if labels is not None:
            loss = self.loss_function(logits, labels, self.config.vocab_size)
        return CausalLMOutputWithPast(loss=loss, logits=logits)


class IgnoreZeroForCausalLM(PlantedForCausalLM):
    """Ignore index: token 0 is never trained on."""

    def forward(self, input_ids=None, labels=None, **kwargs):
        outputs = self.model(input_ids=input_ids, **kwargs)
        hidden_states = outputs.last_hidden_state
        logits = self.lm_head(hidden_states)
        loss = None
        if labels is not None:
            loss = self.loss_function(logits, labels, self.config.vocab_size, ignore_index=0)
        return CausalLMOutputWithPast(loss=loss, logits=logits)


class ScaledAfterLossForCausalLM(PlantedForCausalLM):
    """Logit scaling: the returned logits are scaled, the loss was taken before."""

    def forward(self, input_ids=None, labels=None, **kwargs):
        outputs = self.model(input_ids=input_ids, **kwargs)
        hidden_states = outputs.last_hidden_state
        logits = self.lm_head(hidden_states)
        loss = None
        if labels is not None:
            loss = self.loss_function(logits, labels, self.config.vocab_size, **kwargs)
        logits = logits * 2.0
        return CausalLMOutputWithPast(loss=loss, logits=logits)


AutoConfig.register("kw_planted", PlantedConfig, exist_ok=True)
AutoModelForCausalLM.register(PlantedConfig, PlantedForCausalLM, exist_ok=True)


def _planted(loss: str) -> PlantedConfig:
    return PlantedConfig(loss=loss)


# --------------------------------------------------------------------------- statuses


def test_sweep_statuses_patched_left_alone_cannot_build():
    """One type of each status: llama is patched with parity; the planted unshifted loss is
    refused by the source check (nothing else to patch: left alone, with the reason); a model
    that does not run unpatched cannot be built."""
    llama = S.sweep_one("llama")
    assert llama.status == "patched", llama
    for kind in ("norm", "mlp", "rope", "fused_linear_cross_entropy"):
        assert kind in llama.patched
    tol = parity.PARITY_TOLERANCES[torch.float32]
    assert llama.loss_diff <= tol.loss and llama.grad_error <= tol.grads
    assert llama.logprob_diff <= tol.logprobs

    planted = S.sweep_one("kw_planted", config=_planted("unshifted"))
    assert planted.status == "left_alone", planted
    assert "without self.loss_function" in planted.left_alone

    broken = S.sweep_one("kw_planted", config=_planted("broken"))
    assert broken.status == "cannot_build"
    assert "planted: this model does not run" in broken.error


def test_model_check_catches_what_the_source_check_misses(monkeypatch):
    """With the source check of the loss call switched off, the planted unshifted loss gets
    the fused forward; the numbers must catch it: in train() its loss differs from the
    model's own. First the analyser's model check (the default `patch(model)` path) demotes it,
    then, with that check off too, the sweep's own comparison does. Never 'patched'."""
    monkeypatch.setattr(fwd, "_check_loss_call", lambda *a, **k: None)
    AutoModelForCausalLM.register(PlantedConfig, HiddenShiftForCausalLM, exist_ok=True)
    try:
        torch.manual_seed(0)
        model = HiddenShiftForCausalLM(_planted("hidden"))
        profile = analyze(model)
        assert profile.output.status == "unsupported"
        assert "model check failed" in profile.output.reason
        assert "train loss" in profile.output.reason

        row = S.sweep_one("kw_planted", config=_planted("hidden"))
        assert row.status == "left_alone", row
        assert "model check failed" in row.left_alone

        analyzer = importlib.import_module(analyze.__module__)
        monkeypatch.setattr(analyzer, "_confirm_model", lambda ctx, profile: None)
        row = S.sweep_one("kw_planted", config=_planted("hidden"))
        assert row.status == "left_alone", row
        assert "sweep parity failed" in row.demoted and "train loss" in row.demoted
    finally:
        AutoModelForCausalLM.register(PlantedConfig, PlantedForCausalLM, exist_ok=True)


CONVENTIONS = {
    # class: (what the source check says, what the numbers show without it). Ignoring token 0
    # instead of -100 cannot run on labels with -100 at all: the source check alone decides.
    HiddenShiftForCausalLM: ("labels re-assigned", "train loss"),
    MeanLossForCausalLM: ("num_items_in_batch would be dropped", "train loss"),
    IgnoreZeroForCausalLM: ("ignore_index=0", None),
    ScaledAfterLossForCausalLM: ("changed after the loss", "train loss"),
}


@pytest.mark.parametrize("cls", list(CONVENTIONS), ids=lambda c: c.__name__)
def test_each_loss_convention_is_read_and_checked(cls, monkeypatch):
    """Label shift, reduction, ignore index, logit scaling: each planted difference is refused
    by the source check with its reason, and, with that check off, demoted by the numbers."""
    read, measured = CONVENTIONS[cls]
    torch.manual_seed(0)
    model = cls(_planted("planted"))
    with pytest.raises(fwd.NotStandardForward, match=read):
        fwd.plan_causal_lm(cls, analyze(model, check=False))
    if measured is None:
        return
    monkeypatch.setattr(fwd, "_check_loss_call", lambda *a, **k: None)
    profile = analyze(model)
    assert profile.output.status == "unsupported"
    assert "model check failed" in profile.output.reason and measured in profile.output.reason


def test_compare_sees_each_quantity():
    # the comparison itself: loss, a gradient, a log-prob, each moved alone, fails alone
    torch.manual_seed(0)
    model = PlantedForCausalLM(_planted("unshifted"))
    batch = parity.make_batch(96, seq=8)
    ref = parity.measure(model, batch)
    assert parity.compare(ref, parity.measure(model, batch)).passed
    for mode in ("train", "eval"):
        moved = parity.measure(model, batch)
        getattr(moved, mode).loss += 1e-3
        assert not parity.compare(ref, moved).passed
        moved = parity.measure(model, batch)
        getattr(moved, mode).grads["lm_head.weight"][0, 0] += 1.0
        res = parity.compare(ref, moved)
        assert not res.passed and "gradients" in res.detail
        moved = parity.measure(model, batch)
        getattr(moved, mode).logprobs[0, 0] += 1e-2
        res = parity.compare(ref, moved)
        assert not res.passed and "log-probs" in res.detail


# --------------------------------------------------------------------------- command line


def test_cli_sweep_writes_the_table_and_times_out(tmp_path):
    """Worker processes, the per-type timeout and the files: a timeout too short for any
    type stops it (never 'patched'), and the CSV and markdown tables are written."""
    result = CliRunner().invoke(
        app,
        ["autopatch", "--sweep", "--only", "llama", "--timeout", "0.01", "--jobs", "1"]
        + ["--no-profiles", "--out", str(tmp_path)],
    )
    assert result.exit_code == 0, result.output
    assert "llama" in result.output and "timed out" in result.output
    text = (tmp_path / "cpu_fp32.csv").read_text()
    assert "llama" in text and "timed out" in text
    md = (tmp_path / "cpu_fp32.md").read_text()
    assert "| llama |" in md and "patched: **0**" in md


def test_cli_sweep_refuses_unknown_types_and_model_with_sweep(tmp_path):
    runner = CliRunner()
    bad = runner.invoke(app, ["autopatch", "--sweep", "--only", "lama", "--out", str(tmp_path)])
    assert bad.exit_code != 0 and "llama" in bad.output
    both = runner.invoke(app, ["autopatch", "llama", "--sweep", "--out", str(tmp_path)])
    assert both.exit_code != 0


def test_cli_sweep_refuses_options_that_cannot_work(tmp_path, monkeypatch):
    # a timeout <= 0 (every type would end "timed out"), negative workers, an --out that is a
    # file and one MODEL's options: one usage line (exit 2) before any type is swept
    from kernelwright import cli_sweep

    ran = []
    monkeypatch.setattr(cli_sweep, "_sweep_mapping", lambda *a: ran.append(a))
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    cases = [
        (["--timeout", "-5"], "--timeout"),
        (["--timeout", "0"], "--timeout"),
        (["--jobs", "-1"], "--jobs"),
        (["--emit", str(tmp_path / "t.py")], "--emit"),
        (["--no-check"], "--no-check"),
        (["--out", str(a_file)], "--out"),
    ]
    for args, flag in cases:
        got = CliRunner().invoke(app, ["autopatch", "--sweep", "--only", "llama", *args])
        assert got.exit_code == 2 and f"Invalid value for {flag}" in got.output, got.output
    assert ran == [] and a_file.read_text() == "mine"


def test_cli_sweep_takes_every_dtype_spelling(tmp_path, monkeypatch):
    from kernelwright import cli_sweep

    seen = []
    monkeypatch.setattr(cli_sweep, "_sweep_mapping", lambda *a: seen.append(a[-1]))
    runner = CliRunner()
    for spelling in ("bf16", "bfloat16", "fp32", "float32", "float"):
        args = ["autopatch", "--sweep", "--only", "llama", "--dtype", spelling]
        result = runner.invoke(app, [*args, "--out", str(tmp_path)])
        assert result.exit_code == 0, result.output
    assert seen == ["bf16", "bf16", "fp32", "fp32", "fp32"]  # its tables' names: cpu_bf16.*
    bad = runner.invoke(app, ["autopatch", "--sweep", "--dtype", "fp16", "--out", str(tmp_path)])
    assert bad.exit_code == 2 and "fp32/float32/float" in bad.output
    assert "bf16/bfloat16" in bad.output and "half" not in bad.output


# --------------------------------------------------------------------------- device and dtype


def test_sweep_bf16_uses_the_bf16_tolerances(tmp_path, monkeypatch):
    """Both models in bf16, compared within bf16's row of the table: llama's rounding differs
    from the unpatched model's beyond fp32's bounds (so fp32's row would demote everything)
    and stays within bf16's; the profile's evidence says bf16. One layer, 8 tokens, and the
    analyser's own fp32 model check off (the first test runs it): the sweep's check alone."""
    analyzer = importlib.import_module(analyze.__module__)
    monkeypatch.setattr(analyzer, "_confirm_model", lambda ctx, profile: None)
    config = S.sweep_config("llama")
    config.num_hidden_layers = 1
    row = S.sweep_one("llama", config=config, seq=8, dtype="bf16", profile_dir=tmp_path)
    assert row.status == "patched", row
    assert "norm" in row.patched and "fused_linear_cross_entropy" in row.patched
    bf16, fp32 = parity.PARITY_TOLERANCES[torch.bfloat16], parity.PARITY_TOLERANCES[torch.float32]
    assert fp32.grads < row.grad_error <= bf16.grads
    assert row.loss_diff <= bf16.loss and row.logprob_diff <= bf16.logprobs
    assert "tokens, bf16, train() and eval()" in (tmp_path / "llama.yaml").read_text()
    with pytest.raises(ValueError, match="no parity tolerance"):
        parity.tolerance_for(torch.float16)


def test_sweep_results_names_and_device_errors(tmp_path):
    assert S.results_name() == "cpu_fp32"
    assert S.results_name("image-text-to-text") == "cpu_fp32_vlm"
    assert S.results_name("causal-lm", "cuda", "bf16") == "gpu_bf16"
    assert S.results_name("image-text-to-text", "cuda", "fp32") == "gpu_fp32_vlm"
    with pytest.raises(ValueError):
        S.require_device("cpu", "fp16")
    with pytest.raises(RuntimeError, match="no CUDA GPU"):
        S.require_device("cuda", "bf16")
    result = CliRunner().invoke(
        app,
        ["autopatch", "--sweep", "--only", "llama", "--device", "cuda", "--dtype", "bf16"]
        + ["--out", str(tmp_path)],
    )
    assert result.exit_code != 0 and "no CUDA GPU" in result.output
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("model_type", ["lfm2_moe", "dots1", "dbrx"])
def test_sweep_config_builds_and_runs(model_type):
    # lfm2_moe: the default leaves layer_types None; dbrx: no attn_config.rope_theta and
    # clip_qkv None; dots1: no expert or shared-expert count
    torch.manual_seed(0)
    model = S.build(AutoModelForCausalLM, S.sweep_config(model_type))
    ids = torch.randint(0, model.config.get_text_config().vocab_size, (1, 8))
    loss = model(input_ids=ids, labels=ids).loss
    assert torch.isfinite(loss) and loss.item() > 0
