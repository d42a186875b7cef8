"""autopatch on image-text-to-text models: M-RoPE through the rope kernel, and tiny Qwen2.5-VL
and LLaVA trained with images, patched against unpatched.

M-RoPE (Qwen2-VL, Qwen2.5-VL, Qwen3-VL): the text rotary embedding builds cos/sin from three
position streams (temporal, height, width), a section of frequencies each, and the attention
rotates q and k by those tables with rotate_half. The kernel is fed the model's own sectioned
tables and compared with the model's own rotation, forward and backward.
"""

from __future__ import annotations

import copy
import importlib
import types

import pytest
import torch

pytest.importorskip("transformers")

from transformers import AutoConfig, AutoModelForImageTextToText  # noqa: E402

import kernelwright as kw  # noqa: E402
from kernelwright.integrations.transformers import parity, patch_record, replacements  # noqa: E402
from kernelwright.integrations.transformers.analysis import analyze  # noqa: E402
from kernelwright.integrations.transformers.analysis.load import tiny_config  # noqa: E402
from kernelwright.integrations.transformers.pixels import check_batch  # noqa: E402
from kernelwright.ops.rope import rope  # noqa: E402
from kernelwright.testing.convergence import TOLERANCES  # noqa: E402

# model type -> (modeling module, text rotary-embedding class)
MROPE = {
    "qwen2_vl": ("qwen2_vl", "Qwen2VLRotaryEmbedding"),  # contiguous sections
    "qwen2_5_vl": ("qwen2_5_vl", "Qwen2_5_VLRotaryEmbedding"),
    "qwen3_vl": ("qwen3_vl", "Qwen3VLTextRotaryEmbedding"),  # interleaved sections
}


def _tiny_text_config(model_type: str):
    config, _ = tiny_config(AutoConfig.for_model(model_type))
    return config.get_text_config()


@pytest.mark.parametrize("model_type", list(MROPE))
def test_mrope_through_the_rope_kernel_forward_and_backward(model_type, device):
    module_name, rotary_name = MROPE[model_type]
    modeling = importlib.import_module(f"transformers.models.{module_name}.modeling_{module_name}")
    cfg = _tiny_text_config(model_type)
    assert sum(cfg.rope_parameters["mrope_section"]) == cfg.head_dim // 2  # the shrinker's cut
    rot = getattr(modeling, rotary_name)(cfg).to(device)
    b, s, heads, kv, d = 2, 6, 4, 2, cfg.head_dim
    gen = torch.Generator().manual_seed(0)
    pos = torch.randint(0, 64, (3, b, s), generator=gen).to(device)  # three different streams
    x = torch.zeros(b, s, cfg.hidden_size, device=device)
    cos, sin = rot(x, pos)
    # the sections matter: one stream for all of them gives other tables
    same, _ = rot(x, pos[:1].expand(3, b, s))
    assert (cos - same).abs().max() > 1e-3
    # HF's layout: [B, S, H, D] projections viewed as [B, H, S, D]
    q = torch.randn(b, s, heads, d, generator=gen).to(device).transpose(1, 2).requires_grad_()
    k = torch.randn(b, s, kv, d, generator=gen).to(device).transpose(1, 2).requires_grad_()
    gq = torch.randn(b, heads, s, d, generator=gen).to(device)
    gk = torch.randn(b, kv, s, d, generator=gen).to(device)

    ref_q, ref_k = modeling.apply_rotary_pos_emb(q, k, cos, sin)
    ref_dq, ref_dk = torch.autograd.grad((ref_q, ref_k), (q, k), (gq, gk))
    out_q, out_k = rope(q, k, cos, sin)
    dq, dk = torch.autograd.grad((out_q, out_k), (q, k), (gq, gk))
    for got, want in ((out_q, ref_q), (out_k, ref_k), (dq, ref_dq), (dk, ref_dk)):
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


# --------------------------------------------------------------------------- convergence


def _tiny_vlm(model_type: str):
    config, _ = tiny_config(AutoConfig.for_model(model_type))
    config._attn_implementation = "eager"
    vision = config.vision_config
    if isinstance(getattr(vision, "image_size", None), int):
        vision.image_size = 2 * vision.patch_size  # 2 x 2 patches: fewer interpreted rows
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32)
    parity.spread_vectors(model)
    return model


def _on(batch, device):
    """(input_ids, labels, the image inputs) on `device`."""
    inputs = {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.inputs.items()}
    return batch.input_ids.to(device), batch.labels.to(device), inputs


def _train(model, batch, steps: int, lr: float = 1e-3):
    """Per-step losses, the first step's gradients and the final parameters."""
    ids, labels, inputs = _on(batch, next(model.parameters()).device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses, first = [], None
    for i in range(steps):
        opt.zero_grad(set_to_none=True)
        out = model(input_ids=ids, labels=labels, **inputs)
        out.loss.backward()
        if i == 0:
            first = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        opt.step()
        losses.append(float(out.loss.detach()))
    return losses, first, {n: p.detach().clone() for n, p in model.named_parameters()}


def _rel(a: dict, b: dict) -> float:
    num = sum(float((a[n] - b[n]).double().square().sum()) for n in b)
    den = sum(float(b[n].double().square().sum()) for n in b)
    return (num / den) ** 0.5


# model type -> the modules a patch must reach in the tiny model (kind, class)
CONVERGENCE = {
    "qwen2_5_vl": {
        ("norm", "Qwen2_5_VLRMSNorm"),  # text and vision blocks
        ("mlp", "Qwen2_5_VLMLP"),  # the vision blocks' SwiGLU (with biases)
        ("mlp", "Qwen2MLP"),
        ("rope", "Qwen2_5_VLAttention"),  # M-RoPE
        ("causal_lm", "Qwen2_5_VLForConditionalGeneration"),
    },
    "llava": {
        ("norm", "LlamaRMSNorm"),
        ("norm", "LayerNorm"),  # CLIP's
        ("mlp", "LlamaMLP"),
        ("rope", "LlamaAttention"),
        ("causal_lm", "LlavaForConditionalGeneration"),
    },
}


def _wrong_vision(profile, kind: str, class_name: str):
    """A deliberately wrong replacement for a class only the vision tower uses."""
    if kind == "mlp":  # gate and up swapped: silu(up) * gate
        d = next(m for m in profile.mlps if m.class_name == class_name)
        swap = {"gate_attribute": d.up_attribute, "up_attribute": d.gate_attribute}
        return replacements.mlp_forward(d.model_copy(update=swap))
    d = next(n for n in profile.norms if n.class_name == class_name)  # scaled by (1 + w)
    return replacements.norm_forward(d.model_copy(update={"offset": 1.0}))


VISION_ONLY = {"qwen2_5_vl": ("mlp", "Qwen2_5_VLMLP"), "llava": ("norm", "LayerNorm")}


@pytest.mark.parametrize("model_type", list(CONVERGENCE))
def test_vlm_trains_like_unpatched_with_images(model_type, device):
    """Two AdamW steps on one sequence with an image: the patched model's loss at every step,
    its first gradients and its final weights against the unpatched copy's (the convergence
    suite's fp32 tolerances). The vision tower runs, and its norms (and Qwen2.5-VL's SwiGLU
    MLPs) are patched too."""
    model = _tiny_vlm(model_type).to(device)
    # 4 text tokens around one image of 4: 8 rows, one program of the rope kernel
    batch = check_batch(model, batch=1, seq=4, run=False)
    assert batch.has_images, batch.note
    ref = copy.deepcopy(model)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    profile = analyze(model, check=False)
    if model_type == "qwen2_5_vl":  # M-RoPE: the sections' origin is part of the decision
        assert any("mrope_section" in e.source + e.detail for e in profile.rope.evidence)
    kw.patch(model, profile)
    done = {(m.kind, m.class_name) for m in patch_record(model).modules}
    assert CONVERGENCE[model_type] <= done, CONVERGENCE[model_type] - done

    ref_losses, ref_grads, ref_params = _train(ref, batch, steps=2)
    losses, grads, params = _train(model, batch, steps=2)
    tol = TOLERANCES[torch.float32]
    assert ref_losses[-1] < ref_losses[0]  # it trains
    for got, want in zip(losses, ref_losses, strict=True):
        assert abs(got - want) <= tol.loss, (losses, ref_losses)
    assert set(grads) == set(ref_grads)  # the vision tower gets gradients in both
    assert any(n.startswith(("model.visual.", "model.vision_tower.")) for n in grads)
    assert _rel(grads, ref_grads) <= tol.grads
    # ||p - p_ref|| / ||p_ref - p_init||: the difference against how far training moved them
    moved = {n: ref_params[n] - start[n] for n in start}
    assert _rel({n: params[n] - start[n] for n in start}, moved) <= tol.params

    # and the comparison sees the vision path: a wrong patch of a vision-only class differs
    kind, name = VISION_ONLY[model_type]
    wrong = _wrong_vision(profile, kind, name)
    for m in patch_record(model).modules:
        if (m.kind, m.class_name) == (kind, name):
            m.module.forward = types.MethodType(wrong, m.module)
    ids, _, inputs = _on(batch, device)
    with torch.no_grad():  # the log-probs, as the model check compares them
        got, want = (m(input_ids=ids, **inputs).logits.log_softmax(-1) for m in (model, ref))
    assert (got - want).abs().max() > parity.PARITY_TOLERANCES[torch.float32].logprobs


def test_image_text_to_text_types_resolve_and_are_swept():
    """`autopatch llava` is no longer refused; the sweep's second mapping holds the VLMs."""
    from typer.testing import CliRunner

    from kernelwright.cli import app
    from kernelwright.integrations.transformers.analysis.load import resolve
    from kernelwright.workflows.autopatch import sweep as S

    assert resolve("llava").model_cls.__name__ == "LlavaForConditionalGeneration"
    assert resolve("qwen2_vl").model_cls.__name__ == "Qwen2VLForConditionalGeneration"
    vlm_types = S.sweep_types("image-text-to-text")
    assert {"qwen2_vl", "qwen2_5_vl", "qwen3_vl", "llava", "gemma3", "mllama"} <= set(vlm_types)
    assert "llama" in S.sweep_types("causal-lm") and "llava" not in S.sweep_types("causal-lm")
    bad = CliRunner().invoke(app, ["autopatch", "--sweep", "--mapping", "vlm"])
    assert bad.exit_code != 0 and "image-text-to-text" in bad.output
