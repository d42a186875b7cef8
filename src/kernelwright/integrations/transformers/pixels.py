"""A check batch with images for image-text-to-text models: pixel values, the placeholder tokens
they replace, and what the forward needs beside them, built from the model's own config.

    batch = check_batch(model, batch=2, seq=8)   # parity.Batch; batch.inputs holds the pixels

Nothing here names a model. What the forward takes is read from its signature; the number of
placeholder tokens an image becomes is measured by running the model's own
`get_image_features`; the batch is then run once through the model, and any error leaves the
text-only batch with the reason in `batch.note`. A model on a GPU is searched on a CPU copy
(a rejected layout can end in a device-side assert there, which no `except` recovers from):

- images: `pixel_values` [images, C, S, S] with S the vision config's `image_size` (LLaVA,
  Gemma-3, InternVL, ...), then one or two crops a row ([rows, crops, C, S, S]: Idefics2,
  LLaVA-NeXT), each also with `image_sizes` where the forward takes it (Pixtral); or, where the
  forward takes `image_grid_thw` (Qwen2-VL and kin), flattened patches [t*h*w, C*T*P*P] with a
  grid of 1 x h x w patches, h = w = 2 merge units (so M-RoPE's height and width streams
  differ inside the image);
- one image per row, its placeholder tokens after the third text token; their labels are
  ignored (-100), as a processor's collator does; text tokens avoid the multimodal special
  ids (pad/bos/eos stay). A `get_image_features` that returns patches before the projector
  merges them is tried with its count divided by `spatial_merge_size`^2 too;
- `mm_token_type_ids` (1 at image tokens), where the forward takes it: M-RoPE's position
  streams are computed from it;
- a model with no placeholder token id (GIT, BLIP) gets the pixels beside the text, if its
  forward runs so.

A model whose forward takes no `pixel_values` gets `parity.make_batch`'s batch unchanged.
"""

from __future__ import annotations

import copy
import inspect

import torch
from torch import nn

from kernelwright.integrations.transformers.parity import IGNORE_INDEX, Batch, make_batch

_IMAGE_TOKEN_KEYS = ("image_token_id", "image_token_index", "image_token")


def _forward_params(model: nn.Module) -> set[str]:
    return set(inspect.signature(inspect.unwrap(type(model).forward)).parameters)


def special_token_ids(config) -> set[int]:
    """The token ids a multimodal config names beside pad/bos/eos (image, video, begin/end of
    image, ...): placeholders the model treats specially wherever they appear."""
    out: set[int] = set()
    for key, value in config.to_dict().items():
        if key in ("pad_token_id", "bos_token_id", "eos_token_id"):
            continue
        if not key.endswith(("_token_id", "_token_index", "_token_ids", "image_token")):
            continue
        values = value if isinstance(value, list) else [value]
        out |= {v for v in values if isinstance(v, int) and not isinstance(v, bool)}
    return out


def _image_token(config) -> int | None:
    for key in _IMAGE_TOKEN_KEYS:
        v = getattr(config, key, None)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return None


def _channels(vision) -> int:
    for key in ("in_channels", "in_chans", "num_channels"):
        v = getattr(vision, key, None)
        if isinstance(v, int):
            return v
    return 3


def _candidates(vision, params: set[str], images: int, gen) -> list[dict]:
    """Image inputs of `images` images in the layouts image-text-to-text forwards take, the
    most common first; [] when the vision config gives no size to build them from."""
    patch = getattr(vision, "patch_size", None)
    if "image_grid_thw" in params:
        merge = getattr(vision, "spatial_merge_size", 1) or 1
        temporal = getattr(vision, "temporal_patch_size", 1) or 1
        if not isinstance(patch, int):
            return []
        side = 2 * merge
        width = _channels(vision) * temporal * patch * patch
        grid = {
            "pixel_values": torch.randn(images * side * side, width, generator=gen),
            "image_grid_thw": torch.tensor([[1, side, side]] * images),
        }
        return [grid]
    size = getattr(vision, "image_size", None)
    if isinstance(size, int):
        h = w = size
    elif isinstance(size, list | tuple) and len(size) == 2:
        h, w = size
    else:
        return []
    image = torch.randn(images, _channels(vision), h, w, generator=gen)
    sizes = torch.tensor([[h, w]] * images)
    out = []
    # [images, C, H, W]; then one image of 1 or 2 crops a row ([rows, crops, C, H, W]: Idefics,
    # LLaVA-NeXT's base image and one tile), each also with image_sizes (Pixtral, LLaVA-NeXT)
    for pixels in (image, image[:, None], torch.stack([image, image.flip(-1)], dim=1)):
        out.append({"pixel_values": pixels})
        if "image_sizes" in params:
            out.append({"pixel_values": pixels, "image_sizes": sizes})
    return out


def _feature_rows(features, hidden: int) -> int:
    """How many text positions the image features fill: their elements / the text width."""
    from transformers.utils import ModelOutput

    if isinstance(features, ModelOutput):
        pooled = features.get("pooler_output")
        features = pooled if pooled is not None else features[0]
    if isinstance(features, list | tuple):
        return sum(int(f.numel()) for f in features) // hidden
    return int(features.numel()) // hidden


def _image_features(model: nn.Module, inputs: dict):
    """model.get_image_features on `inputs`, its other required arguments from the config."""
    get = model.get_image_features
    kwargs = {}
    for name, p in inspect.signature(get).parameters.items():
        if name in inputs:
            kwargs[name] = inputs[name]
        elif p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            for cfg in (model.config, getattr(model.config, "vision_config", None)):
                if cfg is not None and getattr(cfg, name, None) is not None:
                    kwargs[name] = getattr(cfg, name)
                    break
            else:
                raise ValueError(f"get_image_features needs {name!r}, which the config lacks")
    with torch.no_grad():
        return get(**kwargs)


def _with_images(model: nn.Module, text: Batch, images: int, seed: int, run: bool) -> Batch:
    """`text` with one image per row; raises when the model takes none of the layouts."""
    params = _forward_params(model)
    cfg = model.config
    vision = getattr(cfg, "vision_config", None)
    if vision is None:
        raise ValueError("no vision_config")
    gen = torch.Generator().manual_seed(seed + 5)
    candidates = _candidates(vision, params, images, gen)
    if not candidates:
        raise ValueError("the vision config has no image_size / patch_size to build images from")
    device = next(model.parameters()).device
    image_token = _image_token(cfg)
    if image_token is None:
        if not run:
            raise ValueError(f"no image token id in the config ({', '.join(_IMAGE_TOKEN_KEYS)})")
        return _without_placeholders(model, text, candidates, device)
    if getattr(model, "get_image_features", None) is None:
        raise ValueError("the model has no get_image_features to count the image tokens")
    hidden = cfg.get_text_config().hidden_size
    # a get_image_features that returns the vision tower's patches before the projector merges
    # them (Pixtral's) over-counts by the merge: those counts are tried after the measured one
    merge = getattr(cfg, "spatial_merge_size", None) or getattr(vision, "spatial_merge_size", 1)
    errors = []
    for inputs in candidates:
        inputs = {k: v.to(device) for k, v in inputs.items()}
        try:
            rows = _feature_rows(_image_features(model, inputs), hidden)
        except Exception as e:  # the next layout, or the text-only batch with the reasons
            errors.append(" ".join(str(e).split())[:120] or type(e).__name__)
            continue
        counts = [rows] + ([rows // merge**2] if merge > 1 and rows % merge**2 == 0 else [])
        for n in counts if run else counts[:1]:
            try:
                if n <= 0 or n % images:
                    raise ValueError(f"{n} image feature rows for {images} images")
                batch = _placed(text, inputs, n // images, image_token, params, device)
                if run:
                    with torch.no_grad():
                        model(
                            input_ids=batch.input_ids.to(device),
                            labels=batch.labels.to(device),
                            **batch.inputs,
                        )
            except Exception as e:
                errors.append(" ".join(str(e).split())[:120] or type(e).__name__)
                continue
            return batch
    raise ValueError("; ".join(dict.fromkeys(errors)))


def _without_placeholders(model: nn.Module, text: Batch, candidates, device) -> Batch:
    """Images beside the text tokens, for a model with no image placeholder token (BLIP-2, GIT:
    it joins the image features to the text itself); the first layout the forward takes."""
    errors = [f"no image token id in the config ({', '.join(_IMAGE_TOKEN_KEYS)})"]
    for inputs in candidates:
        inputs = {k: v.to(device) for k, v in inputs.items()}
        try:
            with torch.no_grad():
                model(input_ids=text.input_ids.to(device), labels=text.labels.to(device), **inputs)
        except Exception as e:
            errors.append(" ".join(str(e).split())[:120] or type(e).__name__)
            continue
        shape = "x".join(str(s) for s in inputs["pixel_values"].shape)
        note = f"{text.input_ids.shape[0]} images, no placeholder tokens (pixel_values {shape})"
        return Batch(text.input_ids, text.labels, inputs=inputs, note=note)
    raise ValueError("; ".join(dict.fromkeys(errors)))


def _placed(text: Batch, inputs: dict, per_image: int, image_token: int, params, device) -> Batch:
    b = text.input_ids.shape[0]
    block = torch.full((b, per_image), image_token)
    ids = torch.cat([text.input_ids[:, :3], block, text.input_ids[:, 3:]], dim=1)
    ignored = torch.full((b, per_image), IGNORE_INDEX)
    labels = torch.cat([text.labels[:, :3], ignored, text.labels[:, 3:]], dim=1)
    inputs = dict(inputs)
    if "mm_token_type_ids" in params:
        inputs["mm_token_type_ids"] = (ids == image_token).long().to(device)
    shape = "x".join(str(s) for s in inputs["pixel_values"].shape)
    note = f"{b} images of {per_image} tokens (pixel_values {shape})"
    return Batch(ids, labels, inputs=inputs, note=note)


def check_batch(
    model: nn.Module, *, batch: int = 2, seq: int = 8, seed: int = 0, run: bool = True
) -> Batch:
    """The check batch for `model`: with images where its forward takes `pixel_values` and
    they run (one per row), else text only (`note` says why). `run`: confirm the image batch
    by one forward with labels first."""
    from kernelwright.integrations.transformers.parity import vocab_size

    params = _forward_params(model)
    if "pixel_values" not in params:
        text = make_batch(vocab_size(model), batch=batch, seq=seq, seed=seed)
        if getattr(model.config, "vision_config", None) is not None:
            text.note = "text only: the forward takes no pixel_values"
        return text
    avoid = special_token_ids(model.config)
    text = make_batch(vocab_size(model), batch=batch, seq=seq, seed=seed, avoid=avoid)
    device = next(model.parameters()).device
    if device.type != "cpu":
        # a layout the model rejects can fail inside a GPU kernel (a device-side assert), which
        # leaves the process's CUDA context unusable: the layouts are tried on a CPU copy of
        # the (tiny) model, and the batch that ran there moves to the model's device
        try:
            cpu_model = copy.deepcopy(model).to("cpu", torch.float32)
        except Exception as e:  # noqa: BLE001  a model that cannot be copied: no image batch
            text.note = f"text only: the model could not be copied to the CPU to try images ({e})"
            return text
        found = _search(cpu_model, text, batch, seed, run)
        found.inputs = {k: v.to(device) for k, v in found.inputs.items()}
        return found
    return _search(model, text, batch, seed, run)


def _search(model: nn.Module, text: Batch, batch: int, seed: int, run: bool) -> Batch:
    was_training = model.training
    try:
        return _with_images(model.eval(), text, batch, seed, run)
    except Exception as e:  # the text-only batch still checks the text decoder
        text.note = f"text only: images did not run ({' '.join(str(e).split())[:300]})"
        return text
    finally:
        model.train(was_training)
