"""A policy-gradient loss with an entropy bonus, on the policy's full logits: each token's
advantage-weighted log-prob (GRPO without clipping or KL, on-policy) minus `coef` times the
entropy of its sampling distribution (temperature 0.8), averaged over the completion tokens."""

import torch


def grpo_entropy_paper(logits, completion_ids, mask, advantages, coef: float = 0.01):
    logp = torch.log_softmax(logits.float() / 0.8, dim=-1)
    tok = logp.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    per_token = -advantages.unsqueeze(-1) * tok - coef * entropy
    return (per_token * mask).sum() / mask.sum().clamp(min=1)


def get_inputs():
    B, T, V = 4, 9, 41
    mask = (torch.rand(B, T) > 0.2).float()
    return [torch.randn(B, T, V), torch.randint(0, V, (B, T)), mask, torch.randn(B)]
