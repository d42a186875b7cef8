"""kernelwright.patch on stacked MoE experts: the tiny qwen3_moe and mixtral, patched from the
analyser's profile, against the unpatched model (loss and every gradient in fp32); unpatch; the
flag; and the instances the patcher must leave alone (with a reason in the record)."""

from __future__ import annotations

import sys
import warnings

import pytest
import torch
from conftest import DEVICE

transformers = pytest.importorskip("transformers")

from kernelwright.integrations.transformers import (  # noqa: E402
    patch,
    patch_record,
    unpatch,
)
from kernelwright.integrations.transformers.analysis import analyze  # noqa: E402
from kernelwright.integrations.transformers.analysis import checks as C  # noqa: E402

RTOL = 2e-5  # fp32, relative to the largest reference entry
B, T, V = 2, 8, 128

_CONFIGS = {
    "qwen3_moe": (
        "Qwen3MoeConfig",
        {"moe_intermediate_size": 32, "num_experts": 6, "num_experts_per_tok": 2, "head_dim": 16},
    ),
    "mixtral": ("MixtralConfig", {"num_local_experts": 4, "num_experts_per_tok": 2}),
}


def tiny_model(model_type: str, seed: int = 0, **overrides):
    cls_name, extra = _CONFIGS[model_type]
    kw = dict(
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=V,
        pad_token_id=0,
        attn_implementation="eager",
        output_router_logits=True,
        router_aux_loss_coef=0.1,
    )
    kw.update(extra)
    kw.update(overrides)
    torch.manual_seed(seed)
    config = getattr(transformers, cls_name)(**kw)
    return transformers.AutoModelForCausalLM.from_config(config).to(DEVICE)


def batch(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, V, (B, T), generator=g).to(DEVICE)
    return ids, ids.clone()


def loss_and_grads(model, ids, labels):
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=labels)
    out.loss.backward()
    return out, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _experts_only(model):
    """Patch only the experts (the other kernels are covered by test_autopatch_patch)."""
    return patch(
        model,
        analyze(model),
        rms_norm=False,
        layer_norm=False,
        rope=False,
        mlp=False,
        fused_linear_cross_entropy=False,
    )


@pytest.mark.parametrize("model_type", list(_CONFIGS))
def test_patched_experts_match_hf(model_type):
    ref = tiny_model(model_type)
    model = tiny_model(model_type)
    profile = _experts_only(model)
    assert profile.moe.expert_layout == "stacked"
    rec = patch_record(model)
    assert rec.count("moe_experts") == 2
    assert all(e.class_name == profile.moe.experts_class for e in rec.modules)
    ids, labels = batch()
    out, grads = loss_and_grads(model, ids, labels)
    want, ref_grads = loss_and_grads(ref, ids, labels)
    assert out.aux_loss is not None
    torch.testing.assert_close(out.loss, want.loss, rtol=RTOL, atol=0)
    assert grads.keys() == ref_grads.keys()
    for name, g in ref_grads.items():
        err = (grads[name] - g).abs().max().item()
        assert err <= RTOL * g.abs().max().item(), name

    unpatch(model)
    assert all("forward" not in m.__dict__ for m in model.modules())
    again, _ = loss_and_grads(model, ids, labels)
    assert torch.equal(again.loss, want.loss)


def test_full_patch_includes_experts():
    ref = tiny_model("qwen3_moe", num_hidden_layers=1)
    model = tiny_model("qwen3_moe", num_hidden_layers=1)
    patch(model)
    rec = patch_record(model)
    assert rec.count("moe_experts") == 1 and rec.count("norm") > 0
    ids, labels = batch()
    out, grads = loss_and_grads(model, ids, labels)
    want, ref_grads = loss_and_grads(ref, ids, labels)
    torch.testing.assert_close(out.loss, want.loss, rtol=1e-4, atol=0)
    for name, g in ref_grads.items():
        torch.testing.assert_close(grads[name], g, rtol=1e-4, atol=1e-4 * g.abs().max().item())


def test_the_profile_notes_do_not_say_patched_experts_are_not():
    # the stacked experts' note (printed by `kernelwright autopatch`) agrees with the patch
    model = tiny_model("qwen3_moe", num_hidden_layers=1)
    profile = patch(model, analyze(model, check=False), rms_norm=False, rope=False)
    assert patch_record(model).count("moe_experts") == 1
    note = next(n for n in profile.notes if "stacked expert weights" in n)
    assert "not patched" not in note and "moe_experts" in note


def test_flag_off_leaves_experts():
    model = tiny_model("mixtral", num_hidden_layers=1)
    patch(model, moe_experts=False)
    rec = patch_record(model)
    assert rec.count("moe_experts") == 0
    assert ("moe_experts", "moe_experts=False") in rec.skipped


def test_module_list_layout_is_skipped():
    model = tiny_model("mixtral", num_hidden_layers=1)
    profile = analyze(model)
    profile.moe = profile.moe.model_copy(update={"expert_layout": "module_list"})
    patch(model, profile)
    rec = patch_record(model)
    assert rec.count("moe_experts") == 0
    assert any(what == "moe_experts" and "stacked" in why for what, why in rec.skipped)


@pytest.mark.parametrize(
    "tamper, reason",
    [
        (lambda ex: setattr(ex, "is_transposed", True), "is_transposed"),
        (lambda ex: setattr(ex, "has_bias", True), "has_bias"),
        (lambda ex: setattr(ex, "act_fn", torch.nn.GELU()), "silu"),
    ],
)
def test_unsupported_instance_is_left_alone(tamper, reason):
    model = tiny_model("qwen3_moe", num_hidden_layers=2)
    profile = analyze(model)
    tamper(model.model.layers[1].mlp.experts)
    with pytest.warns(UserWarning, match="unpatched"):
        patch(model, profile)
    rec = patch_record(model)
    assert rec.count("moe_experts") == 1  # layer 0 only
    (why,) = [w for what, w in rec.skipped if what == "moe_experts model.layers.1.mlp.experts"]
    assert reason in why
    assert "forward" not in model.model.layers[1].mlp.experts.__dict__


def test_no_warning_for_plain_model():
    model = tiny_model("qwen3_moe", num_hidden_layers=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        patch(model)


@pytest.mark.parametrize("interleave", [True, False], ids=["rope_interleave", "half_split"])
def test_deepseek_v3_rope_is_patched_with_parity(interleave):
    # MLA: the rotary function sees q_rot (a split view of each head) and one k_rot head. With
    # rope_interleave the attention calls apply_rotary_pos_emb_interleave (interleaved pairs in,
    # half-split out: the kernel's deinterleave pairing), else apply_rotary_pos_emb; the profile
    # follows the config's branch. Only the rope is patched: loss and every gradient in fp32.
    kw = dict(
        hidden_size=32, intermediate_size=32, moe_intermediate_size=16, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, n_routed_experts=4, num_experts_per_tok=2,
        n_group=1, topk_group=1, q_lora_rank=None, kv_lora_rank=8, qk_rope_head_dim=8,
        qk_nope_head_dim=8, v_head_dim=8, vocab_size=V, pad_token_id=0,
        attn_implementation="eager", rope_interleave=interleave,
    )  # fmt: skip
    models = []
    for _ in range(2):
        torch.manual_seed(0)
        config = transformers.DeepseekV3Config(**kw)
        models.append(transformers.AutoModelForCausalLM.from_config(config).to(DEVICE))
    ref, model = models
    profile = analyze(model, check=False)
    want = ("deinterleave", "apply_rotary_pos_emb_interleave") if interleave else None
    want = want or ("half_split", "apply_rotary_pos_emb")
    assert (profile.rope.status, profile.rope.variant, profile.rope.call_name) == ("patch", *want)
    assert any(e.source == "config:rope_interleave" for e in profile.rope.evidence)
    off = dict(rms_norm=False, layer_norm=False, mlp=False, moe_experts=False)
    patch(model, profile, **off, fused_linear_cross_entropy=False)
    assert patch_record(model).count("rope") == 1
    ids, labels = batch()
    out, grads = loss_and_grads(model, ids, labels)
    expected, ref_grads = loss_and_grads(ref, ids, labels)
    torch.testing.assert_close(out.loss, expected.loss, rtol=RTOL, atol=0)
    assert grads.keys() == ref_grads.keys()
    for name, g in ref_grads.items():
        err = (grads[name] - g).abs().max().item()
        assert err <= RTOL * g.abs().max().item(), name


def _pair(cls_name: str, **kw):
    """(reference, model to patch): the same tiny model twice, from one seed."""
    models = []
    for _ in range(2):
        torch.manual_seed(0)
        config = getattr(transformers, cls_name)(vocab_size=V, pad_token_id=0, **kw)
        config._attn_implementation = "eager"
        models.append(transformers.AutoModelForCausalLM.from_config(config).to(DEVICE))
    return models


def _assert_rope_only_parity(ref, model, profile, n_rope: int):
    off = dict(rms_norm=False, layer_norm=False, mlp=False, moe_experts=False)
    patch(model, profile, **off, fused_linear_cross_entropy=False)
    assert patch_record(model).count("rope") == n_rope
    ids, labels = batch()
    out, grads = loss_and_grads(model, ids, labels)
    expected, ref_grads = loss_and_grads(ref, ids, labels)
    torch.testing.assert_close(out.loss, expected.loss, rtol=RTOL, atol=0)
    assert grads.keys() == ref_grads.keys()
    for name, g in ref_grads.items():
        err = (grads[name] - g).abs().max().item()
        assert err <= RTOL * g.abs().max().item(), name


def _rope_check(site, fn, cos, sin, **shapes) -> bool:
    return C.check_rope(site, fn, cos, sin, **shapes).passed


GPT_OSS = dict(hidden_size=32, intermediate_size=16, num_hidden_layers=2,
               num_attention_heads=2, num_key_value_heads=1, head_dim=16, num_local_experts=4,
               num_experts_per_tok=2)  # fmt: skip


def test_gpt_oss_rope_is_patched_with_parity():
    # GPT-OSS's rotary embedding returns each angle once (cos/sin [.., D/2]) and
    # _apply_rotary_emb rotates torch.chunk halves by them: the kernel's half_table pairing,
    # which the check tells from half_split, then patched (loss and every gradient, fp32, YaRN
    # tables). Its experts (biased, transposed, interleaved gate/up) keep HF's forward; their own
    # clamped gate (alpha, up + 1) is replaced by swiglu_clamped, checked below.
    ref, model = _pair("GptOssConfig", **GPT_OSS)
    profile = analyze(model, check=False)
    rope = profile.rope
    assert (rope.status, rope.variant, rope.call_name) == (
        "patch", "half_table", "apply_rotary_pos_emb",
    )  # fmt: skip
    assert any("torch.chunk(x, 2, dim=-1)" in e.detail for e in rope.evidence)
    fn = sys.modules[type(model).__module__].apply_rotary_pos_emb
    cos, sin = model.model.rotary_emb(torch.zeros(2, 5, 32), torch.arange(5)[None] * 97)
    assert cos.shape[-1] == 8  # one angle a pair of the 16 head dims
    shapes = dict(heads=2, kv_heads=1, head_dim=16)
    assert _rope_check(rope, fn, cos, sin, **shapes)
    assert not _rope_check(
        rope.model_copy(update={"variant": "half_split"}), fn, cos, sin, **shapes
    )
    _assert_rope_only_parity(ref, model, profile, n_rope=2)
    unpatch(model)


def test_gpt_oss_clamped_gate_is_patched_with_parity():
    # Only the experts' _apply_gate replaced: loss and every gradient against the unpatched
    # model, with a limit small enough that the clamp cuts both gate and up; unpatch restores it.
    ref, model = _pair("GptOssConfig", **GPT_OSS)
    for m in (*ref.modules(), *model.modules()):
        if type(m).__name__ == "GptOssExperts":
            m.limit = 0.05  # per instance, as HF's gate reads it
    profile = analyze(model, check=False)
    off = dict(rms_norm=False, layer_norm=False, mlp=False, rope=False)
    patch(model, profile, **off, fused_linear_cross_entropy=False)
    record = patch_record(model)
    assert record.count("moe_experts") == 2, record.summary()
    assert {p.detail for p in record.modules} == {"swiglu_clamped/interleaved"}
    assert all("_apply_gate" in vars(p.module) for p in record.modules)
    ids, labels = batch()
    out, grads = loss_and_grads(model, ids, labels)
    expected, ref_grads = loss_and_grads(ref, ids, labels)
    torch.testing.assert_close(out.loss, expected.loss, rtol=RTOL, atol=0)
    for name, g in ref_grads.items():
        err = (grads[name] - g).abs().max().item()
        assert err <= RTOL * g.abs().max().item(), name
    unpatch(model)
    assert not any("_apply_gate" in vars(m) for m in model.modules())


def test_a_gate_that_is_not_the_clamped_swiglu_is_left_alone():
    # Step-3.7 clamps after the activation: no (alpha, offset, layout) reproduces it
    from kernelwright.integrations.transformers import guards

    class Step37Like(torch.nn.Module):
        limit = 0.5

        def _apply_gate(self, gate_up):
            gate, up = gate_up.chunk(2, dim=-1)
            return torch.nn.functional.silu(gate).clamp(max=self.limit) * up.clamp(-0.5, 0.5)

    class GptOssLike(Step37Like):
        alpha = 1.702

        def _apply_gate(self, gate_up):
            gate, up = gate_up[..., ::2].clamp(max=self.limit), gate_up[..., 1::2]
            up = up.clamp(min=-self.limit, max=self.limit)
            return (up + 1) * (gate * torch.sigmoid(gate * self.alpha))

    spec, why = guards.clamped_gate(Step37Like())
    assert spec is None and "not a clamped SwiGLU" in why
    spec, _ = guards.clamped_gate(GptOssLike())
    assert spec == {"alpha": 1.702, "limit": 0.5, "up_offset": 1.0, "interleaved": True}


def test_deepseek_v32_patches_the_rope_of_mla_and_of_its_indexer():
    # MLA calls apply_rotary_pos_emb_interleave (deinterleave), the DSA indexer
    # apply_rotary_pos_emb on [B, S, H, D] views (half_split, unsqueeze_dim=2): one site each,
    # each checked against its own function, each class patched with its own. index_topk < the
    # sequence, so the indexer's rotation picks the keys attention sees.
    ref, model = _pair(
        "DeepseekV32Config", hidden_size=64, intermediate_size=32, moe_intermediate_size=16,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4,
        num_experts_per_tok=2, n_group=1, topk_group=1, q_lora_rank=16, kv_lora_rank=8,
        qk_rope_head_dim=16, qk_nope_head_dim=8, v_head_dim=8, head_dim=16, index_n_heads=2,
        index_head_dim=24, index_topk=3, first_k_dense_replace=1,
    )  # fmt: skip
    profile = analyze(model, check=False)
    rope = profile.rope
    assert (rope.status, rope.attention_class, rope.variant) == (
        "patch", "DeepseekV32Attention", "deinterleave",
    )  # fmt: skip
    (indexer,) = rope.other_sites
    assert (indexer.status, indexer.attention_class, indexer.call_name) == (
        "patch", "DeepseekV32Indexer", "apply_rotary_pos_emb",
    )  # fmt: skip
    assert (indexer.variant, indexer.unsqueeze_dim) == ("half_split", 2)
    modeling = sys.modules[type(model).__module__]
    cos, sin = model.model.rotary_emb(torch.zeros(2, 5, 64), torch.arange(5)[None] * 97)
    shapes = dict(heads=2, kv_heads=1, head_dim=16)
    assert _rope_check(rope, modeling.apply_rotary_pos_emb_interleave, cos, sin, **shapes)
    assert _rope_check(indexer, modeling.apply_rotary_pos_emb, cos, sin, **shapes)
    # the MLA site's pairing on the indexer's function is caught
    wrong = indexer.model_copy(update={"variant": "deinterleave"})
    assert not _rope_check(wrong, modeling.apply_rotary_pos_emb, cos, sin, **shapes)
    _assert_rope_only_parity(ref, model, profile, n_rope=4)  # 2 layers x (MLA, indexer)
    # a site marked unsupported in review is left alone by itself, with its reason
    unpatch(model)
    indexer.status, indexer.reason = "unsupported", "left alone in review"
    patch(model, profile, rms_norm=False, layer_norm=False, mlp=False, moe_experts=False)
    rec = patch_record(model)
    assert rec.count("rope") == 2 and all(
        p.class_name == "DeepseekV32Attention" for p in rec.modules if p.kind == "rope"
    )
    assert ("rope DeepseekV32Indexer", "unsupported: left alone in review") in rec.skipped
