"""Group-relative policy optimisation (GRPO) and its variants on per-token log-probs.

Definitions as TRL states them. Per token: the importance ratio r = exp(logp - old_logp)
("token" level; "sequence" level, as in GSPO: exp of the masked mean of the log-ratio over the
sequence), clipped to [1 - ε_low, 1 + ε_high]; loss = -min(r·A, clip(r)·A) + β·KL, with the
k3 estimator KL = exp(ref - logp) - (ref - logp) - 1. The variants differ in normalisation:
- "grpo": each sequence's mean over its tokens, then the mean over sequences;
- "bnpo": the sum over every token / the number of tokens in the batch;
- "dr_grpo": the sum / (sequences × max_completion_length) (no length bias);
- "dapo": the sum / `num_items_in_batch` (the active tokens of the whole global batch, as
  gradient accumulation needs; default: this batch's). Under DDP, which averages gradients
  over ranks, pass the global count divided by the world size.
"""

from __future__ import annotations

import torch

GRPO_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")


def grpo_loss(
    logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    old_logps: torch.Tensor | None = None,
    ref_logps: torch.Tensor | None = None,
    beta: float = 0.0,
    epsilon_low: float = 0.2,
    epsilon_high: float | None = None,
    loss_type: str = "dapo",
    importance_sampling_level: str = "token",
    max_completion_length: int | None = None,
    num_items_in_batch: int | float | torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(loss, metrics) from per-token log-probs [B, T] of the sampled completions, their
    advantages [B] and completion mask [B, T]. old_logps None: the policy that sampled is
    this one (ratio 1, gradient unchanged); ref_logps is needed when beta > 0."""
    if loss_type not in GRPO_LOSS_TYPES:
        raise ValueError(
            f"grpo_loss: loss_type must be one of {GRPO_LOSS_TYPES}, got {loss_type!r}"
        )
    if importance_sampling_level not in ("token", "sequence"):
        raise ValueError("grpo_loss: importance_sampling_level must be 'token' or 'sequence'")
    if beta != 0 and ref_logps is None:
        raise ValueError("grpo_loss: beta > 0 needs ref_logps (the KL to the reference)")
    if logps.dim() != 2 or mask.shape != logps.shape or advantages.shape != logps.shape[:1]:
        raise ValueError(
            f"grpo_loss: logps and mask [B, T], advantages [B]; got {tuple(logps.shape)}, "
            f"{tuple(mask.shape)}, {tuple(advantages.shape)}"
        )
    mask = mask.to(logps.dtype)
    old = logps.detach() if old_logps is None else old_logps
    log_ratio = logps - old
    if importance_sampling_level == "sequence":
        log_ratio = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1)).unsqueeze(-1)
    ratio = torch.exp(log_ratio)
    high = epsilon_low if epsilon_high is None else epsilon_high
    clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + high)
    adv = advantages.unsqueeze(-1)
    per_token = -torch.minimum(ratio * adv, clipped * adv)
    metrics: dict[str, torch.Tensor] = {}
    if beta != 0:
        d = ref_logps - logps
        kl = torch.exp(d) - d - 1
        per_token = per_token + beta * kl
        metrics["kl"] = ((kl * mask).sum() / mask.sum().clamp(min=1)).detach()
    per_token = per_token * mask
    if loss_type == "grpo":
        loss = (per_token.sum(-1) / mask.sum(-1).clamp(min=1)).mean()
    elif loss_type == "bnpo":
        loss = per_token.sum() / mask.sum().clamp(min=1)
    elif loss_type == "dr_grpo":
        if max_completion_length is None:
            raise ValueError("grpo_loss: loss_type 'dr_grpo' needs max_completion_length")
        loss = per_token.sum() / (logps.shape[0] * max_completion_length)
    else:  # dapo
        n = mask.sum().clamp(min=1) if num_items_in_batch is None else num_items_in_batch
        loss = per_token.sum() / n
    was_clipped = ((ratio < 1 - epsilon_low) & (adv < 0)) | ((ratio > 1 + high) & (adv > 0))
    metrics["clip_ratio"] = (
        (was_clipped.to(mask.dtype) * mask).sum() / mask.sum().clamp(min=1)
    ).detach()
    return loss, metrics
