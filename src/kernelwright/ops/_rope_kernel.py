"""The RoPE kernel (ops/rope.py): one program per block of token positions rotates every head
of q and of k there, loading the position's cos/sin rows once.

Pairs (x1, x2) with cos pairs (c1, c2) and sin pairs (s1, s2): out1 = x1 * c1 - x2 * s1,
out2 = x2 * c2 + x1 * s2; the backward is the same kernel with (s1, s2) replaced by (-s2, -s1).
Where the pairs sit is set apart for the input (X_INTERLEAVED), the output (O_INTERLEAVED) and
the cos/sin rows (TABLE: 0 halves, 1 interleaved, 2 one value for both members, from the row's
first R/2 entries: DeepSeek-V3's first half, or GPT-OSS's half-width rows), so a launch may read
interleaved pairs and write them half-split (DeepSeek-V3), or the reverse (its backward).
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernelwright.runtime.fastlaunch import fast

# --------------------------------------------------------------------------- tile helpers


@triton.jit
def _load_pairs(ptr, pairs, R: tl.constexpr, BLOCK_R: tl.constexpr, TABLE: tl.constexpr):
    # The two members of each rotated pair of a cos or sin row: fp32 [BLOCK_R] each. `pairs`
    # is R/2, or 0 past the last token (masks are built from bounds: the interpreter cannot AND
    # a block with a scalar condition).
    if TABLE == 2:
        # one angle a pair, from the row's first R/2 entries (DeepSeek-V3's cos[..., : R // 2],
        # or all of a GPT-OSS row, which holds each angle once)
        cols = tl.arange(0, BLOCK_R)
        v1 = tl.load(ptr + cols, mask=cols < pairs, other=0.0).to(tl.float32)
        v2 = v1
    elif TABLE == 1:
        cols = tl.arange(0, 2 * BLOCK_R)
        v = tl.load(ptr + cols, mask=cols < 2 * pairs, other=0.0).to(tl.float32)
        v1, v2 = tl.split(tl.reshape(v, (BLOCK_R, 2)))  # v[0::2], v[1::2]
    else:
        cols = tl.arange(0, BLOCK_R)
        mask = cols < pairs
        v1 = tl.load(ptr + cols, mask=mask, other=0.0).to(tl.float32)
        v2 = tl.load(ptr + R // 2 + cols, mask=mask, other=0.0).to(tl.float32)
    return v1, v2


@triton.jit
def _load_heads(
    x_ptr, stride_xh, stride_xd, h0, h_end,  # one token's first element; tile's first head
    BLOCK_H: tl.constexpr, R: tl.constexpr, BLOCK_R: tl.constexpr, IS_INTERLEAVED: tl.constexpr,
):  # fmt: skip
    # The rotated pairs of heads h0 .. h0 + BLOCK_H of one token: fp32 [BLOCK_H, BLOCK_R] each.
    heads = h0 + tl.arange(0, BLOCK_H)
    head_mask = (heads < h_end)[:, None]
    # int64 offsets: h * stride (and c * stride, for a strided head_dim) may pass 2^31
    x_row = x_ptr + heads.to(tl.int64)[:, None] * stride_xh
    if IS_INTERLEAVED:
        # One contiguous load of the R rotated channels, split into even and odd channels.
        cols = tl.arange(0, 2 * BLOCK_R)[None, :]
        mask = head_mask & (cols < R)
        x = tl.load(x_row + cols.to(tl.int64) * stride_xd, mask=mask, other=0.0).to(tl.float32)
        x1, x2 = tl.split(tl.reshape(x, (BLOCK_H, BLOCK_R, 2)))
    else:
        cols = tl.arange(0, BLOCK_R)[None, :]
        mask = head_mask & (cols < R // 2)
        x1 = tl.load(x_row + cols.to(tl.int64) * stride_xd, mask=mask, other=0.0)
        x2 = tl.load(x_row + (cols + R // 2).to(tl.int64) * stride_xd, mask=mask, other=0.0)
        x1, x2 = x1.to(tl.float32), x2.to(tl.float32)
    return x1, x2


@triton.jit
def _store_heads(
    x_ptr, o_ptr, stride_xh, stride_xd, stride_oh, h0, h_end, x1, x2, c1, c2, s1, s2,
    BLOCK_H: tl.constexpr, D: tl.constexpr, R: tl.constexpr, BLOCK_R: tl.constexpr,
    BLOCK_P: tl.constexpr, IS_INTERLEAVED: tl.constexpr,
):  # fmt: skip
    # Rotates the pairs loaded by _load_heads and stores them; copies channels R..D through.
    heads = h0 + tl.arange(0, BLOCK_H)
    head_mask = (heads < h_end)[:, None]
    o_row = o_ptr + heads.to(tl.int64)[:, None] * stride_oh
    dtype = o_ptr.dtype.element_ty
    o1 = x1 * c1[None, :] - x2 * s1[None, :]
    o2 = x2 * c2[None, :] + x1 * s2[None, :]
    if IS_INTERLEAVED:
        cols = tl.arange(0, 2 * BLOCK_R)[None, :]
        o = tl.reshape(tl.join(o1, o2), (BLOCK_H, 2 * BLOCK_R))
        tl.store(o_row + cols, o.to(dtype), mask=head_mask & (cols < R))
    else:
        cols = tl.arange(0, BLOCK_R)[None, :]
        mask = head_mask & (cols < R // 2)
        tl.store(o_row + cols, o1.to(dtype), mask=mask)
        tl.store(o_row + R // 2 + cols, o2.to(dtype), mask=mask)
    if R < D:
        # Partial rotary: channels R..D are copied unchanged.
        x_row = x_ptr + heads.to(tl.int64)[:, None] * stride_xh
        cols = R + tl.arange(0, BLOCK_P)[None, :]
        mask = head_mask & (cols < D)
        x = tl.load(x_row + cols.to(tl.int64) * stride_xd, mask=mask, other=0.0)
        tl.store(o_row + cols, x.to(dtype), mask=mask)


@triton.jit
def _rotate_heads(
    x_ptr, o_ptr,  # one token's first element in the input and in the output
    stride_xh, stride_xd, stride_oh,
    h0, h_end, c1, c2, s1, s2,  # tile's first head; H, or 0 past the last token; cos/sin pairs
    BLOCK_H: tl.constexpr, D: tl.constexpr, R: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr,
    X_INTERLEAVED: tl.constexpr, O_INTERLEAVED: tl.constexpr,
):  # fmt: skip
    # Heads h0 .. h0 + BLOCK_H of one token: a [BLOCK_H, channels] tile.
    x1, x2 = _load_heads(x_ptr, stride_xh, stride_xd, h0, h_end, BLOCK_H, R, BLOCK_R,
                         X_INTERLEAVED)  # fmt: skip
    _store_heads(x_ptr, o_ptr, stride_xh, stride_xd, stride_oh, h0, h_end, x1, x2,
                 c1, c2, s1, s2, BLOCK_H, D, R, BLOCK_R, BLOCK_P, O_INTERLEAVED)  # fmt: skip


# --------------------------------------------------------------------------- the kernel


@fast
@triton.jit
def _rope_kernel(
    q_ptr, k_ptr, qo_ptr, ko_ptr, cos_ptr, sin_ptr,  # q/k (or their output gradients), outputs
    S,
    stride_qb, stride_qs, stride_qh, stride_qd,  # q, k: [B, S, H, D] views, any strides
    stride_kb, stride_ks, stride_kh, stride_kd,
    stride_qob, stride_qos, stride_qoh,  # outputs: [B, S, H, D] views, last dim contiguous
    stride_kob, stride_kos, stride_koh,
    stride_cb, stride_cs, stride_sb, stride_ss,  # cos, sin: [Bc, S, R], batch stride 0 if Bc = 1
    HQ: tl.constexpr, HK: tl.constexpr, D: tl.constexpr, R: tl.constexpr,
    BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr,
    ROWS: tl.constexpr,
    X_INTERLEAVED: tl.constexpr,  # where q/k's pairs sit: (2i, 2i + 1), else (i, i + R/2)
    O_INTERLEAVED: tl.constexpr,  # where the outputs' pairs go
    TABLE: tl.constexpr,  # cos/sin pairs: 0 halves, 1 interleaved, 2 first R/2 for both
    IS_BACKWARD: tl.constexpr,
):  # fmt: skip
    # Program p owns tokens s0 .. s0 + ROWS of batch b; the token blocks of one batch are on
    # consecutive programs, so neighbouring programs touch neighbouring memory.
    pid = tl.program_id(0)
    s_blocks = tl.cdiv(S, ROWS)
    b = (pid // s_blocks).to(tl.int64)  # int64: b * stride may pass 2^31
    s0 = (pid % s_blocks) * ROWS
    for r in tl.static_range(ROWS):
        pos = s0 + r
        valid = pos < S
        pos = pos.to(tl.int64)
        # cos/sin of this position: loaded once, shared by all HQ + HK heads.
        pairs = tl.where(valid, R // 2, 0)
        c1, c2 = _load_pairs(cos_ptr + b * stride_cb + pos * stride_cs, pairs, R, BLOCK_R,
                             TABLE)  # fmt: skip
        s1, s2 = _load_pairs(sin_ptr + b * stride_sb + pos * stride_ss, pairs, R, BLOCK_R,
                             TABLE)  # fmt: skip
        if IS_BACKWARD:
            # The transposed rotation: dx1 = g1 * c1 + g2 * s2, dx2 = g2 * c2 - g1 * s1.
            s1, s2 = -s2, -s1
        q_tok = q_ptr + b * stride_qb + pos * stride_qs
        qo_tok = qo_ptr + b * stride_qob + pos * stride_qos
        k_tok = k_ptr + b * stride_kb + pos * stride_ks
        ko_tok = ko_ptr + b * stride_kob + pos * stride_kos
        hq_end, hk_end = tl.where(valid, HQ, 0), tl.where(valid, HK, 0)
        if BLOCK_HQ >= HQ and BLOCK_HK >= HK:
            # One tile holds every head of q and one every head of k: issue all four loads
            # before any store (a store may alias a later load, in place, so the compiler
            # cannot hoist loads past it: a tile loop waits out one memory latency per tile).
            q1, q2 = _load_heads(q_tok, stride_qh, stride_qd, 0, hq_end, BLOCK_HQ, R, BLOCK_R,
                                 X_INTERLEAVED)  # fmt: skip
            k1, k2 = _load_heads(k_tok, stride_kh, stride_kd, 0, hk_end, BLOCK_HK, R, BLOCK_R,
                                 X_INTERLEAVED)  # fmt: skip
            _store_heads(q_tok, qo_tok, stride_qh, stride_qd, stride_qoh, 0, hq_end, q1, q2,
                         c1, c2, s1, s2, BLOCK_HQ, D, R, BLOCK_R, BLOCK_P,
                         O_INTERLEAVED)  # fmt: skip
            _store_heads(k_tok, ko_tok, stride_kh, stride_kd, stride_koh, 0, hk_end, k1, k2,
                         c1, c2, s1, s2, BLOCK_HK, D, R, BLOCK_R, BLOCK_P,
                         O_INTERLEAVED)  # fmt: skip
        else:
            for h0 in tl.static_range(0, HQ, BLOCK_HQ):
                _rotate_heads(
                    q_tok, qo_tok, stride_qh, stride_qd, stride_qoh, h0, hq_end,
                    c1, c2, s1, s2, BLOCK_HQ, D, R, BLOCK_R, BLOCK_P, X_INTERLEAVED,
                    O_INTERLEAVED,
                )  # fmt: skip
            for h0 in tl.static_range(0, HK, BLOCK_HK):
                _rotate_heads(
                    k_tok, ko_tok, stride_kh, stride_kd, stride_koh, h0, hk_end,
                    c1, c2, s1, s2, BLOCK_HK, D, R, BLOCK_R, BLOCK_P, X_INTERLEAVED,
                    O_INTERLEAVED,
                )  # fmt: skip
