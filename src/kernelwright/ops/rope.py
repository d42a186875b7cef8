"""RoPE: rotary position embedding of q and k, as Hugging Face's `apply_rotary_pos_emb`.

    q_embed = q * cos + rotate_half(q) * sin        (cos, sin unsqueezed at `unsqueeze_dim`)

on the first R = cos.shape[-1] channels of every head (2 * cos.shape[-1] for a half table);
channels R..D pass through unchanged (partial rotary). Channels are rotated in pairs (x1, x2)
with the matching (cos1, cos2) and (sin1, sin2):
    out1 = x1 * cos1 - x2 * sin1,   out2 = x2 * cos2 + x1 * sin2
- half-split (default; Llama, Mistral, Qwen, Gemma): x1 = x[:R/2], x2 = x[R/2:R], and cos1,
  cos2 the same halves of cos (likewise sin);
- interleaved (GPT-J, GLM): x1 = x[0::2], x2 = x[1::2], cos1 = cos[0::2], cos2 = cos[1::2];
- deinterleave (DeepSeek-V3's `apply_rotary_pos_emb_interleave`): x1 = x[0::2], x2 = x[1::2],
  cos1 = cos2 = cos[:R/2] (likewise sin), and out1, out2 written half-split (out[:R/2],
  out[R/2:R]): the input's pairs are de-interleaved on load, with no copy of q or k;
- half table (GPT-OSS's `_apply_rotary_emb`): half-split pairs with cos/sin one angle a pair,
  [.., R/2] (the rotary embedding returns the angles once, not [f, f]): cos1 = cos2 = cos, and
  R = 2 * cos.shape[-1].
The full cos/sin vectors are used element-wise (HF's tables repeat one half; nothing here
assumes it), in fp32, with one rounding to q's dtype at the end. The backward is the transpose
of the rotation, which is the same kernel with (sin1, sin2) replaced by (-sin2, -sin1):
    dx1 = g1 * cos1 + g2 * sin2,    dx2 = g2 * cos2 - g1 * sin1
Gradients flow to q and k only. HF's cos/sin come from a buffer and never need one; cos/sin
that require grad are an error rather than a gradient silently missing.

One launch per direction for q and k together: a program owns a block of token positions
(b, s), loads their cos/sin rows once and rotates every head of q and of k there, so each
element is read once and written once. Inputs may have any strides (HF hands in
`proj(x).view(B, S, H, D).transpose(1, 2)`, a non-contiguous view; nothing is copied). Outputs
and gradients are new dense tensors whose dims lie in memory in their input's order: for HF's
view that is [B, S, H, D] storage, so dq flows back through the transpose and the view
without a copy, as eager autograd's would.

Layer order: the kernel (ops/_rope_kernel.py) → launchers → custom ops → autograd Function →
`rope` → `RoPE`; the references (`rope_ref`, `rope_eager`, and `rope_tables`, HF's cos/sin
tables) live in ops/_rope_ref.py and are importable from here.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from kernelwright.ops._rope_kernel import _rope_kernel
from kernelwright.ops._rope_ref import (  # noqa: F401  (re-exported: ops.rope is their home)
    _deinterleaved,
    _rotate_half,
    rope_eager,
    rope_ref,
    rope_tables,
)
from kernelwright.runtime import device_info, lookup
from kernelwright.runtime.alloc import empty
from kernelwright.runtime.checks import check_in_place, check_same_device, check_tensor
from kernelwright.runtime.launch import LaunchConfig, PlanCache, cdiv, next_pow2, traced
from kernelwright.runtime.tables.rope import TABLE

_OP = "rope"
# The layout of q and k per unsqueeze_dim (HF unsqueezes cos/sin [B, S, R] at that dim).
LAYOUTS = {1: "[batch, heads, seq, head_dim]", 2: "[batch, seq, heads, head_dim]"}
# Channel pairings (the launchers' `pairing`; False/True are HALF/INTERLEAVED).
HALF, INTERLEAVED, DEINTERLEAVE, HALF_TABLE = 0, 1, 2, 3

# --------------------------------------------------------------------------- launchers


def _grid(b: int, s: int, cfg: LaunchConfig) -> tuple[int]:
    # One program per (batch, block of cfg.rows tokens). Axis 0 takes up to 2^31 - 1.
    programs = b * cdiv(s, cfg.rows)
    if programs >= 2**31:
        raise ValueError(f"{_OP}: {b} x {s} tokens need {programs} programs, over the grid limit")
    return (programs,)


_PLANS = PlanCache()


def _launch(
    kernel: str,
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    q_out: torch.Tensor,
    k_out: torch.Tensor,
    unsqueeze_dim: int,
    pairing: int,
    config: LaunchConfig | None,
) -> None:
    key = (kernel, q.shape, q.stride(), k.shape, k.stride(), q_out.stride(), k_out.stride())
    key += (cos.shape, cos.stride(), sin.stride(), unsqueeze_dim, int(pairing), q.device, config)
    plan = _PLANS.get_for(key, TABLE, kernel)  # None too where the table's rows were swapped
    if plan is None:
        plan = _PLANS.put_for(key, TABLE, kernel, device_info(q.device).arch, _plan(*key))
    if plan:
        grid, ints, constexprs = plan
        _rope_kernel[grid](q, k, q_out, k_out, cos, sin, *ints, **constexprs)


def _plan(kernel, q_shape, q_stride, k_shape, k_stride, qo_stride, ko_stride, cos_shape,
          cos_stride, sin_stride, unsqueeze_dim, pairing, device, config):  # fmt: skip
    """(grid, integer arguments, constexprs) of one launch, or None when there is nothing to
    rotate. q/k and the outputs are read as [B, S, H, D]: with unsqueeze_dim=1 ([B, H, S, D])
    their dims 1 and 2 swap places, in the strides alone (no view, no copy)."""

    def bshd(t: tuple) -> tuple:
        return (t[0], t[2], t[1], t[3]) if unsqueeze_dim == 1 else tuple(t)

    q_shape, q_stride, k_shape, k_stride = (
        bshd(q_shape),
        bshd(q_stride),
        bshd(k_shape),
        bshd(k_stride),
    )
    qo_stride, ko_stride = bshd(qo_stride), bshd(ko_stride)
    B, S, HQ, D = q_shape
    # a half table holds one angle a pair: the rotated width is twice its own
    HK, R = k_shape[2], cos_shape[-1] * (2 if pairing == HALF_TABLE else 1)
    if B == 0 or S == 0 or HQ + HK == 0:
        return None
    cfg = config or lookup(TABLE, _OP, kernel, device_info(device), (HQ + HK) * D)
    heads = max(1, cfg.block_n // next_pow2(D))  # heads per tile
    ints = (S, *q_stride, *k_stride, *qo_stride[:3], *ko_stride[:3])
    ints += (cos_stride[0] if cos_shape[0] > 1 else 0, cos_stride[1])
    ints += (sin_stride[0] if cos_shape[0] > 1 else 0, sin_stride[1])
    constexprs = dict(
        HQ=HQ, HK=HK, D=D, R=R,
        BLOCK_HQ=min(heads, next_pow2(max(HQ, 1))),
        BLOCK_HK=min(heads, next_pow2(max(HK, 1))),
        BLOCK_R=next_pow2(R // 2),  # rotated pairs, padded
        BLOCK_P=next_pow2(D - R) if D > R else 1,
        ROWS=cfg.rows, BLOCK_T=next_pow2(cfg.rows), IS_BACKWARD=kernel == "bwd",
        # DEINTERLEAVE reads interleaved pairs and writes half-split ones; its backward reads
        # the gradient half-split and writes it interleaved
        X_INTERLEAVED=pairing == INTERLEAVED or (pairing == DEINTERLEAVE and kernel == "fwd"),
        O_INTERLEAVED=pairing == INTERLEAVED or (pairing == DEINTERLEAVE and kernel == "bwd"),
        # the table's pairs: halves, interleaved, or one value a pair from the row's start
        # (DeepSeek-V3's first half, or a whole half table)
        TABLE=2 if pairing == HALF_TABLE else pairing,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    return _grid(B, S, cfg), ints, constexprs


def rope_fwd_launch(
    q: torch.Tensor,  # [B, Hq, S, D] (unsqueeze_dim=1) or [B, S, Hq, D] (2), any strides
    k: torch.Tensor,  # the same with Hk heads
    cos: torch.Tensor,  # [Bc, S, R], Bc in {1, B}, stride(-1) == 1
    sin: torch.Tensor,  # [Bc, S, R], stride(-1) == 1
    q_out: torch.Tensor,  # q's shape and dtype, stride(-1) == 1
    k_out: torch.Tensor,  # k's shape and dtype, stride(-1) == 1
    unsqueeze_dim: int,
    pairing: int,  # HALF, INTERLEAVED, DEINTERLEAVE or HALF_TABLE
    config: LaunchConfig | None = None,
) -> None:
    _launch("fwd", q, k, cos, sin, q_out, k_out, unsqueeze_dim, pairing, config)


def rope_bwd_launch(
    dq_out: torch.Tensor,  # gradient of q_out: q's shape, any strides (stride 0 included)
    dk_out: torch.Tensor,  # gradient of k_out
    cos: torch.Tensor,  # [Bc, S, R], stride(-1) == 1
    sin: torch.Tensor,
    dq: torch.Tensor,  # q's shape and dtype, stride(-1) == 1
    dk: torch.Tensor,  # k's shape and dtype, stride(-1) == 1
    unsqueeze_dim: int,
    pairing: int,  # the forward's
    config: LaunchConfig | None = None,
) -> None:
    _launch("bwd", dq_out, dk_out, cos, sin, dq, dk, unsqueeze_dim, pairing, config)


# --------------------------------------------------------------------------- custom ops
# Registered so torch.compile(fullgraph=True) treats each launch as one opaque node. Eager calls
# skip the dispatcher and go straight to the launcher.


@torch.library.custom_op("kernelwright::rope_fwd", mutates_args=("q_out", "k_out"))
def _rope_fwd_op(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    q_out: torch.Tensor,
    k_out: torch.Tensor,
    unsqueeze_dim: int,
    pairing: int,
) -> None:
    rope_fwd_launch(q, k, cos, sin, q_out, k_out, unsqueeze_dim, pairing)


@_rope_fwd_op.register_fake
def _(q, k, cos, sin, q_out, k_out, unsqueeze_dim, pairing) -> None:
    return None


@torch.library.custom_op("kernelwright::rope_fwd_inplace", mutates_args=("q", "k"))
def _rope_fwd_inplace_op(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    unsqueeze_dim: int,
    pairing: int,
) -> None:
    rope_fwd_launch(q, k, cos, sin, q, k, unsqueeze_dim, pairing)


@_rope_fwd_inplace_op.register_fake
def _(q, k, cos, sin, unsqueeze_dim, pairing) -> None:
    return None


@torch.library.custom_op("kernelwright::rope_bwd", mutates_args=("dq", "dk"))
def _rope_bwd_op(
    dq_out: torch.Tensor,
    dk_out: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    dq: torch.Tensor,
    dk: torch.Tensor,
    unsqueeze_dim: int,
    pairing: int,
) -> None:
    rope_bwd_launch(dq_out, dk_out, cos, sin, dq, dk, unsqueeze_dim, pairing)


@_rope_bwd_op.register_fake
def _(dq_out, dk_out, cos, sin, dq, dk, unsqueeze_dim, pairing) -> None:
    return None


# --------------------------------------------------------------------------- autograd


def _dim_order(t: torch.Tensor) -> list[int]:
    # t's first three dims from the largest stride down (ties keep their order), head_dim last.
    return [*sorted(range(3), key=lambda d: -t.stride(d)), 3]


class _RoPEFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, cos, sin, unsqueeze_dim, pairing, in_place):
        # Outputs and gradients: new tensors with q's / k's dims in the same memory order (not
        # views: callers may modify an output in place, which autograd forbids on a view made
        # inside a custom Function).
        ctx.layouts = [
            dict(shape=t.shape, order=_dim_order(t), dtype=t.dtype, device=t.device) for t in (q, k)
        ]
        if in_place:
            # Each program loads a head's channels before it stores them, so the outputs may be
            # q and k themselves. Autograd is not told (as Liger's rope): see rope().
            if traced(q):
                _rope_fwd_inplace_op(q, k, cos, sin, unsqueeze_dim, pairing)
            else:
                rope_fwd_launch(q, k, cos, sin, q, k, unsqueeze_dim, pairing)
            q_out, k_out = q, k
        else:
            q_out, k_out = (empty(**layout) for layout in ctx.layouts)
            args = (q, k, cos, sin, q_out, k_out, unsqueeze_dim, pairing)
            if traced(q):
                _rope_fwd_op(*args)
            else:
                rope_fwd_launch(*args)
        ctx.save_for_backward(cos, sin)  # q and k are not needed: the rotation is linear
        ctx.unsqueeze_dim = unsqueeze_dim
        ctx.pairing = pairing
        return q_out, k_out

    @staticmethod
    @once_differentiable
    def backward(ctx, dq_out, dk_out):
        cos, sin = ctx.saved_tensors
        # dq/dk in q/k's own layout; an unused output's gradient arrives as zeros.
        dq, dk = (empty(**layout) for layout in ctx.layouts)
        args = (dq_out, dk_out, cos, sin, dq, dk, ctx.unsqueeze_dim, ctx.pairing)
        if traced(dq_out):
            _rope_bwd_op(*args)
        else:
            rope_bwd_launch(*args)
        need_q, need_k = ctx.needs_input_grad[:2]
        return dq if need_q else None, dk if need_k else None, None, None, None, None, None


# --------------------------------------------------------------------------- public API


def _shape_error(name: str, t: torch.Tensor, expected: str) -> ValueError:
    return ValueError(f"{_OP}: argument '{name}' must have shape {expected}, got {tuple(t.shape)}")


def _check_inputs(q, k, cos, sin, unsqueeze_dim, half_table=False) -> None:
    for name, t in (("q", q), ("k", k), ("cos", cos), ("sin", sin)):
        check_tensor(_OP, name, t)
    check_same_device(_OP, q=q, k=k, cos=cos, sin=sin)
    if unsqueeze_dim not in LAYOUTS:
        raise ValueError(
            f"{_OP}: unsqueeze_dim must be 1 (q, k as {LAYOUTS[1]}) or 2 ({LAYOUTS[2]}), "
            f"got {unsqueeze_dim!r}"
        )
    layout = LAYOUTS[unsqueeze_dim]
    for name, t in (("q", q), ("k", k)):
        if t.dim() != 4:
            raise _shape_error(name, t, f"{layout} (4-D, unsqueeze_dim={unsqueeze_dim})")
    if k.dtype != q.dtype:
        raise TypeError(
            f"{_OP}: argument 'k' has dtype {str(k.dtype).replace('torch.', '')} but 'q' has "
            f"dtype {str(q.dtype).replace('torch.', '')}; pass both in one dtype"
        )
    B, S, D = q.shape[0], q.shape[3 - unsqueeze_dim], q.shape[3]
    if (k.shape[0], k.shape[3 - unsqueeze_dim], k.shape[3]) != (B, S, D):
        raise _shape_error("k", k, f"{layout} with q's batch {B}, seq {S} and head_dim {D}")
    if cos.shape != sin.shape:
        raise ValueError(
            f"{_OP}: arguments 'cos' and 'sin' must have one shape, got {tuple(cos.shape)} "
            f"and {tuple(sin.shape)}"
        )
    if half_table:
        expected = f"[1 or {B}, {S}, R/2] or [{S}, R/2] (R = rotary dim <= head_dim {D})"
    else:
        expected = f"[1 or {B}, {S}, R] or [{S}, R] (R = rotary dim <= head_dim {D}, even)"
    if cos.dim() not in (2, 3) or cos.shape[-2] != S:
        raise _shape_error("cos", cos, expected)
    if cos.dim() == 3 and cos.shape[0] not in (1, B):
        raise _shape_error("cos", cos, expected)
    R = cos.shape[-1] * (2 if half_table else 1)
    if R == 0 or R > D or R % 2:
        raise _shape_error("cos", cos, expected)
    if torch.is_grad_enabled() and (cos.requires_grad or sin.requires_grad):
        name = "cos" if cos.requires_grad else "sin"
        raise ValueError(
            f"{_OP}: argument '{name}' requires grad, but rope computes gradients for q and k "
            "only (HF's cos/sin come from a buffer); pass it detached, or use rope_eager to "
            "differentiate through cos/sin"
        )


def _table_view(t: torch.Tensor) -> torch.Tensor:
    # cos/sin as [Bc, S, R] with a contiguous last dim ([S, R] is [1, S, R]). They are
    # 1/H of q's size or less, so the rare copy is cheap.
    t = t if t.dim() == 3 else t.unsqueeze(0)
    return t if t.stride(-1) == 1 else t.contiguous()


def rope(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    unsqueeze_dim: int = 1,
    interleaved: bool = False,
    deinterleave: bool = False,
    half_table: bool = False,
    in_place: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary position embedding of q and k in one Triton launch each way (HF semantics).

    Args:
        q: [B, Hq, S, D] for unsqueeze_dim=1 (HF's attention layout, usually a transposed view
            of a [B, S, Hq, D] projection) or [B, S, Hq, D] for unsqueeze_dim=2. Any strides;
            float32/float16/bfloat16, on a CUDA GPU (CPU under TRITON_INTERPRET=1).
        k: the same layout with Hk heads (GQA/MQA: Hk need not divide Hq), q's B, S, D, dtype.
        cos, sin: [Bc, S, R] with Bc in {1, B}, or [S, R]; R <= D, even, the rotary dim
            (channels past R pass through). Already scaled (HF's attention_scaling); any float
            dtype, read in fp32. They get no gradient: ones that require grad raise ValueError.
        unsqueeze_dim: where HF unsqueezes cos/sin, which fixes the layout of q and k (above).
        interleaved: rotate channel pairs (2i, 2i+1) (GPT-J/GLM, cos/sin repeat-interleaved)
            instead of (i, i + R/2) (rotate_half).
        deinterleave: rotate pairs (2i, 2i+1) by angle i (cos[..., :R/2], one angle a pair) and
            write them half-split, (i, i + R/2), as DeepSeek-V3's
            `apply_rotary_pos_emb_interleave`; the gradients go back interleaved.
        half_table: cos/sin are [.., R/2], one angle a pair (i, i + R/2), as GPT-OSS's rotary
            embedding returns them (`_apply_rotary_emb`: no [f, f] repeat); R = 2 *
            cos.shape[-1]. At most one of interleaved, deinterleave and half_table.
        in_place: UNSAFE opt-in. Write the rotated values into q's and k's own storage (no new
            memory: the forward's peak drops by the size of q and k) and return (views of)
            them. Autograd is not told, as with Liger's rope: correct only when nothing else
            reads q or k afterwards, which holds in HF attention (the projections' outputs feed
            rope alone; rope's backward needs only cos/sin). Needs stride(-1) == 1;
            refused for a leaf that requires grad.

    Returns:
        (q_embed, k_embed): new tensors of q's and k's shapes and dtype, their dims laid out in
        memory in q's and k's order, computed in fp32 and rounded once.
    """
    _check_inputs(q, k, cos, sin, unsqueeze_dim, half_table)
    if interleaved + deinterleave + half_table > 1:
        raise ValueError(
            f"{_OP}: pass at most one of interleaved=True, deinterleave=True and half_table=True"
        )
    pairing = (
        DEINTERLEAVE if deinterleave else INTERLEAVED if interleaved else
        HALF_TABLE if half_table else HALF
    )  # fmt: skip
    if in_place and (q.stride(-1) != 1 or k.stride(-1) != 1):
        raise ValueError(
            f"{_OP}: in_place=True needs q and k with a contiguous last dim, got strides "
            f"{tuple(q.stride())} and {tuple(k.stride())}"
        )
    if in_place and not traced(q):
        check_in_place(_OP, "q", q)
        check_in_place(_OP, "k", k)
    cos, sin = _table_view(cos), _table_view(sin)
    return _RoPEFunction.apply(q, k, cos, sin, int(unsqueeze_dim), pairing, bool(in_place))


class RoPE(torch.nn.Module):
    """Applies rotary position embedding: `forward(q, k, cos, sin) -> (q_embed, k_embed)`, a
    drop-in for HF's `apply_rotary_pos_emb` (cos/sin from the model's rotary embedding)."""

    def __init__(
        self,
        *,
        unsqueeze_dim: int = 1,
        interleaved: bool = False,
        deinterleave: bool = False,
        half_table: bool = False,
    ):
        super().__init__()
        self.unsqueeze_dim = unsqueeze_dim
        self.interleaved = interleaved
        self.deinterleave = deinterleave
        self.half_table = half_table

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return rope(
            q, k, cos, sin, unsqueeze_dim=self.unsqueeze_dim, interleaved=self.interleaved,
            deinterleave=self.deinterleave, half_table=self.half_table,
        )  # fmt: skip

    def extra_repr(self) -> str:
        out = f"unsqueeze_dim={self.unsqueeze_dim}, interleaved={self.interleaved}"
        out += ", deinterleave=True" if self.deinterleave else ""
        return out + (", half_table=True" if self.half_table else "")
