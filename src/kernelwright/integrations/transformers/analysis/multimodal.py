"""What the analyser adds for image-text-to-text models: which class to build, and a tiny
config whose vision tower, projector and special tokens stay consistent with the tiny text
decoder.

`load.tiny_config` shrinks every (sub-)config's widths and depths; for a multimodal config this
module then
- shrinks the vision tower's own size keys (`depth`, `embed_dim`, `out_hidden_size`, ...) and
  the projector's (`projector_hidden_size`, ...), and makes its images 4 x 4 patches
  (`image_size = 4 * patch_size`), so the tiny model sees a few image tokens per image, not
  hundreds; keys the model derives from them follow (Gemma-3's `mm_tokens_per_image`,
  LLaVA-NeXT's tiling, layer indices into the vision stack, a Q-Former's or cross-attending
  decoder's `encoder_hidden_size`);
- moves every special token id (`image_token_id`, `boi_token_index`, ...) that lies past the
  tiny text vocabulary to the top ids of that vocabulary, distinct from each other;
- cuts M-RoPE's `mrope_section` (frequencies per position stream: temporal, height, width) to
  the tiny head's rotary width, in the same proportions.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import re
from pathlib import Path

# vision tower size keys, set only downwards (the same widths as the text decoder's tiny config)
TINY_VISION = {
    "depth": 2,
    "embed_dim": 64,
    "num_heads": 4,
    "attention_heads": 4,
    "num_global_layers": 1,
    "num_patches": 16,
    "projection_dim": 64,  # PaliGemma projects the vision output to the text width through it
}
# the projector's own widths on a multimodal config (merged: 2 x 2 patches of the projector's)
_TINY_PROJECTOR = {"projector_hidden_size": 64, "merged_hidden_size": 256, "out_hidden_size": 64}
# per-layer index lists into the vision stack: kept inside the tiny depth
_VISION_INDEX_LISTS = ("fullatt_block_indexes", "deepstack_visual_indexes")
_FEATURE_LAYER_LISTS = ("vision_feature_layers",)
_IMAGE_PATCHES = 4  # patches per image side in the tiny config


def image_text_to_text_class(config) -> type | None:
    """The `*ForConditionalGeneration` (or other image-text-to-text) class of `config`, or None."""
    import transformers
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES as M,
    )

    for arch in getattr(config, "architectures", None) or []:
        cls = getattr(transformers, arch, None)
        if cls is not None and arch in M.values():
            return cls
    name = M.get(getattr(config, "model_type", None))
    return getattr(transformers, name, None) if name else None


def _set(cfg, key: str, value) -> None:
    with contextlib.suppress(AttributeError, TypeError, ValueError):
        setattr(cfg, key, value)


def _is_vision(key: str, sub) -> bool:
    return "vision" in key.lower() or "vision" in type(sub).__name__.lower()


def shrink_multimodal(cfg, notes: list[str]) -> None:
    """Make an already shrunken multimodal config consistent (see the module docstring)."""
    from transformers import PretrainedConfig

    subs = {k: v for k, v in vars(cfg).items() if isinstance(v, PretrainedConfig)}
    if not subs:
        return
    for key, sub in subs.items():
        if _is_vision(key, sub):
            _shrink_vision(sub, notes)
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else None
    d = cfg.to_dict()
    for key, value in _TINY_PROJECTOR.items():
        # the projector between the towers (MiniMax-M3-VL, Muse): widths of the tiny towers
        if isinstance(d.get(key), int) and d[key] > value:
            _set(cfg, key, value)
    if "mm_tokens_per_image" in cfg.to_dict() and isinstance(cfg.mm_tokens_per_image, int):
        # Gemma-3 pools the patch grid to sqrt(mm_tokens_per_image) tokens a side
        _set(cfg, "mm_tokens_per_image", (_IMAGE_PATCHES // 2) ** 2)
    vision = next((v for k, v in subs.items() if _is_vision(k, v)), None)
    depth = _depth(vision) if vision is not None else None
    width = getattr(vision, "hidden_size", None)
    for key, sub in subs.items():
        # a Q-Former or text decoder cross-attending to the vision tower (BLIP, BLIP-2)
        crosses = isinstance(sub.to_dict().get("encoder_hidden_size"), int)
        if crosses and not _is_vision(key, sub) and isinstance(width, int):
            _set(sub, "encoder_hidden_size", width)
    size = getattr(vision, "image_size", None)
    if isinstance(getattr(cfg, "image_grid_pinpoints", None), list) and isinstance(size, int):
        # LLaVA-NeXT's any-resolution tiling: one tile of the tiny image size
        _set(cfg, "image_grid_pinpoints", [[size, size]])
    for key in _FEATURE_LAYER_LISTS:
        layers = getattr(cfg, key, None)
        if not isinstance(layers, list | tuple) or not depth:
            continue
        if any(not -depth - 1 <= i <= depth for i in layers):
            _set(cfg, key, [-2, -1])
            notes.append(f"{key}: {layers} -> [-2, -1] (tiny vision stack of {depth} layers)")
    vocab = getattr(text, "vocab_size", None) if text is not None and text is not cfg else None
    if isinstance(vocab, int):
        _special_ids_in_vocab(cfg, vocab, notes)


def _depth(vision) -> int | None:
    for key in ("depth", "num_hidden_layers"):
        v = getattr(vision, key, None)
        if isinstance(v, int):
            return v
    return None


def _shrink_vision(cfg, notes: list[str]) -> None:
    d = cfg.to_dict()
    for key, value in TINY_VISION.items():
        current = d.get(key)
        if isinstance(current, int) and not isinstance(current, bool) and current > value:
            _set(cfg, key, value)
    hidden = getattr(cfg, "hidden_size", None)
    if isinstance(d.get("out_hidden_size"), int) and isinstance(hidden, int):
        _set(cfg, "out_hidden_size", hidden)  # projected to the (tiny) text width
    depth = _depth(cfg) or 2
    for key in _VISION_INDEX_LISTS:
        if isinstance(d.get(key), list) and d[key]:
            _set(cfg, key, [depth - 1])
    patch = d.get("patch_size")
    size = d.get("image_size")
    if isinstance(patch, int) and isinstance(size, int):
        _set(cfg, "image_size", _IMAGE_PATCHES * patch)
    elif isinstance(patch, list | tuple) and isinstance(size, list | tuple):
        _set(cfg, "image_size", [_IMAGE_PATCHES * p for p in patch])
    elif isinstance(size, list | tuple) and isinstance(patch, int):
        _set(cfg, "image_size", [_IMAGE_PATCHES * patch] * len(size))
    if getattr(cfg, "image_size", size) != size:
        notes.append(f"vision image_size: {size} -> {cfg.image_size} ({_IMAGE_PATCHES}^2 patches)")


def _special_ids_in_vocab(cfg, vocab: int, notes: list[str]) -> None:
    """Token ids of the top-level config past the text vocabulary -> distinct ids below it."""
    taken: set[int] = set()
    text = cfg.get_text_config()
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
        v = getattr(text, key, None)
        if isinstance(v, int):
            taken.add(v)
    d = cfg.to_dict()
    keys = [
        k
        for k, v in d.items()
        if (k.endswith(("_token_id", "_token_index", "_token_ids")) or k == "image_token")
        and (isinstance(v, int) and not isinstance(v, bool) or isinstance(v, list))
    ]
    nxt = vocab - 1

    def fresh() -> int:
        nonlocal nxt
        while nxt in taken:
            nxt -= 1
        taken.add(nxt)
        return nxt

    for key in keys:
        v = d[key]
        if isinstance(v, int) and v >= vocab:
            _set(cfg, key, fresh())
        elif isinstance(v, list) and any(isinstance(i, int) and i >= vocab for i in v):
            _set(cfg, key, [fresh() if isinstance(i, int) and i >= vocab else i for i in v])
        elif isinstance(v, int):
            taken.add(v)
    moved = [k for k in keys if getattr(cfg, k, None) != d[k]]
    if moved:
        notes.append(f"special token ids moved inside the tiny vocabulary of {vocab}: {moved}")


_MROPE_DEFAULT = re.compile(r"""\.get\(\s*["']mrope_section["']\s*,\s*\[([0-9,\s]+)\]\s*\)""")


def mrope_default(config) -> list[int] | None:
    """The `mrope_section` the modeling code falls back to when the config has none
    (`config.rope_parameters.get("mrope_section", [16, 24, 24])` in Qwen2-VL's rotary
    embedding), read from the modeling module beside the config's class; None if it has none."""
    module = type(config).__module__
    if ".configuration_" not in module:
        return None
    spec = importlib.util.find_spec(module.replace(".configuration_", ".modeling_"))
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    found = _MROPE_DEFAULT.search(Path(spec.origin).read_text())
    return [int(v) for v in found.group(1).split(",") if v.strip()] if found else None


def shrink_mrope(params: dict, rotary_pairs: int, config=None) -> None:
    """`mrope_section` (frequency pairs per position stream) cut to `rotary_pairs` in total,
    in the same proportions, each stream keeping at least one. A config without one gets the
    modeling code's default cut the same way (the tiny head has fewer frequencies than the
    default's sections add up to)."""
    text = config is not None and "vision" not in type(config).__name__.lower()
    if "mrope_section" not in params and text and "rope_type" in params:
        default = mrope_default(config)
        if default is not None:
            params["mrope_section"] = list(default)
    sections = params.get("mrope_section")
    if not isinstance(sections, list) or not sections or sum(sections) == rotary_pairs:
        return
    if rotary_pairs < len(sections):
        return
    total = sum(sections)
    exact = [s * rotary_pairs / total for s in sections]
    out = [max(1, math.floor(x)) for x in exact]
    order = sorted(range(len(sections)), key=lambda i: exact[i] - math.floor(exact[i]))
    while sum(out) < rotary_pairs:
        out[order.pop() if order else 0] += 1
    while sum(out) > rotary_pairs:
        out[max(range(len(out)), key=lambda i: out[i])] -= 1
    params["mrope_section"] = out
