"""The training-step benchmark's model shapes (benchmarks/train_step.py): real models cut to a
few layers, tiny ones for the CPU smoke test, their configs and their input batches.

    shape = MODELS["llama3-8b-4l"]
    config = build_config(shape, layers=None, seq=4096)
    inputs = make_batch(shape, batch=4, seq=4096, seed=0, device=device)  # model(**inputs)

A causal LM's batch is random tokens with labels = input_ids (the forward shifts them). A
vision-language shape (`vlm` set: Qwen2-VL-style configs, whose vision tower takes flattened
patches and `image_grid_thw`) builds the whole image-text-to-text model, the shape's dims being
its text_config, and each sample holds one image: a few random text tokens, <vision_start>, the
image's placeholder tokens (patches a side squared over spatial_merge_size^2), <vision_end>,
text up to `seq`. The batch carries the flattened patches, their grid and `mm_token_type_ids`,
from which transformers 5 computes the M-RoPE positions (get_rope_index); without it the model
would fall back to 1-D positions. Labels ignore the image tokens (-100); there is no padding.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kernelwright.bench.models import BY_NAME, ModelConfig


@dataclass(frozen=True)
class Shape:
    model_type: str  # transformers' model_type
    hidden: int
    intermediate: int  # dense MLP inner size (MoE: the expert inner size, see extra)
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    layers: int
    rope_theta: float
    extra: dict = field(default_factory=dict)  # any other config keys, as transformers names them
    # image-text-to-text shapes: the other keys of the top-level config (vision_config, token
    # ids); the fields above are its text_config. `image`: the side in pixels of each sample's
    # image (one per sample).
    vlm: dict | None = None
    image: int = 0


def _cut(model_type: str, m: ModelConfig, layers: int, rope_theta: float, extra: dict, **kw):
    """A model of the shared registry (kernelwright.bench.models) cut to `layers` layers."""
    dims = (m.hidden, m.intermediate, m.heads, m.kv_heads, m.head_dim, m.vocab)
    return Shape(model_type, *dims, layers, rope_theta, extra, **kw)


# Real models' dims (the dense ones from the shared registry of config.json values; Qwen3-MoE,
# which the op sweeps do not use, here) cut to a few decoder layers, and tiny ones for
# the CPU smoke test (the interpreter runs our kernels there: hidden <= 64, vocab <= 256).
_DEEPSEEK3 = {"first_k_dense_replace": 1, "q_lora_rank": None, "qk_nope_head_dim": 128,
              "qk_rope_head_dim": 64, "v_head_dim": 128, "n_group": 1, "topk_group": 1,
              "norm_topk_prob": True}  # fmt: skip
_GEMMA2_CAPS = {"attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0}
# Qwen2.5-VL-7B-Instruct's config.json: its text decoder has Qwen2.5-7B's dims; the vision
# tower (32 blocks, full attention in blocks 7, 15, 23, 31, windowed elsewhere) is cut to 4
# blocks, the last of them full attention.
_QWEN25_VL_7B_VISION = {
    "depth": 4,
    "hidden_size": 1280,
    "intermediate_size": 3420,
    "num_heads": 16,
    "out_hidden_size": 3584,
    "patch_size": 14,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "window_size": 112,
    "fullatt_block_indexes": [3],
    "tokens_per_second": 2,
}
# tiny: 8x8-pixel images (4x4 patches of 2 pixels, 4 tokens), windows of 2x2 patches
_TINY_VL = {
    "vision_config": {
        "depth": 2,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "out_hidden_size": 64,
        "patch_size": 2,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "window_size": 4,
        "fullatt_block_indexes": [1],
    },
    "image_token_id": 250,
    "video_token_id": 251,
    "vision_start_token_id": 252,
    "vision_end_token_id": 253,
}
# fmt: off
MODELS: dict[str, Shape] = {
    #                     type         hidden inter  heads kv  hd   vocab   L  rope_theta
    "llama3-8b-4l":  _cut("llama", BY_NAME["Llama-3-8B"], 4, 500000.0,
                          {"rms_norm_eps": 1e-5, "max_position_embeddings": 8192}),
    "gemma2-9b-4l":  _cut("gemma2", BY_NAME["Gemma-2-9B"], 4, 10000.0,
                          {**_GEMMA2_CAPS, "query_pre_attn_scalar": 256, "sliding_window": 4096}),
    "qwen3-8b-4l":   Shape("qwen3",      4096, 12288, 32,  8,   128, 151936, 4, 1000000.0,
                           {"rms_norm_eps": 1e-6, "max_position_embeddings": 40960}),
    "qwen3moe-30b-a3b-4l": Shape("qwen3_moe", 2048, 6144, 32, 4, 128, 151936, 4, 1000000.0,
                           {"moe_intermediate_size": 768, "num_experts": 128,
                            "num_experts_per_tok": 8, "norm_topk_prob": True}),
    # Moonlight-16B-A3B: the DeepSeek-V3 architecture (MLA, shared experts, grouped routing)
    "moonlight-16b-a3b-4l": Shape("deepseek_v3", 2048, 11264, 16, 16, 64, 163840, 4, 50000.0,
                           _DEEPSEEK3 | {"moe_intermediate_size": 1408, "n_routed_experts": 64,
                            "num_experts_per_tok": 6, "n_shared_experts": 2,
                            "kv_lora_rank": 512, "routed_scaling_factor": 2.446}),
    "qwen2.5-vl-7b-4l": _cut("qwen2_5_vl", BY_NAME["Qwen2.5-7B"], 4, 1000000.0,
                          {"rms_norm_eps": 1e-6, "max_position_embeddings": 128000,
                           "mrope_section": [16, 24, 24]},
                          vlm={"vision_config": _QWEN25_VL_7B_VISION}, image=448),
    "tiny-llama":    Shape("llama",       64,   128,  4,   2,   16,    256, 2, 500000.0),
    "tiny-gemma2":   Shape("gemma2",      64,   128,  4,   2,   16,    256, 2, 10000.0,
                           {**_GEMMA2_CAPS, "query_pre_attn_scalar": 16, "sliding_window": 8}),
    "tiny-deepseek3": Shape("deepseek_v3", 64, 128, 4,   4,   16,    256, 2, 50000.0,
                           _DEEPSEEK3 | {"moe_intermediate_size": 32, "n_routed_experts": 4,
                            "num_experts_per_tok": 2, "n_shared_experts": 1,
                            "kv_lora_rank": 16, "qk_nope_head_dim": 16, "qk_rope_head_dim": 16,
                            "v_head_dim": 16, "routed_scaling_factor": 2.5}),
    "tiny-qwen3moe": Shape("qwen3_moe",   64,   128,  4,   2,   16,    256, 2, 1000000.0,
                           {"moe_intermediate_size": 32, "num_experts": 4,
                            "num_experts_per_tok": 2, "norm_topk_prob": True}),
    "tiny-qwen2.5-vl": Shape("qwen2_5_vl", 64,  128,  4,   2,   16,    256, 2, 1000000.0,
                           {"mrope_section": [2, 3, 3], "bos_token_id": 0, "eos_token_id": 1},
                           vlm=_TINY_VL, image=8),
}
# fmt: on
FULL_MODELS = ("llama3-8b-4l", "gemma2-9b-4l", "qwen3moe-30b-a3b-4l")


def build_config(shape: Shape, *, layers: int | None, seq: int):
    """The model's config: a causal LM's, or a VLM's with the shape's dims as its text_config
    (`layers` overrides the text layers only; a vision tower keeps its depth)."""
    from transformers import AutoConfig

    kw = dict(
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        vocab_size=shape.vocab,
        num_hidden_layers=layers or shape.layers,
        rope_parameters={"rope_type": "default", "rope_theta": shape.rope_theta},
        use_cache=False,
    )
    kw.update(shape.extra)
    if "mrope_section" in kw:  # M-RoPE: the frequencies split among the 3 position streams
        kw["rope_parameters"] = kw["rope_parameters"] | {"mrope_section": kw.pop("mrope_section")}
    # the rotary tables must cover the sequence
    kw["max_position_embeddings"] = max(kw.get("max_position_embeddings", 0), seq)
    if shape.vlm is not None:
        return AutoConfig.for_model(shape.model_type, text_config=kw, **shape.vlm)
    return AutoConfig.for_model(shape.model_type, **kw)


def make_batch(
    shape: Shape, batch: int, seq: int, *, seed: int, device, layers: int | None = None
) -> dict:
    """The forward's keyword inputs (see the module docstring); the same for every device."""
    g = torch.Generator().manual_seed(seed + 1)  # drawn on the CPU: the same on every device
    if shape.vlm is None:
        ids = torch.randint(0, shape.vocab, (batch, seq), generator=g).to(device)
        return {"input_ids": ids, "labels": ids}
    cfg = build_config(shape, layers=layers, seq=seq)
    vis = cfg.vision_config
    grid = shape.image // vis.patch_size  # patches a side
    tokens = grid * grid // vis.spatial_merge_size**2  # placeholders: patches after the merge
    start = 4  # a few text tokens, <vision_start>, the image's tokens, <vision_end>, text
    if seq < start + tokens + 3:
        raise ValueError(f"a sequence of {seq} tokens cannot hold an image of {tokens} tokens")
    # text tokens below the multimodal ids (image, video, vision start/end)
    special = [v for k, v in cfg.to_dict().items() if k.endswith("_token_id") and v is not None]
    ids = torch.randint(0, min([shape.vocab, *special]), (batch, seq), generator=g)
    ids[:, start] = cfg.vision_start_token_id
    ids[:, start + 1 : start + 1 + tokens] = cfg.image_token_id
    ids[:, start + 1 + tokens] = cfg.vision_end_token_id
    width = vis.in_channels * vis.temporal_patch_size * vis.patch_size**2
    out = {
        "input_ids": ids,
        "labels": ids.masked_fill(ids == cfg.image_token_id, -100),
        # flattened patches as the image processor gives them, and their grid (t, h, w)
        "pixel_values": torch.randn(batch * grid * grid, width, generator=g),
        "image_grid_thw": torch.tensor([[1, grid, grid]] * batch),
        # 1 at image tokens: transformers 5 builds M-RoPE's 3 position streams only with it
        "mm_token_type_ids": (ids == cfg.image_token_id).int(),
    }
    return {k: v.to(device) for k, v in out.items()}


def describe_inputs(shape: Shape, seq: int, layers: int | None = None) -> str:
    """What one sample of make_batch holds, in words."""
    if shape.vlm is None:
        return "text"
    vis = build_config(shape, layers=layers, seq=seq).vision_config
    patches = (shape.image // vis.patch_size) ** 2
    tokens = patches // vis.spatial_merge_size**2
    px = shape.image
    return f"1 image {px}x{px} ({patches} patches -> {tokens} of the {seq} tokens)"
