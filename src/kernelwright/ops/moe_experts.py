"""Mixture-of-experts expert layer (stacked weights, SwiGLU experts), with a lean backward.

    out[t] = sum_j w[t, j] * down[e] @ (silu(gate_up[e][:I] @ x[t]) * (gate_up[e][I:] @ x[t]))
    with e = top_k_index[t, j], w = top_k_weights

It computes what Hugging Face's `grouped_mm` experts forward (transformers/integrations/moe.py,
the default of `@use_experts_implementation` on CUDA) computes for gated experts without bias,
gate_up_proj [E, 2I, H] ([gate | up] along dim 1) and down_proj [E, H, I]: the S = T*k
(token, expert) pairs are sorted by expert, run through two grouped matmuls, weighted and summed
over the top-k back to their tokens with fp32 accumulation (one rounding).

What it changes is memory. Eager autograd keeps five [S, .] tensors per layer (the gathered
input, the gate_up output, silu(gate), the activation, the down output; ~3.7 GB per layer of
Qwen3-30B-A3B at 32K tokens in bf16). This op keeps only the gate_up output [S, 2I] and
recomputes the rest in the backward:
    xs = x[perm // k]                                gathered again, twice per layer in all
    g = dout[perm // k] @ down[e]                    [S, I]: grad of h before the weighting
    dw = <g, h>                                      = <dout, down[e] @ h>: no down output kept
    dh = w * g ; dW_down[e] = sum over e's rows of dout^T (w * h)
    dgu = swiglu'(gu) dh ; dW_gu[e] = dgu^T xs ; dxs = dgu @ gate_up[e]
    dx[t] = sum_j dxs[pair (t, j)]                   gathered, not scattered: deterministic
One Triton kernel does the whole element-wise middle of the backward (recompute h, dw, dh, the
SwiGLU backward and w * h) in one pass over each row; a second sums k rows per token
(forward output and dx). The grouped matmuls are `torch._grouped_mm` (CUDA, bf16) or a loop
over experts (CPU under the interpreter, and fp32/fp16 on CUDA).

Routing indices must lie in [0, E): expert-parallel sentinels (HF's index E for experts held
elsewhere) are not supported. Not traced by torch.compile (a graph break, see `moe_experts`).

Layer order: kernels → launchers → grouped matmul → autograd Function → `moe_experts` →
reference.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from kernelwright.ops._activations import _activation_grad, _chain
from kernelwright.ops.swiglu import swiglu_fused_fwd_launch
from kernelwright.runtime.alloc import empty
from kernelwright.runtime.checks import check_same_device, check_tensor
from kernelwright.runtime.fastlaunch import fast
from kernelwright.runtime.launch import cdiv, next_pow2

ACTIVATIONS = ("swiglu",)

# --------------------------------------------------------------------------- kernels


@fast
@triton.jit
def _experts_act_bwd_kernel(
    g_ptr,  # [S, I]: dout_sorted @ down[e], the gradient of the weighted h before weighting
    gu_ptr,  # [S, 2I]: the saved gate_up output, [gate | up]
    w_ptr,  # [S]: routing weight of each sorted pair
    dgu_ptr,  # [S, 2I] out: gradient of the gate_up output
    hw_ptr,  # [S, I] out: w * h, the operand of dW_down
    dw_ptr,  # [S] fp32 out: gradient of the routing weight
    N, stride_g, stride_gu, stride_dgu, stride_hw,
    BLOCK_I: tl.constexpr,
):  # fmt: skip
    # One program per sorted pair (row); rows are N = I wide (768 for Qwen3-30B-A3B), so one or a
    # few BLOCK_I tiles. Roundings sit where eager autograd puts them in the input dtype.
    row = tl.program_id(0).to(tl.int64)
    dtype = gu_ptr.dtype.element_ty
    w = tl.load(w_ptr + row).to(tl.float32)
    acc = tl.zeros((BLOCK_I,), dtype=tl.float32)
    for start in range(0, N, BLOCK_I):
        cols = start + tl.arange(0, BLOCK_I)
        mask = cols < N
        g = tl.load(g_ptr + row * stride_g + cols, mask=mask, other=0.0).to(tl.float32)
        a = tl.load(gu_ptr + row * stride_gu + cols, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(gu_ptr + row * stride_gu + N + cols, mask=mask, other=0.0).to(tl.float32)
        act, s = _activation_grad(a, None, "silu")  # silu(a) and sigmoid(a)
        act = act.to(dtype).to(tl.float32)  # silu(gate), as the forward rounded it
        h = (act * b).to(dtype).to(tl.float32)  # the activation fed to the down projection
        acc += g * h  # dw = <g, h>
        dh = (g * w).to(dtype).to(tl.float32)
        # h = act * b: db = dh * act; dact = dh * b; da = dact * silu'(a)
        db = dh * act
        dact = (dh * b).to(dtype).to(tl.float32)
        da = _chain(a, s, dact, None, "silu")
        tl.store(dgu_ptr + row * stride_dgu + cols, da.to(dtype), mask=mask)
        tl.store(dgu_ptr + row * stride_dgu + N + cols, db.to(dtype), mask=mask)
        tl.store(hw_ptr + row * stride_hw + cols, (h * w).to(dtype), mask=mask)
    tl.store(dw_ptr + row, tl.sum(acc, axis=0))


@fast
@triton.jit
def _combine_kernel(
    y_ptr,  # [S, H]: rows in expert-sorted order
    inv_ptr,  # [T*K] int64: sorted row of pair (t, j) = inv[t*K + j]
    w_ptr,  # [T*K]: weight of pair (t, j) (read only when HAS_WEIGHT)
    out_ptr,  # [T, H]
    H, K, stride_y, stride_out,
    HAS_WEIGHT: tl.constexpr,
    BLOCK_H: tl.constexpr,
):  # fmt: skip
    # out[t] = sum_j w[t, j] * y[inv[t*K + j]]: fp32 accumulation, one rounding; a gather per
    # token instead of a scatter-add per pair, so the sum order is fixed (deterministic).
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask = cols < H
    acc = tl.zeros((BLOCK_H,), dtype=tl.float32)
    for j in range(K):
        r = tl.load(inv_ptr + t * K + j)
        y = tl.load(y_ptr + r * stride_y + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_WEIGHT:
            y = y * tl.load(w_ptr + t * K + j).to(tl.float32)
        acc += y
    tl.store(out_ptr + t * stride_out + cols, acc.to(out_ptr.dtype.element_ty), mask=mask)


# --------------------------------------------------------------------------- launchers


def _block(n: int, cap: int) -> tuple[int, int]:
    """(BLOCK, num_warps) for a row of n elements: one tile up to `cap`, 4 warps per 1K."""
    block = min(next_pow2(max(n, 16)), cap)
    return block, max(1, min(8, block // 256))


def experts_act_bwd_launch(
    g: torch.Tensor,  # [S, I]
    gu: torch.Tensor,  # [S, 2I]
    w: torch.Tensor,  # [S]
    dgu: torch.Tensor,  # [S, 2I]
    hw: torch.Tensor,  # [S, I]
    dw: torch.Tensor,  # [S] fp32
) -> None:
    S, N = g.shape
    if S == 0 or N == 0:
        return
    block, warps = _block(N, 2048)
    _experts_act_bwd_kernel[(S,)](
        g, gu, w, dgu, hw, dw, N, g.stride(0), gu.stride(0), dgu.stride(0), hw.stride(0),
        BLOCK_I=block, num_warps=warps,
    )  # fmt: skip


def combine_launch(
    y: torch.Tensor,  # [S, H], last dim contiguous
    inv: torch.Tensor,  # [T*K] int64
    w: torch.Tensor | None,  # [T*K] contiguous, or None for a plain sum
    out: torch.Tensor,  # [T, H]
    k: int,
) -> None:
    T, H = out.shape
    if T == 0 or H == 0:
        return
    block, warps = _block(H, 1024)
    grid = (T, cdiv(H, block))
    _combine_kernel[grid](
        y, inv, inv if w is None else w, out, H, k, y.stride(0), out.stride(0),
        HAS_WEIGHT=w is not None, BLOCK_H=block, num_warps=warps,
    )  # fmt: skip


# --------------------------------------------------------------------------- grouped matmul


def _use_grouped_mm(a: torch.Tensor, b: torch.Tensor) -> bool:
    # torch._grouped_mm runs on CUDA in bf16 only; its CPU kernel wants 16-byte strides, which
    # tiny test shapes do not have, so the CPU always takes the loop.
    return a.is_cuda and a.dtype == b.dtype == torch.bfloat16 and hasattr(torch, "_grouped_mm")


def grouped_mm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """Grouped matmul with group ends `offs` ([E] int32, cumulative row counts).

    a [S, K] @ b [E, K, N] -> [S, N]: rows offs[e-1]:offs[e] of a times b[e].
    a [M, S] @ b [S, N]    -> [E, M, N]: the contraction split into the same groups (weight
    gradients); an empty group gives zeros.
    """
    if _use_grouped_mm(a, b):
        return torch._grouped_mm(a, b, offs=offs)
    ends = offs.tolist()  # one host sync for the whole loop
    starts = [0, *ends[:-1]]
    if b.dim() == 3:
        out = torch.zeros(a.shape[0], b.shape[2], dtype=a.dtype, device=a.device)
        for e, (s, t) in enumerate(zip(starts, ends, strict=True)):
            if t > s:
                torch.mm(a[s:t], b[e], out=out[s:t])
        return out
    out = torch.zeros(len(ends), a.shape[0], b.shape[1], dtype=a.dtype, device=a.device)
    for e, (s, t) in enumerate(zip(starts, ends, strict=True)):
        if t > s:
            torch.mm(a[:, s:t], b[s:t], out=out[e])
    return out


# --------------------------------------------------------------------------- autograd


def _route(top_k_index: torch.Tensor, num_experts: int):
    """Sort the T*k pairs by expert: (perm, inv, offs). Sorted row r is pair perm[r]; pair p
    is sorted row inv[p]; offs[e] is the end of expert e's rows."""
    ids = top_k_index.reshape(-1)
    sorted_ids, perm = torch.sort(ids, stable=True)
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.numel(), device=perm.device)
    # group ends by binary search on the sorted ids: no atomics, no host sync
    experts = torch.arange(num_experts, device=ids.device, dtype=sorted_ids.dtype)
    offs = torch.searchsorted(sorted_ids, experts, right=True).to(torch.int32)
    return perm, inv, offs


class _MoEExpertsFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, gate_up_proj, down_proj, top_k_index, top_k_weights):
        T, H = x.shape
        k = top_k_index.shape[1]
        E, two_i, _ = gate_up_proj.shape
        dtype = gate_up_proj.dtype
        with torch.no_grad():
            perm, inv, offs = _route(top_k_index, E)
            tok = perm // k  # token of each sorted row
            xs = x.to(dtype).index_select(0, tok)  # [S, H]
            gu = grouped_mm(xs, gate_up_proj.transpose(1, 2), offs)  # [S, 2I]
            del xs  # recomputed in the backward
            h = empty((gu.shape[0], two_i // 2), dtype=dtype, device=x.device)  # [S, I]
            swiglu_fused_fwd_launch(gu, h)
            y = grouped_mm(h, down_proj.transpose(1, 2), offs)  # [S, H]
            del h
            out = empty((T, H), dtype=x.dtype, device=x.device)
            combine_launch(y, inv, top_k_weights.reshape(-1).contiguous(), out, k)
        ctx.save_for_backward(x, gate_up_proj, down_proj, top_k_weights, gu, perm, inv, offs)
        ctx.k = k
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        x, gate_up_proj, down_proj, top_k_weights, gu, perm, inv, offs = ctx.saved_tensors
        k = ctx.k
        dtype = gate_up_proj.dtype
        need_x, need_gu, need_down, _, need_w = ctx.needs_input_grad
        tok = perm // k
        S, two_i = gu.shape
        dx = dgate_up = ddown = dweights = None

        dout_s = dout.to(dtype).index_select(0, tok)  # [S, H]
        g = grouped_mm(dout_s, down_proj, offs)  # [S, I]
        w_s = top_k_weights.reshape(-1).index_select(0, perm)  # [S]
        dgu = empty((S, two_i), dtype=dtype, device=gu.device)
        hw = empty((S, two_i // 2), dtype=dtype, device=gu.device)
        dw_s = empty((S,), dtype=torch.float32, device=gu.device)
        experts_act_bwd_launch(g, gu, w_s, dgu, hw, dw_s)
        del g
        if need_down:
            ddown = grouped_mm(dout_s.t(), hw, offs)  # [E, H, I]
        del dout_s, hw
        if need_w:
            dweights = dw_s.index_select(0, inv).view_as(top_k_weights).to(top_k_weights.dtype)
        # dx before dW_gu: the two [S, H] buffers (dxs, xs) are never alive together
        if need_x:
            dxs = grouped_mm(dgu, gate_up_proj, offs)  # [S, H]
            dx = empty(tuple(x.shape), dtype=x.dtype, device=x.device)
            combine_launch(dxs, inv, None, dx, k)
            del dxs
        if need_gu:
            xs = x.to(dtype).index_select(0, tok)  # [S, H], the forward's gather again
            dgate_up = grouped_mm(dgu.t(), xs, offs)  # [E, 2I, H]
        return dx, dgate_up, ddown, None, dweights


# --------------------------------------------------------------------------- public API


@torch.compiler.disable
def moe_experts(
    x: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    *,
    activation: str = "swiglu",
) -> torch.Tensor:
    """The expert layer of a mixture of experts with stacked SwiGLU experts.

    Args:
        x: [T, H] tokens (float32/float16/bfloat16), on a CUDA GPU (CPU under
            TRITON_INTERPRET=1). Cast to the weights' dtype for the matmuls, as HF does.
        gate_up_proj: [E, 2I, H]; rows [0, I) of each expert are gate, [I, 2I) up.
        down_proj: [E, H, I].
        top_k_index: [T, k] integer expert of each (token, slot), in [0, E).
        top_k_weights: [T, k] float routing weights (differentiable).
        activation: "swiglu" (silu(gate) * up), the only one so far.
    Returns:
        [T, H] in x's dtype. Backward gives gradients of x, both weights and top_k_weights.

    Runs eagerly under torch.compile (a graph break): the routing is data-dependent.
    """
    if activation not in ACTIVATIONS:
        raise ValueError(
            f"moe_experts: activation must be one of {ACTIVATIONS}, got {activation!r}; use the "
            "model's own experts forward for other activations"
        )
    check_tensor("moe_experts", "x", x, min_dim=2)
    check_tensor("moe_experts", "gate_up_proj", gate_up_proj, min_dim=3)
    check_tensor("moe_experts", "down_proj", down_proj, min_dim=3)
    check_tensor("moe_experts", "top_k_weights", top_k_weights, min_dim=2)
    check_same_device(
        "moe_experts", x=x, gate_up_proj=gate_up_proj, down_proj=down_proj,
        top_k_index=top_k_index, top_k_weights=top_k_weights,
    )  # fmt: skip
    T, H = x.shape
    E, two_i, h2 = gate_up_proj.shape
    if x.dim() != 2 or gate_up_proj.dim() != 3 or h2 != H or two_i % 2:
        raise ValueError(
            f"moe_experts: expected x [T, H] and gate_up_proj [E, 2I, H], got x "
            f"{tuple(x.shape)} and gate_up_proj {tuple(gate_up_proj.shape)}"
        )
    if tuple(down_proj.shape) != (E, H, two_i // 2):
        raise ValueError(
            f"moe_experts: down_proj must have shape {(E, H, two_i // 2)} ([E, H, I]), got "
            f"{tuple(down_proj.shape)}"
        )
    if down_proj.dtype != gate_up_proj.dtype:
        raise TypeError(
            f"moe_experts: gate_up_proj is {gate_up_proj.dtype} but down_proj is "
            f"{down_proj.dtype}; pass both in one dtype"
        )
    if top_k_index.dim() != 2 or top_k_index.shape[0] != T or top_k_index.is_floating_point():
        raise ValueError(
            f"moe_experts: top_k_index must be an integer [T={T}, k] tensor, got "
            f"{top_k_index.dtype} {tuple(top_k_index.shape)}"
        )
    if tuple(top_k_weights.shape) != tuple(top_k_index.shape):
        raise ValueError(
            f"moe_experts: top_k_weights must have top_k_index's shape "
            f"{tuple(top_k_index.shape)}, got {tuple(top_k_weights.shape)}"
        )
    return _MoEExpertsFunction.apply(x, gate_up_proj, down_proj, top_k_index, top_k_weights)


# --------------------------------------------------------------------------- reference


def moe_experts_ref(
    x: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    *,
    activation: str = "swiglu",
) -> torch.Tensor:
    """fp32 reference (differentiable): a loop over (token, slot) groups per expert."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"moe_experts_ref: unknown activation {activation!r}")
    xf, guf, df, wf = x.float(), gate_up_proj.float(), down_proj.float(), top_k_weights.float()
    out = torch.zeros_like(xf)
    for e in range(gate_up_proj.shape[0]):
        tok, slot = torch.where(top_k_index == e)
        if tok.numel() == 0:
            continue
        gate, up = F.linear(xf[tok], guf[e]).chunk(2, dim=-1)
        y = F.linear(F.silu(gate) * up, df[e]) * wf[tok, slot, None]
        out = out.index_add(0, tok, y)
    return out
