"""Shapes from real model configs: benchmark sweeps take their x values from here.

One line per model, copied from each model's Hugging Face `config.json` (hidden_size,
intermediate_size, num_attention_heads, num_key_value_heads, head_dim, vocab_size). A sweep
"over hidden sizes" is the set of distinct hidden sizes below, so every point on a plot is a
shape someone trains, and adding a model adds its shapes to every sweep.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelConfig:
    name: str
    hidden: int
    intermediate: int  # MLP inner size: the last dim of the SwiGLU gate/up projections
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int


# fmt: off
MODELS: tuple[ModelConfig, ...] = (
    #            name               hidden  intermediate heads kv_heads head_dim vocab
    ModelConfig("Llama-3.2-1B",     2048,   8192,        32,   8,       64,      128256),
    ModelConfig("Llama-3-8B",       4096,   14336,       32,   8,       128,     128256),
    ModelConfig("Qwen2.5-7B",       3584,   18944,       28,   4,       128,     152064),
    ModelConfig("Mistral-7B-v0.3",  4096,   14336,       32,   8,       128,     32768),
    ModelConfig("Gemma-2-9B",       3584,   14336,       16,   8,       256,     256000),
    ModelConfig("Llama-3-70B",      8192,   28672,       64,   8,       128,     128256),
    ModelConfig("Llama-3.1-405B",   16384,  53248,       128,  8,       128,     128256),
)
# fmt: on

BY_NAME: dict[str, ModelConfig] = {m.name: m for m in MODELS}

# The reference model for sweeps that hold the model dims fixed and vary the token count.
REFERENCE = BY_NAME["Llama-3-8B"]

# Tokens per step (batch x sequence) on one GPU: 8192 is e.g. 4 x 2048 or 1 x 8192, a common
# micro-batch for 7-8B models; the sweeps double it from 1K up to where memory allows.
DEFAULT_TOKENS = 8192


def token_counts(lo: int = 1024, hi: int = 32768) -> tuple[int, ...]:
    """Powers of two from `lo` to `hi` inclusive."""
    out = []
    t = lo
    while t <= hi:
        out.append(t)
        t *= 2
    return tuple(out)


def distinct(field: str, models: tuple[ModelConfig, ...] = MODELS) -> tuple[int, ...]:
    """The sorted distinct values of one config field across `models` (e.g. "hidden")."""
    if field not in ModelConfig.__dataclass_fields__ or field == "name":
        raise ValueError(f"distinct: no integer field {field!r} in ModelConfig")
    return tuple(sorted({getattr(m, field) for m in models}))


def models_with(field: str, value: int) -> list[str]:
    """Names of the models whose `field` equals `value` (for plot and table labels)."""
    return [m.name for m in MODELS if getattr(m, field) == value]
