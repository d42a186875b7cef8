"""The per-slice kernels of the vocabulary-parallel losses (vocab_parallel.py) and their
launchers.

A rank holds the logits of classes [start, start + V_r) of a V-class vocabulary, for every
row. Per row:

1. `_vp_stats_kernel` reads the slice once: its max m_r, sum_j exp(z_j - m_r), the target's
   logit z_t where this rank owns the target (else 0), sum_j w_j z_j (label smoothing) and the
   owned target's class weight w_t (else 0).
2. The caller all-reduces (MAX) the row max into m, `_vp_rescale_kernel` rescales the local
   sum by exp(m_r - m), and one all-reduce (SUM) of the packed sums gives the whole row's.
3. `_vp_loss_grad_kernel`, elementwise over the slice: the row's loss (the formulas of
   ops/cross_entropy.py, with its `_row_loss` / `_grad_terms`), and the slice's gradient
   dloss/dz_j = A p_j - (1 - eps) w_t [j == t] - eps / V w_j times the reduction's scale,
   written into a new tensor or over the logits.

Per-row statistics live in `RowStats`: m (the slice's max, then the lse), gm (the row max over
ranks once all-reduced) and `st`, [rows, n_st] fp32 with the sums of a row side by side (d,
z_t, then s with smoothing, then w_t with class weights), so that any run of rows (a chunk of
tokens) is one contiguous buffer for the SUM all-reduce. W (the sum of all class weights)
travels in the same buffer (after the rows) or comes precomputed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernelwright.ops._ce_kernels import _grad_block, _grad_terms, _row_loss, _softcap
from kernelwright.runtime import device_info, lookup
from kernelwright.runtime.alloc import empty
from kernelwright.runtime.fastlaunch import fast
from kernelwright.runtime.launch import LaunchConfig, cdiv
from kernelwright.runtime.tables.vocab_parallel import TABLE

# Columns a thread folds into its own running max before the rescaled sum: one exp per column
# plus one per group (instead of two per column); 8 bf16 values are one 16-byte load.
VEC = tl.constexpr(8)


@dataclass(frozen=True)
class Options:
    """The loss options the kernels take (those of ops.cross_entropy)."""

    ignore_index: int
    label_smoothing: float
    lse_square_scale: float
    softcap: float | None


# --------------------------------------------------------------------------- kernels


@fast
@triton.jit
def _vp_stats_kernel(
    x_ptr,  # logits slice [M, V], row stride stride_x
    t_ptr,  # targets [M] (classes of the whole vocabulary), int32 or int64
    w_ptr,  # class weights of the slice [V], fp32 (HAS_WEIGHT)
    m_ptr,  # [M] fp32 out: the slice's row max
    gm_ptr,  # [M] fp32 out: the same (all-reduced into the global max afterwards)
    st_ptr,  # [M, n_st] fp32 out: d, z_t, (s), (w_t)
    V,
    start,  # the slice's first class
    stride_x,
    n_st,
    col_s,  # st's column of s (HAS_SMOOTH)
    col_w,  # of w_t (HAS_WEIGHT)
    ignore_index,
    cap,
    HAS_WEIGHT: tl.constexpr,
    HAS_SMOOTH: tl.constexpr,
    SOFTCAP: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    R: tl.constexpr = BLOCK_V // VEC  # groups of VEC columns per block
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x
    st_row = st_ptr + row * n_st
    t = tl.load(t_ptr + row).to(tl.int64)
    if t == ignore_index:  # zero sums (the max 0 keeps the rescale finite); never read
        tl.store(m_ptr + row, 0.0)
        tl.store(gm_ptr + row, 0.0)
        tl.store(st_row, 0.0)
        tl.store(st_row + 1, 0.0)
        if HAS_SMOOTH:
            tl.store(st_row + col_s, 0.0)
        if HAS_WEIGHT:
            tl.store(st_row + col_w, 0.0)
    else:
        # Each thread's group of VEC columns shares a running max m and a sum d of exp(z - m),
        # rescaled when m grows; the groups merge at the end.
        m = tl.full([R], -float("inf"), dtype=tl.float32)
        d = tl.zeros([R], dtype=tl.float32)
        s = tl.zeros([R], dtype=tl.float32)
        for c in range(0, V, BLOCK_V):
            cols = c + tl.arange(0, R)[:, None] * VEC + tl.arange(0, VEC)[None, :]
            mask = cols < V
            z = tl.load(x_row + cols, mask=mask, other=-float("inf")).to(tl.float32)
            if SOFTCAP:
                z = tl.where(mask, _softcap(z, cap), -float("inf"))
            m_new = tl.maximum(m, tl.max(z, axis=1))
            # A group that has seen only -inf shifts by 0 (-inf - -inf would be NaN).
            shift = tl.where(m_new == -float("inf"), 0.0, m_new)
            d = d * tl.exp(m - shift) + tl.sum(tl.exp(z - shift[:, None]), axis=1)
            m = m_new
            if HAS_SMOOTH:
                wz = tl.where(mask, z, 0.0)
                if HAS_WEIGHT:
                    wz = wz * tl.load(w_ptr + cols, mask=mask, other=0.0)
                s += tl.sum(wz, axis=1)
        m_row = tl.max(m, axis=0)
        # An empty or all -inf slice: max -inf and sum 0, which the rescale turns into 0.
        m_shift = tl.where(m_row == -float("inf"), 0.0, m_row)
        d_row = tl.sum(d * tl.exp(m - m_shift), axis=0)
        owns = (t >= start) & (t < start + V)
        t_loc = tl.where(owns, t - start, 0)
        z_t = tl.load(x_row + t_loc, mask=owns, other=0.0).to(tl.float32)
        if SOFTCAP:
            z_t = _softcap(z_t, cap)
        tl.store(m_ptr + row, m_row)
        tl.store(gm_ptr + row, m_row)
        tl.store(st_row, d_row)
        tl.store(st_row + 1, tl.where(owns, z_t, 0.0))
        if HAS_SMOOTH:
            tl.store(st_row + col_s, tl.sum(s, axis=0))
        if HAS_WEIGHT:
            tl.store(st_row + col_w, tl.load(w_ptr + t_loc, mask=owns, other=0.0))


@fast
@triton.jit
def _vp_rescale_kernel(
    m_ptr,  # [M] fp32: the slice's row max
    gm_ptr,  # [M] fp32: the row max over ranks
    st_ptr,  # [M, n_st] fp32: column 0, the slice's sum of exp(z - m), rescaled in place
    M,
    n_st,
    BLOCK: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = rows < M
    m = tl.load(m_ptr + rows, mask=mask, other=0.0)
    gm = tl.load(gm_ptr + rows, mask=mask, other=0.0)
    d = tl.load(st_ptr + rows * n_st, mask=mask, other=0.0)
    tl.store(st_ptr + rows * n_st, d * tl.exp(m - gm), mask=mask)  # exp(-inf) = 0: empty


@fast
@triton.jit
def _vp_loss_grad_kernel(
    x_ptr,  # logits slice [M, V], row stride stride_x
    t_ptr,  # targets [M], int32 or int64
    w_ptr,  # class weights of the slice [V], fp32 (HAS_WEIGHT)
    gm_ptr,  # [M] fp32: the row max over ranks
    st_ptr,  # [M, n_st] fp32: the row's sums over ranks
    wsum_ptr,  # [1] fp32: W, the sum of all class weights (HAS_WEIGHT)
    loss_ptr,  # [M] fp32 out: per-row loss, z-loss included (0 on ignored rows)
    z_ptr,  # [M] fp32 out: per-row z-loss (STORE_Z)
    lse_ptr,  # [M] fp32 out: per-row log-sum-exp over the whole vocabulary
    g_ptr,  # gradient [M, V] (COMPUTE_GRAD); may be x_ptr itself (in place)
    scale_ptr,  # fp32 gradient scale, read at row * stride_scale (HAS_SCALE)
    M,
    V,
    start,
    vocab,  # V of the whole vocabulary
    n_blocks,  # programs per row
    stride_x,
    stride_g,
    stride_scale,
    n_st,
    col_s,
    col_w,
    ignore_index,
    eps,
    eps_v,  # eps / vocab
    zscale,
    cap,
    HAS_WEIGHT: tl.constexpr,
    HAS_SMOOTH: tl.constexpr,
    HAS_Z: tl.constexpr,
    STORE_Z: tl.constexpr,
    SOFTCAP: tl.constexpr,
    COMPUTE_GRAD: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    REVERSE: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    # One program per BLOCK_V columns of a row: nothing is reduced here, every column needs only
    # its row's statistics. The row's first program also writes its loss.
    # The grid (M * n_blocks programs) fits int32: divide there, offsets in int64.
    pid = tl.program_id(0)
    if REVERSE:
        pid = M * n_blocks - 1 - pid
    row32 = pid // n_blocks
    blk = pid - row32 * n_blocks
    row = row32.to(tl.int64)
    cols = blk * BLOCK_V + tl.arange(0, BLOCK_V)
    mask = cols < V
    g_row = g_ptr + row * stride_g
    t = tl.load(t_ptr + row).to(tl.int64)
    if t == ignore_index:
        if blk == 0:
            tl.store(loss_ptr + row, 0.0)
            tl.store(lse_ptr + row, 0.0)
            if STORE_Z:
                tl.store(z_ptr + row, 0.0)
        if COMPUTE_GRAD:
            tl.store(g_row + cols, tl.zeros([BLOCK_V], dtype=g_ptr.dtype.element_ty), mask=mask)
    else:
        st_row = st_ptr + row * n_st
        m_row = tl.load(gm_ptr + row)
        d_row = tl.load(st_row)
        # A target outside [0, vocab) (an error the host checks) poisons its row: NaN.
        in_range = (t >= 0) & (t < vocab)
        z_t = tl.where(in_range, tl.load(st_row + 1), float("nan"))
        s_row = tl.load(st_row + col_s) if HAS_SMOOTH else 0.0
        if HAS_WEIGHT:
            w_t = tl.load(st_row + col_w)
            w_all = tl.load(wsum_ptr)
        else:
            w_t = 1.0
            w_all = vocab * 1.0
        if blk == 0:
            _row_loss(loss_ptr, z_ptr, lse_ptr, row, m_row, d_row, s_row, z_t, w_t, w_all, eps,
                      eps_v, zscale, HAS_SMOOTH, HAS_Z, STORE_Z)  # fmt: skip
        if COMPUTE_GRAD:
            log_d = tl.log(d_row)
            scale, a, b = _grad_terms(scale_ptr, row, stride_scale, in_range, w_t, w_all,
                                      m_row + log_d, eps, eps_v, zscale, HAS_SCALE, HAS_SMOOTH,
                                      HAS_Z)  # fmt: skip
            z = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
            if SOFTCAP:
                z = _softcap(z, cap)
            g = _grad_block(z, cols, mask, t, start, w_ptr, m_row, log_d, a, b, eps_v, cap,
                            HAS_WEIGHT, HAS_SMOOTH, SOFTCAP, False)  # fmt: skip
            tl.store(g_row + cols, (g * scale).to(g_ptr.dtype.element_ty), mask=mask)


# --------------------------------------------------------------------------- statistics


@dataclass(frozen=True)
class RowStats:
    """Per-row statistics of `rows` rows (see the module doc)."""

    m: torch.Tensor  # [rows] fp32: the slice's max; the loss kernel may write the lse over it
    gm: torch.Tensor  # [rows] fp32: the max over ranks (after the MAX all-reduce)
    st: torch.Tensor  # [rows, n_st] fp32: d, z_t, (s), (w_t)
    flat: torch.Tensor  # what the SUM all-reduce covers: st, and W when it travels with it
    wsum: torch.Tensor | None  # [1] fp32: W (with class weights)
    col_s: int
    col_w: int

    @staticmethod
    def new(rows: int, smooth: bool, weighted: bool, device, wsum=None) -> RowStats:
        """Buffers for `rows` rows. With class weights and no `wsum`, W gets a slot after the
        rows, summed with them (the caller writes this rank's share there first)."""
        col_s = 2
        col_w = 2 + int(smooth)
        n_st = col_w + int(weighted)
        tail = int(weighted and wsum is None)
        flat = empty((rows * n_st + tail,), dtype=torch.float32, device=device)
        if tail:
            wsum = flat[rows * n_st :]
        m = empty((2, rows), dtype=torch.float32, device=device)
        st = flat[: rows * n_st].view(rows, n_st)
        return RowStats(m[0], m[1], st, flat, wsum, col_s, col_w)

    def rows(self, a: int, b: int) -> RowStats:
        """Rows [a, b) (W, when it travels with the rows, stays out: precompute it)."""
        st = self.st[a:b]
        return RowStats(self.m[a:b], self.gm[a:b], st, st.view(-1), self.wsum, self.col_s,
                        self.col_w)  # fmt: skip


# --------------------------------------------------------------------------- launchers


def _config(kernel: str, x: torch.Tensor, config: LaunchConfig | None) -> LaunchConfig:
    n = max(x.shape[1], 1)
    return config or lookup(TABLE, "vocab_parallel", kernel, device_info(x.device), n)


def stats_launch(x, t, w, s: RowStats, start: int, o: Options, config=None) -> None:
    """The slice's statistics of logits `x` [M, V_r] (stride(1) == 1) into `s`'s m, gm, st."""
    M, V = x.shape
    if M == 0:
        return
    cfg = _config("stats", x, config)
    dummy = s.gm  # in place of the empty slice's tensors: never read
    _vp_stats_kernel[(M,)](
        x if V else dummy,
        t,
        w if w is not None and V else dummy,
        s.m,
        s.gm,
        s.st,
        V,
        start,
        x.stride(0) if V else 0,
        s.st.stride(0),
        s.col_s,
        s.col_w,
        o.ignore_index,
        float(o.softcap) if o.softcap is not None else 1.0,
        HAS_WEIGHT=w is not None,
        HAS_SMOOTH=o.label_smoothing > 0.0,
        SOFTCAP=o.softcap is not None,
        BLOCK_V=cfg.block_n,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )


def rescale_launch(s: RowStats) -> None:
    """st's sums of exp(z - m_r) rescaled to the row max over ranks (gm)."""
    M = s.m.shape[0]
    if M:
        cfg = lookup(TABLE, "vocab_parallel", "rescale", device_info(s.m.device), M)
        grid = (cdiv(M, cfg.block_n),)
        _vp_rescale_kernel[grid](s.m, s.gm, s.st, M, s.st.stride(0), BLOCK=cfg.block_n,
                                 num_warps=cfg.num_warps)  # fmt: skip


def loss_grad_launch(x, t, w, s: RowStats, loss, lse, *, z_loss=None, grad=None, scale=None,
                     start: int, vocab: int, o: Options, config=None) -> None:  # fmt: skip
    """Per-row loss (and z-loss, lse) from the all-reduced `s`; with `grad` ([M, V_r], stride(1)
    == 1, may be `x`) the slice's gradient times `scale` (fp32, [1] or one per row)."""
    M, V = x.shape
    if M == 0:
        return
    cfg = _config("grad", x, config)
    n_blocks = max(1, cdiv(V, cfg.block_n)) if grad is not None else 1
    dummy = s.gm
    xg = x if V else dummy
    g = grad if grad is not None and V else xg
    eps = float(o.label_smoothing)
    _vp_loss_grad_kernel[(M * n_blocks,)](
        xg,
        t,
        w if w is not None and V else dummy,
        s.gm,
        s.st,
        s.wsum if s.wsum is not None else dummy,
        loss,
        z_loss if z_loss is not None else loss,
        lse,
        g,
        scale if scale is not None else dummy,
        M,
        V,
        start,
        vocab,
        n_blocks,
        x.stride(0) if V else 0,
        g.stride(0) if V else 0,
        0 if scale is None or scale.numel() == 1 else scale.stride(0),
        s.st.stride(0),
        s.col_s,
        s.col_w,
        o.ignore_index,
        eps,
        eps / vocab,
        float(o.lse_square_scale),
        float(o.softcap) if o.softcap is not None else 1.0,
        HAS_WEIGHT=w is not None,
        HAS_SMOOTH=eps > 0.0,
        HAS_Z=o.lse_square_scale > 0.0,
        STORE_Z=z_loss is not None,
        SOFTCAP=o.softcap is not None,
        COMPUTE_GRAD=grad is not None,
        HAS_SCALE=scale is not None,
        REVERSE=cfg.reverse_pass,
        BLOCK_V=cfg.block_n,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
