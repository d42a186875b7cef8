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
    return_entropy: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """log softmax((hidden @ weight.T + bias) / temperature)[target], per token, in fp32.

    hidden [..., H], weight [V, H] (an lm_head, tied or not), target [...] token ids; a token
    whose target is `ignore_index` gets 0 (mask it out of any sum). Chunked over tokens on the
    fused linear cross-entropy kernels: the forward keeps one chunk's logits at a time, the
    backward recomputes them. Differentiable in hidden, weight and bias.

    return_entropy: also each token's entropy of that distribution (every token, ignored ones
    included, as GRPO's entropy masking reads it): (logps, entropy). This path is chunked in
    PyTorch (`chunk_size` tokens of logits at a time, recomputed in the backward).
    """
    if not temperature > 0:
        raise ValueError(f"fused_linear_logprobs: temperature must be > 0, got {temperature}")
    if return_entropy:
        h2 = hidden.reshape(-1, hidden.shape[-1])
        logps, entropy = _LogprobsEntropy.apply(
            h2, weight, bias, target.reshape(-1), float(temperature), ignore_index,
            int(chunk_size or 1024),
        )  # fmt: skip
        return logps.reshape(target.shape), entropy.reshape(target.shape)
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


def _chunk_stats(h, w, b, t, temperature, ignore_index):
    """One chunk: fp32 scaled logits, their log-softmax, the target's log-prob (0 where
    ignored) and the entropy."""
    logits = h.float() @ w.float().T
    if b is not None:
        logits = logits + b.float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    keep = t != ignore_index
    picked = logp.gather(-1, torch.where(keep, t, 0).unsqueeze(-1)).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    return logp, torch.where(keep, picked, 0.0), entropy, keep


class _LogprobsEntropy(torch.autograd.Function):
    """Log-probs of the targets and entropies, chunk by chunk; the backward recomputes each
    chunk's logits: d/dz = dlogp·(onehot - p) - dH·p·(log p + H), over the temperature."""

    @staticmethod
    def forward(ctx, h, w, b, t, temperature, ignore_index, chunk):
        logps = torch.empty(h.shape[0], dtype=torch.float32, device=h.device)
        entropy = torch.empty_like(logps)
        for s in range(0, h.shape[0], chunk):
            r = slice(s, s + chunk)
            _, logps[r], entropy[r], _ = _chunk_stats(h[r], w, b, t[r], temperature, ignore_index)
        ctx.save_for_backward(h, w, *([] if b is None else [b]), t)
        ctx.args = (temperature, ignore_index, chunk, b is not None)
        return logps, entropy

    @staticmethod
    def backward(ctx, d_logps, d_entropy):
        temperature, ignore_index, chunk, has_b = ctx.args
        h, w, *rest = ctx.saved_tensors
        b, t = (rest[0], rest[1]) if has_b else (None, rest[0])
        grad_h = torch.empty_like(h)
        grad_w = torch.zeros(w.shape, dtype=torch.float32, device=w.device)
        grad_b = torch.zeros(w.shape[0], dtype=torch.float32, device=w.device) if has_b else None
        for s in range(0, h.shape[0], chunk):
            r = slice(s, s + chunk)
            logp, _, ent, keep = _chunk_stats(h[r], w, b, t[r], temperature, ignore_index)
            p = logp.exp()
            dl = torch.where(keep, d_logps[r].float(), 0.0)[:, None]
            g = -dl * p
            g.scatter_add_(-1, torch.where(keep, t[r], 0)[:, None], dl)
            g -= d_entropy[r].float()[:, None] * p * (logp + ent[:, None])
            g = g / temperature
            grad_h[r] = (g @ w.float()).to(h.dtype)
            grad_w += g.T @ h[r].float()
            if has_b:
                grad_b += g.sum(0)
        return (grad_h, grad_w.to(w.dtype), None if b is None else grad_b.to(b.dtype),
                None, None, None, None)  # fmt: skip


def fused_linear_logprobs_ref(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    ignore_index: int = -100,
    chunk_size: int | None = None,
    return_entropy: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The unfused fp32 reference: the full logits, log_softmax, a gather (and the entropy)."""
    logits = hidden.float() @ weight.float().T
    if bias is not None:
        logits = logits + bias.float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    keep = target != ignore_index
    picked = logp.gather(-1, torch.where(keep, target, 0).unsqueeze(-1)).squeeze(-1)
    logps = torch.where(keep, picked, 0.0)
    if return_entropy:
        return logps, -(torch.softmax(logits / temperature, -1) * logp).sum(-1)
    return logps


def sequence_logprobs(
    token_logps: torch.Tensor, mask: torch.Tensor, *, average: bool = False
) -> torch.Tensor:
    """Each sequence's log-probability: the sum over its tokens where `mask` is true (the
    mean over them with `average`, as IPO and SimPO take). token_logps, mask: [batch, T]."""
    mask = mask.to(token_logps.dtype)
    total = (token_logps * mask).sum(-1)
    return total / mask.sum(-1).clamp(min=1) if average else total
