"""kernelwright.patch: a ModelProfile applied to tiny HF models, checked against the unpatched
model (loss and every gradient in fp32), plus unpatch, flags, PEFT, from_pretrained, the
Trainer callback and torch.compile.

Profiles are built by hand here (`make_profile`), so these tests do not depend on the
analyser; one test runs the analyser when it is installed.
"""

from __future__ import annotations

import collections
import copy
import functools
import inspect
import subprocess
import sys
import types

import pytest
import torch

transformers = pytest.importorskip("transformers")

from conftest import DEVICE  # noqa: E402

import kernelwright  # noqa: E402
from kernelwright.integrations.transformers import (  # noqa: E402
    KernelwrightCallback,
    is_patched,
    patch,
    patch_record,
    unpatch,
)
from kernelwright.integrations.transformers.forward import NotStandardForward  # noqa: E402
from kernelwright.integrations.transformers.rebind import with_global  # noqa: E402
from kernelwright.profiles.model import (  # noqa: E402
    DecoderDecision,
    Evidence,
    LMHeadDecision,
    LogitsDecision,
    MLPDecision,
    ModelProfile,
    MoEDecision,
    NormDecision,
    NormUse,
    OutputDecision,
    RopeDecision,
)

# fp32 loss and gradients: patched vs unpatched, relative to the largest reference entry
RTOL = 1e-5
B, T, V = 2, 12, 128

# --------------------------------------------------------------------------- tiny models

_CONFIGS = {
    "llama": ("LlamaConfig", {}),
    "gemma2": (
        "Gemma2Config",
        {"final_logit_softcapping": 5.0, "attn_logit_softcapping": None, "head_dim": 16},
    ),
    "granite": ("GraniteConfig", {"logits_scaling": 4.0, "embedding_multiplier": 2.0}),
    "phi3": ("Phi3Config", {"partial_rotary_factor": 0.5}),
    "nemotron": ("NemotronConfig", {"partial_rotary_factor": 0.5, "head_dim": 16}),
    "qwen3": ("Qwen3Config", {"head_dim": 16}),
    "mixtral": ("MixtralConfig", {"num_local_experts": 4, "num_experts_per_tok": 2}),
}


def tiny_config(model_type: str, **overrides):
    cls_name, extra = _CONFIGS[model_type]
    kw = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=V,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        attn_implementation="eager",
    )
    kw.update(extra)
    kw.update(overrides)
    return getattr(transformers, cls_name)(**kw)


def tiny_model(model_type: str, seed: int = 0, **overrides):
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(tiny_config(model_type, **overrides))
    model = model.to(DEVICE)
    # zero-initialised norm weights (gemma's 1 + w, LayerNorm1P) would hide a wrong offset
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model


def batch(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, V, (B, T), generator=g, device="cpu").to(DEVICE)
    labels = ids.clone()
    labels[0, :3] = -100  # a prompt that is not trained on
    labels[1, -2:] = -100
    return ids, labels


@pytest.fixture(autouse=True)
def _on_device():
    # Models and tensors the tests build land on the suite's device: CUDA on a GPU machine
    # (where the kernels need CUDA tensors), the CPU under the interpreter.
    with torch.device(DEVICE):
        yield


# --------------------------------------------------------------------------- hand-made profiles

_EV = [Evidence(source="test", detail="hand-written for the patcher tests")]

# prefix, norm (kind, casting, offset, eps attribute, bias), norm uses (attribute, owner
# suffix, in-place safe), mlp (activation, layout, attributes, hidden_act), logits
_ARCH = {
    "llama": dict(prefix="Llama"),
    "qwen3": dict(
        prefix="Qwen3",
        uses=[
            ("input_layernorm", "DecoderLayer", True),
            ("post_attention_layernorm", "DecoderLayer", True),
            ("norm", "Model", True),
            ("q_norm", "Attention", True),
            ("k_norm", "Attention", True),
        ],
    ),
    "gemma2": dict(
        prefix="Gemma2",
        norm=("rms_norm", "gemma", 1.0, "eps", None),
        # sandwich norms: the post norms' outputs join the residual sum (not in-place safe)
        uses=[
            ("input_layernorm", "DecoderLayer", True),
            ("post_attention_layernorm", "DecoderLayer", False),
            ("pre_feedforward_layernorm", "DecoderLayer", True),
            ("post_feedforward_layernorm", "DecoderLayer", False),
            ("norm", "Model", True),
        ],
        mlp=("geglu_tanh", "separate", "gelu_pytorch_tanh"),
        logits=dict(softcap=30.0, softcap_config_key="final_logit_softcapping"),
    ),
    "granite": dict(
        prefix="Granite",
        logits=dict(scale_op="divide", scale=1.0, scale_config_key="logits_scaling"),
    ),
    "phi3": dict(prefix="Phi3", mlp=("swiglu", "fused_gate_up", "silu")),
    "nemotron": dict(
        prefix="Nemotron",
        norm_class="NemotronLayerNorm1P",
        norm=("layer_norm", None, 1.0, "eps", "bias"),
        mlp=("relu_squared", "non_gated", "relu2"),
    ),
    "mixtral": dict(prefix="Mixtral", mlp=None, moe=True),
}


def make_profile(model_type: str) -> ModelProfile:
    a = _ARCH[model_type]
    p = a["prefix"]
    kind, casting, offset, eps_attr, bias_attr = a.get(
        "norm", ("rms_norm", "llama", 0.0, "variance_epsilon", None)
    )
    uses = a.get(
        "uses",
        [
            ("input_layernorm", "DecoderLayer", True),
            ("post_attention_layernorm", "DecoderLayer", True),
            ("norm", "Model", True),
        ],
    )
    norm = NormDecision(
        class_name=a.get("norm_class", f"{p}RMSNorm"),
        kind=kind,
        casting_mode=casting,
        offset=offset,
        eps_attribute=eps_attr,
        bias_attribute=bias_attr,
        uses=[
            NormUse(attribute=attr, owner_class=f"{p}{owner}", role="other", in_place_safe=safe)
            for attr, owner, safe in uses
        ],
        evidence=_EV,
    )
    mlps = []
    mlp = a.get("mlp", ("swiglu", "separate", "silu"))
    if mlp is not None:
        act, layout, hidden_act = mlp
        attrs = {
            "separate": dict(gate_attribute="gate_proj", up_attribute="up_proj"),
            "fused_gate_up": dict(gate_up_attribute="gate_up_proj"),
            "non_gated": dict(up_attribute="up_proj"),
        }[layout]
        mlps.append(
            MLPDecision(
                class_name=f"{p}MLP",
                activation=act,
                layout=layout,
                down_attribute="down_proj",
                hidden_act=hidden_act,
                evidence=_EV,
                **attrs,
            )
        )
    is_moe = a.get("moe", False)
    moe = (
        MoEDecision(
            status="patch",
            is_moe=True,
            block_class=f"{p}SparseMoeBlock",
            aux_loss_function="load_balancing_loss_func",
            evidence=_EV,
        )
        if is_moe
        else MoEDecision(status="absent")
    )
    logits = a.get("logits")
    return ModelProfile(
        model_type=model_type,
        architecture=f"{p}ForCausalLM",
        transformers_version=transformers.__version__,
        modeling_file=f"models/{model_type}/modeling_{model_type}.py",
        config_source=f"model_type:{model_type}",
        norms=[norm],
        decoder=DecoderDecision(class_name=f"{p}DecoderLayer", num_layers=2),
        mlps=mlps,
        moe=moe,
        rope=RopeDecision(
            attention_class=f"{p}Attention",
            function=f"transformers.models.{model_type}.modeling_{model_type}.apply_rotary_pos_emb",
            call_name="apply_rotary_pos_emb",
            variant="half_split",
            evidence=_EV,
        ),
        output=OutputDecision(
            causal_lm_class=f"{p}ForCausalLM",
            output_class="MoeCausalLMOutputWithPast" if is_moe else "CausalLMOutputWithPast",
            base_model_attribute="model",
            vocab_size=V,
            evidence=_EV,
        ),
        logits=LogitsDecision(status="patch", evidence=_EV, **logits)
        if logits
        else LogitsDecision(status="absent"),
        lm_head=LMHeadDecision(tied=False, evidence=_EV),
    )


# --------------------------------------------------------------------------- helpers


def count_kernel_launches(monkeypatch) -> collections.Counter:
    """Counts launcher calls (`*_launch` in kernelwright.ops.*) by op module; eager calls go
    straight to the launchers, past the dispatcher."""
    counts = collections.Counter()
    for modname, module in list(sys.modules.items()):
        if not modname.startswith("kernelwright.ops."):
            continue
        op = modname.rsplit(".", 1)[1]
        for name, fn in list(vars(module).items()):
            if name.endswith("_launch") and callable(fn):

                def counted(*args, _fn=fn, _op=op, _mod=module, **kwargs):
                    if _op == "_gated":  # the gated family's launchers take the activation first
                        _op = _mod.ACTIVATIONS[args[0]]
                    counts[_op] += 1
                    return _fn(*args, **kwargs)

                monkeypatch.setattr(module, name, counted)
    return counts


def loss_and_grads(model, ids, labels, **kwargs):
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=labels, **kwargs)
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out, grads


def assert_close_rel(got, want, rtol=RTOL, what=""):
    err = (got.float() - want.float()).abs().max().item()
    scale = want.float().abs().max().item()
    assert err <= rtol * scale + 1e-7, f"{what}: max error {err:.3g} vs max |ref| {scale:.3g}"


def assert_grads_match(grads, ref, rtol=RTOL):
    assert grads.keys() == ref.keys()
    for name in ref:
        assert_close_rel(grads[name], ref[name], rtol, name)


def patched_pair(model_type: str, **overrides):
    ref = tiny_model(model_type, **overrides)
    model = copy.deepcopy(ref)
    profile = make_profile(model_type)
    patch(model, profile)
    return model, ref, profile


# --------------------------------------------------------------------------- tests

# per model: (norm instances, mlp instances) with 2 layers
_EXPECTED = {
    "llama": (5, 2),
    "gemma2": (9, 2),
    "granite": (5, 2),
    "phi3": (5, 2),
    "nemotron": (5, 2),
    "qwen3": (9, 2),
}


@pytest.mark.parametrize("model_type", list(_EXPECTED))
def test_patched_loss_and_grads_match_hf(model_type, monkeypatch):
    model, ref, _ = patched_pair(model_type)
    rec = patch_record(model)
    n_norms, n_mlps = _EXPECTED[model_type]
    assert (rec.count("norm"), rec.count("mlp"), rec.count("rope")) == (n_norms, n_mlps, 2)
    assert rec.count("causal_lm") == 1 and rec.skipped == []
    ids, labels = batch()
    launches = count_kernel_launches(monkeypatch)
    out, grads = loss_and_grads(model, ids, labels)
    ran = dict(launches)
    monkeypatch.undo()
    want, ref_grads = loss_and_grads(ref, ids, labels)
    assert out.logits is None  # the fused loss never builds them
    assert_close_rel(out.loss, want.loss, what="loss")
    assert_grads_match(grads, ref_grads)
    # every patched part really ran our kernels: forward and backward launches per layer (the
    # fused loss computes its gradients in the forward)
    norm_op = "layer_norm" if model_type == "nemotron" else "rms_norm"
    mlp_op = {"gemma2": "geglu", "nemotron": "relu_squared"}.get(model_type, "swiglu")
    want_launches = {norm_op: 2 * n_norms, mlp_op: 2 * n_mlps, "rope": 4}
    for op, n in want_launches.items():
        assert ran.get(op, 0) >= n, f"{op}: fewer than {n} launches; saw {ran}"
    assert ran.get("fused_linear_cross_entropy", 0) >= 1, ran


def test_in_place_backward_only_where_every_use_is_safe():
    model, _, _ = patched_pair("gemma2")
    flags = {e.name: e.detail for e in patch_record(model).modules if e.kind == "norm"}
    assert flags["model.layers.0.input_layernorm"] == "in_place_backward=True"
    assert flags["model.layers.0.post_attention_layernorm"] == "in_place_backward=False"
    assert flags["model.layers.1.post_feedforward_layernorm"] == "in_place_backward=False"
    assert flags["model.norm"] == "in_place_backward=True"


def test_patched_forward_is_ours_and_parameters_unchanged():
    ref = tiny_model("llama")
    model = copy.deepcopy(ref)
    params = dict(model.named_parameters())
    signature = inspect.signature(model.forward)
    patch(model, make_profile("llama"))
    # Trainer keeps dataset columns by the forward's parameters: they must not change
    assert inspect.signature(model.forward) == signature
    layer = model.model.layers[0]
    for m in (layer.input_layernorm, layer.mlp, layer.self_attn, model):
        assert isinstance(m.__dict__["forward"], types.MethodType)
        assert m.forward.__self__ is m
    assert "kernelwright" in model.forward.__doc__
    # the attention's forward is a copy of the class's with our rope as its global
    fn = layer.self_attn.forward.__func__
    assert fn.__code__ is type(layer.self_attn).forward.__code__
    assert fn.__globals__["apply_rotary_pos_emb"].__module__.startswith("kernelwright")
    modeling = __import__(type(layer.self_attn).__module__, fromlist=["x"])
    assert modeling.apply_rotary_pos_emb.__module__ == modeling.__name__  # module untouched
    assert all(p is params[n] for n, p in model.named_parameters())
    assert model.state_dict().keys() == ref.state_dict().keys()
    # other instances of the same classes stay unpatched
    other = tiny_model("llama")
    assert "forward" not in other.model.layers[0].mlp.__dict__


def test_labels_num_items_in_batch_and_shift_labels():
    model, ref, _ = patched_pair("llama")
    ids, labels = batch()
    n = torch.tensor(37)  # gradient accumulation: sum over this micro-batch / tokens in all
    out, grads = loss_and_grads(model, ids, labels, num_items_in_batch=n)
    want, ref_grads = loss_and_grads(ref, ids, labels, num_items_in_batch=n)
    assert_close_rel(out.loss, want.loss, what="loss")
    assert_grads_match(grads, ref_grads)
    # already aligned targets (sequence parallelism): used as they are, labels not shifted
    shift = torch.roll(labels, 3, dims=1)
    out, grads = loss_and_grads(model, ids, labels, shift_labels=shift)
    want, ref_grads = loss_and_grads(ref, ids, labels, shift_labels=shift)
    assert_close_rel(out.loss, want.loss, what="loss with shift_labels")
    assert_grads_match(grads, ref_grads)


def test_no_labels_no_grad_and_logits_to_keep_keep_the_original_path():
    model, ref, _ = patched_pair("gemma2")
    ids, labels = batch()
    out, want = model(input_ids=ids), ref(input_ids=ids)
    assert out.loss is None
    assert_close_rel(out.logits, want.logits, what="logits")
    with torch.no_grad():  # evaluation with labels: logits and loss as HF computes them
        out, want = model(input_ids=ids, labels=labels), ref(input_ids=ids, labels=labels)
    assert out.logits is not None
    assert_close_rel(out.loss, want.loss, what="eval loss")
    out, want = model(input_ids=ids, logits_to_keep=1), ref(input_ids=ids, logits_to_keep=1)
    assert out.logits.shape == (B, 1, V)
    assert_close_rel(out.logits, want.logits, what="last logits")
    # return_dict=False: a tuple (loss first) on the fused path too, each field in the unpatched
    # model's place: the logits (not computed) are None there, not left out
    got, want = (
        model(ids, labels=labels, return_dict=False),
        ref(ids, labels=labels, return_dict=False),
    )
    assert len(got) == len(want) and got[1] is None and torch.is_tensor(want[1])
    assert_close_rel(got[0], want[0], what="tuple loss")
    assert [type(g) for g in got[2:]] == [type(w) for w in want[2:]]


def test_generate_after_patch():
    model, ref, _ = patched_pair("llama")
    ids, _ = batch()
    kw = dict(max_new_tokens=3, do_sample=False, pad_token_id=0)
    assert torch.equal(model.generate(ids[:1, :5], **kw), ref.generate(ids[:1, :5], **kw))


def test_unpatch_is_bit_exact():
    ref = tiny_model("gemma2")
    model = copy.deepcopy(ref)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    profile = make_profile("gemma2")
    assert patch(model, profile) is profile
    assert unpatch(model) is profile
    assert not is_patched(model)
    assert all("forward" not in m.__dict__ for m in model.modules())
    ids, labels = batch()
    out, grads = loss_and_grads(model, ids, labels)
    want, ref_grads = loss_and_grads(ref, ids, labels)
    assert torch.equal(out.logits, want.logits) and torch.equal(out.loss, want.loss)
    assert all(torch.equal(grads[n], ref_grads[n]) for n in ref_grads)
    after = model.state_dict()
    assert after.keys() == before.keys()
    assert all(torch.equal(after[k], before[k]) for k in before)
    with pytest.raises(ValueError, match="not patched"):
        unpatch(model)


def test_deepcopy_of_a_patched_model_is_patched_on_its_own():
    model, ref, _ = patched_pair("llama", num_hidden_layers=1)
    twin = copy.deepcopy(model)
    with torch.no_grad():
        for p in twin.parameters():
            p.mul_(0.5)
    layer = twin.model.layers[0]
    assert layer.mlp.forward.__self__ is layer.mlp and twin.forward.__self__ is twin
    ids, labels = batch()
    # the fallback (no labels) runs the twin's own class forward, not the model it came from
    assert not torch.allclose(twin(input_ids=ids).logits, model(input_ids=ids).logits)
    unpatch(twin)
    assert is_patched(model) and not is_patched(twin)


def test_forward_wrapped_by_someone_else():
    # accelerate's mixed precision puts an autocast wrapper on the instance: left alone, said so
    model = tiny_model("llama", num_hidden_layers=1)
    wrapper = types.MethodType(type(model).forward, model)
    model.forward = wrapper
    with pytest.warns(UserWarning, match="instance-level forward"):
        patch(model, make_profile("llama"))
    rec = patch_record(model)
    assert rec.count("causal_lm") == 0 and rec.count("norm") == 3
    assert model.forward is wrapper
    unpatch(model)
    assert model.forward is wrapper  # unpatch removes only what patch set
    # wrapped after patching: unpatch refuses rather than dropping that wrapper
    model = tiny_model("llama", num_hidden_layers=1)
    patch(model, make_profile("llama"))
    model.model.norm.forward = types.MethodType(lambda self, x: x, model.model.norm)
    with pytest.raises(RuntimeError, match="replaced after"):
        unpatch(model)


def test_gradient_checkpointing_and_bf16():
    model, ref, _ = patched_pair("qwen3", num_hidden_layers=1)
    for m in (model, ref):
        m.gradient_checkpointing_enable()
        m.train()
    ids, labels = batch()
    out, grads = loss_and_grads(model, ids, labels)
    want, ref_grads = loss_and_grads(ref, ids, labels)
    assert_close_rel(out.loss, want.loss, what="loss")
    assert_grads_match(grads, ref_grads)
    model.to(torch.bfloat16)
    ref.to(torch.bfloat16)
    out, want = model(input_ids=ids, labels=labels), ref(input_ids=ids, labels=labels)
    assert out.loss.dtype == torch.float32 and out.logits is None
    assert abs(out.loss.item() - want.loss.item()) < 2e-2 * want.loss.item()


def test_patching_twice_raises():
    model, _, profile = patched_pair("llama")
    with pytest.raises(RuntimeError, match="already patched"):
        patch(model, profile)
    with pytest.raises(RuntimeError, match="already patched"):
        patch(model.model, profile)  # a part of a patched model too
    with pytest.raises(ValueError, match="enclosing module"):
        unpatch(model.model)
    unpatch(model)
    patch(model, profile)  # patch, unpatch, patch again
    assert patch_record(model).count("norm") == 5


def test_a_float64_model_is_refused_before_anything_is_patched():
    # the kernels take fp32/fp16/bf16; a float64 model would patch, then fail at its first forward
    model = tiny_model("llama", num_hidden_layers=1).double()
    with pytest.raises(TypeError, match=r"float64 parameters.*model\.float\(\)") as info:
        patch(model)
    assert "bfloat16" in str(info.value)
    assert not is_patched(model) and patch_record(model) is None
    assert all("forward" not in m.__dict__ for m in model.modules())


@pytest.mark.parametrize(
    "flag, kind",
    [
        ("rms_norm", "norm"),
        ("mlp", "mlp"),
        ("rope", "rope"),
        ("fused_linear_cross_entropy", "causal_lm"),
    ],
)
def test_flags(flag, kind):
    model = tiny_model("llama", num_hidden_layers=1)
    patch(model, make_profile("llama"), **{flag: False})
    rec = patch_record(model)
    assert rec.count(kind) == 0
    assert sum(rec.count(k) for k in ("norm", "mlp", "rope", "causal_lm")) > 0
    assert any(why == f"{flag}=False" for _, why in rec.skipped)
    # the norm flags go by kind: layer_norm=False leaves RMSNorms patched and LayerNorms alone
    model = tiny_model("llama", num_hidden_layers=1)
    patch(model, make_profile("llama"), layer_norm=False)
    assert patch_record(model).count("norm") == 3
    model = tiny_model("nemotron", num_hidden_layers=1)
    patch(model, make_profile("nemotron"), rms_norm=False)
    assert patch_record(model).count("norm") == 3
    model = tiny_model("nemotron", num_hidden_layers=1)
    patch(model, make_profile("nemotron"), layer_norm=False)
    assert patch_record(model).count("norm") == 0 and patch_record(model).count("mlp") == 1


def test_unsupported_and_absent_decisions_are_left_alone():
    profile = make_profile("llama")
    profile.mlps[0] = profile.mlps[0].model_copy(
        update={"status": "unsupported", "reason": "tampered in a test"}
    )
    profile.rope = RopeDecision(status="absent")
    model = tiny_model("llama", num_hidden_layers=1)
    patch(model, profile)
    layer = model.model.layers[0]
    assert "forward" not in layer.mlp.__dict__
    assert "forward" not in layer.self_attn.__dict__
    assert "forward" in layer.input_layernorm.__dict__
    rec = patch_record(model)
    assert ("mlp LlamaMLP", "unsupported: tampered in a test") in rec.skipped
    # an unsupported logits decision: the loss stays HF's
    profile = make_profile("granite")
    profile.logits = LogitsDecision(status="unsupported", reason="scale not proven")
    model = tiny_model("granite", num_hidden_layers=1)
    patch(model, profile)
    assert patch_record(model).count("causal_lm") == 0
    ids, labels = batch()
    assert model(input_ids=ids, labels=labels).logits is not None


def test_profile_from_another_config_is_refused_per_module():
    # same classes, another activation: the swiglu kernel would be silently wrong
    model = tiny_model("llama", num_hidden_layers=1, hidden_act="gelu")
    with pytest.warns(UserWarning, match="does not compute"):
        patch(model, make_profile("llama"))
    assert "forward" not in model.model.layers[0].mlp.__dict__
    with pytest.raises(ValueError, match="has no"):
        patch(tiny_model("phi3", num_hidden_layers=1), make_profile("llama"))


def test_profile_from_yaml_path(tmp_path):
    path = make_profile("phi3").save(tmp_path / "phi3.yaml")
    model = tiny_model("phi3", num_hidden_layers=1)
    profile = kernelwright.patch(model, str(path))
    assert profile.architecture == "Phi3ForCausalLM" and patch_record(model).count("mlp") == 1
    kernelwright.unpatch(model)


def test_profile_yaml_that_fails_validation_is_one_line_per_problem(tmp_path):
    from kernelwright.profiles.base import ProfileError

    # the review edit to skip a norm, half done: status changed, its reason left empty
    path = make_profile("llama").save(tmp_path / "profile.yaml")
    text = path.read_text().replace("status: patch", "status: unsupported", 1)
    path.write_text(text)
    model = tiny_model("llama", num_hidden_layers=1)
    with pytest.raises(ProfileError) as e:
        kernelwright.patch(model, str(path))
    assert isinstance(e.value, ValueError) and not is_patched(model)
    assert str(e.value) == (
        f"{path}: norms[0] (LlamaRMSNorm): an 'unsupported' decision needs a reason: one "
        "sentence on why it is left alone"
    )
    # each problem on its own line, named by where it is, no pydantic dump
    path.write_text(text.replace("kind: rms_norm", "kind: rmsnorm").replace("offset:", "ofset:"))
    with pytest.raises(ProfileError) as e:
        ModelProfile.load(path)
    assert str(e.value).splitlines() == [
        f"{path}: norms[0].kind (LlamaRMSNorm): Input should be 'rms_norm' or 'layer_norm' "
        "(got 'rmsnorm')",
        f"{path}: norms[0].ofset (LlamaRMSNorm): unknown key (a typo?)",
    ]
    path.write_text("norms: [1\n")
    with pytest.raises(ProfileError, match=r"profile.yaml is not valid YAML \(line 2\): expected"):
        ModelProfile.load(path)
    # with its reason filled in, the edit is a skip
    path.write_text(text.replace("reason: ''", "reason: reviewed out", 1))
    kernelwright.patch(model, path)
    assert ("norm LlamaRMSNorm", "unsupported: reviewed out") in patch_record(model).skipped
    unpatch(model)


def test_peft_lora_keeps_training():
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    ref = peft.get_peft_model(tiny_model("llama"), config)
    with torch.no_grad():  # non-zero B so LoRA changes the output and gets a full gradient
        for n, p in ref.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    model = copy.deepcopy(ref)
    patch(model, make_profile("llama"))
    rec = patch_record(model)
    assert (rec.count("norm"), rec.count("mlp"), rec.count("rope"), rec.count("causal_lm")) == (
        5,
        2,
        2,
        1,
    )
    ids, labels = batch()
    out, grads = loss_and_grads(model, ids, labels)
    want, ref_grads = loss_and_grads(ref, ids, labels)
    assert out.logits is None
    assert_close_rel(out.loss, want.loss, what="loss")
    assert {n for n in grads} == {n for n, p in model.named_parameters() if p.requires_grad}
    assert any("lora_A" in n for n in grads)
    assert_grads_match(grads, ref_grads)
    unpatch(model)
    assert not is_patched(model)


def test_from_pretrained(tmp_path):
    tiny_model("llama", num_hidden_layers=1).save_pretrained(tmp_path)
    profile = make_profile("llama")
    model = kernelwright.from_pretrained(
        tmp_path, profile=profile, patch_kwargs={"rope": False}, dtype=torch.float32
    )
    rec = patch_record(model)
    assert rec.profile is profile and rec.count("rope") == 0 and rec.count("norm") == 3
    ref = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    ids, labels = batch()
    assert_close_rel(model(ids, labels=labels).loss, ref(ids, labels=labels).loss, what="loss")


def test_trainer_callback(tmp_path, monkeypatch):
    model = tiny_model("llama", num_hidden_layers=1)
    ids, labels = batch()
    first_loss = copy.deepcopy(model)(input_ids=ids, labels=labels).loss.item()
    # the dataset holds CPU tensors, as a real one does (the Trainer pins and moves them)
    data = [{"input_ids": ids[i].cpu(), "labels": labels[i].cpu()} for i in range(B)]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=2,
        per_device_train_batch_size=B,
        use_cpu=DEVICE.type == "cpu",
        report_to=[],
        save_strategy="no",
        logging_steps=1,
    )
    callback = KernelwrightCallback(make_profile("llama"), unpatch_on_end=True)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data, callbacks=[callback])
    assert is_patched(model)  # on_init_end: before accelerate wraps anything
    losses = []

    class Spy(transformers.TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if "loss" in logs:
                losses.append(logs["loss"])
                assert is_patched(kwargs["model"])

    trainer.add_callback(Spy())
    launches = count_kernel_launches(monkeypatch)
    trainer.train()
    assert launches["fused_linear_cross_entropy"] == 2 and launches["rms_norm"] > 0
    # the first step's loss (Trainer passes num_items_in_batch) is the unpatched model's loss
    assert len(losses) == 2 and abs(losses[0] - first_loss) <= 1e-5 * abs(first_loss)
    assert not is_patched(model)  # unpatch_on_end


def test_torch_compile_fullgraph(monkeypatch):
    model, ref, _ = patched_pair("llama", num_hidden_layers=1)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    ids, labels = batch()
    launches = count_kernel_launches(monkeypatch)
    out, grads = loss_and_grads(compiled, ids, labels)
    assert {"rms_norm", "swiglu", "rope", "fused_linear_cross_entropy"} <= set(launches)
    want, ref_grads = loss_and_grads(ref, ids, labels)
    assert_close_rel(out.loss, want.loss, what="compiled loss")
    assert_grads_match({k.removeprefix("_orig_mod."): v for k, v in grads.items()}, ref_grads)
    with torch.no_grad():  # the original path compiles too
        assert_close_rel(compiled(input_ids=ids).logits, ref(input_ids=ids).logits, what="logits")


def test_rope_copy_compiles_fullgraph():
    model, ref, _ = patched_pair("llama", num_hidden_layers=1)
    attn, attn_ref = model.model.layers[0].self_attn, ref.model.layers[0].self_attn
    x = torch.randn(B, T, 64)
    cos, sin = model.model.rotary_emb(x, torch.arange(T)[None])
    f = torch.compile(attn, backend="aot_eager", fullgraph=True)
    got = f(x, position_embeddings=(cos, sin), attention_mask=None)[0]
    want = attn_ref(x, position_embeddings=(cos, sin), attention_mask=None)[0]
    assert_close_rel(got, want, what="attention output")


@pytest.mark.parametrize("router_logits", [False, True])
def test_moe_loss_with_router_aux_loss(router_logits):
    model, ref, _ = patched_pair("mixtral", num_hidden_layers=1, router_aux_loss_coef=0.5)
    ids, labels = batch()
    kw = {"output_router_logits": router_logits}
    out, grads = loss_and_grads(model, ids, labels, **kw)
    want, ref_grads = loss_and_grads(ref, ids, labels, **kw)
    assert out.logits is None  # the aux loss is reproduced, so the fused path runs
    assert_close_rel(out.loss, want.loss, what="loss")
    if router_logits:
        assert_close_rel(out.aux_loss, want.aux_loss, what="aux loss")
        assert len(out.router_logits) == 1
    assert_grads_match(grads, ref_grads)


def test_moe_aux_loss_not_reproducible_falls_back():
    profile = make_profile("mixtral")
    profile.moe = profile.moe.model_copy(update={"aux_loss_function": "some_other_function"})
    ref = tiny_model("mixtral", num_hidden_layers=1)
    model = copy.deepcopy(ref)
    patch(model, profile)
    ids, labels = batch()
    out = model(input_ids=ids, labels=labels, output_router_logits=True)
    assert out.logits is not None  # HF's own forward computed logits, loss and aux loss
    want = ref(input_ids=ids, labels=labels, output_router_logits=True)
    assert_close_rel(out.loss, want.loss, what="loss")
    assert model(input_ids=ids, labels=labels).logits is None  # router off: fused


def test_analyser_profile_patches():
    analyze = pytest.importorskip("kernelwright.integrations.transformers.analysis").analyze
    ref = tiny_model("qwen3")
    model = copy.deepcopy(ref)
    profile = kernelwright.patch(model)  # profile=None runs the analyser
    assert isinstance(profile, ModelProfile) and analyze is not None
    assert patch_record(model).count("norm") > 0
    ids, labels = batch()
    out, grads = loss_and_grads(model, ids, labels)
    want, ref_grads = loss_and_grads(ref, ids, labels)
    assert_close_rel(out.loss, want.loss, what="loss")
    assert_grads_match(grads, ref_grads)


def test_import_kernelwright_does_not_import_transformers():
    code = (
        "import sys, kernelwright; assert 'transformers' not in sys.modules; "
        "kernelwright.patch; assert 'transformers' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# --------------------------------------------------------------------------- with_global


def _helper(x):
    return x + 1


def _twice(f):
    @functools.wraps(f)
    def wrapper(x):
        return 2 * f(x)

    return wrapper


@_twice
def _decorated(x):
    return _helper(x)


def test_with_global_rebuilds_wraps_decorators():
    new = with_global(_decorated, "_helper", lambda x: x + 100)
    assert new(1) == 202 and _decorated(1) == 4  # the decorator kept, the original untouched
    assert new.__wrapped__(1) == 101 and new.__name__ == "_decorated"

    def opaque(f):  # keeps the wrapped function somewhere else than a closure cell
        g = types.SimpleNamespace(f=f)

        def wrapper(x):
            return g.f(x)

        wrapper.__wrapped__ = f
        return wrapper

    with pytest.raises(NotStandardForward, match="elsewhere"):
        with_global(opaque(_decorated.__wrapped__), "_helper", None)
    with pytest.raises(NotStandardForward, match="never reads"):
        with_global(_decorated, "nothing_by_this_name", None)
