"""The gated family's activation formulas in fp32, as Triton helpers (ops/_gated.py's kernels
call them with their `ACTIVATION` constexpr): silu, gelu_tanh, gelu_erf, relu_squared and
silu_clamped.

`_activation`: act(a). `_activation_grad`: act(a) and the term `_chain` takes to form
da = dh * act'(a). `alpha` is silu_clamped's runtime scale (None for the others).

silu_clamped is GPT-OSS's expert gate, act(g) = g * sigmoid(alpha * g) on the clamped gate
g = min(gate, limit); `_clamp_gate_up` clamps gate and up and adds up's offset,
`_clamp_grads` applies clamp's gradient (torch's: it passes where limit >= the input, both
bounds included, and is 0 beyond them and for NaN).
"""

from __future__ import annotations

import triton
import triton.language as tl

# Compiled kernels may only read globals that are tl.constexpr.
_K = tl.constexpr(0.7978845608028654)  # sqrt(2 / pi)
_KAPPA = tl.constexpr(0.044715)
_KAPPA3 = tl.constexpr(0.134145)  # 3 * 0.044715
_SQRT1_2 = tl.constexpr(0.7071067811865476)  # 1 / sqrt(2)
_INV_SQRT_2PI = tl.constexpr(0.3989422804014327)  # 1 / sqrt(2 pi)

# sigmoid is tl.sigmoid, the fast exp and division: an exact IEEE division and libdevice's expf
# (PyTorch's formula bit for bit) cost bandwidth, for a last-bit difference in ~1 in 10^4
# elements. Triton has no portable tanh, so tanh(u) = 2 * sigmoid(2u) - 1 (exact algebra; in the
# far negative tail 2 * sigmoid(2u) - 1 cancels in fp32 as eager's 1 + tanh(u) does).


@triton.jit
def _activation(a, alpha, ACTIVATION: tl.constexpr):
    # act(a) in fp32, PyTorch's formula term for term.
    if ACTIVATION == "silu":
        g = a * tl.sigmoid(a)
    elif ACTIVATION == "silu_clamped":
        g = a * tl.sigmoid(alpha * a)  # a: the clamped gate
    elif ACTIVATION == "gelu_tanh":
        u = _K * (a + _KAPPA * (a * a * a))
        t = 2.0 * tl.sigmoid(2.0 * u) - 1.0  # tanh(u)
        g = 0.5 * a * (1.0 + t)
    elif ACTIVATION == "gelu_erf":
        g = a * 0.5 * (1.0 + tl.erf(a * _SQRT1_2))
    else:
        tl.static_assert(ACTIVATION == "relu_squared", "unknown ACTIVATION")
        r = tl.maximum(a, 0.0, propagate_nan=tl.PropagateNan.ALL)  # relu(NaN) = NaN, as torch's
        g = r * r  # exact in fp32 for fp16/bf16 inputs: one rounding, at the store
    return g


@triton.jit
def _activation_grad(a, alpha, ACTIVATION: tl.constexpr):
    # (act(a), d) in fp32, d what the chain rule `_chain` takes: act'(a), or for silu sigmoid(a)
    # (silu's backward forms its derivative with the incoming gradient, in PyTorch's order).
    if ACTIVATION == "silu":
        d = tl.sigmoid(a)
        g = a * d
    elif ACTIVATION == "silu_clamped":
        d = tl.sigmoid(alpha * a)
        g = a * d
    elif ACTIVATION == "gelu_tanh":
        a2 = a * a
        u = _K * (a + _KAPPA * (a2 * a))
        t = 2.0 * tl.sigmoid(2.0 * u) - 1.0  # tanh(u)
        left = 0.5 * a
        right = 1.0 + t
        g = left * right
        # d/da [0.5 a (1 + tanh(u))] = 0.5 (1 + t) + 0.5 a (1 - t^2) du/da
        du = _K * (1.0 + _KAPPA3 * a2)
        d = 0.5 * right + left * (1.0 - t * t) * du
    elif ACTIVATION == "gelu_erf":
        cdf = 0.5 * (1.0 + tl.erf(a * _SQRT1_2))  # Phi(a)
        pdf = _INV_SQRT_2PI * tl.exp(a * a * -0.5)  # phi(a)
        g = a * cdf
        d = cdf + a * pdf
    else:
        tl.static_assert(ACTIVATION == "relu_squared", "unknown ACTIVATION")
        g = a  # unused, as d: relu_squared's gradient is a select on a alone (see `_chain`)
        d = a
    return g, d


@triton.jit
def _chain(a, d, dh, alpha, ACTIVATION: tl.constexpr):
    # da = dh * act'(a) in fp32, with d from `_activation_grad`.
    if ACTIVATION == "silu":
        # silu'(a) = s * (1 + a * (1 - s)); PyTorch's compiled kernels (CPU and CUDA) fuse
        # 1 + a * (1 - s) into one fma.
        da = dh * d * tl.fma(a, 1.0 - d, 1.0)
    elif ACTIVATION == "silu_clamped":
        # d/da [a * s(alpha a)] = s * (1 + alpha * a * (1 - s)); at alpha = 1 silu's form
        da = dh * d * tl.fma(alpha * a, 1.0 - d, 1.0)
    elif ACTIVATION == "relu_squared":
        # d/da relu(a)^2 = 2 relu(a); +0 where a <= 0, as eager's relu backward (a select).
        da = tl.where(a > 0, 2.0 * a * dh, 0.0)
    else:
        da = dh * d
    return da


@triton.jit
def _clamp_gate_up(a, b, limit, offset, dtype: tl.constexpr):
    # silu_clamped's inputs in fp32: min(gate, limit), and clamp(up, -limit, limit) + offset
    # rounded to the input dtype (the `up + 1` tensor eager keeps); NaN stays NaN, as clamp's.
    g = tl.minimum(a, limit, propagate_nan=tl.PropagateNan.ALL)
    u = tl.maximum(b, -limit, propagate_nan=tl.PropagateNan.ALL)
    u = tl.minimum(u, limit, propagate_nan=tl.PropagateNan.ALL)
    u = (u + offset).to(dtype).to(tl.float32)
    return g, u


@triton.jit
def _clamp_grads(a, b, da, db, limit):
    # clamp's backward on the raw gate a and up b: the gradient where the input lies within
    # the bounds (inclusive), else 0 (NaN included: its comparisons are false)
    da = tl.where(a <= limit, da, 0.0)
    db = tl.where((b >= -limit) & (b <= limit), db, 0.0)
    return da, db
