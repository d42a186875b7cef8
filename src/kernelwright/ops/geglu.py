"""GeGLU: c = gelu(gate) * up, elementwise over tensors of identical shape [..., N].

Numerics as Hugging Face's MLP writes it, `act_fn(gate_proj(x)) * up_proj(x)` with `act_fn`
either `gelu_pytorch_tanh` (Gemma; approximate="tanh") or the exact erf `gelu`
(approximate="none"): the kernel computes in fp32, rounds gelu(gate) to the input dtype (the
activation's output tensor), multiplies by up in fp32 and rounds once. The formulas are
PyTorch's own, term for term, so the roundings land where eager's do:
    tanh:  u = k * (a + 0.044715 * a^3),  t = tanh(u),  k = sqrt(2/pi)
           gelu(a)  = 0.5 * a * (1 + t)
           gelu'(a) = 0.5 * (1 + t) + 0.5 * a * (1 - t^2) * k * (1 + 3 * 0.044715 * a^2)
    erf:   cdf = 0.5 * (1 + erf(a / sqrt(2))),  pdf = exp(-a^2 / 2) / sqrt(2 pi)
           gelu(a)  = a * cdf,  gelu'(a) = cdf + a * pdf
The backward recomputes gelu and gelu' from gate in fp32 (only gate and up are saved) and
rounds where eager autograd does:
    h = round(gelu(a)),  dh = round(dc * b),  da = dh * gelu'(a),  db = dc * h
Triton has no portable tanh (libdevice is GPU-only, `tl.math` has none), so
tanh(u) = 2 * sigmoid(2u) - 1: exact algebra, and in the far negative tail, where eager's
1 + tanh(u) cancels, the fp32 rounding of 2 * sigmoid(2u) - 1 cancels the same way.

Two forms share the two kernels:
- `geglu(gate, up)`: separate tensors (the outputs of gate_proj and up_proj).
- `geglu_fused(x)`: x = [gate | up] along the last dimension (a fused gate_up_proj). The halves
  are two row-strided views of x, so nothing is split or copied.

Layer order: kernels → launchers → custom ops → autograd Functions → `geglu`/`geglu_fused` →
`GeGLU`/`GeGLUFused` → references.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernelwright.ops._elementwise import elementwise_grid, elementwise_tile, retile
from kernelwright.runtime import device_info, lookup
from kernelwright.runtime.alias import disjoint, storage_ptr, writes_through
from kernelwright.runtime.alloc import empty
from kernelwright.runtime.checks import check_same_device, check_shape, check_tensor, rows_view
from kernelwright.runtime.launch import LaunchConfig
from kernelwright.runtime.tables.geglu import TABLE

APPROXIMATIONS = ("tanh", "none")

# Compiled kernels may only read globals that are tl.constexpr.
_K = tl.constexpr(0.7978845608028654)  # sqrt(2 / pi)
_KAPPA = tl.constexpr(0.044715)
_KAPPA3 = tl.constexpr(0.134145)  # 3 * 0.044715
_SQRT1_2 = tl.constexpr(0.7071067811865476)  # 1 / sqrt(2)
_INV_SQRT_2PI = tl.constexpr(0.3989422804014327)  # 1 / sqrt(2 pi)

# --------------------------------------------------------------------------- kernels


@triton.jit
def _gelu(a, IS_TANH: tl.constexpr):
    # gelu(a) in fp32, PyTorch's formula for each form (see the module docstring).
    if IS_TANH:
        u = _K * (a + _KAPPA * (a * a * a))
        t = 2.0 * tl.sigmoid(2.0 * u) - 1.0  # tanh(u)
        g = 0.5 * a * (1.0 + t)
    else:
        g = a * 0.5 * (1.0 + tl.erf(a * _SQRT1_2))
    return g


@triton.jit
def _gelu_and_grad(a, IS_TANH: tl.constexpr):
    # (gelu(a), gelu'(a)) in fp32.
    if IS_TANH:
        a2 = a * a
        u = _K * (a + _KAPPA * (a2 * a))
        t = 2.0 * tl.sigmoid(2.0 * u) - 1.0  # tanh(u)
        left = 0.5 * a
        right = 1.0 + t
        g = left * right
        # d/da [0.5 a (1 + tanh(u))] = 0.5 (1 + t) + 0.5 a (1 - t^2) du/da
        du = _K * (1.0 + _KAPPA3 * a2)
        dg = 0.5 * right + left * (1.0 - t * t) * du
    else:
        cdf = 0.5 * (1.0 + tl.erf(a * _SQRT1_2))  # Phi(a)
        pdf = _INV_SQRT_2PI * tl.exp(a * a * -0.5)  # phi(a)
        g = a * cdf
        dg = cdf + a * pdf
    return g, dg


@triton.jit
def _geglu_fwd_kernel(
    a_ptr, b_ptr, c_ptr,  # gate, up, out: [M, N] views with row strides, last dim contiguous
    M, N, stride_a, stride_b, stride_c,
    IS_TANH: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ROWS: tl.constexpr,
):  # fmt: skip
    rows, cols, mask = elementwise_tile(M, N, BLOCK_N, ROWS)
    a = tl.load(a_ptr + rows * stride_a + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + rows * stride_b + cols, mask=mask, other=0.0).to(tl.float32)
    h = _gelu(a, IS_TANH).to(a_ptr.dtype.element_ty).to(tl.float32)  # the activation tensor
    c = h * b
    tl.store(c_ptr + rows * stride_c + cols, c.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _geglu_bwd_kernel(
    dc_ptr, a_ptr, b_ptr, da_ptr, db_ptr,  # [M, N] views with row strides, last dim contiguous
    M, N, stride_dc, stride_a, stride_b, stride_da, stride_db,
    IS_TANH: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ROWS: tl.constexpr,
):  # fmt: skip
    # da/db may be a/b themselves (in-place backward): each element is loaded, then stored, by
    # the one program that owns it, so overwriting the inputs is race-free.
    rows, cols, mask = elementwise_tile(M, N, BLOCK_N, ROWS)
    dc = tl.load(dc_ptr + rows * stride_dc + cols, mask=mask, other=0.0).to(tl.float32)
    a = tl.load(a_ptr + rows * stride_a + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + rows * stride_b + cols, mask=mask, other=0.0).to(tl.float32)
    dtype = a_ptr.dtype.element_ty
    g, dg = _gelu_and_grad(a, IS_TANH)
    # c = h * b with h = round(gelu(a)): db = dc * h; eager autograd rounds dh = dc * b to the
    # input dtype before gelu's backward, da = dh * gelu'(a).
    db = dc * g.to(dtype).to(tl.float32)
    dh = (dc * b).to(dtype).to(tl.float32)
    da = dh * dg
    tl.store(da_ptr + rows * stride_da + cols, da.to(da_ptr.dtype.element_ty), mask=mask)
    tl.store(db_ptr + rows * stride_db + cols, db.to(db_ptr.dtype.element_ty), mask=mask)


# --------------------------------------------------------------------------- launchers


def _config(kernel: str, t: torch.Tensor, n: int, config: LaunchConfig | None) -> LaunchConfig:
    return config or lookup(TABLE, "geglu", kernel, device_info(t.device), n)


def _is_tanh(approximate: str) -> bool:
    if approximate not in APPROXIMATIONS:
        raise ValueError(
            f"geglu: approximate must be one of {APPROXIMATIONS} (as F.gelu), got {approximate!r}"
        )
    return approximate == "tanh"


def geglu_fwd_launch(
    a: torch.Tensor,  # gate [M, N], stride(1) == 1
    b: torch.Tensor,  # up [M, N], stride(1) == 1
    c: torch.Tensor,  # out [M, N], stride(1) == 1
    approximate: str = "tanh",
    config: LaunchConfig | None = None,
) -> None:
    is_tanh = _is_tanh(approximate)
    M, N = a.shape
    if M == 0 or N == 0:
        return
    cfg = _config("fwd", a, N, config)
    a, b, c = retile((a, b, c), cfg)
    M, N = a.shape
    _geglu_fwd_kernel[elementwise_grid("geglu", M, N, cfg)](
        a, b, c, M, N, a.stride(0), b.stride(0), c.stride(0), IS_TANH=is_tanh,
        BLOCK_N=cfg.block_n, ROWS=cfg.rows, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip


def geglu_bwd_launch(
    dc: torch.Tensor,  # [M, N], stride(1) == 1 (row stride may be 0: an expanded gradient)
    a: torch.Tensor,  # gate [M, N]
    b: torch.Tensor,  # up [M, N]
    da: torch.Tensor,  # [M, N]; may be a itself (in-place backward)
    db: torch.Tensor,  # [M, N]; may be b itself
    approximate: str = "tanh",
    config: LaunchConfig | None = None,
) -> None:
    is_tanh = _is_tanh(approximate)
    M, N = a.shape
    if M == 0 or N == 0:
        return
    cfg = _config("bwd", a, N, config)
    dc, a, b, da, db = retile((dc, a, b, da, db), cfg)
    M, N = a.shape
    _geglu_bwd_kernel[elementwise_grid("geglu", M, N, cfg)](
        dc, a, b, da, db, M, N,
        dc.stride(0), a.stride(0), b.stride(0), da.stride(0), db.stride(0), IS_TANH=is_tanh,
        BLOCK_N=cfg.block_n, ROWS=cfg.rows, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip


def geglu_fused_fwd_launch(
    x: torch.Tensor,  # [M, 2N] = [gate | up], stride(1) == 1
    c: torch.Tensor,  # [M, N]
    approximate: str = "tanh",
    config: LaunchConfig | None = None,
) -> None:
    n = x.shape[1] // 2
    geglu_fwd_launch(x[:, :n], x[:, n:], c, approximate, config)  # views: no copy


def geglu_fused_bwd_launch(
    dc: torch.Tensor,  # [M, N]
    x: torch.Tensor,  # [M, 2N]
    dx: torch.Tensor,  # [M, 2N]: [da | db]
    approximate: str = "tanh",
    config: LaunchConfig | None = None,
) -> None:
    n = x.shape[1] // 2
    geglu_bwd_launch(dc, x[:, :n], x[:, n:], dx[:, :n], dx[:, n:], approximate, config)


# --------------------------------------------------------------------------- custom ops
# Registered so torch.compile(fullgraph=True) treats each launch as one opaque node. Eager calls
# skip the dispatcher and go straight to the launcher. The fused ops take the whole [M, 2N]
# tensors and slice inside the launcher: a custom op may not mutate two aliases of one base.


@torch.library.custom_op("kernelwright::geglu_fwd", mutates_args=("c",))
def _geglu_fwd_op(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, approximate: str) -> None:
    geglu_fwd_launch(a, b, c, approximate)


@_geglu_fwd_op.register_fake
def _(a, b, c, approximate) -> None:
    return None


@torch.library.custom_op("kernelwright::geglu_bwd", mutates_args=("da", "db"))
def _geglu_bwd_op(
    dc: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    da: torch.Tensor,
    db: torch.Tensor,
    approximate: str,
) -> None:
    geglu_bwd_launch(dc, a, b, da, db, approximate)


@_geglu_bwd_op.register_fake
def _(dc, a, b, da, db, approximate) -> None:
    return None


@torch.library.custom_op("kernelwright::geglu_fused_fwd", mutates_args=("c",))
def _geglu_fused_fwd_op(x: torch.Tensor, c: torch.Tensor, approximate: str) -> None:
    geglu_fused_fwd_launch(x, c, approximate)


@_geglu_fused_fwd_op.register_fake
def _(x, c, approximate) -> None:
    return None


@torch.library.custom_op("kernelwright::geglu_fused_bwd", mutates_args=("dx",))
def _geglu_fused_bwd_op(
    dc: torch.Tensor, x: torch.Tensor, dx: torch.Tensor, approximate: str
) -> None:
    geglu_fused_bwd_launch(dc, x, dx, approximate)


@_geglu_fused_bwd_op.register_fake
def _(dc, x, dx, approximate) -> None:
    return None


# --------------------------------------------------------------------------- autograd
# The in-place rule is swiglu's (kernelwright.runtime.alias).


class _GeGLUFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate, up, approximate, in_place_backward):
        a2 = rows_view("geglu", "gate", gate)  # [M, N]
        b2 = rows_view("geglu", "up", up)  # [M, N]
        # out in gate's shape, returned as allocated (see rms_norm); written via a 2-D view
        out = empty(gate.shape, dtype=gate.dtype, device=gate.device)
        c = out.view(a2.shape)
        compiling = torch.compiler.is_compiling()
        if compiling:
            _geglu_fwd_op(a2, b2, c, approximate)
        else:
            geglu_fwd_launch(a2, b2, c, approximate)
        ctx.save_for_backward(a2, b2)
        ctx.shape = gate.shape
        ctx.approximate = approximate
        # The backward may overwrite gate/up only when the [M, N] views are exactly their
        # elements and the two share none; never under torch.compile.
        ctx.in_place = (
            in_place_backward
            and not compiling
            and writes_through(gate, a2)
            and writes_through(up, b2)
            and disjoint(a2, b2)
        )
        return out

    @staticmethod
    def backward(ctx, dc):
        a2, b2 = ctx.saved_tensors
        dc2 = rows_view("geglu", "dc", dc)  # copies a gradient whose last stride is not 1
        need_a, need_b = ctx.needs_input_grad[:2]
        in_place = ctx.in_place and storage_ptr(dc2) not in (storage_ptr(a2), storage_ptr(b2))
        da = a2 if in_place and need_a else empty(a2.shape, dtype=a2.dtype, device=a2.device)
        db = b2 if in_place and need_b else empty(b2.shape, dtype=b2.dtype, device=b2.device)
        if torch.compiler.is_compiling():
            _geglu_bwd_op(dc2, a2, b2, da, db, ctx.approximate)
        else:
            geglu_bwd_launch(dc2, a2, b2, da, db, ctx.approximate)
        return (
            da.view(ctx.shape) if need_a else None,
            db.view(ctx.shape) if need_b else None,
            None,
            None,
        )


class _GeGLUFusedFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, approximate):
        x2 = rows_view("geglu_fused", "x", x)  # [M, 2N]
        out = empty((*x.shape[:-1], x.shape[-1] // 2), dtype=x.dtype, device=x.device)
        c = out.view(x2.shape[0], x2.shape[1] // 2)
        if torch.compiler.is_compiling():
            _geglu_fused_fwd_op(x2, c, approximate)
        else:
            geglu_fused_fwd_launch(x2, c, approximate)
        ctx.save_for_backward(x2)
        ctx.shape = x.shape
        ctx.approximate = approximate
        return out

    @staticmethod
    def backward(ctx, dc):
        (x2,) = ctx.saved_tensors
        dc2 = rows_view("geglu_fused", "dc", dc)
        dx = empty(x2.shape, dtype=x2.dtype, device=x2.device)  # [M, 2N] = [da | db]
        if torch.compiler.is_compiling():
            _geglu_fused_bwd_op(dc2, x2, dx, ctx.approximate)
        else:
            geglu_fused_bwd_launch(dc2, x2, dx, ctx.approximate)
        return dx.view(ctx.shape), None


# --------------------------------------------------------------------------- public API


def _check_approximate(op: str, approximate: object) -> str:
    if approximate not in APPROXIMATIONS:
        raise ValueError(
            f"{op}: argument 'approximate' must be one of {APPROXIMATIONS} (as F.gelu: 'tanh' "
            f"for gelu_pytorch_tanh, 'none' for the erf gelu), got {approximate!r}"
        )
    return approximate


def geglu(
    gate: torch.Tensor,
    up: torch.Tensor,
    *,
    approximate: str = "tanh",
    in_place_backward: bool = False,
) -> torch.Tensor:
    """gelu(gate) * up, forward and backward in Triton, rounded as Hugging Face's MLP rounds.

    Args:
        gate: [..., N] float32/float16/bfloat16 (any leading dims, any layout), on a CUDA GPU
            (CPU under TRITON_INTERPRET=1).
        up: same shape, dtype and device as gate.
        approximate: "tanh" (gelu_pytorch_tanh, Gemma) or "none" (exact erf gelu).
        in_place_backward: write the gradient of gate into gate's storage and that of up into
            up's (see `kernelwright.ops.swiglu.swiglu`: UNSAFE when gate or up is read after
            this forward). Ignored under torch.compile and when the kernel cannot write
            through gate/up (a copy was needed, rows overlap, or they share elements).
    """
    check_tensor("geglu", "gate", gate)
    check_tensor("geglu", "up", up)
    check_same_device("geglu", gate=gate, up=up)
    if up.dtype != gate.dtype:
        raise TypeError(
            f"geglu: argument 'up' has dtype {str(up.dtype).replace('torch.', '')} but 'gate' "
            f"has dtype {str(gate.dtype).replace('torch.', '')}; pass both in one dtype"
        )
    check_shape("geglu", "up", up, gate.shape, "the shape of gate")
    approximate = _check_approximate("geglu", approximate)
    return _GeGLUFunction.apply(gate, up, approximate, bool(in_place_backward))


def geglu_fused(x: torch.Tensor, *, approximate: str = "tanh") -> torch.Tensor:
    """gelu(gate) * up for x = [gate | up] along the last dim (a fused gate_up_proj output).

    Args:
        x: [..., 2N] float32/float16/bfloat16; the first N columns are gate, the last N up.
        approximate: "tanh" or "none", as in `geglu`.
    Returns:
        [..., N] in x's dtype. The gradient of x is one [..., 2N] tensor.
    """
    check_tensor("geglu_fused", "x", x)
    if x.shape[-1] % 2:
        raise ValueError(
            "geglu_fused: argument 'x' must have an even last dimension ([..., 2N]: gate then "
            f"up), got shape {tuple(x.shape)}"
        )
    approximate = _check_approximate("geglu_fused", approximate)
    return _GeGLUFusedFunction.apply(x, approximate)


class GeGLU(torch.nn.Module):
    """The gated activation of a Gemma-style MLP: `forward(gate, up) = gelu(gate) * up`."""

    def __init__(self, *, approximate: str = "tanh", in_place_backward: bool = False):
        super().__init__()
        self.approximate = _check_approximate("GeGLU", approximate)
        self.in_place_backward = in_place_backward

    def forward(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return geglu(
            gate, up, approximate=self.approximate, in_place_backward=self.in_place_backward
        )

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}, in_place_backward={self.in_place_backward}"


class GeGLUFused(torch.nn.Module):
    """The same on a fused gate_up_proj output: `forward(x)` with x = [gate | up]."""

    def __init__(self, *, approximate: str = "tanh"):
        super().__init__()
        self.approximate = _check_approximate("GeGLUFused", approximate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return geglu_fused(x, approximate=self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


# --------------------------------------------------------------------------- references


def geglu_ref(
    gate: torch.Tensor,
    up: torch.Tensor,
    *,
    approximate: str = "tanh",
    in_place_backward: bool = False,
) -> torch.Tensor:
    """fp32 reference (differentiable), no intermediate rounding."""
    del in_place_backward  # changes where gradients are written, not their values
    return F.gelu(gate.float(), approximate=approximate) * up.float()


def geglu_fused_ref(x: torch.Tensor, *, approximate: str = "tanh") -> torch.Tensor:
    """fp32 reference of `geglu_fused` (differentiable)."""
    gate, up = x.float().chunk(2, dim=-1)
    return F.gelu(gate, approximate=approximate) * up


def geglu_eager(gate: torch.Tensor, up: torch.Tensor, approximate: str = "tanh") -> torch.Tensor:
    """Eager PyTorch as Hugging Face writes it (the `torch` provider)."""
    return F.gelu(gate, approximate=approximate) * up


def geglu_fused_eager(x: torch.Tensor, approximate: str = "tanh") -> torch.Tensor:
    """Eager PyTorch on a fused gate_up_proj output."""
    gate, up = x.chunk(2, dim=-1)
    return F.gelu(gate, approximate=approximate) * up
