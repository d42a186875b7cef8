"""Preference losses on sequence log-probabilities (sum over each response's tokens, or the
mean where a method says so: `sequence_logprobs(..., average=True)`).

Each returns (per-pair losses, chosen rewards, rejected rewards); reduce the losses as the
trainer does (a mean over pairs). Definitions, option names and defaults are TRL 1.16's
(`DPOTrainer`, `trl.experimental`'s `CPOTrainer` and `ORPOTrainer`, `KTOTrainer`):
- DPO (Rafailov et al. 2023): h = (pi_c - pi_r) - (ref_c - ref_r), with ref = 0 when
  reference-free; "sigmoid": -log σ(β·h); "robust" (Chowdhury et al. 2024): label noise ε,
  ((1 - ε)·-log σ(β·h) - ε·-log σ(-β·h)) / (1 - 2ε); "hinge" (RSO): relu(1 - β·h); "ipo"
  (Azar et al. 2023): (h - 1 / (2β))², on mean log-probs. `label_smoothing` changes "robust"
  only: TRL 1.16 dropped the conservative-DPO smoothing of "sigmoid" (and never smoothed
  "hinge" and "ipo"), so there it is ignored, with a warning. Rewards: β·(pi - ref).
- CPO (Xu et al. 2024), no reference: h = pi_c - pi_r (sums; means for "ipo" and "simpo");
  "sigmoid": (1 - ε)·-log σ(β·h) + ε·-log σ(-β·h) (ε = label_smoothing; conservative);
  "simpo" (Meng et al. 2024): the same on h - γ/β (γ = simpo_gamma, the target margin);
  "hinge" and "ipo" as in DPO, ε ignored. `alpha` ≠ 0 (AlphaPO, Gupta et al. 2025) replaces
  each log-prob by the reward (1 - p^(-α)) / α first. The trainer adds cpo_alpha·NLL of the
  chosen responses ("alphapo" is "simpo" with cpo_alpha = 0). SimPO is CPO's "simpo".
- ORPO (Hong et al. 2024), on mean log-probs (< 0): log_odds = (c - r) - (log(1 - e^c) -
  log(1 - e^r)), log(1 - e^x) evaluated stably; the term -β·log σ(log_odds) is added to the
  NLL of the chosen (TRL returns β·log σ(log_odds) and subtracts it).
- KTO (Ethayarajh et al. 2024), unpaired: "kto": desirable 1 - σ(β·(logratio - z)),
  undesirable 1 - σ(β·(z - logratio)), weighted, with z the reference-KL estimate clamped at
  0 (no gradient); "apo_zero_unpaired" (APO-zero, D'Oosterlinck et al. 2024, unpaired):
  1 - σ(β·logratio) and σ(β·logratio), no KL estimate; rewards β·logratio.
"""

from __future__ import annotations

import math
import warnings

import torch
import torch.nn.functional as F

DPO_LOSS_TYPES = ("sigmoid", "robust", "hinge", "ipo")
CPO_LOSS_TYPES = ("sigmoid", "hinge", "ipo", "simpo", "alphapo")
KTO_LOSS_TYPES = ("kto", "apo_zero_unpaired")


def _check(name: str, *ts: torch.Tensor | None) -> None:
    shapes = {tuple(t.shape) for t in ts if t is not None}
    if len(shapes) > 1:
        raise ValueError(f"{name}: the log-prob tensors must share a shape, got {sorted(shapes)}")


def _check_beta(name: str, beta: float, loss_type: str, divides: tuple[str, ...]) -> None:
    if loss_type in divides and not beta > 0:
        raise ValueError(f"{name}: beta must be > 0 for loss_type {loss_type!r} (the loss "
                         f"divides by it), got {beta}")  # fmt: skip


def _sigmoid_mix(z: torch.Tensor, eps: float) -> torch.Tensor:
    return -F.logsigmoid(z) * (1 - eps) - F.logsigmoid(-z) * eps


def _hinge_or_ipo(h: torch.Tensor, beta: float, loss_type: str) -> torch.Tensor:
    """The margin losses DPO and CPO share: "hinge" relu(1 - β·h), "ipo" (h - 1/(2β))²."""
    if loss_type == "hinge":
        return torch.relu(1 - beta * h)
    return (h - 1 / (2 * beta)) ** 2


def _ignored_smoothing(name: str, loss_type: str, label_smoothing: float) -> None:
    if label_smoothing != 0:
        warnings.warn(
            f"{name}: label_smoothing has no effect on loss_type {loss_type!r} (as in TRL 1.16)",
            stacklevel=3,
        )


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
    """DPO and its loss types on [pairs] sequence log-probs (mean log-probs for "ipo"); no
    reference log-probs (both None) is the reference-free form. `label_smoothing` is the
    "robust" loss's label-flip probability, in [0, 0.5) (TRL only warns outside it)."""
    if loss_type not in DPO_LOSS_TYPES:
        raise ValueError(f"dpo_loss: loss_type must be one of {DPO_LOSS_TYPES}, got {loss_type!r}")
    if (ref_chosen_logps is None) != (ref_rejected_logps is None):
        raise ValueError("dpo_loss: pass both reference log-probs, or neither (reference-free)")
    if loss_type == "robust" and not 0 <= label_smoothing < 0.5:
        raise ValueError(f"dpo_loss: label_smoothing must be in [0, 0.5), got {label_smoothing}")
    if loss_type != "robust":
        _ignored_smoothing("dpo_loss", loss_type, label_smoothing)
    _check_beta("dpo_loss", beta, loss_type, ("ipo",))
    _check("dpo_loss", chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps)
    ref_c = torch.zeros_like(chosen_logps) if ref_chosen_logps is None else ref_chosen_logps
    ref_r = torch.zeros_like(rejected_logps) if ref_rejected_logps is None else ref_rejected_logps
    chosen_ratio, rejected_ratio = chosen_logps - ref_c, rejected_logps - ref_r
    h = chosen_ratio - rejected_ratio
    if loss_type == "sigmoid":
        losses = -F.logsigmoid(beta * h)
    elif loss_type == "robust":  # the label noise's bias removed
        eps = label_smoothing
        losses = -F.logsigmoid(beta * h) * (1 - eps) + F.logsigmoid(-beta * h) * eps
        losses = losses / (1 - 2 * eps)
    else:
        losses = _hinge_or_ipo(h, beta, loss_type)
    return losses, beta * chosen_ratio.detach(), beta * rejected_ratio.detach()


def cpo_loss(
    chosen_logps: torch.Tensor,
    rejected_logps: torch.Tensor,
    *,
    beta: float = 0.1,
    loss_type: str = "sigmoid",
    label_smoothing: float = 0.0,
    simpo_gamma: float = 0.5,
    alpha: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """CPO's preference term and its loss types (no reference model) on [pairs] sequence
    log-probs: sums for "sigmoid" and "hinge", means for "ipo" and "simpo" ("alphapo" is
    "simpo"). Add cpo_alpha·NLL of the chosen responses (TRL's default cpo_alpha is 1; 0 for
    "alphapo")."""
    if loss_type not in CPO_LOSS_TYPES:
        raise ValueError(f"cpo_loss: loss_type must be one of {CPO_LOSS_TYPES}, got {loss_type!r}")
    if loss_type in ("hinge", "ipo"):
        _ignored_smoothing("cpo_loss", loss_type, label_smoothing)
    _check_beta("cpo_loss", beta, loss_type, ("ipo", "simpo", "alphapo"))
    _check("cpo_loss", chosen_logps, rejected_logps)
    if alpha != 0:  # AlphaPO's reward shape: (1 - p^(-α)) / α
        chosen = (1 - torch.exp(chosen_logps).pow(-alpha)) / alpha
        rejected = (1 - torch.exp(rejected_logps).pow(-alpha)) / alpha
    else:
        chosen, rejected = chosen_logps, rejected_logps
    h = chosen - rejected
    if loss_type in ("simpo", "alphapo"):
        losses = _sigmoid_mix(beta * (h - simpo_gamma / beta), label_smoothing)
    elif loss_type == "sigmoid":
        losses = _sigmoid_mix(beta * h, label_smoothing)
    else:
        losses = _hinge_or_ipo(h, beta, loss_type)
    return losses, beta * chosen.detach(), beta * rejected.detach()


def simpo_loss(
    chosen_avg_logps: torch.Tensor,
    rejected_avg_logps: torch.Tensor,
    *,
    beta: float = 2.0,
    gamma: float = 0.5,
    label_smoothing: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SimPO on mean (length-normalised) log-probs, γ the target reward margin: CPO's
    "simpo" loss type (without CPO's NLL term)."""
    return cpo_loss(chosen_avg_logps, rejected_avg_logps, beta=beta, loss_type="simpo",
                    simpo_gamma=gamma, label_smoothing=label_smoothing)  # fmt: skip


_MINUS_LN2 = -math.log(2)


def _log1mexp(x: torch.Tensor) -> torch.Tensor:
    """log(1 - e^x) for x < 0 without cancellation: log1p(-e^x) below -ln 2, log(-expm1(x))
    above; each branch sees only its own inputs, so neither sends an inf or NaN gradient."""
    low = x < _MINUS_LN2
    a = torch.log1p(-torch.exp(torch.where(low, x, _MINUS_LN2)))
    b = torch.log(-torch.expm1(torch.where(low, _MINUS_LN2, x)))
    return torch.where(low, a, b)


def orpo_loss(
    chosen_avg_logps: torch.Tensor, rejected_avg_logps: torch.Tensor, *, beta: float = 0.1
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """ORPO's odds-ratio term per pair (add it to the chosen NLL), the rewards, and the log
    odds ratio, in fp32. Mean log-probs must be < 0 (a probability below one)."""
    _check("orpo_loss", chosen_avg_logps, rejected_avg_logps)
    c, r = chosen_avg_logps.float(), rejected_avg_logps.float()
    log_odds = (c - r) - (_log1mexp(c) - _log1mexp(r))
    losses = -beta * F.logsigmoid(log_odds)
    return losses, beta * c.detach(), beta * r.detach(), log_odds.detach()


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
    loss_type: str = "kto",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """KTO on unpaired examples: [desirable] and [undesirable] sequence log-probs with their
    reference's, `kl` the batch's reference-KL estimate (a scalar; "apo_zero_unpaired" does not
    read it). Returns the losses (the desirable ones, then the undesirable ones) and the two
    rewards; the trainer's loss is their mean."""
    if loss_type not in KTO_LOSS_TYPES:
        raise ValueError(f"kto_loss: loss_type must be one of {KTO_LOSS_TYPES}, "
                         f"got {loss_type!r}")  # fmt: skip
    _check("kto_loss", chosen_logps, ref_chosen_logps)
    _check("kto_loss", rejected_logps, ref_rejected_logps)
    if torch.is_tensor(kl) and kl.numel() != 1:
        raise ValueError(f"kto_loss: kl must be a scalar (the batch's reference-KL estimate), "
                         f"got shape {tuple(kl.shape)}")  # fmt: skip
    chosen_ratio = chosen_logps - ref_chosen_logps
    rejected_ratio = rejected_logps - ref_rejected_logps
    if loss_type == "kto":
        z = torch.as_tensor(kl, dtype=chosen_logps.dtype, device=chosen_logps.device)
        z = z.detach().clamp(min=0)
        chosen = 1 - torch.sigmoid(beta * (chosen_ratio - z))
        rejected = 1 - torch.sigmoid(beta * (z - rejected_ratio))
    else:
        chosen = 1 - torch.sigmoid(beta * chosen_ratio)
        rejected = torch.sigmoid(beta * rejected_ratio)
    losses = torch.cat([desirable_weight * chosen, undesirable_weight * rejected])
    return losses, beta * chosen_ratio.detach(), beta * rejected_ratio.detach()
