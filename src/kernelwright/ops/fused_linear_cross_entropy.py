"""Linear layer + cross-entropy in one op: the lm-head matmul and the loss, chunk by chunk, so
the [tokens, V] logits never exist.

For each chunk of C tokens (one reused [C, V] buffer in the hidden dtype):

    logits_c = hidden_c @ weight.T (+ bias)             cuBLAS
    loss, dlogits_c (written over logits_c)             the cross_entropy kernel, scaled by
                                                        the reduction's 1 / denominator
    grad_hidden_c = dlogits_c @ weight                  cuBLAS, into its slice of the output
    grad_weight  += dlogits_c.T @ hidden_c              cuBLAS, accumulated in place
    grad_bias    += dlogits_c.sum(0)                    fp32

so the forward leaves every gradient ready and the backward only multiplies by the incoming
gradient (skipped inside the kernel when it is 1: no sync). With reduction="none" the incoming
gradient differs per token and the weight gradient sums over tokens, so the forward computes the
losses only and the backward recomputes each chunk's logits (four matmuls instead of three).

Chunk size (`choose_chunk_rows`, its knobs in runtime/tables/cross_entropy.py): the grad_weight
update reads and writes the whole [V, H] gradient once per chunk, while its math grows with the
chunk's tokens C: below ~400 tokens it is memory-bound whatever V is. So a chunk has at least
512 tokens and 1/16 of the tokens (about 16 updates at most), and more while the [C, V] logits
buffer stays within 128 MiB (2048 tokens at V = 32768). At 8192 tokens and V = 128256 that is
512 tokens, a 125 MiB buffer (about 1% of what eager PyTorch allocates; the ratio holds as
tokens grow). Never more than a quarter of the free memory; `chunk_size` overrides.
`accum_dtype=torch.float32` accumulates grad_weight / grad_bias in fp32 (one extra fp32 [V, H]
buffer, and cuBLAS's mixed-dtype update is slower) and rounds once at the end.

The loss semantics (ignore_index, reductions, label smoothing, class weights, z-loss,
soft-capping, num_items_in_batch) are those of `kernelwright.ops.cross_entropy`.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from kernelwright.ops._loss import check_loss_args, checked_targets, reduce_rows
from kernelwright.ops.cross_entropy import cross_entropy_fwd_launch, scale_grad_
from kernelwright.runtime.alloc import empty
from kernelwright.runtime.checks import check_chunk_size, check_same_device, check_tensor
from kernelwright.runtime.launch import traced
from kernelwright.runtime.tables.cross_entropy import (
    CHUNK_BYTES,
    CHUNK_SHARE,
    MIN_CHUNK_TOKENS,
)


def choose_chunk_rows(
    n_tokens: int, V: int, itemsize: int, device: torch.device, budget: int | None = None
) -> int:
    """Tokens per chunk: the largest of MIN_CHUNK_TOKENS (below that the grad_weight update
    is memory-bound whatever V is), 1/CHUNK_SHARE of the tokens (so there are about
    CHUNK_SHARE grad_weight updates at most; the buffer is then ~1% of what eager PyTorch
    allocates, whose logits grow with the tokens too) and what fits `budget` bytes (default
    CHUNK_BYTES); never over a quarter of the free memory, a multiple of 64 (whole matmul
    tiles), at least 64, at most the token count."""
    rows = max(MIN_CHUNK_TOKENS, n_tokens // CHUNK_SHARE, (budget or CHUNK_BYTES) // (V * itemsize))
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        rows = min(rows, free // 4 // (V * itemsize))
    rows = max(64, rows // 64 * 64)
    return max(1, min(rows, n_tokens))


def _addmm_(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """acc += a @ b, with acc in fp32 and a, b in half precision when accumulating in fp32."""
    if acc.dtype == a.dtype:
        acc.addmm_(a, b)
    elif acc.device.type == "cuda":
        # cuBLAS reads and writes the fp32 accumulator directly (no half-precision product).
        torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)
    else:  # CPU (interpreter tests): no mixed-dtype addmm there
        acc.addmm_(a.float(), b.float())


def _run_chunks(
    h2: torch.Tensor,  # [N, H]
    weight: torch.Tensor,  # [V, H]
    bias: torch.Tensor | None,  # [V]
    t: torch.Tensor,  # [N]
    loss_rows: torch.Tensor,  # [N] fp32 out
    lse: torch.Tensor,  # [N] fp32 out
    z_rows: torch.Tensor | None,  # [N] fp32 out
    grad_h: torch.Tensor | None,  # [N, H] out
    grad_w: torch.Tensor | None,  # [V, H] accumulated
    grad_b: torch.Tensor | None,  # [V] fp32 accumulated
    w: torch.Tensor | None,
    wsum: torch.Tensor | None,
    scale: torch.Tensor | None,  # [1] (1 / denominator) or [N] (per-token incoming gradient)
    chunk: int,
    **ce_kwargs,
) -> None:
    N = h2.shape[0]
    V = weight.shape[0]
    want_grad = grad_h is not None or grad_w is not None or grad_b is not None
    buf = empty((min(chunk, N), V), dtype=h2.dtype, device=h2.device)
    for s in range(0, N, chunk):
        e = min(s + chunk, N)
        hc = h2[s:e]
        lg = buf[: e - s]
        if bias is not None:
            torch.addmm(bias, hc, weight.t(), out=lg)
        else:
            torch.mm(hc, weight.t(), out=lg)
        cross_entropy_fwd_launch(
            lg,
            t[s:e],
            loss_rows[s:e],
            lse[s:e],
            weight=w,
            weight_sum=wsum,
            z_loss=z_rows[s:e] if z_rows is not None else None,
            grad=lg if want_grad else None,
            scale=scale if scale is None or scale.numel() == 1 else scale[s:e],
            **ce_kwargs,
        )
        if grad_w is not None:
            _addmm_(grad_w, lg.t(), hc)
        if grad_h is not None:
            torch.mm(lg, weight, out=grad_h[s:e])
        if grad_b is not None:
            grad_b += lg.sum(0, dtype=torch.float32)


@torch.library.custom_op(
    "kernelwright::fused_linear_cross_entropy_chunks",
    mutates_args=("loss_rows", "lse", "z_rows", "grad_h", "grad_w", "grad_b"),
)
def _chunks_op(
    h2: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    t: torch.Tensor,
    loss_rows: torch.Tensor,
    lse: torch.Tensor,
    z_rows: torch.Tensor | None,
    grad_h: torch.Tensor | None,
    grad_w: torch.Tensor | None,
    grad_b: torch.Tensor | None,
    w: torch.Tensor | None,
    wsum: torch.Tensor | None,
    scale: torch.Tensor | None,
    chunk: int,
    ignore_index: int,
    label_smoothing: float,
    lse_square_scale: float,
    softcap: float | None,
) -> None:
    _run_chunks(
        h2, weight, bias, t, loss_rows, lse, z_rows, grad_h, grad_w, grad_b, w, wsum, scale,
        chunk, ignore_index=ignore_index, label_smoothing=label_smoothing,
        lse_square_scale=lse_square_scale, softcap=softcap,
    )  # fmt: skip


@_chunks_op.register_fake
def _(h2, weight, bias, t, loss_rows, lse, z_rows, grad_h, grad_w, grad_b, *args) -> None:
    return None


def _chunks(compiling: bool, *args, **kwargs) -> None:
    if compiling:
        _chunks_op(*args, **kwargs)
    else:
        _run_chunks(*args, **kwargs)


def _scale(x: torch.Tensor | None, s: torch.Tensor) -> None:
    """x *= s in place (s: one element), a no-op inside the kernel when s == 1."""
    if x is None or x.numel() == 0:
        return
    scale_grad_(x.view(-1, x.shape[-1]) if x.dim() > 1 else x.view(1, -1), s)


# --------------------------------------------------------------------------- autograd


def _grad_buffers(h2, V, acc, need_h, need_w, need_b):
    """grad_hidden [N, H] (written chunk by chunk), grad_weight [V, H] in `acc` and grad_bias
    [V] in fp32 (both accumulated from zero), each only when needed."""
    N, H = h2.shape
    dev = h2.device
    grad_h = empty((N, H), dtype=h2.dtype, device=dev) if need_h else None
    grad_w = torch.zeros((V, H), dtype=acc, device=dev) if need_w else None
    grad_b = torch.zeros((V,), dtype=torch.float32, device=dev) if need_b else None
    return grad_h, grad_w, grad_b


def _in_param_dtypes(grad_w, grad_b, weight, bias):
    """The accumulated grad_weight / grad_bias rounded once to their parameters' dtypes."""
    if grad_w is not None and grad_w.dtype != weight.dtype:
        grad_w = grad_w.to(weight.dtype)
    if grad_b is not None and grad_b.dtype != bias.dtype:
        grad_b = grad_b.to(bias.dtype)
    return grad_w, grad_b


class _FusedLinearCrossEntropyFunction(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        hidden,
        weight,
        target,
        bias,
        class_weight,
        ignore_index,
        reduction,
        label_smoothing,
        lse_square_scale,
        return_z_loss,
        softcap,
        num_items_in_batch,
        accum_dtype,
        chunk_size,
        want_grad,
    ):
        H = hidden.shape[-1]
        V = weight.shape[0]
        h2 = hidden.reshape(-1, H)
        if not h2.is_contiguous():
            h2 = h2.contiguous()
        N = h2.shape[0]
        dev = hidden.device
        compiling = traced(hidden)
        t, w, wsum, inv = checked_targets(
            "fused_linear_cross_entropy", target, class_weight, reduction, num_items_in_batch,
            ignore_index, V, dev,
        )  # fmt: skip
        chunk = chunk_size or choose_chunk_rows(N, V, h2.element_size(), dev)
        need_h = want_grad and ctx.needs_input_grad[0]
        need_w = want_grad and ctx.needs_input_grad[1]
        need_b = want_grad and bias is not None and ctx.needs_input_grad[3]
        grads_now = (need_h or need_w or need_b) and reduction != "none"
        acc = accum_dtype or weight.dtype
        loss_rows = empty((N,), dtype=torch.float32, device=dev)
        lse = empty((N,), dtype=torch.float32, device=dev)
        z_rows = empty((N,), dtype=torch.float32, device=dev) if return_z_loss else None
        grad_h, grad_w, grad_b = _grad_buffers(
            h2, V, acc, need_h and grads_now, need_w and grads_now, need_b and grads_now
        )
        ce_kwargs = dict(
            ignore_index=ignore_index,
            label_smoothing=label_smoothing,
            lse_square_scale=lse_square_scale,
            softcap=softcap,
        )
        _chunks(
            compiling, h2, weight, bias, t, loss_rows, lse, z_rows, grad_h, grad_w, grad_b, w,
            wsum, inv if grads_now else None, chunk, **ce_kwargs,
        )  # fmt: skip
        ctx.grads_now = grads_now
        ctx.hidden_shape = hidden.shape
        ctx.used = False
        if grads_now:
            ctx.save_for_backward(grad_h, *_in_param_dtypes(grad_w, grad_b, weight, bias))
        elif need_h or need_w or need_b:  # reduction="none": recompute in backward
            ctx.save_for_backward(h2, weight, bias, t, w, wsum)
            ctx.need = (need_h, need_w, need_b)
            ctx.acc = acc
            ctx.chunk = chunk
            ctx.ce_kwargs = ce_kwargs
        loss = reduce_rows(loss_rows, reduction, inv, target.shape)
        if return_z_loss:
            z = reduce_rows(z_rows, reduction, inv, target.shape)
            ctx.mark_non_differentiable(z)
            return loss, z
        return loss

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_loss, *unused):
        compiling = traced(grad_loss)
        s = grad_loss.reshape(-1)
        if s.dtype != torch.float32:
            s = s.float()
        if ctx.grads_now:
            if ctx.used:
                raise RuntimeError(
                    "fused_linear_cross_entropy: backward ran twice through the same graph; "
                    "the gradients are computed in the forward and scaled in place by the "
                    "first backward. Run the forward again for a second backward."
                )
            ctx.used = True
            grad_h, grad_w, grad_b = ctx.saved_tensors
            for g in (grad_h, grad_w, grad_b):
                _scale(g, s)
        else:
            h2, weight, bias, t, w, wsum = ctx.saved_tensors
            need_h, need_w, need_b = ctx.need
            grad_h, grad_w, grad_b = _grad_buffers(
                h2, weight.shape[0], ctx.acc, need_h, need_w, need_b
            )
            scratch = empty((h2.shape[0],), dtype=torch.float32, device=h2.device)
            _chunks(
                compiling, h2, weight, bias, t, scratch, torch.empty_like(scratch), None,
                grad_h, grad_w, grad_b, w, wsum, s, ctx.chunk, **ctx.ce_kwargs,
            )  # fmt: skip
            grad_w, grad_b = _in_param_dtypes(grad_w, grad_b, weight, bias)
        if grad_h is not None:
            grad_h = grad_h.view(ctx.hidden_shape)
        return (grad_h, grad_w, None, grad_b) + (None,) * 11


# --------------------------------------------------------------------------- public API


def fused_linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    class_weight: torch.Tensor | None = None,
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
    """cross_entropy(hidden @ weight.T + bias, target) without materialising the logits.

    Args:
        hidden: [..., H] float32/float16/bfloat16 (the final hidden states).
        weight: [V, H], the lm-head weight (may be tied to the input embedding), same dtype.
        target: [...] class indices (int64/int32), hidden's leading shape.
        bias: optional [V].
        class_weight: optional [V] class weights (`weight` of F.cross_entropy).
        accum_dtype: torch.float32 to accumulate grad_weight / grad_bias in fp32.
        chunk_size: tokens per chunk (default: `choose_chunk_rows`, max(512, tokens / 16, what
            fits 128 MiB of logits)); smaller chunks take less memory and more time.
        The other options as in `kernelwright.ops.cross_entropy.cross_entropy`.

    Under torch.autocast the matmul runs in the autocast dtype, as `nn.Linear` would.
    The loss is fp32; gradients come in the inputs' dtypes. Bad targets and
    `num_items_in_batch` <= 0 are errors, as in `cross_entropy`.
    """
    op = "fused_linear_cross_entropy"
    check_tensor(op, "hidden", hidden)
    check_tensor(op, "weight", weight, min_dim=2)
    if weight.dim() != 2:
        raise ValueError(f"{op}: weight must be [V, H], got shape {tuple(weight.shape)}")
    V, H = weight.shape
    if hidden.shape[-1] != H:
        raise ValueError(
            f"{op}: hidden's last dimension ({hidden.shape[-1]}) must match weight [V, H] "
            f"with H = {H}"
        )
    if V == 0:
        raise ValueError(f"{op}: weight has no classes (V = 0)")
    if H == 0:
        raise ValueError(f"{op}: hidden and weight have an empty last dimension (H = 0)")
    if bias is not None:
        check_tensor(op, "bias", bias)
        if tuple(bias.shape) != (V,):
            raise ValueError(f"{op}: bias must have shape ({V},), got {tuple(bias.shape)}")
    check_same_device(op, hidden=hidden, weight=weight, target=target, bias=bias)
    n_rows = hidden.numel() // H
    check_loss_args(
        op,
        V,
        target,
        n_rows,
        class_weight,
        reduction,
        label_smoothing,
        lse_square_scale,
        softcap,
        num_items_in_batch,
    )
    if target.shape != hidden.shape[:-1]:
        raise ValueError(
            f"{op}: target must have hidden's leading shape {tuple(hidden.shape[:-1])}, "
            f"got {tuple(target.shape)}"
        )
    if accum_dtype not in (None, torch.float32) and accum_dtype != weight.dtype:
        raise ValueError(f"{op}: accum_dtype must be None or torch.float32, got {accum_dtype}")
    check_chunk_size(op, chunk_size)
    hidden, weight, bias, accum_dtype = matmul_inputs(op, hidden, weight, bias, accum_dtype)
    with torch.autocast(hidden.device.type, enabled=False):
        return _FusedLinearCrossEntropyFunction.apply(
            hidden,
            weight,
            target,
            bias,
            class_weight,
            ignore_index,
            reduction,
            float(label_smoothing),
            float(lse_square_scale),
            return_z_loss,
            softcap,
            num_items_in_batch,
            accum_dtype,
            chunk_size,
            # autograd.Function's needs_input_grad ignores grad mode: no gradients under no_grad
            torch.is_grad_enabled(),
        )


class FusedLinearCrossEntropyLoss(torch.nn.Module):
    """`forward(hidden, weight, target, bias=None, num_items_in_batch=None)`: the loss of an
    lm-head `weight` on `hidden`, options fixed at construction (see the function)."""

    def __init__(
        self,
        ignore_index: int = -100,
        reduction: str = "mean",
        label_smoothing: float = 0.0,
        *,
        class_weight: torch.Tensor | None = None,
        lse_square_scale: float = 0.0,
        return_z_loss: bool = False,
        softcap: float | None = None,
        accum_dtype: torch.dtype | None = None,
        chunk_size: int | None = None,
    ):
        super().__init__()
        self.register_buffer("class_weight", class_weight)
        self.ignore_index = ignore_index
        self.reduction = reduction
        self.label_smoothing = label_smoothing
        self.lse_square_scale = lse_square_scale
        self.return_z_loss = return_z_loss
        self.softcap = softcap
        self.accum_dtype = accum_dtype
        self.chunk_size = chunk_size

    def forward(self, hidden, weight, target, bias=None, num_items_in_batch=None):
        return fused_linear_cross_entropy(
            hidden,
            weight,
            target,
            bias,
            class_weight=self.class_weight,
            ignore_index=self.ignore_index,
            reduction=self.reduction,
            label_smoothing=self.label_smoothing,
            lse_square_scale=self.lse_square_scale,
            return_z_loss=self.return_z_loss,
            softcap=self.softcap,
            num_items_in_batch=num_items_in_batch,
            accum_dtype=self.accum_dtype,
            chunk_size=self.chunk_size,
        )


# --------------------------------------------------------------------------- references


def matmul_inputs(op, hidden, weight, bias, accum_dtype):
    """(hidden, weight, bias, accum_dtype) as the chunk matmuls take them: cast to the autocast
    dtype under torch.autocast (as nn.Linear would be), one dtype for the three, and no
    separate accumulator when it is the weight's own dtype."""
    dev_type = hidden.device.type
    if torch.is_autocast_enabled(dev_type):
        dt = torch.get_autocast_dtype(dev_type)
        hidden, weight = hidden.to(dt), weight.to(dt)
        bias = bias.to(dt) if bias is not None else None
    if hidden.dtype != weight.dtype or (bias is not None and bias.dtype != weight.dtype):
        raise TypeError(
            f"{op}: hidden ({hidden.dtype}), weight ({weight.dtype})"
            + (f" and bias ({bias.dtype})" if bias is not None else "")
            + " must have one dtype (as for a matmul); cast them or run under torch.autocast"
        )
    return hidden, weight, bias, None if accum_dtype == weight.dtype else accum_dtype


def fused_linear_cross_entropy_ref(
    hidden, weight, target, bias=None, *, dtype=torch.float32, **kwargs
) -> torch.Tensor:
    """Reference: the logits in `dtype` (fp32 or fp64), then cross_entropy_ref. Differentiable."""
    from kernelwright.ops.cross_entropy import cross_entropy_ref

    kwargs.pop("accum_dtype", None)
    kwargs.pop("chunk_size", None)
    cw = kwargs.pop("class_weight", None)
    logits = hidden.to(dtype) @ weight.to(dtype).t()
    if bias is not None:
        logits = logits + bias.to(dtype)
    return cross_entropy_ref(logits, target, cw, dtype=dtype, **kwargs)


def fused_linear_cross_entropy_eager(hidden, weight, target, bias=None, **kwargs):
    """Eager PyTorch as a Hugging Face model computes it (the `torch` benchmark provider):
    the full logits in the model dtype, upcast to fp32, then F.cross_entropy."""
    logits = torch.nn.functional.linear(hidden, weight, bias)
    V = logits.shape[-1]
    return torch.nn.functional.cross_entropy(
        logits.reshape(-1, V).float(), target.reshape(-1), **kwargs
    )
