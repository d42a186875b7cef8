"""GRPO's clipped surrogate with a k3 KL to the reference, on the policy's full logits, as the
DeepSeekMath paper writes it (token-level, each sequence's mean, then the batch's)."""

import torch


def grpo_paper(logits, completion_ids, mask, advantages, old_logps, ref_logps,
               beta: float = 0.04, eps: float = 0.2):  # fmt: skip
    logp = torch.log_softmax(logits, dim=-1)
    tok = logp.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
    ratio = torch.exp(tok - old_logps)
    adv = advantages.unsqueeze(-1)
    surrogate = torch.min(ratio * adv, torch.clamp(ratio, 1 - eps, 1 + eps) * adv)
    kl = torch.exp(ref_logps - tok) - (ref_logps - tok) - 1
    per_token = -(surrogate - beta * kl)
    return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean()


def get_inputs():
    B, T, V = 4, 9, 41
    mask = (torch.rand(B, T) > 0.2).float()
    return [torch.randn(B, T, V), torch.randint(0, V, (B, T)), mask, torch.randn(B),
            -torch.rand(B, T) * 4, -torch.rand(B, T) * 4]  # fmt: skip
