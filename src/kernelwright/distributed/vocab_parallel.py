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

Only per-row scalars cross ranks. A Triton kernel reads this rank's slice once for its local
max m_r, sum of exp(z - m_r), the target logit when it owns the target (else 0) and, with
smoothing, sum w_j z_j (with class weights, the owned target's w_t too). One all-reduce (MAX)
gives the row max m, each rank rescales its sum by exp(m_r - m), and one all-reduce (SUM) of
the packed sums gives lse = m + log(sum), z_t and the rest. The gradient of a slice then needs
nothing from other ranks: a second kernel, elementwise over the slice, writes the rows' losses
and the gradient already scaled by the reduction (distributed/_vp_kernels.py), so the
backward only multiplies it by the incoming gradient (skipped where that is 1), as
`ops.cross_entropy` does. No fp32 copy of the slice is made. The fused linear version runs the
same kernels on each chunk of its local logits and sums the gradient of the (replicated)
hidden states over ranks, since every rank's slice of the logits depends on all of it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch.autograd.function import once_differentiable

from kernelwright.distributed._layout import (
    _from_dtensor,
    _is_dtensor,
    _layout,
    _replicated_local,
    _sharded_local,
)
from kernelwright.distributed._vp_kernels import Options as _Options
from kernelwright.distributed._vp_kernels import (
    RowStats,
    loss_grad_launch,
    rescale_launch,
    stats_launch,
)
from kernelwright.ops._loss import check_loss_args, check_loss_values, reduce_rows
from kernelwright.ops.cross_entropy import scale_grad_
from kernelwright.ops.fused_linear_cross_entropy import (
    _addmm_,
    choose_chunk_rows,
    matmul_inputs,
)
from kernelwright.runtime.alloc import empty
from kernelwright.runtime.checks import check_in_place, rows_view
from kernelwright.runtime.launch import traced

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# --------------------------------------------------------------------------- statistics


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


def _exchange(s: RowStats, group) -> None:
    """The slice statistics of `s` turned into the whole row's: the max over ranks (MAX), each
    rank's sum rescaled to it, then every sum over ranks (SUM, one packed buffer)."""
    if not s.gm.numel():
        return
    dist.all_reduce(s.gm, op=dist.ReduceOp.MAX, group=group)
    rescale_launch(s)
    dist.all_reduce(s.flat, op=dist.ReduceOp.SUM, group=group)


def _slice_stats(x2, t, w, lay, o: _Options) -> RowStats:
    """Statistics of the logits slice x2 [M, V_r] over the whole vocabulary (two collectives).
    With class weights, W is summed over ranks in the same collective."""
    s = RowStats.new(x2.shape[0], o.label_smoothing > 0.0, w is not None, x2.device)
    if w is not None:
        s.wsum.copy_(w.sum())
    stats_launch(x2, t, w, s, lay.start, o)
    _exchange(s, lay.group)
    return s


def _denominator(reduction, num_items_in_batch, t, ignore_index, w_t, device):
    """1 / the "mean" denominator ([1] fp32), or None for "sum" / "none". `w_t`: the target's
    class weight per row (0 on ignored rows), or None without class weights (then the count
    of rows whose target `t` is not ignored)."""
    if reduction != "mean":
        return None
    if num_items_in_batch is None:
        if w_t is not None:
            denom = w_t.sum().reshape(1)
        else:
            denom = (t != ignore_index).sum(dtype=torch.float32).reshape(1)
    elif isinstance(num_items_in_batch, torch.Tensor):
        denom = num_items_in_batch.to(device=device, dtype=torch.float32).reshape(1)
    else:
        denom = torch.full((1,), float(num_items_in_batch), device=device)
    return 1.0 / denom


def _incoming(grad_loss: torch.Tensor) -> torch.Tensor:
    """The incoming gradient as fp32: one element, or one per row (any stride)."""
    s = grad_loss.reshape(-1)
    return s if s.dtype == torch.float32 else s.float()


def _targets(target: torch.Tensor) -> torch.Tensor:
    t = target.reshape(-1)
    return t if t.is_contiguous() else t.contiguous()


def _class_weights(class_weight):
    return class_weight.float().contiguous() if class_weight is not None else None


# --------------------------------------------------------------------------- autograd


class _VocabParallelCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, class_weight, lay, o, reduction, num_items, return_z,
                in_place, want_grad):  # fmt: skip
        op = "vocab_parallel_cross_entropy"
        x2 = rows_view(op, "logits", logits)
        t = _targets(target)
        M = t.numel()
        dev = logits.device
        w = _class_weights(class_weight)
        s = _slice_stats(x2, t, w, lay, o)
        w_t = s.st[:, s.col_w] if w is not None else None  # 0 on ignored rows
        inv = _denominator(reduction, num_items, t, o.ignore_index, w_t, dev)
        grad = None
        ctx.in_place = False
        if want_grad and ctx.needs_input_grad[0]:
            if in_place and not traced(logits):
                check_in_place(op, "logits", logits)
            # In place only over the caller's own storage with no two rows sharing memory (as
            # ops.cross_entropy decides it).
            ctx.in_place = (
                in_place
                and not traced(logits)
                and lay.local > 0
                and x2.data_ptr() == logits.data_ptr()
                and (M == 1 or x2.stride(0) >= lay.local)
            )
            grad = x2 if ctx.in_place else empty(x2.shape, dtype=logits.dtype, device=dev)
        loss_rows = empty((M,), dtype=torch.float32, device=dev)
        z_rows = empty((M,), dtype=torch.float32, device=dev) if return_z else None
        # the lse goes over the slice's max, no longer needed
        loss_grad_launch(x2, t, w, s, loss_rows, s.m, z_loss=z_rows, grad=grad, scale=inv,
                         start=lay.start, vocab=lay.vocab, o=o)  # fmt: skip
        if grad is not None:
            if ctx.in_place:
                # The logits now hold the gradient: another saver of them fails its version
                # check instead of reading a gradient.
                torch.autograd.graph.increment_version(logits)
            # In place, a detached alias of the logits is saved: the local tensor of a DTensor
            # is a view made by a custom Function, which autograd refuses to hand back once
            # written.
            ctx.save_for_backward(logits.detach() if ctx.in_place else grad)
            ctx.logits_shape = logits.shape
            ctx.used = False
        loss = reduce_rows(loss_rows, reduction, inv, target.shape)
        if return_z:
            z = reduce_rows(z_rows, reduction, inv, target.shape)
            ctx.mark_non_differentiable(z)
            return loss, z
        return loss

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_loss, *unused):
        (saved,) = ctx.saved_tensors
        if ctx.used:
            raise RuntimeError(
                "vocab_parallel_cross_entropy: backward ran twice through the same graph; the "
                "gradient is computed in the forward and scaled in place by the first backward. "
                "Run the forward again for a second backward."
            )
        ctx.used = True
        grad = saved.detach()  # the gradient (or the logits holding it, in place)
        if grad.numel():  # skipped per row where the incoming gradient is 1
            scale_grad_(grad.view(-1, grad.shape[-1]), _incoming(grad_loss))
        return (grad.view(ctx.logits_shape),) + (None,) * 9


def _flce_chunks(h2, weight, bias, lay, o, t, w, s: RowStats, chunk, *, forward, scale=None,
                 loss_rows=None, z_rows=None, grad_h=None, grad_w=None,
                 grad_b=None):  # fmt: skip
    """One pass over the token chunks of the local logits h @ weight.T (+ bias).

    `forward`: each chunk's statistics are computed and exchanged into `s` (two collectives a
    chunk) and its loss rows written; otherwise `s` holds them already (the recompute of
    reduction="none"). With gradients asked, the chunk's gradient (times `scale`) is written
    over its logits and accumulated into the local grad_w / grad_b and the partial grad_h
    (this rank's classes only: the caller all-reduces it)."""
    N = h2.shape[0]
    want = grad_h is not None or grad_w is not None or grad_b is not None
    buf = empty((min(chunk, N), lay.local), dtype=h2.dtype, device=h2.device)
    scratch = None if forward else empty((min(chunk, N),), dtype=torch.float32, device=h2.device)
    for a in range(0, N, chunk):
        b = min(a + chunk, N)
        r = slice(a, b)
        hc, lg, sr = h2[r], buf[: b - a], s.rows(a, b)
        if bias is not None:
            torch.addmm(bias, hc, weight.t(), out=lg)
        else:
            torch.mm(hc, weight.t(), out=lg)
        if forward:
            stats_launch(lg, t[r], w, sr, lay.start, o)
            _exchange(sr, lay.group)
            rows, lse, zr = loss_rows[r], sr.m, (z_rows[r] if z_rows is not None else None)
        else:  # the loss rows again, into scratch
            rows = lse = scratch[: b - a]
            zr = None
        sc = scale if scale is None or scale.numel() == 1 else scale[r]
        loss_grad_launch(lg, t[r], w, sr, rows, lse, z_loss=zr, grad=lg if want else None,
                         scale=sc, start=lay.start, vocab=lay.vocab, o=o)  # fmt: skip
        if not want:
            continue
        if grad_b is not None:
            grad_b += lg.sum(0, dtype=torch.float32)
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


def _flce_weights(t, ignore_index, lay, w):
    """(w_t per row, W) over all ranks with class weights (one collective), else (None, None)."""
    if w is None:
        return None, None
    loc = t.long() - lay.start
    owns = (t != ignore_index) & (loc >= 0) & (loc < lay.local)
    if lay.local:
        w_t = torch.where(owns, w[torch.where(owns, loc, 0)], 0.0)
    else:
        w_t = torch.zeros(t.shape, device=t.device)
    w_t, W = _all_reduce_sum([w_t, w.sum().reshape(1)], lay.group)
    return w_t, W


class _VocabParallelFLCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, target, bias, class_weight, lay, o, reduction, num_items,
                return_z, accum_dtype, chunk, want_grad):  # fmt: skip
        H = hidden.shape[-1]
        h2 = hidden.reshape(-1, H).contiguous()
        N = h2.shape[0]
        dev = hidden.device
        t = _targets(target)
        w = _class_weights(class_weight)
        w_t, W = _flce_weights(t, o.ignore_index, lay, w)  # "mean" needs every w_t before any chunk
        inv = _denominator(reduction, num_items, t, o.ignore_index, w_t, dev)
        need_h = want_grad and ctx.needs_input_grad[0]
        need_w = want_grad and ctx.needs_input_grad[1]
        need_b = want_grad and bias is not None and ctx.needs_input_grad[3]
        grads_now = (need_h or need_w or need_b) and reduction != "none"
        acc = accum_dtype or weight.dtype
        s = RowStats.new(N, o.label_smoothing > 0.0, w is not None, dev, W)
        loss_rows = empty((N,), dtype=torch.float32, device=dev)
        z_rows = empty((N,), dtype=torch.float32, device=dev) if return_z else None
        grads = _flce_grad_buffers(h2, lay, acc, need_h and grads_now, need_w and grads_now,
                                   need_b and grads_now)  # fmt: skip
        _flce_chunks(h2, weight, bias, lay, o, t, w, s, chunk, forward=True, scale=inv,
                     loss_rows=loss_rows, z_rows=z_rows, grad_h=grads[0], grad_w=grads[1],
                     grad_b=grads[2])  # fmt: skip
        ctx.grads_now = grads_now
        ctx.hidden_shape = hidden.shape
        ctx.used = False
        if grads_now:
            ctx.save_for_backward(*_flce_finish(*grads, weight, bias, lay.group))
        elif need_h or need_w or need_b:  # reduction="none": recompute in the backward
            ctx.save_for_backward(h2, weight, bias, t, w, s.gm, s.st, s.wsum)
            ctx.need = (need_h, need_w, need_b)
            ctx.meta = (lay, o, acc, chunk, s.col_s, s.col_w)
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
            h2, weight, bias, t, w, gm, st, wsum = ctx.saved_tensors
            lay, o, acc, chunk, col_s, col_w = ctx.meta
            s = RowStats(gm, gm, st, st.view(-1), wsum, col_s, col_w)  # m: never read here
            grads = _flce_grad_buffers(h2, lay, acc, *ctx.need)
            _flce_chunks(h2, weight, bias, lay, o, t, w, s, chunk, forward=False,
                         scale=_incoming(grad_loss), grad_h=grads[0], grad_w=grads[1],
                         grad_b=grads[2])  # fmt: skip
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
    in_place: bool = False,
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
        in_place: write the gradient over this rank's logits slice (saves one [rows, V_r]
            buffer; the caller must not read the logits afterwards; refused for a leaf that
            requires grad).
        chunk_size: accepted for compatibility, no effect (the kernels need no temporaries).
        The other options as in `kernelwright.ops.cross_entropy.cross_entropy`.

    Returns the loss (fp32; "none": target's shape), a plain tensor, the same on every rank of
    the group; with return_z_loss, (loss, z_loss). Per call: one all-reduce (MAX) of [rows]
    and one (SUM) of [2-4 x rows] in the forward; the backward communicates nothing. Every
    rank must call it (and its backward) with the same targets and options.

    The gradient is computed in the forward (into a new [rows, V_r] tensor in the logits'
    dtype, or over the logits with `in_place`) and the backward only scales it, so a second
    backward through the same graph is an error, as with `ops.cross_entropy`.
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
    return _VocabParallelCE.apply(logits, target, weight, lay, o, reduction, num_items_in_batch,
                                  return_z_loss, in_place, torch.is_grad_enabled())  # fmt: skip


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

    The per-chunk softmax math runs in the Triton kernels of `vocab_parallel_cross_entropy`,
    the gradient written over the chunk's logits; the matmuls run in hidden's dtype.
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
