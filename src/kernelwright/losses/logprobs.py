"""Per-token log-probabilities of target tokens from the last hidden states, never holding the
[tokens, vocab] logits: the primitive every post-training loss here is written on."""

from __future__ import annotations

import torch

from kernelwright.ops.fused_linear_cross_entropy import fused_linear_cross_entropy


def fused_linear_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    ignore_index: int = -100,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """log softmax((hidden @ weight.T + bias) / temperature)[target], per token, in fp32.

    hidden [..., H], weight [V, H] (an lm_head, tied or not), target [...] token ids; a token
    whose target is `ignore_index` gets 0 (mask it out of any sum). Chunked over tokens on the
    fused linear cross-entropy kernels: the forward keeps one chunk's logits at a time, the
    backward recomputes them. Differentiable in hidden, weight and bias.
    """
    if not temperature > 0:
        raise ValueError(f"fused_linear_logprobs: temperature must be > 0, got {temperature}")
    if temperature != 1.0:  # logits / T = (hidden / T) @ weight.T + bias / T, exactly
        hidden = hidden / temperature
        bias = None if bias is None else bias / temperature
    nll = fused_linear_cross_entropy(
        hidden,
        weight,
        target,
        bias,
        ignore_index=ignore_index,
        reduction="none",
        chunk_size=chunk_size,
    )
    return -nll.reshape(target.shape)


def fused_linear_logprobs_ref(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    ignore_index: int = -100,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """The unfused fp32 reference: the full logits, log_softmax, a gather."""
    logits = hidden.float() @ weight.float().T
    if bias is not None:
        logits = logits + bias.float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    keep = target != ignore_index
    picked = logp.gather(-1, torch.where(keep, target, 0).unsqueeze(-1)).squeeze(-1)
    return torch.where(keep, picked, 0.0)


def sequence_logprobs(
    token_logps: torch.Tensor, mask: torch.Tensor, *, average: bool = False
) -> torch.Tensor:
    """Each sequence's log-probability: the sum over its tokens where `mask` is true (the
    mean over them with `average`, as IPO and SimPO take). token_logps, mask: [batch, T]."""
    mask = mask.to(token_logps.dtype)
    total = (token_logps * mask).sum(-1)
    return total / mask.sum(-1).clamp(min=1) if average else total
