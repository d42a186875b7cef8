"""Preference losses on sequence log-probabilities (sum over each response's tokens, or the
mean where a method says so: `sequence_logprobs(..., average=True)`).

Each returns (per-pair losses, chosen rewards, rejected rewards); reduce the losses as the
trainer does (a mean over pairs). Definitions as TRL states them:
- DPO (Rafailov et al. 2023): logits = (pi_c - pi_r) - (ref_c - ref_r), with ref = 0 when
  reference-free; "sigmoid": -log σ(β·logits) (label smoothing ε mixes in -log σ(-β·logits),
  the conservative DPO); "robust": the same mix debiased by 1 / (1 - 2ε) (Chowdhury et al.
  2024); "hinge": relu(1 - β·logits) (RSO); "ipo": (logits - 1 / (2β))², on mean log-probs
  (Azar et al. 2023). Rewards: β·(pi - ref).
- SimPO (Meng et al. 2024): -log σ(β·(avg_c - avg_r) - γ), mean log-probs, no reference.
- CPO (Xu et al. 2024): -log σ(β·(pi_c - pi_r)); the trainer adds α·NLL of the chosen.
- ORPO (Hong et al. 2024), on mean log-probs: log_odds = (c - r) - (log(1 - e^c) - log(1 -
  e^r)); the term -β·log σ(log_odds) is added to the NLL of the chosen.
- KTO (Ethayarajh et al. 2024), unpaired: desirable 1 - σ(β·(logratio - z)), undesirable
  1 - σ(β·(z - logratio)), weighted, with z the reference-KL estimate clamped at 0 (no
  gradient); rewards β·logratio.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

DPO_LOSS_TYPES = ("sigmoid", "robust", "hinge", "ipo")


def _check(name: str, *ts: torch.Tensor | None) -> None:
    shapes = {tuple(t.shape) for t in ts if t is not None}
    if len(shapes) > 1:
        raise ValueError(f"{name}: the log-prob tensors must share a shape, got {sorted(shapes)}")


def _sigmoid_mix(z: torch.Tensor, eps: float) -> torch.Tensor:
    return -F.logsigmoid(z) * (1 - eps) - F.logsigmoid(-z) * eps


def dpo_loss(
    chosen_logps: torch.Tensor,
    rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor | None = None,
    ref_rejected_logps: torch.Tensor | None = None,
    *,
    beta: float = 0.1,
    loss_type: str = "sigmoid",
    label_smoothing: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """DPO and its loss types on [pairs] sequence log-probs; no reference log-probs (both
    None) is the reference-free form."""
    if loss_type not in DPO_LOSS_TYPES:
        raise ValueError(f"dpo_loss: loss_type must be one of {DPO_LOSS_TYPES}, got {loss_type!r}")
    if (ref_chosen_logps is None) != (ref_rejected_logps is None):
        raise ValueError("dpo_loss: pass both reference log-probs, or neither (reference-free)")
    if not 0 <= label_smoothing < 0.5:
        raise ValueError(f"dpo_loss: label_smoothing must be in [0, 0.5), got {label_smoothing}")
    _check("dpo_loss", chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps)
    ref_c = torch.zeros_like(chosen_logps) if ref_chosen_logps is None else ref_chosen_logps
    ref_r = torch.zeros_like(rejected_logps) if ref_rejected_logps is None else ref_rejected_logps
    logits = (chosen_logps - rejected_logps) - (ref_c - ref_r)
    if loss_type == "sigmoid":
        losses = _sigmoid_mix(beta * logits, label_smoothing)
    elif loss_type == "robust":  # the label noise's bias removed
        eps = label_smoothing
        losses = -F.logsigmoid(beta * logits) * (1 - eps) + F.logsigmoid(-beta * logits) * eps
        losses = losses / (1 - 2 * eps)
    elif loss_type == "hinge":
        losses = torch.relu(1 - beta * logits)
    else:  # ipo
        losses = (logits - 1 / (2 * beta)) ** 2
    chosen_rewards = beta * (chosen_logps - ref_c).detach()
    rejected_rewards = beta * (rejected_logps - ref_r).detach()
    return losses, chosen_rewards, rejected_rewards


def simpo_loss(
    chosen_avg_logps: torch.Tensor,
    rejected_avg_logps: torch.Tensor,
    *,
    beta: float = 2.0,
    gamma: float = 0.5,
    label_smoothing: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SimPO on mean (length-normalised) log-probs; γ is the target reward margin."""
    _check("simpo_loss", chosen_avg_logps, rejected_avg_logps)
    z = beta * (chosen_avg_logps - rejected_avg_logps) - gamma
    losses = _sigmoid_mix(z, label_smoothing)
    return losses, beta * chosen_avg_logps.detach(), beta * rejected_avg_logps.detach()


def cpo_loss(
    chosen_logps: torch.Tensor,
    rejected_logps: torch.Tensor,
    *,
    beta: float = 0.1,
    label_smoothing: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """CPO's preference term (no reference model); add α·NLL of the chosen responses."""
    _check("cpo_loss", chosen_logps, rejected_logps)
    losses = _sigmoid_mix(beta * (chosen_logps - rejected_logps), label_smoothing)
    return losses, beta * chosen_logps.detach(), beta * rejected_logps.detach()


def orpo_loss(
    chosen_avg_logps: torch.Tensor, rejected_avg_logps: torch.Tensor, *, beta: float = 0.1
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """ORPO's odds-ratio term per pair (add it to the chosen NLL), the rewards, and the log
    odds ratio. Mean log-probs must be < 0 (a probability below one)."""
    _check("orpo_loss", chosen_avg_logps, rejected_avg_logps)
    log_odds = (chosen_avg_logps - rejected_avg_logps) - (
        torch.log1p(-torch.exp(chosen_avg_logps)) - torch.log1p(-torch.exp(rejected_avg_logps))
    )
    losses = -beta * F.logsigmoid(log_odds)
    return (losses, beta * chosen_avg_logps.detach(), beta * rejected_avg_logps.detach(),
            log_odds.detach())  # fmt: skip


def kto_loss(
    chosen_logps: torch.Tensor,
    rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    kl: torch.Tensor | float = 0.0,
    *,
    beta: float = 0.1,
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """KTO on unpaired examples: [desirable] and [undesirable] sequence log-probs with their
    reference's, `kl` the batch's reference-KL estimate (a scalar). Returns the losses (the
    desirable ones, then the undesirable ones) and the two rewards."""
    _check("kto_loss", chosen_logps, ref_chosen_logps)
    _check("kto_loss", rejected_logps, ref_rejected_logps)
    z = torch.as_tensor(kl, dtype=chosen_logps.dtype, device=chosen_logps.device)
    z = z.detach().clamp(min=0)
    chosen_ratio = chosen_logps - ref_chosen_logps
    rejected_ratio = rejected_logps - ref_rejected_logps
    losses = torch.cat([
        desirable_weight * (1 - torch.sigmoid(beta * (chosen_ratio - z))),
        undesirable_weight * (1 - torch.sigmoid(beta * (z - rejected_ratio))),
    ])  # fmt: skip
    return losses, beta * chosen_ratio.detach(), beta * rejected_ratio.detach()
