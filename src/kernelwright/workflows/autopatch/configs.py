"""What the sweep adds to a type's default config before or after shrinking it, and why a type
that still cannot be built fails.

Some default configs (`AutoConfig.for_model(type)`) leave unset a key that the modeling code
reads unconditionally, while every released checkpoint's config.json sets it: the default model
does not build, though the model users load does. `complete(model_type, config, tiny)` sets such
keys as the checkpoints do (sizes at the tiny widths), only where the default leaves them unset,
so the sweep tests the model users train.

`KNOWN_FAILURES` gives, for a type whose unpatched model still fails, the reason found in
transformers' code; the sweep writes it (prefixed "transformers:") before the raised error.
"""

from __future__ import annotations

from collections.abc import Callable


def _sub(config, key: str):
    return getattr(config, key, None)


def _dbrx(c) -> None:
    # DbrxAttention reads attn_config.rope_theta; checkpoints' attn_config carry it, the default
    # DbrxAttentionConfig has no such field (the base moved to rope_parameters)
    if not hasattr(c.attn_config, "rope_theta"):
        c.attn_config.rope_theta = c.rope_parameters["rope_theta"]
    # the attention clamps q/k/v to +-clip_qkv unconditionally (clamp(None, None) raises);
    # DBRX checkpoints set 8
    if c.attn_config.clip_qkv is None:
        c.attn_config.clip_qkv = 8.0


def _qwen4_exp(c) -> None:
    # every "qwen_sparse_attention" layer builds a QSA indexer, whose sizes the default leaves
    # None; one key head (required), budget a multiple of the compression ratio
    t = c.get_text_config()
    if t.indexer_budget is None:
        t.indexer_n_heads, t.indexer_kv_heads, t.indexer_head_dim = 4, 1, 16
        t.indexer_budget, t.indexer_compress_ratio = 8, 4


def _dots1(c) -> None:
    # every layer past first_k_dense_replace is MoE with shared experts; the default sets no
    # expert count, top-k or shared-expert count
    if c.n_routed_experts is None:
        c.n_routed_experts, c.num_experts_per_tok = 4, 2
    if c.n_shared_experts is None:
        c.n_shared_experts = 1


def _layer_types(key: str, kinds: list[str], text: bool = False) -> Callable:
    # a per-layer list the modeling code indexes but the default config leaves None
    def fix(c) -> None:
        t = c.get_text_config() if text else c
        if getattr(t, key, None) is None:
            n = t.num_hidden_layers
            setattr(t, key, [kinds[min(i, len(kinds) - 1)] for i in range(n)])

    return fix


def _cohere_compass(c) -> None:
    # the rotary embedding reads rope_parameters[layer_type] (per-layer-type RoPE); the default
    # has none. mrope_section: the modeling default [22, 22, 20] cut to the tiny head's 8 pairs
    t = c.get_text_config()
    if not t.rope_parameters:
        rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [3, 3, 2]}
        t.rope_parameters = {kind: dict(rope) for kind in set(t.layer_types)}


def _step3p7(c) -> None:
    # the decoder builds a sliding-window mask for every forward; the default window is None
    t = c.get_text_config()
    if t.sliding_window is None:
        t.sliding_window = 8


def _hunyuan_vl(c) -> None:
    # the rotary embedding splits the head over mrope_section (4 axes: position, width, height,
    # image index); the default has none. 8 frequency pairs of the 16-wide tiny head
    t = c.get_text_config()
    if t.rope_parameters.get("mrope_section") is None:
        t.rope_parameters["mrope_section"] = [2, 2, 2, 2]


# model type -> completion of its shrunken config (tiny sizes)
AFTER_SHRINK: dict[str, Callable] = {
    "dbrx": _dbrx,
    "qwen4_exp": _qwen4_exp,
    "qwen4_exp_text": _qwen4_exp,
    "dots1": _dots1,
    # LFM2-MoE: its checkpoints alternate short convolutions and attention
    "lfm2_moe": _layer_types("layer_types", ["conv", "full_attention"]),
    # DeepSeek-OCR-2: a dense first layer, MoE after it
    "deepseek_ocr2": _layer_types("mlp_layer_types", ["dense", "sparse"], text=True),
    "cohere_compass": _cohere_compass,
    "cohere_compass_text": _cohere_compass,
    "step3p7": _step3p7,
    "hunyuan_vl": _hunyuan_vl,
}

_DRAFTER = (
    "an assisted-decoding drafter, not a trainable causal LM: its forward needs the target "
    "model's inputs_embeds and shared_kv_states and takes no labels (and the default config has "
    "no text_config)"
)
_VOCAB_MAP = (
    "the model reads config.vocabulary_map (the tokenizer's image-token ids, which checkpoints "
    "carry) and the default config has none"
)
_GRANITE4_VISION = (
    "the default config falls back to a LlamaConfig text_config (without the Granite "
    "multipliers the decoder reads) and has no deepstack_layer_map, which the model reads"
)
KNOWN_FAILURES: dict[str, str] = {
    "granite4_vision": _GRANITE4_VISION,
    "gemma4_assistant": _DRAFTER,
    "gemma4_unified_assistant": _DRAFTER,
    "chameleon": _VOCAB_MAP,
    "emu3": _VOCAB_MAP,
}


def complete(model_type: str, config) -> None:
    """Set, in place, the keys `AFTER_SHRINK` gives for `model_type` on its shrunken config."""
    fix = AFTER_SHRINK.get(model_type)
    if fix is not None:
        fix(config)


def failure_reason(model_type: str, error: str) -> str:
    """The row's error: the known reason (prefixed "transformers:") before the raised one."""
    reason = KNOWN_FAILURES.get(model_type)
    return f"transformers: {reason} ({error})" if reason else error
