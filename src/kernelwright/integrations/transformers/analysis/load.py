"""What the analyser reads: resolve a source to a config and a causal-LM class (an
image-text-to-text type's `*ForConditionalGeneration` when it has no causal-LM class), and build
the tiny CPU instance every introspection and numerical check runs on (`multimodal.py` keeps a
VLM's vision tower, special tokens and M-RoPE sections consistent with it).

No weights are ever downloaded. The tiny instance comes from a shrunken copy of the config
(hidden 64, 4 heads of 16, 2 layers, vocab 128; MoE: 4 experts, top-2; no dropout) built on
CPU in fp32;
per-layer lists (`layer_types`, `no_rope_layers`, ...) are cut to two entries that keep each
kind of layer the original has, so a sliding and a full attention layer both exist.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import importlib
import importlib.util
import inspect
import json
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from kernelwright.integrations.transformers.analysis.multimodal import (
    image_text_to_text_class,
    shrink_mrope,
    shrink_multimodal,
)
from kernelwright.integrations.transformers.analysis.unknown import (
    known_types,
    missing_hint,
    unknown,
)

TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_hidden_layers": 2,
    "vocab_size": 128,
}
TINY_MOE = {
    "num_local_experts": 4,
    "num_experts": 4,
    "n_routed_experts": 4,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32,
}
TINY_TOP_K = {"num_experts_per_tok": 2, "top_k": 2, "moe_topk": 2}
# Sizes under family-specific names, set only where the config has the key and only downwards;
# each group keeps the products its modeling code asserts consistent with the widths above.
TINY_EXTRA = {
    # encoder-decoder configs (BART, Marian, Whisper): decoder depth, widths, heads, vocab
    "decoder_layers": 2,
    "encoder_layers": 2,
    "num_layers": 2,
    "num_blocks": 2,
    "decoder_ffn_dim": 128,
    "encoder_ffn_dim": 128,
    "ffn_dim": 128,
    "dim_ff": 128,
    "decoder_attention_heads": 4,
    "encoder_attention_heads": 4,
    "dim_head": 16,
    "embedding_dim": 64,
    "decoder_vocab_size": 128,
    "expert_ffn_hidden_size": 32,
    "shared_intermediate_size": 32,
    "num_dense_layers": 1,
    # recurrent depth (HRM): one layer per stack, two inner cycles (the no-grad ones stay)
    "num_layers_per_stack": 1,
    "L_cycles": 2,
    # multi-head latent attention (DeepSeek-V2/V3, MiniCPM3, GLM-4-MoE-Lite): rope and nope
    # parts of a 16-wide rotary head, low-rank q and kv
    "qk_rope_head_dim": 16,
    "qk_nope_head_dim": 16,
    "qk_head_dim": 32,
    "v_head_dim": 16,
    "kv_lora_rank": 32,
    "q_lora_rank": 32,
    "index_head_dim": 16,
    "index_n_heads": 2,
    "index_topk": 8,
    "linear_head_dim": 16,
    "linear_num_heads": 4,
    # rotary width in channels (GPT-J, CodeGen): within a 16-wide head
    "rotary_dim": 8,
    # state-space layers (Mamba-2, Bamba, Falcon-H1, Zamba-2): heads x head width = expand x
    # hidden = 128, a small state, chunks that fit the sequence
    "mamba_n_heads": 8,
    "n_mamba_heads": 8,
    "mamba_d_head": 16,
    "mamba_headdim": 16,
    "mamba_d_ssm": 128,
    "mamba_d_state": 16,
    "mamba_chunk_size": 16,
    "mamba_dt_rank": 8,
    "num_heads": 8,
    "state_size": 16,
    "chunk_size": 16,
    "time_step_rank": 8,
    "attention_hidden_size": 128,
    "adapter_rank": 8,
    # grouped top-k routing: groups of the 4 tiny experts
    "n_group": 2,
    "topk_group": 1,
    # other per-model widths: BLT's global hidden, Gemma-3n/4's per-layer inputs
    "hidden_size_global": 64,
    "vocab_size_per_layer_input": 128,
    "hidden_size_per_layer_input": 16,
    # BLT's hashed byte-group embeddings (one table of this many rows per group size)
    "encoder_hash_byte_group_vocab": 128,
    # Step-3.5's sliding-attention layers' own head count
    "num_sliding_attention_heads": 4,
}
TOKEN_IDS = ("pad_token_id", "bos_token_id", "eos_token_id")


@dataclass
class Target:
    """A resolved analyser input."""

    model_type: str
    config: object  # the PretrainedConfig as given (or built): decisions report its values
    model_cls: type
    config_source: str
    modeling_file: str
    instance: nn.Module | None = None  # the caller's (unwrapped) model, when one was passed
    notes: list[str] = field(default_factory=list)


def unwrap(model: nn.Module) -> nn.Module:
    """The transformers model inside PEFT (and similar) wrappers."""
    from transformers import PreTrainedModel

    for _ in range(4):
        if isinstance(model, PreTrainedModel):
            break  # a transformers model's own base_model is its decoder, not a wrapped model
        if hasattr(model, "get_base_model") and callable(model.get_base_model):
            inner = model.get_base_model()
        elif hasattr(model, "base_model") and hasattr(model.base_model, "model"):
            inner = model.base_model.model
        else:
            break
        if inner is model:
            break
        model = inner
    return model


def resolve(source) -> Target:
    from transformers import PretrainedConfig

    if isinstance(source, nn.Module):
        return _from_instance(source)
    if isinstance(source, PretrainedConfig):
        cls = _causal_lm_class(source)
        return Target(
            source.model_type,
            source,
            cls,
            f"config:{type(source).__name__}",
            _modeling_file(cls),
        )
    if isinstance(source, str | Path):
        path = Path(source)
        if path.exists():
            return _from_path(path)
        causal, vlm = known_types()
        if isinstance(source, str) and (source in causal or source in vlm):
            return _from_model_type(source, f"model_type:{source}")
        raise unknown(source, missing_hint(str(source)))
    raise TypeError(
        f"analyze() takes a model type, a path, a PretrainedConfig or an nn.Module, "
        f"not {type(source).__name__}"
    )


def _from_model_type(model_type: str, config_source: str) -> Target:
    from transformers import AutoConfig

    config = AutoConfig.for_model(model_type)
    cls = _causal_lm_class(config)
    return Target(model_type, config, cls, config_source, _modeling_file(cls))


def _from_instance(model: nn.Module) -> Target:
    inner = unwrap(model)
    config = getattr(inner, "config", None)
    if config is None:
        raise ValueError(
            f"{type(inner).__name__} has no .config; pass a transformers model (or its "
            "model type / config.json) instead"
        )
    if inner.get_output_embeddings() is None if hasattr(inner, "get_output_embeddings") else True:
        raise ValueError(
            f"{type(inner).__name__} has no output embeddings (lm_head): pass the causal-LM "
            "model (…ForCausalLM), not the bare base model"
        )
    notes = []
    if inner is not model:
        notes.append(f"unwrapped {type(model).__name__} to {type(inner).__name__}")
    return Target(
        getattr(config, "model_type", type(inner).__name__),
        config,
        type(inner),
        f"instance:{type(model).__name__}",
        _modeling_file(type(inner)),
        instance=inner,
        notes=notes,
    )


def _from_path(path: Path) -> Target:
    if path.is_dir():
        cfg_path = path / "config.json"
        if not cfg_path.exists():
            modeling = sorted(path.glob("modeling_*.py"))
            if len(modeling) == 1:
                return _from_modeling_file(modeling[0])
            raise unknown(str(path), " The directory has no config.json.")
        modeling = sorted(path.glob("modeling_*.py"))
        data = _read_json(cfg_path)
        if modeling and "auto_map" in data:
            return _from_modeling_file(modeling[0])
        return _from_config_json(cfg_path)
    if path.suffix == ".json":
        return _from_config_json(path)
    if path.suffix == ".py":
        return _from_modeling_file(path)
    raise unknown(str(path), " Expected a directory, a .json config or a modeling_*.py file.")


def _read_json(path: Path) -> dict:
    """A config.json's object; a ValueError naming the file for one that is not JSON."""
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} holds a JSON {type(data).__name__}, not a config object")
    return data


def _from_config_json(path: Path) -> Target:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    data = _read_json(path)
    model_type = data.get("model_type")
    if model_type not in CONFIG_MAPPING:
        raise unknown(model_type, f" (model_type of {path})")
    config = CONFIG_MAPPING[model_type].from_dict(data)
    cls = _causal_lm_class(config)
    return Target(model_type, config, cls, str(path), _modeling_file(cls))


def _from_modeling_file(path: Path) -> Target:
    import transformers

    path = path.resolve()
    tf_root = Path(transformers.__file__).resolve().parent
    if tf_root in path.parents:
        mod_name = "transformers." + ".".join(path.relative_to(tf_root).with_suffix("").parts)
        module = importlib.import_module(mod_name)
        model_type = _model_type_of_module(module, path)
        t = _from_model_type(model_type, str(path))
        return t
    module = _import_outside(path)
    cls = _causal_lm_in(module, path)
    config_cls = getattr(cls, "config_class", None)
    if config_cls is None:
        config_cls = _config_class_beside(path)
    cfg_json = path.parent / "config.json"
    if cfg_json.exists():
        config = config_cls.from_dict(_read_json(cfg_json))
        config_source = str(cfg_json)
    else:
        config = config_cls()
        config_source = f"{path} (default {config_cls.__name__})"
    return Target(getattr(config, "model_type", path.stem), config, cls, config_source, str(path))


def _model_type_of_module(module, path: Path) -> str:
    causal, vlm = known_types()
    M = {**vlm, **causal}  # a type in both: its causal-LM class
    names = {n for n, v in vars(module).items() if inspect.isclass(v)}
    types_ = [mt for mt, cls in M.items() if cls in names]
    if not types_:
        raise unknown(str(path), " It defines no causal-LM class that transformers registers.")
    types_.sort(key=lambda mt: (not M[mt].endswith("ForCausalLM"), mt != path.parent.name))
    return types_[0]


def _import_outside(path: Path):
    # modeling files import their siblings relatively (`from .configuration_x import XConfig`):
    # import the file as a submodule of a synthetic package rooted at its directory
    pkg = "kernelwright_autopatch_" + hashlib.sha1(str(path.parent).encode()).hexdigest()[:10]
    if pkg not in sys.modules:
        mod = types.ModuleType(pkg)
        mod.__path__ = [str(path.parent)]
        sys.modules[pkg] = mod
    return importlib.import_module(f"{pkg}.{path.stem}")


def _causal_lm_in(module, path: Path) -> type:
    from transformers import PreTrainedModel

    found = [
        v
        for v in vars(module).values()
        if inspect.isclass(v)
        and issubclass(v, PreTrainedModel)
        and v.__module__ == module.__name__
        and v.__name__.endswith("ForCausalLM")
    ]
    if len(found) != 1:
        raise ValueError(
            f"{path} defines {len(found)} …ForCausalLM classes "
            f"({', '.join(c.__name__ for c in found) or 'none'}); pass a model instance instead"
        )
    return found[0]


def _config_class_beside(path: Path):
    from transformers import PretrainedConfig

    for cfg_file in sorted(path.parent.glob("configuration_*.py")):
        mod = _import_outside(cfg_file)
        for v in vars(mod).values():
            is_config = inspect.isclass(v) and issubclass(v, PretrainedConfig)
            if is_config and v.__module__ == mod.__name__:
                return v
    raise ValueError(
        f"no config class for {path}: add a configuration_*.py beside it, or set config_class "
        "on its causal-LM class"
    )


def _causal_lm_class(config) -> type:
    """The causal-LM class of `config`, else its image-text-to-text class (a VLM's
    `*ForConditionalGeneration`: the analyser patches the text decoder inside it)."""
    import transformers

    M, _vlm = known_types()
    for arch in getattr(config, "architectures", None) or []:
        cls = getattr(transformers, arch, None)
        if cls is not None and arch in M.values():
            return cls
    name = M.get(getattr(config, "model_type", None))
    if name is None:
        cls = image_text_to_text_class(config)
        if cls is None:
            raise unknown(getattr(config, "model_type", None), " (the config's model_type)")
        return cls
    return getattr(transformers, name)


def _modeling_file(cls: type) -> str:
    from kernelwright.integrations.transformers.analysis.source import display_path, source_file

    path = source_file(cls)
    return display_path(path) if path else cls.__module__


# ----------------------------------------------------------------------------- tiny instance


def _pick_indices(values: list, n: int) -> list[int]:
    """n indices of a per-layer list that keep its distinct values (first occurrences first)."""
    picked = []
    for i, v in enumerate(values):
        if v not in [values[j] for j in picked]:
            picked.append(i)
    for i in range(len(values)):
        if len(picked) >= n:
            break
        if i not in picked:
            picked.append(i)
    return sorted(picked[:n])


def _pick_layers(values: list, n: int) -> list:
    """n entries of a per-layer list that keep its distinct values (first occurrences first)."""
    return [values[i] for i in _pick_indices(values, n)]


def tiny_config(config) -> tuple[object, list[str]]:
    """A shrunken copy of `config` (and of its sub-configs) and the notes on what changed."""
    from transformers import PretrainedConfig

    cfg = copy.deepcopy(config)
    notes: list[str] = []

    def shrink(c, depth: int) -> None:
        # sub-configs of sub-configs too (pi0's vlm_config holds a whole VLM config)
        _shrink(c, notes)
        for value in list(vars(c).values()):
            if isinstance(value, PretrainedConfig) and depth < 3:
                shrink(value, depth + 1)
        shrink_multimodal(c, notes)

    shrink(cfg, 0)
    return cfg, notes


def _has(cfg, key: str) -> bool:
    return key in cfg.to_dict() or key in getattr(cfg, "attribute_map", {})


def _get(cfg, key: str):
    # configs may refuse a global read of a per-layer key (Gemma-4's head_dim): None then
    try:
        return getattr(cfg, key, None)
    except Exception:
        return None


def _set(cfg, key: str, value) -> None:
    # a read-only property derived from other keys (Falcon's head_dim) follows them
    with contextlib.suppress(AttributeError):
        setattr(cfg, key, value)


def _shrink(cfg, notes: list[str]) -> None:
    n_orig = getattr(cfg, "num_hidden_layers", None)
    rope_part = _rope_part_of_head(cfg)
    # multi-head attention stays multi-head (latent attention produces one kv head per head)
    mha = _get(cfg, "num_key_value_heads") == _get(cfg, "num_attention_heads")
    for key, value in TINY.items():
        if key == "num_key_value_heads" and mha:
            value = TINY["num_attention_heads"]
        if _has(cfg, key) or key == "head_dim" and _has(cfg, "num_attention_heads"):
            current = _get(cfg, key)
            # per-layer sizes (Gemma3n's intermediate_size) stay lists
            _set(cfg, key, [value] * len(current) if isinstance(current, list) else value)
    n_new = TINY["num_hidden_layers"]
    for key, value in TINY_MOE.items():
        current = _get(cfg, key) if _has(cfg, key) else None
        if isinstance(current, int) and current > 0:
            _set(cfg, key, value)
    experts = any(
        isinstance(_get(cfg, k), int) and _get(cfg, k) > 0 for k in TINY_MOE if _has(cfg, k)
    )
    for key, value in TINY_TOP_K.items():
        current = _get(cfg, key) if _has(cfg, key) else None
        if isinstance(current, int) and current > 0:
            _set(cfg, key, min(current, value))
        elif current is None and experts and _has(cfg, key):
            _set(cfg, key, value)  # a default config with experts but no top-k (DeepSeek-V2)
    for key, value in TINY_EXTRA.items():
        current = _get(cfg, key) if _has(cfg, key) else None
        if isinstance(current, int) and not isinstance(current, bool) and current > value:
            _set(cfg, key, value)
    _consistent(cfg)
    if rope_part is not None:
        _keep_rope_part(cfg, rope_part)
    if isinstance(n_orig, int) and n_orig > n_new:
        original = cfg.to_dict()
        for key, value in list(original.items()):
            if isinstance(value, list) and len(value) == n_orig:
                _set(cfg, key, _pick_layers(value, n_new))
                notes.append(f"{key}: kept {getattr(cfg, key)} of {n_orig} layers")
        # lists of layer indices (Zamba-2's hybrid_layer_ids) follow the layers the layer-type
        # list kept, renumbered
        kinds = next(
            (original[k] for k in ("layer_types", "layers_block_type") if k in original), None
        )
        kept = _pick_indices(kinds, n_new) if isinstance(kinds, list) else list(range(n_new))
        for key, value in original.items():
            ids = isinstance(value, list) and all(isinstance(i, int) for i in value)
            if key.endswith("layer_ids") and ids:
                _set(cfg, key, [kept.index(i) for i in value if i in kept])
        for key in ("mlp_only_layers",):
            v = getattr(cfg, key, None)
            if isinstance(v, list):
                _set(cfg, key, [i for i in v if i < n_new])
        for key in ("first_k_dense_replace", "num_kv_shared_layers"):
            # layer counts inside the stack: keep them below the tiny depth
            v = getattr(cfg, key, None)
            if isinstance(v, int) and v > 1:
                _set(cfg, key, 1 if key == "first_k_dense_replace" else 0)
    vocab = getattr(cfg, "vocab_size", None)
    if isinstance(vocab, int):
        for key in TOKEN_IDS:
            v = getattr(cfg, key, None)
            if isinstance(v, int) and v >= vocab:
                _set(cfg, key, vocab - 1)
            elif isinstance(v, list):
                _set(cfg, key, [i for i in v if i < vocab] or None)
    _shrink_rope(cfg)
    if hasattr(cfg, "use_cache"):
        cfg.use_cache = False
    # no dropout: the model check compares a patched and an unpatched forward in train()
    for key, value in cfg.to_dict().items():
        if ("dropout" in key or "pdrop" in key) and isinstance(value, float):
            _set(cfg, key, 0.0)


def _consistent(cfg) -> None:
    """Sizes a config keeps as products of others, recomputed from the shrunken ones."""
    d = cfg.to_dict()
    heads, width = d.get("mamba_n_heads"), d.get("mamba_d_head")
    if isinstance(d.get("mamba_d_ssm"), int) and isinstance(heads, int) and isinstance(width, int):
        _set(cfg, "mamba_d_ssm", heads * width)  # Falcon-H1: the SSM's inner width
    hidden = d.get("hidden_size")
    if isinstance(d.get("axial_pos_embds_dim"), list | tuple) and isinstance(hidden, int):
        _set(cfg, "axial_pos_embds_dim", [hidden // 2, hidden - hidden // 2])  # Reformer


def _rotary_factor(cfg) -> float:
    rp = getattr(cfg, "rope_parameters", None)
    factor = rp.get("partial_rotary_factor") if isinstance(rp, dict) else None
    return factor or _get(cfg, "partial_rotary_factor") or 1.0


def _rope_part_of_head(cfg) -> float | None:
    """The partial rotary factor where a latent-attention config's rotary width is that part of
    head_dim (Mistral-4: the rotary tables span head_dim x factor, q/k rotate qk_rope_head_dim):
    the shrunken config keeps the two equal. None where they are not tied."""
    rope, head = _get(cfg, "qk_rope_head_dim"), _get(cfg, "head_dim")
    factor = _rotary_factor(cfg)
    tied = isinstance(rope, int) and isinstance(head, int) and rope == int(head * factor)
    if tied and factor < 1:
        return factor
    return None


def _keep_rope_part(cfg, factor: float) -> None:
    rope = int(_get(cfg, "head_dim") * factor)
    _set(cfg, "qk_rope_head_dim", rope)
    nope = _get(cfg, "qk_nope_head_dim")
    if isinstance(_get(cfg, "qk_head_dim"), int) and isinstance(nope, int):
        _set(cfg, "qk_head_dim", nope + rope)  # q/k heads are the nope and rope parts together


def _shrink_rope(cfg) -> None:
    # long/short rope factors have one entry per rotary frequency: cut them to the tiny head
    rp = getattr(cfg, "rope_parameters", None)
    head = TINY["head_dim"]
    for params in [rp] + (list(rp.values()) if isinstance(rp, dict) else []):
        if not isinstance(params, dict):
            continue
        factor = params.get("partial_rotary_factor", getattr(cfg, "partial_rotary_factor", 1.0))
        n = int(head * (factor or 1.0)) // 2
        for key in ("long_factor", "short_factor"):
            if isinstance(params.get(key), list):
                params[key] = params[key][:n]
        shrink_mrope(params, n, cfg)  # M-RoPE's frequencies per position stream sum to n


def build_tiny(model_cls: type, config, seed: int = 0) -> tuple[nn.Module, object, list[str]]:
    """(tiny model, its config, notes): a CPU fp32 instance of `model_cls` from a shrunk config."""
    torch.manual_seed(seed)
    try:
        cfg, notes = tiny_config(config)
        with torch.device("cpu"):
            model = model_cls._from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    except Exception as e:
        raise RuntimeError(
            f"could not build a tiny {model_cls.__name__} from the shrunken config "
            f"({type(e).__name__}: {e}); pass a model instance (kernelwright analyses its "
            "classes) or a config whose sizes can be reduced"
        ) from e
    return model.float().eval(), cfg, notes
