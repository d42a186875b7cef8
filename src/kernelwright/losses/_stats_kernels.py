"""Triton kernels of the log-prob primitive's statistics path (`losses/logprobs.py`).

The logits of one chunk of tokens are a [C, V] buffer in the matmul dtype. The transform a
model applies to them is z = softcap * tanh(scale * x / softcap) / temperature (no tanh
without a softcap).

`_stats_fwd_kernel`, one program per token: a single pass over the row keeps the online
log-sum-exp (running max m, s = sum exp(z - m)) and, when asked, sum exp(z - m) * z (the
entropy: H = lse - that / s), sum exp(2 (z - m)) (log sum p^2), sum z (the mean logit) and the
largest logit before the target (whether the target is the first argmax). It writes the
target's log-prob (0 where the target is ignored), the lse and the asked statistics in fp32.

`_stats_bwd_kernel`, one program per (token, block of the vocabulary): recomputes p from the
saved lse and writes the gradient

    dL/dz = dlogp * (onehot - p) - dH * p * (log p + H)

through the transform's derivative, in the logits' dtype, ready for the two matmuls: over the
logits (the same buffer given twice) or into another buffer when the logits are kept.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernelwright.ops._ce_kernels import _softcap


@triton.jit
def _transform(x, scale, cap, inv_t, SOFTCAP: tl.constexpr):
    z = x.to(tl.float32) * scale
    if SOFTCAP:
        z = _softcap(z, cap)
    return z * inv_t


@triton.jit
def _stats_fwd_kernel(
    logits_ptr, stride, target_ptr, logp_ptr, lse_ptr, ent_ptr, lssp_ptr, mean_ptr, top1_ptr,
    V, ignore_index, scale, cap, inv_t,
    SOFTCAP: tl.constexpr, ENTROPY: tl.constexpr, SUM_SQ: tl.constexpr, MEAN: tl.constexpr,
    TOP1: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    base = logits_ptr + row * stride
    t = tl.load(target_ptr + row).to(tl.int64)
    valid = t != ignore_index
    tt = tl.where(valid, t, 0)
    cols = tl.arange(0, BLOCK)
    zero = tl.sum(tl.zeros([BLOCK], dtype=tl.float32), axis=0)
    m = zero - float("inf")
    s = zero
    xs = zero
    sq = zero
    zs = zero
    before = zero - float("inf")
    for start in range(0, V, BLOCK):
        offs = start + cols
        mask = offs < V
        z = _transform(tl.load(base + offs, mask=mask, other=0.0), scale, cap, inv_t, SOFTCAP)
        z = tl.where(mask, z, 0.0)
        if MEAN:
            zs += tl.sum(z, axis=0)
        m_new = tl.maximum(m, tl.max(tl.where(mask, z, -float("inf")), axis=0))
        a = tl.exp(m - m_new)
        e = tl.where(mask, tl.exp(z - m_new), 0.0)
        s = s * a + tl.sum(e, axis=0)
        if ENTROPY:
            xs = xs * a + tl.sum(e * z, axis=0)
        if SUM_SQ:
            sq = sq * a * a + tl.sum(e * e, axis=0)
        if TOP1:
            before = tl.maximum(before, tl.max(tl.where(offs < tt, z, -float("inf")), axis=0))
        m = m_new
    zt = _transform(tl.load(base + tt), scale, cap, inv_t, SOFTCAP)
    lse = m + tl.log(s)
    tl.store(logp_ptr + row, tl.where(valid, zt - lse, 0.0))
    tl.store(lse_ptr + row, lse)
    if ENTROPY:
        tl.store(ent_ptr + row, lse - xs / s)
    if SUM_SQ:
        tl.store(lssp_ptr + row, tl.log(sq) - 2.0 * tl.log(s))
    if MEAN:
        tl.store(mean_ptr + row, zs / V)
    if TOP1:
        tl.store(top1_ptr + row, (valid & (zt >= m) & (zt > before)).to(tl.int8))


@triton.jit
def _stats_bwd_kernel(
    logits_ptr, stride, grad_ptr, grad_stride, target_ptr, lse_ptr, ent_ptr, dlogp_ptr, dent_ptr,
    V, ignore_index, scale, cap, inv_t,
    SOFTCAP: tl.constexpr, DLOGP: tl.constexpr, DENT: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < V
    x = tl.load(logits_ptr + row * stride + offs, mask=mask, other=0.0).to(tl.float32) * scale
    if SOFTCAP:  # noqa: SIM108  (a constexpr branch: one of the two is compiled)
        y = _softcap(x, cap)
    else:
        y = x
    logp = y * inv_t - tl.load(lse_ptr + row)
    p = tl.exp(logp)
    g = tl.zeros([BLOCK], dtype=tl.float32)
    if DLOGP:
        t = tl.load(target_ptr + row).to(tl.int64)
        dl = tl.where(t != ignore_index, tl.load(dlogp_ptr + row), 0.0)
        g = tl.where(offs == t, dl, 0.0) - dl * p
    if DENT:
        g -= tl.load(dent_ptr + row) * p * (logp + tl.load(ent_ptr + row))
    g = g * inv_t
    if SOFTCAP:
        th = y / cap
        g = g * (1.0 - th * th)
    g = g * scale
    tl.store(grad_ptr + row * grad_stride + offs, g.to(grad_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _logaddexp(a, b):
    hi = tl.maximum(a, b)
    return hi + tl.log(1.0 + tl.exp(tl.minimum(a, b) - hi))


@triton.jit
def _distill_kernel(
    s_ptr, t_ptr, s_stride, t_stride, loss_ptr, ent_ptr,
    V, inv_t, beta, log_1mb, log_b, scale,
    MODE: tl.constexpr, ENTROPY: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """One token of `fused_linear_distill`: the divergence between softmax(s / T) (student) and
    softmax(t / T) (teacher), and its gradient in s written over the student's logits, times
    `scale` (the reduction's). MODE 0: forward KL(t || s), gradient (p_s - p_t) / T; 1: reverse
    KL(s || t); 2: generalized JSD with mixture m = (1 - beta) p_s + beta p_t. For 1 and 2 the
    gradient is c * p_s * (r - E_s[r]) / T with r = log p_s - log m (log p_t for 1) and c =
    1 - beta (1 for 1). Three passes over the row: the two log-sum-exps, the divergence and
    E_s[r] (and, with ENTROPY, the student's entropy -sum p_s log p_s), the gradient."""
    row = tl.program_id(0).to(tl.int64)
    s_row = s_ptr + row * s_stride
    t_row = t_ptr + row * t_stride
    cols = tl.arange(0, BLOCK)
    zero = tl.sum(tl.zeros([BLOCK], dtype=tl.float32), axis=0)
    ms = zero - float("inf")
    mt = zero - float("inf")
    ss = zero
    st = zero
    for start in range(0, V, BLOCK):
        offs = start + cols
        mask = offs < V
        s = tl.where(mask, tl.load(s_row + offs, mask=mask, other=0.0).to(tl.float32) * inv_t,
                     -float("inf"))  # fmt: skip
        t = tl.where(mask, tl.load(t_row + offs, mask=mask, other=0.0).to(tl.float32) * inv_t,
                     -float("inf"))  # fmt: skip
        ms_new = tl.maximum(ms, tl.max(s, axis=0))
        mt_new = tl.maximum(mt, tl.max(t, axis=0))
        ss = ss * tl.exp(ms - ms_new) + tl.sum(tl.exp(s - ms_new), axis=0)
        st = st * tl.exp(mt - mt_new) + tl.sum(tl.exp(t - mt_new), axis=0)
        ms = ms_new
        mt = mt_new
    lse_s = ms + tl.log(ss)
    lse_t = mt + tl.log(st)
    loss = zero
    er = zero
    ent = zero
    for start in range(0, V, BLOCK):
        offs = start + cols
        mask = offs < V
        ls = tl.load(s_row + offs, mask=mask, other=0.0).to(tl.float32) * inv_t - lse_s
        lt = tl.load(t_row + offs, mask=mask, other=0.0).to(tl.float32) * inv_t - lse_t
        ps = tl.where(mask, tl.exp(ls), 0.0)
        pt = tl.where(mask, tl.exp(lt), 0.0)
        if ENTROPY:
            ent -= tl.sum(ps * ls, axis=0)
        if MODE == 0:
            loss += tl.sum(pt * (lt - ls), axis=0)
        elif MODE == 1:
            loss += tl.sum(ps * (ls - lt), axis=0)
        else:
            m = _logaddexp(ls + log_1mb, lt + log_b)
            r = ps * (ls - m)
            er += tl.sum(r, axis=0)
            loss += beta * tl.sum(pt * (lt - m), axis=0) + (1.0 - beta) * tl.sum(r, axis=0)
    if MODE == 1:
        er = loss
    for start in range(0, V, BLOCK):
        offs = start + cols
        mask = offs < V
        ls = tl.load(s_row + offs, mask=mask, other=0.0).to(tl.float32) * inv_t - lse_s
        lt = tl.load(t_row + offs, mask=mask, other=0.0).to(tl.float32) * inv_t - lse_t
        ps = tl.exp(ls)
        if MODE == 0:
            g = ps - tl.exp(lt)
        elif MODE == 1:
            g = ps * (ls - lt - er)
        else:
            g = (1.0 - beta) * ps * (ls - _logaddexp(ls + log_1mb, lt + log_b) - er)
        tl.store(s_row + offs, (g * (inv_t * scale)).to(s_ptr.dtype.element_ty), mask=mask)
    tl.store(loss_ptr + row, loss)
    if ENTROPY:
        tl.store(ent_ptr + row, ent)
