"""The RoPE kernel (ops/rope.py): one program per block of token positions rotates every head
of q and of k there, the positions a tile dimension: [tokens, heads, pairs] tiles, with each
position's cos/sin row loaded once for all its heads.

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
def _load_pairs(ptr, tok_mask, R: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_R: tl.constexpr,
                TABLE: tl.constexpr):  # fmt: skip
    # The two members of each rotated pair of the cos or sin rows at a block of positions (ptr:
    # [BLOCK_T, 1] row starts, tok_mask: [BLOCK_T, 1]): fp32 [BLOCK_T, BLOCK_R] each.
    if TABLE == 2:
        # one angle a pair, from the row's first R/2 entries (DeepSeek-V3's cos[..., : R // 2],
        # or all of a GPT-OSS row, which holds each angle once)
        cols = tl.arange(0, BLOCK_R)[None, :]
        v1 = tl.load(ptr + cols, mask=tok_mask & (cols < R // 2), other=0.0).to(tl.float32)
        v2 = v1
    elif TABLE == 1:
        cols = tl.arange(0, 2 * BLOCK_R)[None, :]
        v = tl.load(ptr + cols, mask=tok_mask & (cols < R), other=0.0).to(tl.float32)
        v1, v2 = tl.split(tl.reshape(v, (BLOCK_T, BLOCK_R, 2)))  # v[:, 0::2], v[:, 1::2]
    else:
        cols = tl.arange(0, BLOCK_R)[None, :]
        mask = tok_mask & (cols < R // 2)
        v1 = tl.load(ptr + cols, mask=mask, other=0.0).to(tl.float32)
        v2 = tl.load(ptr + R // 2 + cols, mask=mask, other=0.0).to(tl.float32)
    return v1, v2


@triton.jit
def _load_heads(
    x_tok, stride_xh, stride_xd, h0, tok_mask,  # [BLOCK_T, 1, 1] token starts and mask
    H: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, R: tl.constexpr,
    BLOCK_R: tl.constexpr, IS_INTERLEAVED: tl.constexpr,
):  # fmt: skip
    # The rotated pairs of heads h0 .. h0 + BLOCK_H at a block of positions:
    # fp32 [BLOCK_T, BLOCK_H, BLOCK_R] each.
    heads = h0 + tl.arange(0, BLOCK_H)[None, :, None]
    head_mask = tok_mask & (heads < H)
    # int64 offsets: h * stride (and c * stride, for a strided head_dim) may pass 2^31
    x_row = x_tok + heads.to(tl.int64) * stride_xh
    if IS_INTERLEAVED:
        # One contiguous load of the R rotated channels, split into even and odd channels.
        cols = tl.arange(0, 2 * BLOCK_R)[None, None, :]
        mask = head_mask & (cols < R)
        x = tl.load(x_row + cols.to(tl.int64) * stride_xd, mask=mask, other=0.0).to(tl.float32)
        x1, x2 = tl.split(tl.reshape(x, (BLOCK_T, BLOCK_H, BLOCK_R, 2)))
    else:
        cols = tl.arange(0, BLOCK_R)[None, None, :]
        mask = head_mask & (cols < R // 2)
        x1 = tl.load(x_row + cols.to(tl.int64) * stride_xd, mask=mask, other=0.0)
        x2 = tl.load(x_row + (cols + R // 2).to(tl.int64) * stride_xd, mask=mask, other=0.0)
        x1, x2 = x1.to(tl.float32), x2.to(tl.float32)
    return x1, x2


@triton.jit
def _store_heads(
    x_tok, o_tok, stride_xh, stride_xd, stride_oh, h0, tok_mask, x1, x2, c1, c2, s1, s2,
    H: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, D: tl.constexpr,
    R: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr, IS_INTERLEAVED: tl.constexpr,
):  # fmt: skip
    # Rotates the pairs loaded by _load_heads and stores them; copies channels R..D through.
    heads = h0 + tl.arange(0, BLOCK_H)[None, :, None]
    head_mask = tok_mask & (heads < H)
    o_row = o_tok + heads.to(tl.int64) * stride_oh
    dtype = o_tok.dtype.element_ty
    o1 = x1 * c1[:, None, :] - x2 * s1[:, None, :]
    o2 = x2 * c2[:, None, :] + x1 * s2[:, None, :]
    if IS_INTERLEAVED:
        cols = tl.arange(0, 2 * BLOCK_R)[None, None, :]
        o = tl.reshape(tl.join(o1, o2), (BLOCK_T, BLOCK_H, 2 * BLOCK_R))
        tl.store(o_row + cols, o.to(dtype), mask=head_mask & (cols < R))
    else:
        cols = tl.arange(0, BLOCK_R)[None, None, :]
        mask = head_mask & (cols < R // 2)
        tl.store(o_row + cols, o1.to(dtype), mask=mask)
        tl.store(o_row + R // 2 + cols, o2.to(dtype), mask=mask)
    if R < D:
        # Partial rotary: channels R..D are copied unchanged.
        x_row = x_tok + heads.to(tl.int64) * stride_xh
        cols = R + tl.arange(0, BLOCK_P)[None, None, :]
        mask = head_mask & (cols < D)
        x = tl.load(x_row + cols.to(tl.int64) * stride_xd, mask=mask, other=0.0)
        tl.store(o_row + cols, x.to(dtype), mask=mask)


@triton.jit
def _rotate_heads(
    x_tok, o_tok,  # [BLOCK_T, 1, 1] token starts in the input and in the output
    stride_xh, stride_xd, stride_oh,
    h0, tok_mask, c1, c2, s1, s2,  # tile's first head; [BLOCK_T, 1, 1] mask; cos/sin pairs
    H: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, D: tl.constexpr,
    R: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr,
    X_INTERLEAVED: tl.constexpr, O_INTERLEAVED: tl.constexpr,
):  # fmt: skip
    # Heads h0 .. h0 + BLOCK_H at a block of positions: a [BLOCK_T, BLOCK_H, channels] tile.
    x1, x2 = _load_heads(x_tok, stride_xh, stride_xd, h0, tok_mask, H, BLOCK_T, BLOCK_H, R,
                         BLOCK_R, X_INTERLEAVED)  # fmt: skip
    _store_heads(x_tok, o_tok, stride_xh, stride_xd, stride_oh, h0, tok_mask, x1, x2,
                 c1, c2, s1, s2, H, BLOCK_T, BLOCK_H, D, R, BLOCK_R, BLOCK_P,
                 O_INTERLEAVED)  # fmt: skip


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
    ROWS: tl.constexpr,  # token positions a program owns
    BLOCK_T: tl.constexpr,  # ROWS rounded up to a power of two: the tiles' token dimension
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
    r = tl.arange(0, BLOCK_T)
    pos = (pid % s_blocks) * ROWS + r
    valid = (r < ROWS) & (pos < S)
    pos = pos.to(tl.int64)
    # cos/sin at these positions: loaded once, shared by all HQ + HK heads.
    c1, c2 = _load_pairs(cos_ptr + b * stride_cb + pos[:, None] * stride_cs, valid[:, None], R,
                         BLOCK_T, BLOCK_R, TABLE)  # fmt: skip
    s1, s2 = _load_pairs(sin_ptr + b * stride_sb + pos[:, None] * stride_ss, valid[:, None], R,
                         BLOCK_T, BLOCK_R, TABLE)  # fmt: skip
    if IS_BACKWARD:
        # The transposed rotation: dx1 = g1 * c1 + g2 * s2, dx2 = g2 * c2 - g1 * s1.
        s1, s2 = -s2, -s1
    tok = pos[:, None, None]
    tok_mask = valid[:, None, None]
    q_tok = q_ptr + b * stride_qb + tok * stride_qs
    qo_tok = qo_ptr + b * stride_qob + tok * stride_qos
    k_tok = k_ptr + b * stride_kb + tok * stride_ks
    ko_tok = ko_ptr + b * stride_kob + tok * stride_kos
    if BLOCK_HQ >= HQ and BLOCK_HK >= HK:
        # One tile holds every head of q and one every head of k: issue all four loads before
        # any store (a store may alias a later load, in place, so the compiler cannot hoist
        # loads past it: a tile loop waits out one memory latency per tile).
        q1, q2 = _load_heads(q_tok, stride_qh, stride_qd, 0, tok_mask, HQ, BLOCK_T, BLOCK_HQ, R,
                             BLOCK_R, X_INTERLEAVED)  # fmt: skip
        k1, k2 = _load_heads(k_tok, stride_kh, stride_kd, 0, tok_mask, HK, BLOCK_T, BLOCK_HK, R,
                             BLOCK_R, X_INTERLEAVED)  # fmt: skip
        _store_heads(q_tok, qo_tok, stride_qh, stride_qd, stride_qoh, 0, tok_mask, q1, q2,
                     c1, c2, s1, s2, HQ, BLOCK_T, BLOCK_HQ, D, R, BLOCK_R, BLOCK_P,
                     O_INTERLEAVED)  # fmt: skip
        _store_heads(k_tok, ko_tok, stride_kh, stride_kd, stride_koh, 0, tok_mask, k1, k2,
                     c1, c2, s1, s2, HK, BLOCK_T, BLOCK_HK, D, R, BLOCK_R, BLOCK_P,
                     O_INTERLEAVED)  # fmt: skip
    else:
        for h0 in tl.static_range(0, HQ, BLOCK_HQ):
            _rotate_heads(
                q_tok, qo_tok, stride_qh, stride_qd, stride_qoh, h0, tok_mask,
                c1, c2, s1, s2, HQ, BLOCK_T, BLOCK_HQ, D, R, BLOCK_R, BLOCK_P, X_INTERLEAVED,
                O_INTERLEAVED,
            )  # fmt: skip
        for h0 in tl.static_range(0, HK, BLOCK_HK):
            _rotate_heads(
                k_tok, ko_tok, stride_kh, stride_kd, stride_koh, h0, tok_mask,
                c1, c2, s1, s2, HK, BLOCK_T, BLOCK_HK, D, R, BLOCK_R, BLOCK_P, X_INTERLEAVED,
                O_INTERLEAVED,
            )  # fmt: skip
