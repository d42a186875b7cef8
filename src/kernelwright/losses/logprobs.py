"""Per-token log-probabilities of target tokens from the last hidden states, never holding the
[tokens, vocab] logits: the primitive every post-training loss here is written on."""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
from torch.autograd.function import once_differentiable

from kernelwright.losses._stats_kernels import _stats_bwd_kernel, _stats_fwd_kernel
from kernelwright.ops.fused_linear_cross_entropy import (
    _addmm_,
    choose_chunk_rows,
    fused_linear_cross_entropy,
)
from kernelwright.runtime.checks import check_chunk_size, check_same_device, check_tensor
from kernelwright.runtime.launch import traced


class LogprobStats(NamedTuple):
    """Per-token outputs of `fused_linear_logprob_stats`, fp32 (is_top1 bool); a statistic
    that was not asked for is None."""

    log_probs: torch.Tensor
    entropy: torch.Tensor | None = None
    log_sum_sq_probs: torch.Tensor | None = None
    mean_logits: torch.Tensor | None = None
    is_top1: torch.Tensor | None = None


STATS = ("entropy", "log_sum_sq_probs", "mean_logits", "is_top1")
LOGITS_BYTES = 256 << 20  # the [chunk, V] logits buffer: 1024 tokens at V = 128256 in bf16


def fused_linear_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    ignore_index: int = -100,
    chunk_size: int | None = None,
    return_entropy: bool = False,
    softcap: float | None = None,
    logit_scale: float = 1.0,
    accum_dtype: torch.dtype | None = None,
    backward: str = "recompute",
    entropy_grad: bool = True,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """log softmax(z)[target] per token, in fp32, where z are the logits a model samples from:
    z = softcap * tanh(logit_scale * (hidden @ weight.T + bias) / softcap) / temperature (no
    tanh without `softcap`).

    hidden [..., H] (float), weight [V, H] (an lm_head, tied or not), target token ids
    (int64/int32) of hidden's leading shape [...]; a token whose target is `ignore_index` gets
    0 (mask it out of any sum), any other target must lie in [0, V). Chunked over tokens:
    `chunk_size` tokens per chunk (None: chosen from the sizes; else an int >= 1); the
    forward keeps one chunk's logits at a time, the backward recomputes them. Differentiable in
    hidden, weight and bias; under torch.autocast the matmuls run in the autocast dtype.

    Only the tokens with a target are computed: a prompt costs nothing (in eager mode; a
    traced call computes every token). return_entropy: also each token's entropy of that
    distribution, differentiable, 0 where the target is ignored: (logps, entropy).
    accum_dtype=torch.float32 accumulates the weight gradient of bf16 weights in fp32.
    backward: "recompute" or "stored", what the forward keeps for the backward, and
    entropy_grad=False, an entropy that is only a metric (see `fused_linear_logprob_stats`).
    """
    if return_entropy or (softcap is not None and temperature != 1.0) or backward != "recompute":
        st = fused_linear_logprob_stats(
            hidden, weight, target, bias=bias, temperature=temperature, softcap=softcap,
            logit_scale=logit_scale, ignore_index=ignore_index, chunk_size=chunk_size,
            accum_dtype=accum_dtype, outputs=("entropy",) if return_entropy else (),
            backward=backward, entropy_grad=entropy_grad,
        )  # fmt: skip
        return (st.log_probs, st.entropy) if return_entropy else st.log_probs
    _check(temperature, softcap, backward)
    _check_inputs(hidden, weight, target, bias, chunk_size)
    target = widen_ids(target, ignore_index)
    keep = _scored_checked(target, ignore_index, weight.shape[0])
    # Without a cap after it, the temperature folds into the matmul's input:
    # logits * k = (hidden * k) @ weight.T + bias * k (one more rounding in half precision).
    k = logit_scale if softcap is not None else logit_scale / temperature
    if k != 1.0:
        hidden = hidden * k
        bias = None if bias is None else bias * k
    h2, t = hidden.reshape(-1, hidden.shape[-1]), target.reshape(-1)
    if keep is not None:
        h2, t = h2[keep], t[keep]
    if chunk_size is None:
        chunk_size = chunk_rows(h2.shape[0], weight.shape[0], _compute_dtype(h2), h2.device)
    nll = fused_linear_cross_entropy(
        h2,
        weight,
        t,
        bias,
        ignore_index=ignore_index,
        reduction="none",
        softcap=softcap,
        accum_dtype=accum_dtype,
        chunk_size=chunk_size,
    )
    return -_spread(nll, keep).reshape(target.shape)


def chunk_rows(n: int, V: int, dtype: torch.dtype, device: torch.device) -> int:
    """Tokens per chunk of the log-prob paths: as fused linear cross-entropy chooses, with a
    LOGITS_BYTES buffer. Their backward recomputes the logits and the weight gradient is
    read and written once per chunk, so fewer, larger chunks pay off more than there."""
    return choose_chunk_rows(n, V, torch.finfo(dtype).bits // 8, device, budget=LOGITS_BYTES)


def widen_ids(t: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """`t` as int64 when `ignore_index` lies outside its integer dtype's range: PyTorch
    compares an int32 tensor with such a number after wrapping it (-(2**62) becomes 0), which
    would ignore every target equal to the wrapped value."""
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        return t
    info = torch.iinfo(t.dtype)
    return t if info.min <= ignore_index <= info.max else t.long()


def _scored(t: torch.Tensor, ignore_index: int) -> torch.Tensor | None:
    """The mask of the tokens to compute, or None for all of them (none ignored, all
    ignored, or a traced call, where the count would break the graph)."""
    if traced(t) or t.numel() == 0:
        return None
    keep = t != ignore_index
    n = int(keep.sum())
    return None if n in (0, t.numel()) else keep


def _scored_checked(target: torch.Tensor, ignore_index: int, V: int) -> torch.Tensor | None:
    """`_scored`'s mask, the targets checked from the same host sync: one that is neither
    `ignore_index` nor in [0, V) raises, named by its position in `target`."""
    t = target.reshape(-1)
    if traced(t) or t.numel() == 0:
        return None
    keep = t != ignore_index
    bad = keep & ((t < 0) | (t >= V))
    n, n_bad = torch.stack((keep.sum(), bad.sum())).tolist()
    if n_bad:
        i = int(bad.nonzero()[0, 0])
        pos = [str(int(p)) for p in torch.unravel_index(torch.tensor(i), target.shape)]
        where = f"target[{', '.join(pos)}]" if pos else "target"
        raise ValueError(
            f"fused_linear_logprobs: {where} = {int(t[i])} is outside [0, {V}) (the rows of "
            f"weight) and is not ignore_index ({ignore_index})"
        )
    return None if n in (0, t.numel()) else keep


def _spread(x: torch.Tensor | None, keep: torch.Tensor | None) -> torch.Tensor | None:
    """The computed tokens' values back in place, 0 (False) at the skipped ones."""
    if x is None or keep is None:
        return x
    return x.new_zeros(keep.shape).masked_scatter(keep, x)


def fused_linear_logprob_stats(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    softcap: float | None = None,
    logit_scale: float = 1.0,
    ignore_index: int = -100,
    chunk_size: int | None = None,
    accum_dtype: torch.dtype | None = None,
    outputs: tuple[str, ...] = STATS,
    backward: str = "recompute",
    entropy_grad: bool = True,
) -> LogprobStats:
    """The target log-probs and, per token, the statistics named in `outputs` (of STATS) of
    the same distribution as `fused_linear_logprobs`, from one pass over each chunk's logits.

    entropy is differentiable (its gradient joins the log-probs' in the one recomputation of
    the backward); log_sum_sq_probs (log sum_v p_v^2), mean_logits (the mean of z) and
    is_top1 (the target is the first argmax) are not. Every output is 0 (False) where the
    target is ignored; those tokens are not computed (in eager mode).

    backward="recompute" keeps one chunk's logits at a time, and the backward projects each
    chunk again: four matmuls per chunk in all (the logits, the logits again, d hidden,
    d weight; three with a frozen head). backward="stored" trades memory for that second
    projection when a gradient is recorded (under no_grad it keeps nothing):
    - the hidden states alone need a gradient (a frozen head and bias) and no entropy is
      asked, or it is asked with entropy_grad=False: each token's gradient row
      d logp_t / d hidden_t = (onehot(y_t) - p_t) @ W (through the transform) is computed in
      the forward, [N, H] fp32 kept; the backward only scales the rows by the upstream
      gradient (two matmuls per chunk, not three).
    - otherwise: every chunk's logits are kept, [N, V] in the matmul dtype (N the scored
      tokens); the backward skips their projection (three matmuls per chunk, not four).
    The weight's gradient sum_t dlogp_t (onehot(y_t) - p_t) h_t^T cannot be formed before
    the per-token upstream gradients are known without p itself, nor the entropy's hidden
    gradient without a second matmul, hence the logits there.

    entropy_grad=False: the entropy is a metric (a trainer that logs it, or masks tokens by
    it, without differentiating it). Its values are the same and it stays in the graph, but
    a backward that reaches it raises instead of computing its gradient; that lets the stored
    backward of a frozen head keep the gradient rows rather than the logits.
    """
    _check(temperature, softcap, backward)
    unknown = set(outputs) - set(STATS)
    if unknown:
        raise ValueError(f"fused_linear_logprob_stats: unknown outputs {sorted(unknown)}; "
                         f"choose from {STATS}")  # fmt: skip
    _check_inputs(hidden, weight, target, bias, chunk_size)
    target = widen_ids(target, ignore_index)
    keep = _scored_checked(target, ignore_index, weight.shape[0])
    want = tuple(name in outputs for name in STATS)
    h2, t = hidden.reshape(-1, hidden.shape[-1]), target.reshape(-1)
    res = _LogprobStats.apply(
        h2 if keep is None else h2[keep], weight, bias, t if keep is None else t[keep],
        float(temperature), None if softcap is None else float(softcap), float(logit_scale),
        int(ignore_index), chunk_size, want, accum_dtype,
        backward == "stored" and torch.is_grad_enabled(), bool(entropy_grad),
    )  # fmt: skip
    shape = target.shape
    if keep is None and t.numel():
        # every token computed (none ignored, all ignored, or traced): 0 where ignored
        ignored = t == ignore_index
        res = tuple(None if x is None else x.masked_fill(ignored, 0) for x in res)
    return LogprobStats(*(None if x is None else _spread(x, keep).reshape(shape) for x in res))


BACKWARDS = ("recompute", "stored")


def _check(temperature: float, softcap: float | None, backward: str = "recompute") -> None:
    if backward not in BACKWARDS:
        raise ValueError(f"fused_linear_logprobs: backward must be one of {BACKWARDS}, "
                         f"got {backward!r}")  # fmt: skip
    if not temperature > 0:
        raise ValueError(f"fused_linear_logprobs: temperature must be > 0, got {temperature}")
    if softcap is not None and not softcap > 0:
        raise ValueError(f"fused_linear_logprobs: softcap must be > 0, got {softcap}")


def check_head(op: str, names: tuple[str, str, str], hidden, weight, bias) -> None:
    """hidden [..., H], weight [V, H] and bias [V] (or None), float tensors; `names` are the
    three arguments' names in `op`."""
    h, w, b = names
    check_tensor(op, h, hidden)
    check_tensor(op, w, weight, min_dim=2)
    if weight.dim() != 2 or weight.shape[1] != hidden.shape[-1]:
        raise ValueError(f"{op}: {w} must be [V, {hidden.shape[-1]}] (H = {h}'s last "
                         f"dimension), got {tuple(weight.shape)}")  # fmt: skip
    if bias is not None:
        check_tensor(op, b, bias)
        if tuple(bias.shape) != (weight.shape[0],):
            raise ValueError(f"{op}: {b} must have shape ({weight.shape[0]},) (one per row of "
                             f"{w}), got {tuple(bias.shape)}")  # fmt: skip


def _check_inputs(hidden, weight, target, bias, chunk_size) -> None:
    op = "fused_linear_logprobs"
    check_head(op, ("hidden", "weight", "bias"), hidden, weight, bias)
    if not isinstance(target, torch.Tensor) or target.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{op}: target must be a tensor of token ids (int64 or int32), got "
                        f"{getattr(target, 'dtype', type(target).__name__)}")  # fmt: skip
    if target.shape != hidden.shape[:-1]:
        raise ValueError(f"{op}: target shape {tuple(target.shape)} must equal hidden's leading "
                         f"shape {tuple(hidden.shape[:-1])}")  # fmt: skip
    check_same_device(op, hidden=hidden, weight=weight, target=target, bias=bias)
    check_chunk_size(op, chunk_size)


def _compute_dtype(h: torch.Tensor) -> torch.dtype:
    if torch.is_autocast_enabled(h.device.type):
        return torch.get_autocast_dtype(h.device.type)
    return h.dtype


def _project(h, w, b, out):
    if b is not None:
        torch.addmm(b, h, w.t(), out=out)
    else:
        torch.mm(h, w.t(), out=out)


class _LogprobStats(torch.autograd.Function):
    """Chunks of C tokens: logits = hidden_c @ weight.T (+ bias) into one reused [C, V]
    buffer, then the stats kernel. The backward recomputes each chunk's logits, turns them into
    their gradient in place and runs the two gradient matmuls. With `store` (backward="stored"
    under grad mode) the forward keeps what spares the backward that projection: the hidden
    gradient rows of the log-probs (only hidden needs a gradient, no differentiable entropy)
    or the logits. Without `ent_grad` the entropy is a metric: a gradient reaching it raises."""

    @staticmethod
    def forward(
        ctx, h, w, b, t, temperature, softcap, scale, ignore_index, chunk, want, accum, store,
        ent_grad,
    ):  # fmt: skip
        ctx.set_materialize_grads(False)
        N, V = h.shape[0], w.shape[0]
        cd = _compute_dtype(h)
        f32 = dict(dtype=torch.float32, device=h.device)
        logp, lse = torch.empty(N, **f32), torch.empty(N, **f32)
        ent, lssp, mean = (torch.empty(N, **f32) if k else None for k in want[:3])
        top1 = torch.empty(N, dtype=torch.int8, device=h.device) if want[3] else None
        chunk = chunk or chunk_rows(N, V, cd, h.device)
        kw = _kernel_args(V, ignore_index, temperature, softcap, scale)
        need = ctx.needs_input_grad[:3]
        store = store and any(need)
        rows = logits = None
        diff_ent = ent is not None and ent_grad
        if store and not (need[1] or need[2]) and not diff_ent:
            rows = torch.zeros(h.shape, **f32)  # d logp_t / d hidden_t
            ones = torch.ones(N, **f32)
        elif store:
            logits = torch.empty((N, V), dtype=cd, device=h.device)
        with torch.autocast(h.device.type, enabled=False):
            wc = w.to(cd)
            bc = None if b is None else b.to(cd)
            buf = None
            if logits is None:
                buf = torch.empty((min(chunk, N), V), dtype=cd, device=h.device)
            for s in range(0, N, chunk):
                e = min(s + chunk, N)
                lg = logits[s:e] if logits is not None else buf[: e - s]
                _project(h[s:e].to(cd), wc, bc, lg)
                _stats_fwd_kernel[(e - s,)](
                    lg, lg.stride(0), t[s:e], logp[s:e], lse[s:e],
                    *(x[s:e] if x is not None else lse[s:e] for x in (ent, lssp, mean)),
                    top1[s:e] if top1 is not None else lse[s:e],
                    ENTROPY=want[0], SUM_SQ=want[1], MEAN=want[2], TOP1=want[3], **kw,
                )  # fmt: skip
                if rows is not None:  # the gradient of a unit upstream gradient, then @ W
                    _grad_kernel(lg, lg, t[s:e], lse[s:e], lse[s:e], ones[s:e], None, kw)
                    _addmm_(rows[s:e], lg, wc)
        if rows is not None:
            ctx.save_for_backward(rows)
        else:
            ctx.save_for_backward(h, w, b, t, lse, ent if ent is not None else lse, logits)
        ctx.args = (cd, chunk, kw, accum, diff_ent, rows is not None, h.dtype)
        ctx.metric_ent = ent is not None and not ent_grad
        out = [x for x in (lssp, mean) if x is not None]
        if top1 is not None:
            top1 = top1.bool()
            out.append(top1)
        ctx.mark_non_differentiable(*out)
        return logp, ent, lssp, mean, top1

    @staticmethod
    @once_differentiable
    def backward(ctx, d_logp, d_ent, *_):
        cd, chunk, kw, accum, has_ent, has_rows, h_dtype = ctx.args
        if d_ent is not None and ctx.metric_ent:
            raise RuntimeError(
                "fused_linear_logprob_stats: the loss differentiates an entropy computed with "
                "entropy_grad=False (a metric); pass entropy_grad=True to train on it"
            )
        none = (None,) * 10
        if has_rows:  # only hidden needs a gradient, and only the log-probs have one
            (rows,) = ctx.saved_tensors
            if d_logp is None:
                return None, None, None, *none
            return (rows * d_logp.float().unsqueeze(1)).to(h_dtype), None, None, *none
        h, w, b, t, lse, ent, logits = ctx.saved_tensors
        if not has_ent:
            d_ent = None
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        if (d_logp is None and d_ent is None) or not (need_h or need_w or need_b):
            return None, None, None, *none
        N, V = h.shape[0], w.shape[0]
        # fp32 hidden states under autocast (a master copy): their gradient comes out of the
        # half-precision matmul in fp32, not rounded to half first
        wide_h = h.dtype != cd
        grad_h = None
        if need_h:
            grad_h = (torch.zeros if wide_h else torch.empty)(
                h.shape, dtype=h.dtype, device=h.device
            )
        acc = accum or w.dtype
        grad_w = torch.zeros(w.shape, dtype=acc, device=w.device) if need_w else None
        grad_b = torch.zeros(V, dtype=torch.float32, device=w.device) if need_b else None
        dl = d_logp.float().contiguous() if d_logp is not None else None
        de = d_ent.float().contiguous() if d_ent is not None else None
        with torch.autocast(h.device.type, enabled=False):
            wc = w.to(cd)
            bc = None if b is None else b.to(cd)
            buf = torch.empty((min(chunk, N), V), dtype=cd, device=h.device)
            for s in range(0, N, chunk):
                e = min(s + chunk, N)
                g, hc = buf[: e - s], h[s:e].to(cd)
                if logits is None:  # recompute the chunk's logits, then overwrite them
                    _project(hc, wc, bc, g)
                lg = g if logits is None else logits[s:e]
                _grad_kernel(lg, g, t[s:e], lse[s:e], ent[s:e], *(
                    None if x is None else x[s:e] for x in (dl, de)), kw)  # fmt: skip
                if grad_h is not None and wide_h:
                    _addmm_(grad_h[s:e], g, wc)
                elif grad_h is not None:
                    torch.mm(g, wc, out=grad_h[s:e])
                if grad_w is not None:
                    _addmm_(grad_w, g.t(), hc)
                if grad_b is not None:
                    grad_b += g.sum(0, dtype=torch.float32)
        return (
            grad_h,
            None if grad_w is None else grad_w.to(w.dtype),
            None if grad_b is None else grad_b.to(b.dtype),
            *none,
        )


def _grad_kernel(lg, g, t, lse, ent, dl, de, kw) -> None:
    """g = dL/dz of the logits lg (g may be lg itself) for upstream gradients dl of the
    log-probs and de of the entropy (None: no gradient)."""
    _stats_bwd_kernel[(lg.shape[0], triton.cdiv(kw["V"], kw["BLOCK"]))](
        lg, lg.stride(0), g, g.stride(0), t, lse, ent,
        dl if dl is not None else lse, de if de is not None else lse,
        DLOGP=dl is not None, DENT=de is not None, **kw,
    )  # fmt: skip


def _kernel_args(V, ignore_index, temperature, softcap, scale) -> dict:
    return dict(
        V=V, ignore_index=ignore_index, scale=scale, cap=softcap or 1.0,
        inv_t=1.0 / temperature, SOFTCAP=softcap is not None,
        BLOCK=min(4096, triton.next_power_of_2(V)),
    )  # fmt: skip


def head_weight(lm_head: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The (weight [V, H], bias) an lm_head applies, for the fused functions here, which take
    the weight rather than the module; differentiable in whatever the module trains.

    - nn.Linear, tied or not: its weight and bias.
    - FSDP2 (`fully_shard`): called outside the module's forward, the weight is a sharded
      DTensor; it is gathered whole, never used as the local shard, and its gradient is
      averaged over the ranks onto the shards, as FSDP2 averages (inside the module's forward
      FSDP2 has already unsharded it, and reduces the gradient itself).
    - PEFT LoRA on the lm_head: W + sum over the active adapters of scaling * B @ A (merged
      adapters are already in W). LoRA dropout on the head's input cannot be folded into a
      weight: it is an error in training mode, as are DoRA and fan-in-fan-out layers.
    """
    base = getattr(lm_head, "base_layer", None)
    if base is None:
        return _full(lm_head.weight), _full(getattr(lm_head, "bias", None))
    weight, bias = head_weight(base)
    if getattr(lm_head, "merged", False) or getattr(lm_head, "disable_adapters", False):
        return weight, bias
    for name in lm_head.active_adapters:
        if name not in lm_head.lora_A:
            continue
        if lm_head.use_dora.get(name, False) or getattr(lm_head, "fan_in_fan_out", False):
            raise ValueError(f"head_weight: adapter {name!r} (DoRA or fan-in-fan-out) is not "
                             "a low-rank update of the weight")  # fmt: skip
        drop = lm_head.lora_dropout[name]
        if lm_head.training and isinstance(drop, torch.nn.Dropout) and drop.p > 0:
            raise ValueError(f"head_weight: adapter {name!r} has LoRA dropout {drop.p} on the "
                             "head's input, which no merged weight reproduces; set "
                             "lora_dropout=0 for the lm_head or call the module")  # fmt: skip
        a, b = _full(lm_head.lora_A[name].weight), _full(lm_head.lora_B[name].weight)
        weight = weight + lm_head.scaling[name] * (b @ a).to(weight.dtype)
    return weight, bias


def _full(t: torch.Tensor | None) -> torch.Tensor | None:
    """A sharded DTensor parameter gathered whole. Each rank's gradient of the gathered
    tensor differs (its own tokens), so the backward reduce-scatters their mean to the shards:
    what FSDP2 does to a gradient (data-parallel averaging) when the module's own forward runs."""
    from torch.distributed.tensor import DTensor, Partial

    if not isinstance(t, DTensor):
        return t
    return t.full_tensor(grad_placements=[Partial("avg")] * t.device_mesh.ndim)


def fused_linear_logprobs_ref(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    ignore_index: int = -100,
    chunk_size: int | None = None,
    return_entropy: bool = False,
    softcap: float | None = None,
    logit_scale: float = 1.0,
    accum_dtype: torch.dtype | None = None,
    backward: str = "recompute",
    entropy_grad: bool = True,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The unfused fp32 reference: the full logits, log_softmax, a gather (and the entropy),
    0 where the target is ignored, as `fused_linear_logprobs`. It takes the same arguments;
    those that change how, not what, it computes (chunk_size, accum_dtype, backward,
    entropy_grad) are ignored."""
    logp = logits_ref(hidden, weight, bias, temperature, softcap, logit_scale).log_softmax(-1)
    target = widen_ids(target, ignore_index)
    keep = target != ignore_index
    picked = logp.gather(-1, torch.where(keep, target, 0).unsqueeze(-1)).squeeze(-1)
    logps = torch.where(keep, picked, 0.0)
    if return_entropy:
        return logps, torch.where(keep, -(logp.exp() * logp).sum(-1), 0.0)
    return logps


def logits_ref(hidden, weight, bias=None, temperature=1.0, softcap=None, logit_scale=1.0):
    """The full fp32 logits z the primitive samples from (see `fused_linear_logprobs`)."""
    z = hidden.float() @ weight.float().T
    if bias is not None:
        z = z + bias.float()
    z = z * logit_scale
    if softcap is not None:
        z = softcap * torch.tanh(z / softcap)
    return z / temperature


def sequence_logprobs(
    token_logps: torch.Tensor, mask: torch.Tensor, *, average: bool = False
) -> torch.Tensor:
    """Each sequence's log-probability: the sum over its tokens where `mask` is true (the
    mean over them with `average`, as IPO and SimPO take). token_logps, mask: [batch, T]."""
    if mask.shape != token_logps.shape:  # a [T] mask would broadcast over the batch silently
        raise ValueError(f"sequence_logprobs: mask shape {tuple(mask.shape)} must equal "
                         f"token_logps' {tuple(token_logps.shape)}")  # fmt: skip
    mask = mask.to(token_logps.dtype)
    total = (token_logps * mask).sum(-1)
    return total / mask.sum(-1).clamp(min=1) if average else total
