"""Distillation from a teacher's logits without the [tokens, vocab] logits of either model.

The divergence per token (as TRL's generalized JSD states it, on log_softmax(logits / T)):
- beta = 0: forward KL(teacher ‖ student);
- beta = 1: reverse KL(student ‖ teacher);
- 0 < beta < 1: beta·KL(teacher ‖ m) + (1 - beta)·KL(student ‖ m), m = (1 - beta)·student +
  beta·teacher (the generalized Jensen-Shannon divergence).
Tokens whose label is `ignore_index` are left out; "batchmean" divides the sum by the tokens
kept (or by `num_items_in_batch`, the kept tokens of a whole accumulated batch), "sum" does
not. The student's entropy per token comes from the same pass when asked (for a metric: no
gradient). Chunked over tokens: each chunk's logits exist only while its gradient
is computed, in the forward (the loss is a scalar, so its gradient is known up to the incoming
scale, applied in the backward), by one Triton kernel per chunk (`_stats_kernels.py`). The
teacher gets no gradient.
"""

from __future__ import annotations

import math

import torch
import triton
from torch.autograd.function import once_differentiable

from kernelwright.losses._stats_kernels import _distill_kernel
from kernelwright.losses.logprobs import (
    _compute_dtype,
    _project,
    _scored,
    _spread,
    check_head,
    chunk_rows,
    widen_ids,
)
from kernelwright.ops.fused_linear_cross_entropy import _addmm_
from kernelwright.runtime.checks import check_chunk_size
from kernelwright.runtime.launch import traced

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


class _ChunkedDistill(torch.autograd.Function):
    """Chunks of C tokens: the student's and the teacher's logits (cuBLAS, into two reused
    [C, V] buffers in the matmul dtype), then `_distill_kernel` writes each token's divergence
    and, over the student's logits, their gradient times the reduction's scale; the two
    gradient matmuls follow in the forward. The backward multiplies by the incoming gradient.
    Returns the loss and, with `want_ent`, the student's entropy per token (else None)."""

    @staticmethod
    def forward(ctx, h_s, w_s, b_s, h_t, w_t, b_t, beta, temperature, scale, chunk, accum,
                want_ent, grad_mode):  # fmt: skip
        N, V = h_s.shape[0], w_s.shape[0]
        cd = _compute_dtype(h_s)
        chunk = chunk or chunk_rows(N, 2 * V, cd, h_s.device)  # two buffers
        # under no_grad (an evaluation) no gradient is computed
        need_h, need_w, need_b = (grad_mode and n for n in ctx.needs_input_grad[:3])
        grad_h = torch.empty(h_s.shape, dtype=h_s.dtype, device=h_s.device) if need_h else None
        grad_w = (
            torch.zeros(w_s.shape, dtype=accum or w_s.dtype, device=w_s.device) if need_w else None
        )
        grad_b = torch.zeros(V, dtype=torch.float32, device=w_s.device) if need_b else None
        per_token = torch.empty(N, dtype=torch.float32, device=h_s.device)
        ent = torch.empty(N, dtype=torch.float32, device=h_s.device) if want_ent else None
        mode = 0 if beta == 0 else 1 if beta == 1 else 2
        logs = (math.log(1 - beta) if beta < 1 else 0.0, math.log(beta) if beta > 0 else 0.0)
        block = min(4096, triton.next_power_of_2(V))
        with torch.autocast(h_s.device.type, enabled=False):
            ws, wt = w_s.to(cd), w_t.to(cd)
            bs = None if b_s is None else b_s.to(cd)
            bt = None if b_t is None else b_t.to(cd)
            buf_s = torch.empty((min(chunk, N), V), dtype=cd, device=h_s.device)
            buf_t = torch.empty_like(buf_s)
            for s in range(0, N, chunk):
                e = min(s + chunk, N)
                hs, ls, lt = h_s[s:e].to(cd), buf_s[: e - s], buf_t[: e - s]
                _project(hs, ws, bs, ls)
                _project(h_t[s:e].to(cd), wt, bt, lt)
                _distill_kernel[(e - s,)](
                    ls, lt, ls.stride(0), lt.stride(0), per_token[s:e],
                    per_token[s:e] if ent is None else ent[s:e], V, 1.0 / temperature,
                    float(beta), *logs, float(scale), MODE=mode, ENTROPY=ent is not None,
                    BLOCK=block,
                )  # fmt: skip
                if grad_h is not None:
                    if grad_h.dtype != cd:
                        grad_h[s:e] = 0
                        _addmm_(grad_h[s:e], ls, ws)
                    else:
                        torch.mm(ls, ws, out=grad_h[s:e])
                if grad_w is not None:
                    _addmm_(grad_w, ls.t(), hs)
                if grad_b is not None:
                    grad_b += ls.sum(0, dtype=torch.float32)
        ctx.save_for_backward(*(g for g in (grad_h, grad_w, grad_b) if g is not None))
        ctx.meta = (grad_h is not None, grad_w is not None, grad_b is not None,
                    w_s.dtype, None if b_s is None else b_s.dtype)  # fmt: skip
        if ent is not None:
            ctx.mark_non_differentiable(ent)
        return per_token.sum() * scale, ent

    @staticmethod
    @once_differentiable
    def backward(ctx, dy, _):
        saved = list(ctx.saved_tensors)
        has_h, has_w, has_b, w_dtype, b_dtype = ctx.meta
        one = not traced(dy) and bool(dy == 1)

        def scaled(g, dtype=None):
            g = g if one else g * dy.to(g.dtype)
            return g if dtype is None else g.to(dtype)

        grad_h = scaled(saved.pop(0)) if has_h else None
        grad_w = scaled(saved.pop(0), w_dtype) if has_w else None
        grad_b = scaled(saved.pop(0), b_dtype) if has_b else None
        return (grad_h, grad_w, grad_b) + (None,) * 10


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
    num_items_in_batch: int | float | torch.Tensor | None = None,
    chunk_size: int | None = None,
    accum_dtype: torch.dtype | None = None,
    return_entropy: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The distillation loss (module doc) of the student's lm_head on `student_hidden` [..., Hs]
    against the teacher's on `teacher_hidden` [..., Ht], same tokens; `labels` [...] marks the
    tokens kept (not `ignore_index`; only those are computed). The vocabularies must match.
    Under torch.autocast the matmuls run in the autocast dtype; accum_dtype=torch.float32
    accumulates the weight gradient of bf16 weights in fp32. chunk_size: tokens per chunk, an
    int >= 1 (None: as fused linear cross-entropy chooses, for two logits buffers).

    num_items_in_batch: "batchmean" divides by it instead of the tokens kept here (the kept
    tokens of every micro-batch of a gradient-accumulated step). return_entropy: also the
    student's entropy per token [...] in fp32, no gradient, 0 at the tokens left out:
    (loss, entropy)."""
    if not 0 <= beta <= 1:
        raise ValueError(f"fused_linear_distill: beta must be in [0, 1], got {beta}")
    if not temperature > 0:
        raise ValueError(f"fused_linear_distill: temperature must be > 0, got {temperature}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"fused_linear_distill: reduction must be one of {REDUCTIONS}")
    if num_items_in_batch is not None and reduction != "batchmean":
        raise ValueError("fused_linear_distill: num_items_in_batch divides the batchmean only")
    op = "fused_linear_distill"
    check_head(op, ("student_hidden", "student_weight", "student_bias"), student_hidden,
               student_weight, student_bias)  # fmt: skip
    check_head(op, ("teacher_hidden", "teacher_weight", "teacher_bias"), teacher_hidden,
               teacher_weight, teacher_bias)  # fmt: skip
    check_chunk_size(op, chunk_size)
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
    if labels is not None and labels.shape != student_hidden.shape[:-1]:
        raise ValueError(
            f"fused_linear_distill: labels shape {tuple(labels.shape)} != the hidden states' "
            f"leading shape {tuple(student_hidden.shape[:-1])}"
        )
    if labels is not None:
        labels = widen_ids(labels, ignore_index)
    keep = None if labels is None else _scored(labels.reshape(-1), ignore_index)
    if keep is not None:  # only the kept tokens are computed
        h_s, h_t = h_s[keep], h_t[keep]
        n = h_s.shape[0]
    elif labels is not None and traced(labels):
        raise ValueError("fused_linear_distill: labels under tracing are not supported")
    elif labels is not None and bool((labels == ignore_index).all()):
        n = 0
        h_s, h_t = h_s[:0], h_t[:0]
    else:
        n = h_s.shape[0]
    scale = 1.0 / max(n, 1) if reduction == "batchmean" else 1.0
    if num_items_in_batch is not None:
        if not float(num_items_in_batch) > 0:
            raise ValueError("fused_linear_distill: num_items_in_batch must be > 0")
        scale = 1.0 / float(num_items_in_batch)
    b_t = None if teacher_bias is None else teacher_bias.detach()
    loss, ent = _ChunkedDistill.apply(
        h_s, student_weight, student_bias, h_t, teacher_weight.detach(), b_t, float(beta),
        float(temperature), scale, chunk_size, accum_dtype, return_entropy,
        torch.is_grad_enabled(),
    )  # fmt: skip
    if not return_entropy:
        return loss
    lead = student_hidden.shape[:-1]
    if keep is not None:
        return loss, _spread(ent, keep).reshape(lead)
    return loss, ent.reshape(lead) if n else ent.new_zeros(lead)
