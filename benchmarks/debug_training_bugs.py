"""Planted bugs for benchmarks/debug_training.py: each a context manager that wraps one launcher
of the library while the `with` lasts (as tests/debug_planted.py plants its bugs). Never
shipped: benchmarks/ is no part of the package.

Every bug leaves the forward as it is (the loss at step 0 is the clean run's) and changes one
gradient. `PLANTED` lists them with where `kernelwright debug` must localise each: the module
debug MODEL names (a class or a module name) and its pass, the op behind it and the pass debug
OP names.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

import kernelwright  # noqa: F401  (selects the interpreter before the kernel below exists)
from kernelwright.ops import _gated
from kernelwright.ops import fused_linear_cross_entropy as flce_mod
from kernelwright.ops import rms_norm as rms_norm_mod


@contextlib.contextmanager
def _swap(module, name: str, replacement) -> Iterator[None]:
    original = getattr(module, name)
    setattr(module, name, replacement(original))
    try:
        yield
    finally:
        setattr(module, name, original)


# --------------------------------------------------------------------------- RMSNorm


@triton.jit
def _dw_running_sum_kernel(
    dy_ptr, x_ptr, rstd_ptr, dw_ptr, M, N, stride_dy, stride_x, BLOCK_N: tl.constexpr
):
    # dW[c] = sum over rows of dy * x_hat, x_hat rounded to x's dtype as the forward has it
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < N
    acc = tl.zeros([BLOCK_N], dtype=tl.float32).to(dw_ptr.dtype.element_ty)
    for row in range(0, M):
        dy = tl.load(dy_ptr + row * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
        x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(rstd_ptr + row)
        x_hat = (x * rstd).to(x_ptr.dtype.element_ty).to(tl.float32)
        # the bug: the running sum kept in the weight's dtype, rounded after every row
        acc = (acc.to(tl.float32) + dy * x_hat).to(dw_ptr.dtype.element_ty)
    tl.store(dw_ptr + cols, acc, mask=mask)


def _rms_norm_dw_bf16():
    def wrap(original):
        def launch(dy, x, weight, rstd, dx, dw, offset, casting_mode, config=None):
            if dw is None or dw.dtype != torch.bfloat16 or offset or casting_mode != "llama":
                return original(dy, x, weight, rstd, dx, dw, offset, casting_mode, config)
            m, n = x.shape
            # dW first: the in-place backward writes dx over dy
            _dw_running_sum_kernel[(triton.cdiv(n, 32),)](
                dy, x, rstd, dw, m, n, dy.stride(0), x.stride(0), BLOCK_N=32
            )
            return original(dy, x, weight, rstd, dx, None, offset, casting_mode, config)

        return launch

    return _swap(rms_norm_mod, "rms_norm_bwd_launch", wrap)


# --------------------------------------------------------------------------- SwiGLU

SATURATE = 2.0  # |gate| past which the planted SwiGLU backward drops gate's gradient


def _swiglu_dgate_saturated():
    # dgate = 0 where |gate| > SATURATE (lanes taken as saturated): at initialisation almost no
    # gate is that large; training grows them.
    def wrap(original):
        def launch(activation, dc, a, b, da, db, config=None, **kw):
            big = a.abs() > SATURATE if activation == "silu" and b is not None else None
            original(activation, dc, a, b, da, db, config, **kw)  # da may be written over a
            if big is not None:
                da.masked_fill_(big, 0.0)

        return launch

    return _swap(_gated, "gated_bwd_launch", wrap)


# --------------------------------------------------------------------------- cross-entropy


def _cross_entropy_grad_on_ignored():
    # the backward of the fused linear cross-entropy forgets the ignore mask: an ignored token's
    # logits get softmax(logits) / denominator as if its target matched no class. The loss is
    # right. At initialisation the softmax is flat (1/V a class) and the extra gradient tiny; it
    # grows as the model grows confident.
    def wrap(original):
        def launch(x, target, loss, lse, *, grad=None, scale=None, ignore_index=-100, **kw):
            rows = p = None
            if grad is not None:
                rows = (target == ignore_index).nonzero().squeeze(1)
                p = torch.softmax(x[rows].float(), -1)  # before the launch: grad may be x
            original(x, target, loss, lse, grad=grad, scale=scale, ignore_index=ignore_index, **kw)
            if p is not None and rows.numel():
                s = 1.0 if scale is None else scale if scale.numel() == 1 else scale[rows, None]
                grad[rows] = (p * s).to(grad.dtype)

        return launch

    return _swap(flce_mod, "cross_entropy_fwd_launch", wrap)


# --------------------------------------------------------------------------- the list


@dataclass(frozen=True)
class PlantedBug:
    name: str
    what: str
    modules: tuple[str, ...]  # the class or name of the module debug MODEL must name ...
    pass_name: str  # ... and its pass
    op: str  # the library op behind it (debug OP)
    op_passes: tuple[str, ...]  # a pass debug OP must name
    plant: Callable[[], contextlib.AbstractContextManager]


PLANTED = {
    b.name: b
    for b in (
        PlantedBug(
            "swiglu_dgate_saturated",
            f"SwiGLU's backward drops gate's gradient where |gate| > {SATURATE:g}",
            ("LlamaMLP",),
            "backward",
            "swiglu",
            ("grad:gate",),
            _swiglu_dgate_saturated,
        ),
        PlantedBug(
            "cross_entropy_grad_on_ignored",
            "the fused linear cross-entropy's backward gives ignored tokens softmax / n",
            ("(model)", "lm_head"),  # the causal LM whose forward the fused loss is
            "backward",
            "fused_linear_cross_entropy",
            ("grad:hidden", "grad:weight"),
            _cross_entropy_grad_on_ignored,
        ),
        PlantedBug(
            "rms_norm_dw_bf16",
            "RMSNorm's dW summed row by row in a bf16 running sum",
            ("LlamaRMSNorm",),
            "backward",
            "rms_norm",
            ("grad:weight",),
            _rms_norm_dw_bf16,
        ),
    )
}

# the op behind a module debug MODEL may name (class or module name): debug OP runs on it. The
# patched causal LM's own forward is the fused linear cross-entropy (the lm_head and the loss).
OPS = {
    "LlamaRMSNorm": "rms_norm",
    "LlamaMLP": "swiglu",
    "lm_head": "fused_linear_cross_entropy",
    "(model)": "fused_linear_cross_entropy",
}
