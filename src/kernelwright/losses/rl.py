"""Group-relative policy optimisation (GRPO) and its variants on per-token log-probs.

Definitions, option names and defaults are TRL 1.16's (`GRPOTrainer._compute_loss`). Per token:
the importance ratio r = exp(logp - old_logp) ("token" level; "sequence" level, as in GSPO:
exp of the masked mean of the log-ratio over the sequence); the surrogate
-min(r'·A, clip(r, 1 - ε_low, 1 + ε_high)·A), with r' = min(r, δ) when `delta` is set (the
two-sided clipping of INTELLECT-2) and r' = r otherwise; times the high-entropy mask
(`top_entropy_quantile` < 1), the off-policy sequence mask (`off_policy_mask_threshold`) and a
caller's `importance_sampling_ratio` (TRL's vLLM correction) when given; plus β·KL, with the
k3 estimator KL = exp(ref - logp) - (ref - logp) - 1, multiplied by r when
`use_bias_correction_kl` (TRL's default: the unbiased reverse-KL gradient; r carries a
gradient even on-policy, where its value is 1). The variants differ in normalisation:
- "grpo": each sequence's mean over its tokens, then the mean over sequences;
- "bnpo": the sum over every token / the number of tokens in the batch;
- "dr_grpo": the sum / (sequences × max_completion_length) (no length bias);
- "dapo": the sum / `num_items_in_batch`.
Gradient accumulation, as TRL's trainer sums micro-batch gradients: "grpo", "bnpo" and
"dr_grpo" divide by `gradient_accumulation_steps`; "dapo"'s `num_items_in_batch` is the active
tokens of the whole accumulation window (TRL: its input `num_items_in_batch` / processes ×
gradient_accumulation_steps / steps_per_generation), by default this batch's tokens ×
gradient_accumulation_steps. Under DDP, which averages gradients over ranks, pass the global
count divided by the world size; the entropy quantile is this process's (TRL's gathers every
rank's entropies).
"""

from __future__ import annotations

import torch

GRPO_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")


def _high_entropy_mask(entropies: torch.Tensor, mask: torch.Tensor, quantile: float):
    """The tokens whose entropy is at least the (1 - quantile) quantile of the active ones'."""
    active = entropies[mask.bool()].detach().float()
    if active.numel() == 0:
        return torch.zeros_like(mask)
    threshold = torch.quantile(active, 1 - quantile)
    return ((entropies.detach() * mask >= threshold) & mask.bool()).to(mask.dtype)


def _off_policy_mask(advantages, logps, sampling_logps, mask, threshold):
    """DeepSeek-V3.2's off-policy sequence mask: drop a sequence with a negative advantage
    whose mean KL(sampler ‖ policy) over its tokens exceeds the threshold; [B, 1]."""
    kl = torch.nan_to_num(sampling_logps - logps.detach(), nan=0.0)
    seq_kl = (kl * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)
    return ((advantages >= 0) | (seq_kl <= threshold)).to(mask.dtype)


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
    delta: float | None = None,
    loss_type: str = "dapo",
    importance_sampling_level: str = "token",
    use_bias_correction_kl: bool = True,
    max_completion_length: int | None = None,
    num_items_in_batch: int | float | torch.Tensor | None = None,
    gradient_accumulation_steps: int = 1,
    entropies: torch.Tensor | None = None,
    top_entropy_quantile: float = 1.0,
    off_policy_mask_threshold: float | None = None,
    sampling_logps: torch.Tensor | None = None,
    importance_sampling_ratio: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(loss, metrics) from per-token log-probs [B, T] of the sampled completions, their
    advantages [B] (or [B, T]) and completion mask [B, T]. old_logps None: the policy that
    sampled is this one (ratio 1); ref_logps is needed when beta > 0; entropies [B, T] when
    top_entropy_quantile < 1; sampling_logps (the sampler's, default old_logps) for the
    off-policy mask. Each of these is [B, T]; importance_sampling_ratio [B, T] or [B, 1].
    Metrics as TRL computes them: kl (β ≠ 0); clip_ratio (TRL's clip_ratio/region_mean),
    clip_ratio_low, clip_ratio_high."""
    if loss_type not in GRPO_LOSS_TYPES:
        raise ValueError(
            f"grpo_loss: loss_type must be one of {GRPO_LOSS_TYPES}, got {loss_type!r}"
        )
    if importance_sampling_level not in ("token", "sequence"):
        raise ValueError("grpo_loss: importance_sampling_level must be 'token' or 'sequence'")
    if beta != 0 and ref_logps is None:
        raise ValueError("grpo_loss: beta > 0 needs ref_logps (the KL to the reference)")
    if loss_type == "dr_grpo" and max_completion_length is None:
        raise ValueError("grpo_loss: loss_type 'dr_grpo' needs max_completion_length")
    # out of range these divide by zero, or (a quantile above 1) keep every token silently
    if not 0 <= top_entropy_quantile <= 1:
        raise ValueError(f"grpo_loss: top_entropy_quantile must be in [0, 1], "
                         f"got {top_entropy_quantile}")  # fmt: skip
    if not gradient_accumulation_steps >= 1:
        raise ValueError(f"grpo_loss: gradient_accumulation_steps must be >= 1, "
                         f"got {gradient_accumulation_steps}")  # fmt: skip
    if max_completion_length is not None and not max_completion_length >= 1:
        raise ValueError(f"grpo_loss: max_completion_length must be >= 1, "
                         f"got {max_completion_length}")  # fmt: skip
    if top_entropy_quantile < 1 and entropies is None:
        raise ValueError("grpo_loss: top_entropy_quantile < 1 needs the per-token entropies")
    if (
        logps.dim() != 2
        or mask.shape != logps.shape
        or advantages.shape not in (logps.shape[:1], logps.shape)
    ):
        raise ValueError(
            f"grpo_loss: logps and mask [B, T], advantages [B] or [B, T]; got "
            f"{tuple(logps.shape)}, {tuple(mask.shape)}, {tuple(advantages.shape)}"
        )
    per_token = dict(old_logps=old_logps, ref_logps=ref_logps, entropies=entropies,
                     sampling_logps=sampling_logps)  # fmt: skip
    for name, t in per_token.items():
        if t is not None and t.shape != logps.shape:
            raise ValueError(f"grpo_loss: {name} must be [B, T] like logps, "
                             f"{tuple(logps.shape)}; got {tuple(t.shape)}")  # fmt: skip
    isr = importance_sampling_ratio  # [B, 1]: TRL's sequence-level correction
    if isr is not None and isr.shape not in (logps.shape, logps.shape[:1] + (1,)):
        raise ValueError(f"grpo_loss: importance_sampling_ratio must be [B, T] like logps, "
                         f"{tuple(logps.shape)} (or [B, 1]); got {tuple(isr.shape)}")  # fmt: skip
    mask = mask.to(logps.dtype)
    adv = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages
    old = logps.detach() if old_logps is None else old_logps
    log_ratio = logps - old
    if importance_sampling_level == "sequence":
        log_ratio = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1)).unsqueeze(-1)
    ratio = torch.exp(log_ratio)  # [B, T], or [B, 1] at sequence level
    high = epsilon_low if epsilon_high is None else epsilon_high
    clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + high)
    unclipped = ratio if delta is None else torch.clamp(ratio, max=delta)
    per_token = -torch.minimum(unclipped * adv, clipped * adv)
    if off_policy_mask_threshold is not None:
        sampler = old if sampling_logps is None else sampling_logps
        per_token = per_token * _off_policy_mask(adv, logps, sampler, mask,
                                                 off_policy_mask_threshold)  # fmt: skip
    if top_entropy_quantile < 1:
        per_token = per_token * _high_entropy_mask(entropies, mask, top_entropy_quantile)
    if importance_sampling_ratio is not None:
        per_token = per_token * importance_sampling_ratio
    metrics: dict[str, torch.Tensor] = {}
    n_tokens = mask.sum().clamp(min=1)
    if beta != 0:
        d = ref_logps - logps
        kl = torch.exp(d) - d - 1
        if use_bias_correction_kl:
            kl = kl * ratio
        per_token = per_token + beta * kl
        metrics["kl"] = ((kl * mask).sum() / n_tokens).detach()
    per_token = per_token * mask
    if loss_type == "grpo":
        loss = (per_token.sum(-1) / mask.sum(-1).clamp(min=1)).mean()
    elif loss_type == "bnpo":
        loss = per_token.sum() / n_tokens
    elif loss_type == "dr_grpo":
        loss = per_token.sum() / (logps.shape[0] * max_completion_length)
    else:  # dapo: the window's token count already covers the accumulation
        if num_items_in_batch is None:
            n = n_tokens * gradient_accumulation_steps
        elif torch.is_tensor(num_items_in_batch):
            n = num_items_in_batch.clamp(min=1)
        else:
            n = max(num_items_in_batch, 1)
        loss = per_token.sum() / n
    if loss_type != "dapo":
        loss = loss / gradient_accumulation_steps

    # clip fractions over the active tokens (over the sequences at sequence level), with the
    # ratio after the two-sided clipping, as TRL logs them
    def masked_mean(x: torch.Tensor) -> torch.Tensor:
        x = x.to(mask.dtype)
        return (x.mean() if x.shape[-1] == 1 else (x * mask).sum() / n_tokens).detach()

    low = (unclipped < 1 - epsilon_low) & (adv < 0)
    high_clipped = (unclipped > 1 + high) & (adv > 0)
    metrics["clip_ratio"] = masked_mean(low | high_clipped)
    metrics["clip_ratio_low"] = masked_mean(low)
    metrics["clip_ratio_high"] = masked_mean(high_clipped)
    return loss, metrics
