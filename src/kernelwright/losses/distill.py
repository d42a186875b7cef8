"""Distillation from a teacher's logits without the [tokens, vocab] logits of either model.

The divergence per token (as TRL's generalized JSD states it, on log_softmax(logits / T)):
- beta = 0: forward KL(teacher ‖ student);
- beta = 1: reverse KL(student ‖ teacher);
- 0 < beta < 1: beta·KL(teacher ‖ m) + (1 - beta)·KL(student ‖ m), m = (1 - beta)·student +
  beta·teacher (the generalized Jensen-Shannon divergence).
Tokens whose label is `ignore_index` are left out; "batchmean" divides the sum by the tokens
kept, "sum" does not. Chunked over tokens: each chunk's logits exist only while its gradient
is computed, in the forward (the loss is a scalar, so its gradient is known up to the incoming
scale, applied in the backward). The teacher gets no gradient.
"""

from __future__ import annotations

import math

import torch

REDUCTIONS = ("batchmean", "sum")


def divergence(student_logits, teacher_logits, beta: float, temperature: float):
    """The per-token divergence [rows] from [rows, V] logits, in fp32 (also the reference)."""
    s = torch.log_softmax(student_logits.float() / temperature, dim=-1)
    t = torch.log_softmax(teacher_logits.float() / temperature, dim=-1)
    if beta == 0:
        return (t.exp() * (t - s)).sum(-1)
    if beta == 1:
        return (s.exp() * (s - t)).sum(-1)
    m = torch.logsumexp(torch.stack([s + math.log(1 - beta), t + math.log(beta)]), dim=0)
    return beta * (t.exp() * (t - m)).sum(-1) + (1 - beta) * (s.exp() * (s - m)).sum(-1)


def _logits(h, w, b):
    out = h @ w.T
    return out if b is None else out + b


class _ChunkedDistill(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h_s, w_s, b_s, h_t, w_t, b_t, keep, beta, temperature, scale, chunk):
        grad_h = torch.zeros_like(h_s)
        grad_w = torch.zeros(w_s.shape, dtype=torch.float32, device=w_s.device)
        grad_b = None if b_s is None else torch.zeros(b_s.shape, dtype=torch.float32,
                                                      device=b_s.device)  # fmt: skip
        total = torch.zeros((), dtype=torch.float32, device=h_s.device)
        for start in range(0, h_s.shape[0], chunk):
            rows = slice(start, start + chunk)
            with torch.enable_grad():
                logits = _logits(h_s[rows], w_s, b_s).detach().requires_grad_()
                with torch.no_grad():
                    teacher = _logits(h_t[rows], w_t, b_t)
                per_token = divergence(logits, teacher, beta, temperature) * keep[rows]
                loss = per_token.sum() * scale
                (g,) = torch.autograd.grad(loss, [logits])
            total += loss.detach()
            g = g.to(h_s.dtype)
            grad_h[rows] = g @ w_s
            grad_w += (g.T @ h_s[rows]).float()
            if grad_b is not None:
                grad_b += g.float().sum(0)
        ctx.save_for_backward(grad_h, grad_w, *([] if grad_b is None else [grad_b]))
        ctx.dtypes = (w_s.dtype, None if b_s is None else b_s.dtype)
        return total

    @staticmethod
    def backward(ctx, dy):
        grad_h, grad_w, *rest = ctx.saved_tensors
        w_dtype, b_dtype = ctx.dtypes
        grad_b = (rest[0] * dy).to(b_dtype) if rest else None
        return (grad_h * dy.to(grad_h.dtype), (grad_w * dy).to(w_dtype), grad_b,
                None, None, None, None, None, None, None, None)  # fmt: skip


def fused_linear_distill(
    student_hidden: torch.Tensor,
    student_weight: torch.Tensor,
    teacher_hidden: torch.Tensor,
    teacher_weight: torch.Tensor,
    labels: torch.Tensor | None = None,
    *,
    student_bias: torch.Tensor | None = None,
    teacher_bias: torch.Tensor | None = None,
    beta: float = 0.5,
    temperature: float = 1.0,
    ignore_index: int = -100,
    reduction: str = "batchmean",
    chunk_size: int = 1024,
) -> torch.Tensor:
    """The distillation loss (module doc) of the student's lm_head on `student_hidden` [..., Hs]
    against the teacher's on `teacher_hidden` [..., Ht], same tokens; `labels` [...] marks the
    tokens kept (not `ignore_index`). The vocabularies must match."""
    if not 0 <= beta <= 1:
        raise ValueError(f"fused_linear_distill: beta must be in [0, 1], got {beta}")
    if not temperature > 0:
        raise ValueError(f"fused_linear_distill: temperature must be > 0, got {temperature}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"fused_linear_distill: reduction must be one of {REDUCTIONS}")
    if student_weight.shape[0] != teacher_weight.shape[0]:
        raise ValueError(
            "fused_linear_distill: the student's and the teacher's vocabularies differ "
            f"({student_weight.shape[0]} vs {teacher_weight.shape[0]})"
        )
    if student_hidden.shape[:-1] != teacher_hidden.shape[:-1]:
        raise ValueError(
            "fused_linear_distill: student and teacher hidden states cover other tokens"
        )
    h_s = student_hidden.reshape(-1, student_hidden.shape[-1])
    h_t = teacher_hidden.reshape(-1, teacher_hidden.shape[-1]).detach()
    if labels is None:
        keep = torch.ones(h_s.shape[0], dtype=torch.float32, device=h_s.device)
    else:
        keep = (labels.reshape(-1) != ignore_index).to(torch.float32)
    kept = keep.sum().item() if reduction == "batchmean" else 1.0
    scale = 1.0 / max(kept, 1.0)
    b_t = None if teacher_bias is None else teacher_bias.detach()
    args = (h_t, teacher_weight.detach(), b_t, keep, float(beta), float(temperature), scale)
    return _ChunkedDistill.apply(h_s, student_weight, student_bias, *args, int(chunk_size))
