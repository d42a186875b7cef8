"""Inputs makers for the registry's demo cases, by the name an entry's `DemoCase.inputs` gives.

Each maker takes (shape, dtype, device, seed) and returns fresh random inputs by argument name.
`shape` is in the maker's own convention (x-like [..., N] unless said otherwise).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from kernelwright.testing.inputs import class_targets, generator, rand

Maker = Callable[[tuple[int, ...], torch.dtype, torch.device, int], dict]


def x(shape, dtype, device, seed):
    return {"x": rand(shape, dtype, device, gen=generator(seed))}


def x_weight(shape, dtype, device, seed):
    gen = generator(seed)
    x = rand(shape, dtype, device, gen=gen)
    return {"x": x, "weight": rand(shape[-1:], dtype, device, gen=gen, mean=1.0, std=0.5)}


def x_residual_weight(shape, dtype, device, seed):
    inputs = x_weight(shape, dtype, device, seed)
    inputs["residual"] = rand(shape, dtype, device, gen=generator(seed + 1))
    return inputs


def x_weight_bias(shape, dtype, device, seed):
    inputs = x_weight(shape, dtype, device, seed)
    inputs["bias"] = rand(shape[-1:], dtype, device, gen=generator(seed + 1), std=0.1)
    return inputs


def gate_up(shape, dtype, device, seed):
    gen = generator(seed)
    return {"gate": rand(shape, dtype, device, gen=gen), "up": rand(shape, dtype, device, gen=gen)}


def gate_up_fused(shape, dtype, device, seed):
    # shape [..., N]: one [..., 2N] input holding [gate | up]
    *lead, n = shape
    return {"x": rand((*lead, 2 * n), dtype, device, gen=generator(seed))}


def jagged(shape, dtype, device, seed):
    # shape's last dim is D; the leading dims' product is the row total, cut into segments
    # of lengths 0..7 (empty ones included)
    *lead, d = shape
    total = 1
    for s in lead:
        total *= s
    gen = generator(seed)
    lengths = torch.randint(0, 8, (total,), generator=gen)
    cut = torch.cumsum(lengths, 0)
    cut = cut[cut < total]
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), cut, torch.tensor([total])])
    return {"values": rand((total, d), dtype, device, gen=gen), "offsets": offsets.to(device)}


def rope(shape, dtype, device, seed):
    # shape = (B, S, Hq, Hk, D, R): q, k as HF's transposed [B, H, S, D] views, random cos/sin
    # [1, S, R] in fp32 (every channel's cos and sin distinct, not just a real table)
    b, s, hq, hk, d, r = shape
    gen = generator(seed)
    return {
        "q": rand((b, s, hq, d), dtype, device, gen=gen).transpose(1, 2),
        "k": rand((b, s, hk, d), dtype, device, gen=gen).transpose(1, 2),
        "cos": rand((1, s, r), torch.float32, device, gen=gen),
        "sin": rand((1, s, r), torch.float32, device, gen=gen),
    }


def _targets(lead, v, gen, device):
    # class indices in [0, V) of shape `lead`, about 1 in 8 of them ignore_index (-100)
    return class_targets(lead, v, gen, device, ignore_fraction=0.125)


def logits_target(shape, dtype, device, seed):
    # shape = (..., V): logits of std 4 (a trained lm-head's spread) and their targets
    gen = generator(seed)
    return {
        "logits": rand(shape, dtype, device, gen=gen, std=4.0),
        "target": _targets(shape[:-1], shape[-1], gen, device),
    }


def hidden_weight_target(shape, dtype, device, seed):
    # shape = (..., H, V): hidden [..., H], lm-head weight [V, H] scaled for logits of std ~3
    *lead, h, v = shape
    gen = generator(seed)
    return {
        "hidden": rand((*lead, h), dtype, device, gen=gen),
        "weight": rand((v, h), dtype, device, gen=gen, std=3.0 / h**0.5),
        "target": _targets(lead, v, gen, device),
    }


MAKERS: dict[str, Maker] = {
    f.__name__: f
    for f in (x, x_weight, x_residual_weight, x_weight_bias, gate_up, gate_up_fused, jagged,
              rope, logits_target, hidden_weight_target)
}  # fmt: skip


def maker(name: str) -> Maker:
    try:
        return MAKERS[name]
    except KeyError:
        raise KeyError(
            f"no inputs maker {name!r} in kernelwright.testing.cases; known: {', '.join(MAKERS)}"
        ) from None
