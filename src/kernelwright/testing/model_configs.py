"""Small configs of the architectures the convergence suite trains (and autopatch is tested on).

`tiny_config(model_type)` keeps the knobs that change the math a patch must reproduce
(soft-capping, multipliers, partial rotary, experts, no-rope and sliding layers): "tiny" for the
CPU suite through Triton's interpreter, "gpu" for realistic widths on a GPU.
`config_for_profile(profile)` builds one for the architecture a ModelProfile describes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# The model types every suite (CPU and GPU) trains patched against unpatched.
ARCHITECTURES = (
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "qwen3_moe",
    "gemma",
    "gemma2",
    "gemma3_text",
    "phi3",
    "olmo2",
    "granite",
    "nemotron",
    "mixtral",
    "smollm3",
)

# Widths per size. head_dim is explicit because several configs derive it from hidden/heads.
SIZES: dict[str, dict[str, Any]] = {
    "tiny": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=256,
        max_position_embeddings=256,
    ),
    "gpu": dict(
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=128,
        vocab_size=32000,
        max_position_embeddings=4096,
    ),
}

# Knobs that only some architectures have, per size: experts and windows scale with the size.
_SIZED_KNOBS: dict[str, dict[str, dict[str, Any]]] = {
    "tiny": {
        "moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64),
        "window": dict(sliding_window=8),  # shorter than the suites' sequences: it masks
    },
    "gpu": {
        "moe": dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=704),
        "window": dict(sliding_window=128),
    },
}

# Per-architecture knobs that change the math the patch must reproduce. Values follow released
# checkpoints where the default config would hide the feature (default 1.0 multipliers, a no-rope
# interval longer than two layers, a sliding pattern that leaves no full layer in two).
ARCH_KNOBS: dict[str, dict[str, Any]] = {
    "mistral": {"window": True},
    "qwen3_moe": {"moe": True, "norm_topk_prob": True},
    "mixtral": {"moe": True, "router_jitter_noise": 0.0},
    "gemma2": {"window": True, "final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0},
    "gemma3_text": {"window": True, "sliding_window_pattern": 2},  # sliding, full
    "phi3": {"partial_rotary_factor": 0.75},  # Phi-4-mini rotates 3/4 of each head
    "granite": {
        # Granite-3 style: logits divided by 8, embeddings x12, damped residuals
        "embedding_multiplier": 12.0,
        "logits_scaling": 8.0,
        "residual_multiplier": 0.22,
        "attention_multiplier": 0.0625,
    },
    "nemotron": {"partial_rotary_factor": 0.5},
    "smollm3": {"no_rope_layer_interval": 2},  # layer 0 rotates, layer 1 has no rope
}

# Shared by every config: no cache while training, token ids inside any vocab, one attention.
_COMMON = dict(use_cache=False, pad_token_id=None, bos_token_id=1, eos_token_id=2)
ATTN_IMPLEMENTATION = "eager"  # the same attention on CPU and GPU, softcapping included


def tiny_config(model_type: str, *, size: str = "tiny", **overrides):
    """A small `transformers` config of `model_type` ("tiny" for the CPU, "gpu" for a GPU).

    Dropout is zero, the attention is eager and `overrides` win over everything else.
    """
    from transformers import AutoConfig

    if size not in SIZES:
        raise ValueError(f"size must be one of {sorted(SIZES)}, got {size!r}")
    kwargs: dict[str, Any] = {**_COMMON, **SIZES[size]}
    for key, value in ARCH_KNOBS.get(model_type, {}).items():
        if key in _SIZED_KNOBS[size]:
            kwargs.update(_SIZED_KNOBS[size][key])
        else:
            kwargs[key] = value
    kwargs.update(overrides)
    try:
        config = AutoConfig.for_model(model_type, **kwargs)
    except ValueError as e:
        raise ValueError(
            f"transformers cannot build a config for model_type {model_type!r}: {e}. "
            f"Known to this harness: {', '.join(ARCHITECTURES)}"
        ) from e
    return _training_ready(config, overrides)


def config_for_profile(profile, *, size: str = "tiny", **overrides):
    """A small config of the architecture a ModelProfile describes, from its `config_source`.

    A config.json source is shrunk to the size's widths, layer count, experts and window,
    keeping its other keys (per-layer lists are cut to the kept layers). Any other source
    ("model_type:<type>", or a config or instance that was analysed) gives
    `tiny_config(profile.model_type)`: the profile keeps no config values beyond its decisions.
    """
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    path = Path(profile.config_source)
    if path.suffix == ".json" and path.is_file():
        return _shrink_config_json(path, size, overrides)
    if profile.model_type in CONFIG_MAPPING:
        return tiny_config(profile.model_type, size=size, **overrides)
    raise ValueError(
        f"cannot build a config for {profile.architecture}: model_type "
        f"{profile.model_type!r} is not registered with transformers and config_source "
        f"{profile.config_source!r} is not a config.json; build the config yourself and pass it "
        "to run_convergence"
    )


def _shrink_config_json(path: Path, size: str, overrides: Mapping[str, Any]):
    from transformers import AutoConfig

    data = json.loads(path.read_text())
    model_type = data.pop("model_type", None)
    if model_type is None:
        raise ValueError(f"{path} has no 'model_type'; cannot tell which config class to build")
    layers = data.get("num_hidden_layers")
    new_layers = overrides.get("num_hidden_layers", SIZES[size]["num_hidden_layers"])
    for key, value in list(data.items()):
        # layer_types, no_rope_layers, ...: one entry per layer, cut to the kept layers
        if isinstance(value, list) and layers is not None and len(value) == layers:
            data[key] = value[:new_layers]
    for key in (
        "architectures",
        "transformers_version",
        "auto_map",
        "_name_or_path",
        "quantization_config",
    ):
        data.pop(key, None)
    # experts and windows shrink with the size, under whichever key this config uses
    sized = {**_SIZED_KNOBS[size]["moe"], **_SIZED_KNOBS[size]["window"]}
    sized["num_local_experts"] = sized["num_experts"]
    for key, value in sized.items():
        if data.get(key) is not None:
            data[key] = value
    kwargs = {**data, **_COMMON, **SIZES[size], **overrides}
    config = AutoConfig.for_model(model_type, **kwargs)
    return _training_ready(config, overrides)


def _training_ready(config, overrides: Mapping[str, Any]):
    # Dropout would draw different masks in the two models; every *dropout / *pdrop float → 0.
    for key, value in config.to_dict().items():
        if (
            ("dropout" in key or "pdrop" in key)
            and isinstance(value, float)
            and key not in overrides
        ):
            setattr(config, key, 0.0)
    config._attn_implementation = overrides.get("attn_implementation", ATTN_IMPLEMENTATION)
    return config
