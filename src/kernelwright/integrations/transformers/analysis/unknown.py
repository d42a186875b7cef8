"""What the analyser says of an input it cannot read: the model types transformers registers,
and a sentence on what the input looked like it meant."""

from __future__ import annotations

import difflib
import re
from pathlib import Path


def known_types() -> tuple[dict, dict]:
    """(causal-LM, image-text-to-text) model type -> class name, as transformers registers them."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
    )

    return MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES


def unknown(source, hint: str = "") -> ValueError:
    causal, vlm = known_types()
    close = difflib.get_close_matches(str(source), list(dict.fromkeys([*causal, *vlm])), n=3)
    maybe = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    return ValueError(
        f"{source!r} is not a causal-LM or image-text-to-text model type, path or model that "
        f"the analyser can read.{hint}{maybe} Pass one of: a model type transformers knows "
        f"(e.g. 'llama', 'qwen3', 'qwen2_vl'; {len(causal)} causal-LM and {len(vlm)} "
        "image-text-to-text types are registered), a directory holding config.json or the "
        "config.json itself, a modeling_*.py file, a PretrainedConfig, or a model instance "
        "(nn.Module, PEFT-wrapped ones included)."
    )


def missing_hint(source: str) -> str:
    """What a string that is neither a model type nor an existing path looks like it meant."""
    parent, ends = Path(source).parent, (".json", ".py")
    if (
        source.startswith((".", "/", "~"))
        or source.endswith(ends)
        or (parent.name != "" and parent.exists())
    ):
        return f" There is no file or directory {source}."
    if re.fullmatch(r"[\w.-]+/[\w.-]+", source):  # org/name
        return " It reads like a Hub id: download its config.json and pass it or its directory."
    return ""
