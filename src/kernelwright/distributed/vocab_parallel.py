"""Cross-entropy and fused linear cross-entropy with the vocabulary split over ranks (tensor
parallelism of the lm-head, as in Megatron-LM's vocab-parallel cross-entropy).

Every rank of the group holds the same tokens (hidden states and targets are replicated) and a
contiguous slice [start, start + V_r) of the V classes: its logits columns, or its rows of the
lm-head weight. Slices follow the group's rank order and may be uneven (V_r = 0 included).

For row i with target t (not ignored), logits z (after the optional soft-capping
z = cap * tanh(x / cap)), class weights w (all 1 without weights), W = sum_j w_j, smoothing eps
and z-loss scale s, the loss is that of `kernelwright.ops.cross_entropy`:

    loss_i = (1 - eps) * w_t * (lse - z_t) + eps / V * (W * lse - sum_j w_j z_j) + s * lse^2
    dloss_i/dz_j = A * p_j - (1 - eps) * w_t * [j == t] - eps / V * w_j,   p_j = exp(z_j - lse)
    A = (1 - eps) * w_t + eps / V * W + 2 * s * lse

Only per-row scalars cross ranks. Each rank reduces its slice to a local max m_r, a sum of
exp(z - m_r), the target logit when it owns the target (else 0) and, with smoothing, sum w_j z_j.
One all-reduce (MAX) gives the row max m, each rank rescales its sum by exp(m_r - m), and one
all-reduce (SUM) of the packed sums gives lse = m + log(sum), z_t and the smoothing sum. With
class weights, w_t (from the rank owning t) and W are summed the same way. The gradient of a
slice then needs nothing from other ranks: p_j, A and the one-hot term are all local once lse
and w_t are known. The fused linear version also sums the gradient of the (replicated) hidden
states over ranks, since every rank's slice of the logits depends on all of it.

The per-slice math is plain PyTorch in fp32 (the logits are upcast chunk by chunk, whatever
their dtype), not the Triton kernel of `ops.cross_entropy`: that kernel computes the lse of
the row it reads, where here the lse spans all ranks. Temporaries are bounded by chunking rows
(`chunk_size`), a few fp32 [chunk, V_r] buffers at a time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.autograd.function import once_differentiable

from kernelwright.distributed._layout import (
    _from_dtensor,
    _is_dtensor,
    _Layout,
    _layout,
    _replicated_local,
    _sharded_local,
)
from kernelwright.ops._loss import check_loss_args, check_loss_values, reduce_rows
from kernelwright.ops.fused_linear_cross_entropy import (
    _addmm_,
    choose_chunk_rows,
    matmul_inputs,
)

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# fp32 bytes per [rows, V_r] temporary of vocab_parallel_cross_entropy's per-slice math
_MATH_BYTES = 64 << 20

# --------------------------------------------------------------------------- options


@dataclass(frozen=True)
class _Options:
    ignore_index: int
    label_smoothing: float
    lse_square_scale: float
    softcap: float | None


# --------------------------------------------------------------------------- per-slice math


def _capped(x: torch.Tensor, o: _Options) -> torch.Tensor:
    """The logits chunk in fp32, soft-capped when asked."""
    z = x.float()
    if o.softcap is not None:
        z = o.softcap * torch.tanh(z / o.softcap)
    return z


def _ownership(t: torch.Tensor, valid: torch.Tensor, lay: _Layout):
    """(local class index, clamped to 0 where not owned; whether this rank owns the target)."""
    tl = t.long() - lay.start
    owns = valid & (tl >= 0) & (tl < lay.local)
    return torch.where(owns, tl, 0), owns


def _local_stats(z, tl, owns, w, smooth: bool):
    """Row max, sum of exp(z - max) (0 where the slice is empty or all -inf), the owned target
    logit (else 0) and sum_j w_j z_j (with smoothing) over this rank's classes."""
    rows, n = z.shape
    if n == 0:
        zero = z.new_zeros(rows)
        return z.new_full((rows,), -math.inf), zero, zero, (zero if smooth else None)
    m = z.amax(-1)
    s = torch.exp(z - torch.where(m == -math.inf, 0.0, m)[:, None]).sum(-1)
    z_t = torch.where(owns, z.gather(1, tl[:, None]).squeeze(1), 0.0)
    sum_wz = None
    if smooth:
        sum_wz = z @ w if w is not None else z.sum(-1)
    return m, s, z_t, sum_wz


def _all_reduce_sum(parts: list[torch.Tensor], group) -> list[torch.Tensor]:
    """All-reduce (SUM) several fp32 tensors as one flat buffer: one collective."""
    flat = torch.cat([p.reshape(-1) for p in parts])
    if flat.numel():
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
    out, at = [], 0
    for p in parts:
        out.append(flat[at : at + p.numel()].view(p.shape))
        at += p.numel()
    return out


def _global_stats(m, s, z_t, sum_wz, extra: list[torch.Tensor], group):
    """lse, z_t, sum_j w_j z_j over the whole vocabulary (and `extra` summed over ranks)."""
    gm = m.clone()
    if gm.numel():
        dist.all_reduce(gm, op=dist.ReduceOp.MAX, group=group)
    s = s * torch.exp(m - gm)  # exp(-inf) = 0 where this slice is empty or all -inf
    parts = [s, z_t] + ([sum_wz] if sum_wz is not None else []) + extra
    out = _all_reduce_sum(parts, group)
    lse = gm + torch.log(out[0])
    k = 3 if sum_wz is not None else 2  # where `extra` starts
    return lse, out[1], (out[2] if sum_wz is not None else None), out[k:]


def _loss_rows(lse, z_t, sum_wz, w_t, W, valid, o: _Options, vocab: int):
    """Per-row loss and z-loss (0 on ignored rows)."""
    eps, s = o.label_smoothing, o.lse_square_scale
    rows = (1.0 - eps) * w_t * (lse - z_t)
    if eps > 0.0:
        rows = rows + eps / vocab * (W * lse - sum_wz)
    z_rows = s * lse * lse
    if s > 0.0:
        rows = rows + z_rows
    return torch.where(valid, rows, 0.0), torch.where(valid, z_rows, 0.0)


def _grad_rows(z, lse, tl, owns, valid, w, w_t, W, coef, o: _Options, vocab: int):
    """dloss/dx of one chunk of this rank's slice, in fp32, times `coef` (per row).

    `z` is the (soft-capped) fp32 chunk; ignored rows get exact zeros."""
    eps, s = o.label_smoothing, o.lse_square_scale
    d = torch.exp(z - lse[:, None])
    d.mul_(((1.0 - eps) * w_t + eps / vocab * W + 2.0 * s * lse)[:, None])
    if eps > 0.0:
        d.sub_(eps / vocab * (w if w is not None else 1.0))
    if z.shape[1]:
        d.scatter_add_(1, tl[:, None], (-(1.0 - eps) * w_t * owns)[:, None])
    d.mul_(coef[:, None])
    if o.softcap is not None:
        d.mul_(1.0 - (z / o.softcap) ** 2)
    return d.masked_fill_(~valid[:, None], 0.0)


def _denominator(reduction, num_items_in_batch, valid, w_t, device):
    """1 / the "mean" denominator ([1] fp32), or None for "sum" / "none"."""
    if reduction != "mean":
        return None
    if num_items_in_batch is None:
        denom = torch.where(valid, w_t, 0.0).sum().reshape(1)
    elif isinstance(num_items_in_batch, torch.Tensor):
        denom = num_items_in_batch.to(device=device, dtype=torch.float32).reshape(1)
    else:
        denom = torch.full((1,), float(num_items_in_batch), device=device)
    return 1.0 / denom


def _coef(grad_loss: torch.Tensor, inv, rows: int) -> torch.Tensor:
    """Per-row factor of the gradient: the incoming gradient times 1 / denominator."""
    g = grad_loss.reshape(-1).float()
    if inv is not None:
        g = g * inv
    return g.expand(rows) if g.numel() == 1 else g


def _class_weight_parts(t, valid, lay, class_weight):
    """This rank's share of w_t (owned targets) and of W, or (ones, V) without weights."""
    tl, owns = _ownership(t, valid, lay)
    if class_weight is None:
        return tl, owns, None, None, None
    w = class_weight.float()
    w_t = torch.where(owns, w[tl], 0.0) if lay.local else torch.zeros_like(t, dtype=w.dtype)
    return tl, owns, w, w_t, w.sum().reshape(1)


# --------------------------------------------------------------------------- autograd


class _VocabParallelCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, class_weight, lay, o, reduction, num_items, return_z,
                chunk, want_grad):  # fmt: skip
        t = target.reshape(-1)
        M = t.numel()
        x2 = logits.reshape(M, lay.local)
        dev = logits.device
        valid = t != o.ignore_index
        tl, owns, w, w_t_loc, W_loc = _class_weight_parts(t, valid, lay, class_weight)
        smooth = o.label_smoothing > 0.0
        m = torch.empty(M, dtype=torch.float32, device=dev)
        s, z_t = torch.empty_like(m), torch.empty_like(m)
        sum_wz = torch.empty_like(m) if smooth else None
        for a in range(0, M, chunk):
            b = min(a + chunk, M)
            stats = _local_stats(_capped(x2[a:b], o), tl[a:b], owns[a:b], w, smooth)
            for out, val in zip((m, s, z_t, sum_wz), stats, strict=True):
                if out is not None:
                    out[a:b] = val
        extra = [w_t_loc, W_loc] if w is not None else []
        lse, z_t, sum_wz, extra = _global_stats(m, s, z_t, sum_wz, extra, lay.group)
        if w is not None:
            w_t, W = extra
        else:
            w_t, W = torch.ones_like(lse), torch.full((1,), float(lay.vocab), device=dev)
        rows, z_rows = _loss_rows(lse, z_t, sum_wz, w_t, W, valid, o, lay.vocab)
        inv = _denominator(reduction, num_items, valid, w_t, dev)
        if want_grad and ctx.needs_input_grad[0]:
            ctx.save_for_backward(logits, tl, owns, valid, lse, w, w_t, W, inv)
        ctx.meta = (lay, o, chunk)
        loss = reduce_rows(rows, reduction, inv, target.shape)
        if return_z:
            z = reduce_rows(z_rows, reduction, inv, target.shape)
            ctx.mark_non_differentiable(z)
            return loss, z
        return loss

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_loss, *unused):
        logits, tl, owns, valid, lse, w, w_t, W, inv = ctx.saved_tensors
        lay, o, chunk = ctx.meta
        M = tl.numel()
        x2 = logits.reshape(M, lay.local)
        coef = _coef(grad_loss, inv, M)
        grad = torch.empty((M, lay.local), dtype=logits.dtype, device=logits.device)
        for a in range(0, M, chunk):
            b = min(a + chunk, M)
            r = slice(a, b)
            grad[r] = _grad_rows(_capped(x2[r], o), lse[r], tl[r], owns[r], valid[r], w, w_t[r],
                                 W, coef[r], o, lay.vocab)  # fmt: skip
        return (grad.view(logits.shape),) + (None,) * 9


def _flce_chunks(h2, weight, bias, lay, o, tl, owns, valid, w, w_t, W, chunk, *, coef=None,
                 lse=None, loss_rows=None, z_rows=None, grad_h=None, grad_w=None,
                 grad_b=None):  # fmt: skip
    """One pass over the token chunks of the local logits h @ weight.T (+ bias).

    Without `lse` (the forward), each chunk's stats are all-reduced (two collectives a chunk)
    into `lse` and the loss rows. With `coef` the chunk's gradient (times coef per row) is
    written over its logits and accumulated into the local grad_w / grad_b and the partial
    grad_h (this rank's classes only: the caller all-reduces it)."""
    N = h2.shape[0]
    buf = torch.empty((min(chunk, N), lay.local), dtype=h2.dtype, device=h2.device)
    for a in range(0, N, chunk):
        b = min(a + chunk, N)
        r = slice(a, b)
        hc, lg = h2[r], buf[: b - a]
        if bias is not None:
            torch.addmm(bias, hc, weight.t(), out=lg)
        else:
            torch.mm(hc, weight.t(), out=lg)
        z = _capped(lg, o)
        if loss_rows is not None:
            m, s, z_t, sum_wz = _local_stats(z, tl[r], owns[r], w, o.label_smoothing > 0.0)
            lse[r], z_t, sum_wz, _ = _global_stats(m, s, z_t, sum_wz, [], lay.group)
            loss_rows[r], z_rows[r] = _loss_rows(lse[r], z_t, sum_wz, w_t[r], W, valid[r], o,
                                                 lay.vocab)  # fmt: skip
        if coef is None:
            continue
        d = _grad_rows(z, lse[r], tl[r], owns[r], valid[r], w, w_t[r], W, coef[r], o, lay.vocab)
        if grad_b is not None:
            grad_b += d.sum(0)
        lg.copy_(d)  # the gradient in the matmul dtype, over the logits it came from
        if grad_w is not None:
            _addmm_(grad_w, lg.t(), hc)
        if grad_h is not None:
            torch.mm(lg, weight, out=grad_h[r])


def _flce_grad_buffers(h2, lay, acc, need_h, need_w, need_b):
    N, H = h2.shape
    dev = h2.device
    grad_h = torch.empty((N, H), dtype=h2.dtype, device=dev) if need_h else None
    grad_w = torch.zeros((lay.local, H), dtype=acc, device=dev) if need_w else None
    grad_b = torch.zeros((lay.local,), dtype=torch.float32, device=dev) if need_b else None
    return grad_h, grad_w, grad_b


def _flce_finish(grad_h, grad_w, grad_b, weight, bias, group):
    """grad_h summed over the vocabulary ranks; grad_w / grad_b in their parameters' dtypes."""
    if grad_h is not None and grad_h.numel():
        dist.all_reduce(grad_h, op=dist.ReduceOp.SUM, group=group)
    if grad_w is not None and grad_w.dtype != weight.dtype:
        grad_w = grad_w.to(weight.dtype)
    if grad_b is not None and grad_b.dtype != bias.dtype:
        grad_b = grad_b.to(bias.dtype)
    return grad_h, grad_w, grad_b


class _VocabParallelFLCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, target, bias, class_weight, lay, o, reduction, num_items,
                return_z, accum_dtype, chunk, want_grad):  # fmt: skip
        H = hidden.shape[-1]
        h2 = hidden.reshape(-1, H).contiguous()
        N = h2.shape[0]
        dev = hidden.device
        t = target.reshape(-1)
        valid = t != o.ignore_index
        tl, owns, w, w_t, W = _class_weight_parts(t, valid, lay, class_weight)
        if w is not None:  # w_t from the rank owning t, W over all ranks: one collective
            w_t, W = _all_reduce_sum([w_t, W], lay.group)
        else:
            w_t, W = torch.ones(N, device=dev), torch.full((1,), float(lay.vocab), device=dev)
        inv = _denominator(reduction, num_items, valid, w_t, dev)
        need_h = want_grad and ctx.needs_input_grad[0]
        need_w = want_grad and ctx.needs_input_grad[1]
        need_b = want_grad and bias is not None and ctx.needs_input_grad[3]
        grads_now = (need_h or need_w or need_b) and reduction != "none"
        acc = accum_dtype or weight.dtype
        lse = torch.empty(N, dtype=torch.float32, device=dev)
        loss_rows, z_rows = torch.empty_like(lse), torch.empty_like(lse)
        grads = _flce_grad_buffers(h2, lay, acc, need_h and grads_now, need_w and grads_now,
                                   need_b and grads_now)  # fmt: skip
        coef = inv.expand(N) if inv is not None else torch.ones_like(lse)
        _flce_chunks(h2, weight, bias, lay, o, tl, owns, valid, w, w_t, W, chunk,
                     coef=coef if grads_now else None, lse=lse, loss_rows=loss_rows,
                     z_rows=z_rows, grad_h=grads[0], grad_w=grads[1],
                     grad_b=grads[2])  # fmt: skip
        ctx.grads_now = grads_now
        ctx.hidden_shape = hidden.shape
        ctx.used = False
        if grads_now:
            ctx.save_for_backward(*_flce_finish(*grads, weight, bias, lay.group))
        elif need_h or need_w or need_b:  # reduction="none": recompute in the backward
            ctx.save_for_backward(h2, weight, bias, tl, owns, valid, w, w_t, W, lse)
            ctx.need = (need_h, need_w, need_b)
            ctx.meta = (lay, o, acc, chunk)
        loss = reduce_rows(loss_rows, reduction, inv, target.shape)
        if return_z:
            z = reduce_rows(z_rows, reduction, inv, target.shape)
            ctx.mark_non_differentiable(z)
            return loss, z
        return loss

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_loss, *unused):
        if ctx.grads_now:
            if ctx.used:
                raise RuntimeError(
                    "vocab_parallel_fused_linear_cross_entropy: backward ran twice through the "
                    "same graph; the gradients are computed in the forward and scaled by the "
                    "first backward. Run the forward again for a second backward."
                )
            ctx.used = True
            s = grad_loss.reshape(()).float()
            grad_h, grad_w, grad_b = (g.mul_(s) if g is not None else None
                                      for g in ctx.saved_tensors)  # fmt: skip
        else:
            h2, weight, bias, tl, owns, valid, w, w_t, W, lse = ctx.saved_tensors
            lay, o, acc, chunk = ctx.meta
            grads = _flce_grad_buffers(h2, lay, acc, *ctx.need)
            _flce_chunks(h2, weight, bias, lay, o, tl, owns, valid, w, w_t, W, chunk,
                         coef=_coef(grad_loss, None, h2.shape[0]), lse=lse, grad_h=grads[0],
                         grad_w=grads[1], grad_b=grads[2])  # fmt: skip
            grad_h, grad_w, grad_b = _flce_finish(*grads, weight, bias, lay.group)
        if grad_h is not None:
            grad_h = grad_h.view(ctx.hidden_shape)
        return (grad_h, grad_w, None, grad_b) + (None,) * 9


# --------------------------------------------------------------------------- public API


def _check_float(op: str, name: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: argument '{name}' must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(
            f"{op}: argument '{name}' must be float32, float16 or bfloat16, "
            f"got {str(t.dtype).replace('torch.', '')}"
        )


def _check_class_weight(op: str, class_weight, local: int) -> None:
    if class_weight is None:
        return
    _check_float(op, "class weights", class_weight)
    if tuple(class_weight.shape) != (local,):
        raise ValueError(
            f"{op}: class weights must be this rank's slice, shape ({local},) (one per local "
            f"class), got {tuple(class_weight.shape)}"
        )


def vocab_parallel_cross_entropy(
    logits: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None = None,
    *,
    group=None,
    shard_sizes: Sequence[int] | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    lse_square_scale: float = 0.0,
    return_z_loss: bool = False,
    softcap: float | None = None,
    num_items_in_batch: int | float | torch.Tensor | None = None,
    chunk_size: int | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy over a vocabulary split across the ranks of `group`.

    Equal, on every rank, to `kernelwright.ops.cross_entropy` of the logits concatenated over
    ranks (in group rank order); the gradient flows to this rank's slice only.

    Args:
        logits: [..., V_r] float32/float16/bfloat16, this rank's contiguous slice of the
            classes; or a DTensor [..., V] sharded along its last dimension (Shard(-1)) on one
            mesh dimension, whose process group is then used (uneven slices as torch.chunk
            splits them).
        target: [...] class indices in [0, V) (or `ignore_index`), the same on every rank (a
            DTensor must be Replicate along the vocabulary's mesh dimension).
        weight: optional [V_r] class weights, this rank's slice (or a DTensor sharded like
            the logits).
        group: the process group over which the vocabulary is split (default: the default
            group; must be None with a DTensor).
        shard_sizes: every rank's V_r in group rank order. Without it, each call all_gathers
            the sizes (one small collective and a host sync), which also checks that the ranks
            agree on the number of tokens and on the targets.
        chunk_size: rows per chunk of the fp32 per-slice math (default: what keeps one fp32
            [rows, V_r] temporary within 64 MiB).
        The other options as in `kernelwright.ops.cross_entropy.cross_entropy`.

    Returns the loss (fp32; "none": target's shape), a plain tensor, the same on every rank of
    the group; with return_z_loss, (loss, z_loss). Per call: one all-reduce (MAX) of [rows]
    and one (SUM) of [2-4 x rows] in the forward; the backward communicates nothing. Every
    rank must call it (and its backward) with the same targets and options.

    The per-slice math is plain PyTorch in fp32 (see the module docstring for why not the
    Triton kernel); the logits are saved and the gradient computed in the backward.
    """
    op = "vocab_parallel_cross_entropy"
    mesh = mdim = None
    if _is_dtensor(logits):
        logits, mesh, mdim, lay = _from_dtensor(op, "logits", logits, -1, group, shard_sizes)
        target = _replicated_local(op, "target", target, mesh, mdim)
        weight = _sharded_local(op, "weight", weight, mesh, mdim, 0)
    else:
        lay = None
        target = _replicated_local(op, "target", target, None, None)
        weight = _replicated_local(op, "weight", weight, None, None)
    _check_float(op, "logits", logits)
    if logits.dim() < 1:
        raise ValueError(f"{op}: logits must have a class dimension, got a scalar")
    local = logits.shape[-1]
    n_rows = math.prod(logits.shape[:-1])
    if isinstance(target, torch.Tensor) and target.shape != logits.shape[:-1]:
        raise ValueError(
            f"{op}: target must have the logits' leading shape {tuple(logits.shape[:-1])}, "
            f"got {tuple(target.shape)}"
        )
    check_loss_args(op, max(local, 1), target, n_rows, None, reduction, label_smoothing,
                    lse_square_scale, softcap, num_items_in_batch)  # fmt: skip
    _check_class_weight(op, weight, local)
    for name, t in (("target", target), ("weight", weight)):
        if t is not None and t.device != logits.device:
            raise RuntimeError(f"{op}: '{name}' is on {t.device} but logits on {logits.device}")
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"{op}: chunk_size must be >= 1, got {chunk_size}")
    if lay is None:
        lay = _layout(op, group, local, target, shard_sizes)
    check_loss_values(op, target, lay.vocab, ignore_index, num_items_in_batch)
    o = _Options(ignore_index, float(label_smoothing), float(lse_square_scale), softcap)
    chunk = chunk_size or max(1, _MATH_BYTES // (4 * max(local, 1)))
    return _VocabParallelCE.apply(logits, target, weight, lay, o, reduction, num_items_in_batch,
                                  return_z_loss, chunk, torch.is_grad_enabled())  # fmt: skip


def vocab_parallel_fused_linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    class_weight: torch.Tensor | None = None,
    group=None,
    shard_sizes: Sequence[int] | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    lse_square_scale: float = 0.0,
    return_z_loss: bool = False,
    softcap: float | None = None,
    num_items_in_batch: int | float | torch.Tensor | None = None,
    accum_dtype: torch.dtype | None = None,
    chunk_size: int | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """cross_entropy(hidden @ weight.T + bias, target) with the lm-head's vocabulary rows split
    across the ranks of `group`, without materialising any [tokens, V] (or [tokens, V_r])
    logits: chunk by chunk of tokens, as `kernelwright.ops.fused_linear_cross_entropy`.

    Args:
        hidden: [..., H], the same on every rank (a DTensor must be Replicate along the
            vocabulary's mesh dimension).
        weight: [V_r, H], this rank's contiguous rows of the lm-head; or a DTensor [V, H]
            sharded along dimension 0 (as ColwiseParallel leaves an nn.Linear's weight), whose
            mesh gives the process group.
        target: [...] class indices in [0, V), hidden's leading shape, the same on every rank.
        bias: optional [V_r] (or a DTensor sharded like the weight).
        class_weight: optional [V_r] class weights, this rank's slice.
        group, shard_sizes: as in `vocab_parallel_cross_entropy`.
        chunk_size: tokens per chunk (default: `choose_chunk_rows` of the local V_r).
        The other options as in `kernelwright.ops.fused_linear_cross_entropy`.

    Returns the loss (fp32), the same on every rank. The gradient of `hidden` is already
    summed over the vocabulary ranks (each rank's classes contribute to all of it), so the
    model must not all-reduce it again (no Megatron "copy to tensor-parallel region" before
    this call); the weight and bias gradients are this rank's slice. Communication per call:
    two all-reduces of per-token stats per chunk, one all-reduce of the [tokens, H] hidden
    gradient (in hidden's dtype), plus one of [tokens + 1] with class weights. With "mean" /
    "sum" the gradients are computed in the forward and the backward only scales them (every
    rank must pass the same incoming gradient, as it does when the loss is replicated); with
    "none" the backward recomputes each chunk's logits.

    The per-chunk softmax math is plain PyTorch in fp32; the matmuls run in hidden's dtype.
    """
    op = "vocab_parallel_fused_linear_cross_entropy"
    if _is_dtensor(weight):
        weight, mesh, mdim, lay = _from_dtensor(op, "weight", weight, 0, group, shard_sizes)
        bias = _sharded_local(op, "bias", bias, mesh, mdim, 0)
        class_weight = _sharded_local(op, "class_weight", class_weight, mesh, mdim, 0)
        hidden = _replicated_local(op, "hidden", hidden, mesh, mdim)
        target = _replicated_local(op, "target", target, mesh, mdim)
    else:
        lay = None
        hidden, target, bias, class_weight = (
            _replicated_local(op, n, t, None, None)
            for n, t in (("hidden", hidden), ("target", target), ("bias", bias),
                         ("class_weight", class_weight))
        )  # fmt: skip
    _check_float(op, "hidden", hidden)
    _check_float(op, "weight", weight)
    if weight.dim() != 2:
        raise ValueError(f"{op}: weight must be [V_r, H], got shape {tuple(weight.shape)}")
    local, H = weight.shape
    if hidden.dim() < 1 or hidden.shape[-1] != H:
        raise ValueError(
            f"{op}: hidden's last dimension must match weight [V_r, H] with H = {H}, "
            f"got hidden of shape {tuple(hidden.shape)}"
        )
    if bias is not None:
        _check_float(op, "bias", bias)
        if tuple(bias.shape) != (local,):
            raise ValueError(f"{op}: bias must have shape ({local},), got {tuple(bias.shape)}")
    if isinstance(target, torch.Tensor) and target.shape != hidden.shape[:-1]:
        raise ValueError(
            f"{op}: target must have hidden's leading shape {tuple(hidden.shape[:-1])}, "
            f"got {tuple(target.shape)}"
        )
    n_rows = math.prod(hidden.shape[:-1])
    check_loss_args(op, max(local, 1), target, n_rows, None, reduction, label_smoothing,
                    lse_square_scale, softcap, num_items_in_batch)  # fmt: skip
    _check_class_weight(op, class_weight, local)
    for name, t in (("weight", weight), ("target", target), ("bias", bias),
                    ("class_weight", class_weight)):  # fmt: skip
        if t is not None and t.device != hidden.device:
            raise RuntimeError(f"{op}: '{name}' is on {t.device} but hidden on {hidden.device}")
    if accum_dtype not in (None, torch.float32) and accum_dtype != weight.dtype:
        raise ValueError(f"{op}: accum_dtype must be None or torch.float32, got {accum_dtype}")
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"{op}: chunk_size must be >= 1, got {chunk_size}")
    if lay is None:
        lay = _layout(op, group, local, target, shard_sizes)
    check_loss_values(op, target, lay.vocab, ignore_index, num_items_in_batch)
    hidden, weight, bias, accum_dtype = matmul_inputs(op, hidden, weight, bias, accum_dtype)
    dev_type = hidden.device.type
    o = _Options(ignore_index, float(label_smoothing), float(lse_square_scale), softcap)
    chunk = chunk_size or choose_chunk_rows(max(n_rows, 1), max(local, 1),
                                            hidden.element_size(), hidden.device)  # fmt: skip
    with torch.autocast(dev_type, enabled=False):
        return _VocabParallelFLCE.apply(hidden, weight, target, bias, class_weight, lay, o,
                                        reduction, num_items_in_batch, return_z_loss,
                                        accum_dtype, chunk, torch.is_grad_enabled())  # fmt: skip
