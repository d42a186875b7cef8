"""RoPE's references in plain PyTorch (ops/rope.py re-exports them): `rope_eager`, Hugging
Face's `apply_rotary_pos_emb` as written; `rope_ref`, the same in fp32; and `rope_tables`, the
cos/sin tables of HF's default rotary embedding.
"""

from __future__ import annotations

import torch


def _deinterleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # DeepSeek-V3's rotation: pairs (x[2i], x[2i+1]) by angle i, written as (evens, odds)
    half = cos.shape[-1] // 2
    c, s = cos[..., :half], sin[..., :half]
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


def _rotate_half(x: torch.Tensor, interleaved: bool) -> torch.Tensor:
    if interleaved:  # GLM's rotate_half: (-x[1::2], x[0::2]) interleaved back
        return torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def rope_eager(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    unsqueeze_dim: int = 1,
    interleaved: bool = False,
    deinterleave: bool = False,
    half_table: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """HF's `apply_rotary_pos_emb` as written, in the inputs' dtypes (the `torch` provider);
    partial rotary as Phi/GLM write it (rotate the first R channels, concatenate the rest).
    deinterleave: DeepSeek-V3's `apply_rotary_pos_emb_interleave` instead. half_table: cos/sin
    one angle a pair (GPT-OSS), used for both halves."""
    if cos.dim() == 2:
        cos, sin = cos.unsqueeze(0), sin.unsqueeze(0)
    if half_table:
        cos, sin = torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    rotary_dim = cos.shape[-1]

    def rotate(x: torch.Tensor) -> torch.Tensor:
        if deinterleave:
            return _deinterleaved(x, cos, sin)
        return (x * cos) + (_rotate_half(x, interleaved) * sin)

    if rotary_dim == q.shape[-1]:
        return rotate(q), rotate(k)
    q_rot, q_pass = q[..., :rotary_dim], q[..., rotary_dim:]
    k_rot, k_pass = k[..., :rotary_dim], k[..., rotary_dim:]
    return torch.cat([rotate(q_rot), q_pass], dim=-1), torch.cat([rotate(k_rot), k_pass], dim=-1)


def rope_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    unsqueeze_dim: int = 1,
    interleaved: bool = False,
    deinterleave: bool = False,
    half_table: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 reference (differentiable in q and k): `rope_eager` on fp32 copies, returned in q's
    dtype (fp32 when given fp32 inputs, as `testing.check_op` does)."""
    q32, k32 = rope_eager(
        q.float(), k.float(), cos.float(), sin.float(), unsqueeze_dim=unsqueeze_dim,
        interleaved=interleaved, deinterleave=deinterleave, half_table=half_table,
    )  # fmt: skip
    return q32.to(q.dtype), k32.to(k.dtype)


def rope_tables(
    seq_len: int,
    rotary_dim: int,
    *,
    base: float = 10000.0,
    interleaved: bool = False,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [1, seq_len, rotary_dim] as HF's default rotary embedding builds them for
    positions 0..seq_len-1: inv_freq = base^(-2i/R), angles repeated as [f, f] (half-split),
    or each repeated twice in place (interleaved, GLM's repeat_interleave)."""
    inv_freq = 1.0 / base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim)
    freqs = torch.arange(seq_len, dtype=torch.float32)[:, None] * inv_freq[None, :]  # [S, R/2]
    emb = freqs.repeat_interleave(2, dim=-1) if interleaved else torch.cat((freqs, freqs), dim=-1)
    emb = emb[None].to(device)  # [1, S, R]
    return emb.cos().to(dtype), emb.sin().to(dtype)
