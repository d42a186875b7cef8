"""The cross-entropy kernels (ops/cross_entropy.py; also fused_linear_cross_entropy's chunks).

`_ce_fwd_kernel`: one program per row, the loss, the log-sum-exp and, when asked, the gradient
already multiplied by the reduction's scale. `_ce_scale_kernel`: the backward's multiply of
that gradient by the incoming one, skipped per row where it is 1.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernelwright.ops._held import HOLD_FROM, again
from kernelwright.runtime.fastlaunch import fast


@triton.jit
def _softcap(x, cap):
    # cap * tanh(x / cap), tanh(u) = 1 - 2 / (exp(2u) + 1) (no libdevice under the interpreter);
    # exp overflow / underflow give exactly +-cap. Absolute error about cap * 1e-7 near 0.
    return cap * (1.0 - 2.0 / (tl.exp(2.0 * x / cap) + 1.0))


@triton.jit
def _logits(x, mask, cap, SOFTCAP: tl.constexpr):
    # A loaded block of logits in fp32, soft-capped if asked; padding lanes stay -inf.
    z = x.to(tl.float32)
    if SOFTCAP:
        z = tl.where(mask, _softcap(z, cap), -float("inf"))
    return z


@triton.jit
def _ignored_row(
    loss_ptr, lse_ptr, z_ptr, g_row, row, V,
    BLOCK_V: tl.constexpr, STORE_Z: tl.constexpr, COMPUTE_GRAD: tl.constexpr,
):  # fmt: skip
    # An ignored row: zero loss, lse and z-loss, and (with a gradient) a zero gradient row; the
    # logits are never read.
    tl.store(loss_ptr + row, 0.0)
    tl.store(lse_ptr + row, 0.0)
    if STORE_Z:
        tl.store(z_ptr + row, 0.0)
    if COMPUTE_GRAD:
        zero = tl.zeros([BLOCK_V], dtype=g_row.dtype.element_ty)
        for start in range(0, V, BLOCK_V):
            cols = start + tl.arange(0, BLOCK_V)
            tl.store(g_row + cols, zero, mask=cols < V)


@triton.jit
def _target(x_row, w_ptr, wsum_ptr, t, V, cap, HAS_WEIGHT: tl.constexpr, SOFTCAP: tl.constexpr):
    # The target's logit z_t and weight w_t, the weights' sum W. A target outside [0, V) reads
    # class 0 instead and its z_t is NaN: it poisons its row's loss and gradient, loudly.
    in_range = (t >= 0) & (t < V)
    t_safe = tl.where(in_range, t, 0)
    z_t = tl.load(x_row + t_safe).to(tl.float32)
    if SOFTCAP:
        z_t = _softcap(z_t, cap)
    z_t = tl.where(in_range, z_t, float("nan"))
    if HAS_WEIGHT:
        w_t = tl.load(w_ptr + t_safe).to(tl.float32)
        w_all = tl.load(wsum_ptr).to(tl.float32)
    else:
        w_t = 1.0
        w_all = V * 1.0
    return in_range, z_t, w_t, w_all


@triton.jit
def _row_loss(
    loss_ptr, z_ptr, lse_ptr, row, m_row, d_row, s_row, z_t, w_t, w_all, eps, eps_v, zscale,
    HAS_SMOOTH: tl.constexpr, HAS_Z: tl.constexpr, STORE_Z: tl.constexpr,
):  # fmt: skip
    # Stores the row's loss (z-loss included), z-loss and lse from its max m_row, its sum d_row
    # of exp(z - m_row) and (label smoothing) s_row = sum_j w_j z_j; returns log(d_row), lse.
    # lse = m + log(d), but kept apart where it meets z: at |logits| ~ 1e4 a rounded lse is
    # ~1e-3 off, so (m - z_t) + log(d) and exp((z - m) - log(d)) keep torch's accuracy.
    log_d = tl.log(d_row)
    lse = m_row + log_d
    loss = (1.0 - eps) * w_t * ((m_row - z_t) + log_d)
    if HAS_SMOOTH:
        loss += eps_v * (w_all * lse - s_row)
    z_loss = zscale * lse * lse if HAS_Z else 0.0
    loss += z_loss
    if STORE_Z:
        tl.store(z_ptr + row, z_loss)
    tl.store(loss_ptr + row, loss)
    tl.store(lse_ptr + row, lse)
    return log_d, lse


@triton.jit
def _grad_terms(
    scale_ptr, row, stride_scale, in_range, w_t, w_all, lse, eps, eps_v, zscale,
    HAS_SCALE: tl.constexpr, HAS_SMOOTH: tl.constexpr, HAS_Z: tl.constexpr,
):  # fmt: skip
    # dloss/dz_j = a * p_j - b * [j == t] (- eps / V * w_j), times the scale (NaN for a bad
    # target's row).
    scale = tl.load(scale_ptr + row * stride_scale).to(tl.float32) if HAS_SCALE else 1.0
    scale = tl.where(in_range, scale, float("nan"))
    a = (1.0 - eps) * w_t
    if HAS_SMOOTH:
        a += eps_v * w_all
    if HAS_Z:
        a += 2.0 * zscale * lse
    b = (1.0 - eps) * w_t  # taken off at the target column
    return scale, a, b


@triton.jit
def _grad_block(
    z, cols, mask, t, start, w_ptr, m_row, log_d, a, b, eps_v, cap,
    HAS_WEIGHT: tl.constexpr, HAS_SMOOTH: tl.constexpr, SOFTCAP: tl.constexpr,
    PADDED: tl.constexpr,
):  # fmt: skip
    # dloss/dz over a block of (soft-capped) logits z at columns `cols` (the target's column is
    # t - start), before the scale: a * p_j (- eps / V * w_j), b taken off at the target, times
    # the soft-capping's derivative 1 - (z / cap)^2. PADDED: z's padding lanes hold -inf.
    # (z - m) - log d, not z - lse: see _row_loss.
    g = a * tl.exp((z - m_row) - log_d)
    if HAS_SMOOTH:
        if HAS_WEIGHT:
            g -= eps_v * tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        else:
            g -= eps_v
    g = tl.where(cols == t - start, g - b, g)
    if SOFTCAP:
        zc = (tl.where(mask, z, 0.0) if PADDED else z) / cap
        g *= 1.0 - zc * zc
    return g


@fast
@triton.jit
def _ce_fwd_kernel(
    x_ptr,  # logits [M, V], row stride stride_x
    t_ptr,  # targets [M], int32 or int64
    w_ptr,  # class weights [V], fp32 (HAS_WEIGHT)
    wsum_ptr,  # [1] fp32: sum of the class weights (HAS_WEIGHT)
    loss_ptr,  # [M] fp32: per-row loss, z-loss included
    z_ptr,  # [M] fp32: per-row z-loss (HAS_Z)
    lse_ptr,  # [M] fp32: per-row log-sum-exp (0 for ignored rows)
    g_ptr,  # gradient [M, V] (COMPUTE_GRAD); may be x_ptr itself (in place)
    scale_ptr,  # fp32 gradient scale, read at row * stride_scale (HAS_SCALE)
    V,
    stride_x,
    stride_g,
    stride_scale,
    ignore_index,
    eps,  # label smoothing
    eps_v,  # eps / V
    zscale,  # lse_square_scale
    cap,  # soft-capping
    HAS_WEIGHT: tl.constexpr,
    HAS_SMOOTH: tl.constexpr,
    HAS_Z: tl.constexpr,  # lse_square_scale > 0
    STORE_Z: tl.constexpr,  # write the per-row z-loss to z_ptr
    SOFTCAP: tl.constexpr,
    COMPUTE_GRAD: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    # A row in one block (BLOCK_V >= V): it stays in registers between the statistics and the
    # gradient. From HOLD_FROM columns it is held in its own dtype and each pass converts it
    # again (ops/_held.py): fp32 rows of 32K-64K would fill or spill an SM.
    row = tl.program_id(0).to(tl.int64)  # int64: row * stride passes 2^31 at 131072 x 262144
    x_row = x_ptr + row * stride_x
    g_row = g_ptr + row * stride_g
    t = tl.load(t_ptr + row).to(tl.int64)
    if t == ignore_index:
        _ignored_row(loss_ptr, lse_ptr, z_ptr, g_row, row, V, BLOCK_V, STORE_Z, COMPUTE_GRAD)
    else:
        in_range, z_t, w_t, w_all = _target(x_row, w_ptr, wsum_ptr, t, V, cap, HAS_WEIGHT,
                                            SOFTCAP)  # fmt: skip
        # ---- pass 1: lse (and sum_j w_j z_j for label smoothing)
        hold: tl.constexpr = BLOCK_V >= HOLD_FROM
        cols = tl.arange(0, BLOCK_V)
        mask = cols < V
        x = tl.load(x_row + cols, mask=mask, other=-float("inf"))
        m_row = tl.max(_logits(x, mask, cap, SOFTCAP), axis=0)
        z = _logits(again(x, m_row, hold), mask, cap, SOFTCAP)
        d_row = tl.sum(tl.exp(z - m_row), axis=0)
        s_row = 0.0
        if HAS_SMOOTH:
            wz = tl.where(mask, z, 0.0)
            if HAS_WEIGHT:
                wz = wz * tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
            s_row = tl.sum(wz, axis=0)
        log_d, lse = _row_loss(loss_ptr, z_ptr, lse_ptr, row, m_row, d_row, s_row, z_t, w_t,
                               w_all, eps, eps_v, zscale, HAS_SMOOTH, HAS_Z, STORE_Z)  # fmt: skip
        # ---- pass 2: the gradient, already scaled
        if COMPUTE_GRAD:
            scale, a, b = _grad_terms(scale_ptr, row, stride_scale, in_range, w_t, w_all, lse,
                                      eps, eps_v, zscale, HAS_SCALE, HAS_SMOOTH, HAS_Z)  # fmt: skip
            z = _logits(again(x, d_row, hold), mask, cap, SOFTCAP)
            g = _grad_block(z, cols, mask, t, 0, w_ptr, m_row, log_d, a, b, eps_v, cap,
                            HAS_WEIGHT, HAS_SMOOTH, SOFTCAP, True)  # fmt: skip
            tl.store(g_row + cols, (g * scale).to(g_ptr.dtype.element_ty), mask=mask)


@fast
@triton.jit
def _ce_fwd_looped_kernel(
    x_ptr,  # logits [M, V], row stride stride_x
    t_ptr,  # targets [M], int32 or int64
    w_ptr,  # class weights [V], fp32 (HAS_WEIGHT)
    wsum_ptr,  # [1] fp32: sum of the class weights (HAS_WEIGHT)
    loss_ptr,  # [M] fp32: per-row loss, z-loss included
    z_ptr,  # [M] fp32: per-row z-loss (HAS_Z)
    lse_ptr,  # [M] fp32: per-row log-sum-exp (0 for ignored rows)
    g_ptr,  # gradient [M, V] (COMPUTE_GRAD); may be x_ptr itself (in place)
    scale_ptr,  # fp32 gradient scale, read at row * stride_scale (HAS_SCALE)
    V,
    stride_x,
    stride_g,
    stride_scale,
    ignore_index,
    eps,  # label smoothing
    eps_v,  # eps / V
    zscale,  # lse_square_scale
    cap,  # soft-capping
    HAS_WEIGHT: tl.constexpr,
    HAS_SMOOTH: tl.constexpr,
    HAS_Z: tl.constexpr,  # lse_square_scale > 0
    STORE_Z: tl.constexpr,  # write the per-row z-loss to z_ptr
    SOFTCAP: tl.constexpr,
    COMPUTE_GRAD: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    BLOCK_V: tl.constexpr,
    EVICT_1ST: tl.constexpr,  # eviction policy of pass 1's reads
    EVICT_2ND: tl.constexpr,  # of pass 2's reads and stores
    REVERSE: tl.constexpr,  # pass 2 walks the row from its end (see LaunchConfig)
):
    # A row walked in BLOCK_V chunks, twice: an online max/sum pass, then the gradient pass,
    # which re-reads the row (from L2, in part, with the table's L2 flags).
    row = tl.program_id(0).to(tl.int64)  # int64: row * stride passes 2^31 at 131072 x 262144
    x_row = x_ptr + row * stride_x
    g_row = g_ptr + row * stride_g
    t = tl.load(t_ptr + row).to(tl.int64)
    if t == ignore_index:
        _ignored_row(loss_ptr, lse_ptr, z_ptr, g_row, row, V, BLOCK_V, STORE_Z, COMPUTE_GRAD)
    else:
        in_range, z_t, w_t, w_all = _target(x_row, w_ptr, wsum_ptr, t, V, cap, HAS_WEIGHT,
                                            SOFTCAP)  # fmt: skip
        # ---- pass 1: every lane keeps its own running max m and sum d of exp(z - m), rescaled
        # when m grows, so one read gives both (and sum_j w_j z_j for label smoothing); the
        # lanes merge at the end.
        m = tl.full([BLOCK_V], -float("inf"), dtype=tl.float32)
        d = tl.zeros([BLOCK_V], dtype=tl.float32)
        s = tl.zeros([BLOCK_V], dtype=tl.float32)
        for start in range(0, V, BLOCK_V):
            cols = start + tl.arange(0, BLOCK_V)
            mask = cols < V
            z = tl.load(x_row + cols, mask=mask, other=-float("inf"), eviction_policy=EVICT_1ST)
            z = z.to(tl.float32)
            if SOFTCAP:
                z = tl.where(mask, _softcap(z, cap), -float("inf"))
            m_new = tl.maximum(m, z)
            # A lane that has seen only -inf shifts by 0 (-inf - -inf would be NaN).
            shift = tl.where(m_new == -float("inf"), 0.0, m_new)
            d = d * tl.exp(m - shift) + tl.exp(z - shift)
            m = m_new
            if HAS_SMOOTH:
                wz = tl.where(mask, z, 0.0)
                if HAS_WEIGHT:
                    wz = wz * tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
                s += wz
        m_row = tl.max(m, axis=0)
        d_row = tl.sum(d * tl.exp(m - m_row), axis=0)
        s_row = 0.0
        if HAS_SMOOTH:
            s_row = tl.sum(s, axis=0)
        log_d, lse = _row_loss(loss_ptr, z_ptr, lse_ptr, row, m_row, d_row, s_row, z_t, w_t,
                               w_all, eps, eps_v, zscale, HAS_SMOOTH, HAS_Z, STORE_Z)  # fmt: skip
        # ---- pass 2: the gradient, already scaled
        if COMPUTE_GRAD:
            scale, a, b = _grad_terms(scale_ptr, row, stride_scale, in_range, w_t, w_all, lse,
                                      eps, eps_v, zscale, HAS_SCALE, HAS_SMOOTH, HAS_Z)  # fmt: skip
            n_chunks = tl.cdiv(V, BLOCK_V)
            for c in range(0, n_chunks):
                cols = (n_chunks - 1 - c if REVERSE else c) * BLOCK_V + tl.arange(0, BLOCK_V)
                mask = cols < V
                z = tl.load(x_row + cols, mask=mask, other=0.0, eviction_policy=EVICT_2ND)
                z = z.to(tl.float32)
                if SOFTCAP:
                    z = _softcap(z, cap)
                g = _grad_block(z, cols, mask, t, 0, w_ptr, m_row, log_d, a, b, eps_v, cap,
                                HAS_WEIGHT, HAS_SMOOTH, SOFTCAP, False)  # fmt: skip
                g = (g * scale).to(g_ptr.dtype.element_ty)
                tl.store(g_row + cols, g, mask=mask, eviction_policy=EVICT_2ND)


@fast
@triton.jit
def _ce_scale_kernel(
    g_ptr,  # [M, V] gradient, scaled in place
    s_ptr,  # incoming gradient, read at row * stride_s (stride 0: one scalar)
    V,
    stride_g,
    stride_s,
    BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    s = tl.load(s_ptr + row * stride_s).to(tl.float32)
    if s != 1.0:  # the usual loss.backward(): nothing to read or write
        g_row = g_ptr + row * stride_g
        for start in range(0, V, BLOCK_V):
            cols = start + tl.arange(0, BLOCK_V)
            mask = cols < V
            g = tl.load(g_row + cols, mask=mask, other=0.0).to(tl.float32)
            tl.store(g_row + cols, (g * s).to(g_ptr.dtype.element_ty), mask=mask)
