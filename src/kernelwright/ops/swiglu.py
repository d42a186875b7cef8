"""SwiGLU: c = silu(gate) * up, elementwise over tensors of identical shape [..., N].

Numerics as Hugging Face's MLP writes it, `act_fn(gate_proj(x)) * up_proj(x)`: the kernel
computes in fp32, rounds silu(gate) to the input dtype (the activation's output tensor), then
multiplies by up in fp32 and rounds once. The backward is the gradient of that same
computation as eager autograd takes it, with silu recomputed from gate (only gate and up are
saved; the activation is never stored):
    s = sigmoid(a),  h = round(silu(a)),  dh = round(dc * b)
    da = dh * s * (1 + a * (1 - s)),  db = dc * h
In fp32 every round() is the identity. In fp16/bf16 the roundings sit where eager PyTorch puts
them, so results agree with eager to the last bit except for ~1 in 10^4 elements (1 ulp), where
the fast fp32 sigmoid differs from PyTorch's in its last bits.

Two forms share the two kernels:
- `swiglu(gate, up)`: separate tensors (the outputs of gate_proj and up_proj).
- `swiglu_fused(x)`: x = [gate | up] along the last dimension (a fused gate_up_proj). The halves
  are two row-strided views of x, so nothing is split or copied, and the backward writes the
  one [..., 2N] gradient directly.

Layer order: kernels → launchers → custom ops → autograd Functions → `swiglu`/`swiglu_fused` →
`SwiGLU`/`SwiGLUFused` → references.
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
from kernelwright.runtime.tables.swiglu import TABLE

# --------------------------------------------------------------------------- kernels


@triton.jit
def _silu_parts(a):
    # sigmoid(a) = 1 / (1 + exp(-a)) with the fast exp and division: an exact IEEE division
    # and libdevice's expf (PyTorch's own formula, bit for bit) cost ~4% of the forward on an
    # H200; the results differ from eager in the last bit of about 1 in 10^4 elements.
    s = tl.sigmoid(a)
    return a * s, s


@triton.jit
def _swiglu_fwd_kernel(
    a_ptr, b_ptr, c_ptr,  # gate, up, out: [M, N] views with row strides, last dim contiguous
    M, N, stride_a, stride_b, stride_c,
    BLOCK_N: tl.constexpr,
    ROWS: tl.constexpr,
):  # fmt: skip
    # Program (i, j) covers rows [i*ROWS, (i+1)*ROWS) and columns [j*BLOCK_N, (j+1)*BLOCK_N).
    rows, cols, mask = elementwise_tile(M, N, BLOCK_N, ROWS)
    a = tl.load(a_ptr + rows * stride_a + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + rows * stride_b + cols, mask=mask, other=0.0).to(tl.float32)
    silu, _ = _silu_parts(a)
    h = silu.to(a_ptr.dtype.element_ty).to(tl.float32)  # the model's activation tensor
    c = h * b
    tl.store(c_ptr + rows * stride_c + cols, c.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _swiglu_bwd_kernel(
    dc_ptr, a_ptr, b_ptr, da_ptr, db_ptr,  # [M, N] views with row strides, last dim contiguous
    M, N, stride_dc, stride_a, stride_b, stride_da, stride_db,
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
    silu, s = _silu_parts(a)
    # c = h * b with h = round(silu(a)): db = dc * h, and eager autograd rounds dh = dc * b
    # to the input dtype before silu's backward: silu'(a) = s * (1 + a * (1 - s)), where
    # PyTorch's compiled kernels (CPU and CUDA) fuse 1 + a * (1 - s) into one fma.
    db = dc * silu.to(dtype).to(tl.float32)
    dh = (dc * b).to(dtype).to(tl.float32)
    da = dh * s * tl.fma(a, 1.0 - s, 1.0)
    tl.store(da_ptr + rows * stride_da + cols, da.to(da_ptr.dtype.element_ty), mask=mask)
    tl.store(db_ptr + rows * stride_db + cols, db.to(db_ptr.dtype.element_ty), mask=mask)


# --------------------------------------------------------------------------- launchers


def _config(kernel: str, t: torch.Tensor, n: int, config: LaunchConfig | None) -> LaunchConfig:
    return config or lookup(TABLE, "swiglu", kernel, device_info(t.device), n)


def swiglu_fwd_launch(
    a: torch.Tensor,  # gate [M, N], stride(1) == 1
    b: torch.Tensor,  # up [M, N], stride(1) == 1
    c: torch.Tensor,  # out [M, N], stride(1) == 1
    config: LaunchConfig | None = None,
) -> None:
    M, N = a.shape
    if M == 0 or N == 0:
        return
    cfg = _config("fwd", a, N, config)
    a, b, c = retile((a, b, c), cfg)
    M, N = a.shape
    _swiglu_fwd_kernel[elementwise_grid("swiglu", M, N, cfg)](
        a, b, c, M, N, a.stride(0), b.stride(0), c.stride(0),
        BLOCK_N=cfg.block_n, ROWS=cfg.rows, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip


def swiglu_bwd_launch(
    dc: torch.Tensor,  # [M, N], stride(1) == 1 (row stride may be 0: an expanded gradient)
    a: torch.Tensor,  # gate [M, N]
    b: torch.Tensor,  # up [M, N]
    da: torch.Tensor,  # [M, N]; may be a itself (in-place backward)
    db: torch.Tensor,  # [M, N]; may be b itself
    config: LaunchConfig | None = None,
) -> None:
    M, N = a.shape
    if M == 0 or N == 0:
        return
    cfg = _config("bwd", a, N, config)
    dc, a, b, da, db = retile((dc, a, b, da, db), cfg)
    M, N = a.shape
    _swiglu_bwd_kernel[elementwise_grid("swiglu", M, N, cfg)](
        dc, a, b, da, db, M, N,
        dc.stride(0), a.stride(0), b.stride(0), da.stride(0), db.stride(0),
        BLOCK_N=cfg.block_n, ROWS=cfg.rows, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip


def swiglu_fused_fwd_launch(
    x: torch.Tensor,  # [M, 2N] = [gate | up], stride(1) == 1
    c: torch.Tensor,  # [M, N]
    config: LaunchConfig | None = None,
) -> None:
    n = x.shape[1] // 2
    swiglu_fwd_launch(x[:, :n], x[:, n:], c, config)  # halves keep x's row stride: no copy


def swiglu_fused_bwd_launch(
    dc: torch.Tensor,  # [M, N]
    x: torch.Tensor,  # [M, 2N]
    dx: torch.Tensor,  # [M, 2N]: [da | db]
    config: LaunchConfig | None = None,
) -> None:
    n = x.shape[1] // 2
    swiglu_bwd_launch(dc, x[:, :n], x[:, n:], dx[:, :n], dx[:, n:], config)


# --------------------------------------------------------------------------- custom ops
# Registered so torch.compile(fullgraph=True) treats each launch as one opaque node. Eager calls
# skip the dispatcher and go straight to the launcher. The fused ops take the whole [M, 2N]
# tensors and slice inside the launcher: a custom op may not mutate two aliases of one base.


@torch.library.custom_op("kernelwright::swiglu_fwd", mutates_args=("c",))
def _swiglu_fwd_op(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> None:
    swiglu_fwd_launch(a, b, c)


@_swiglu_fwd_op.register_fake
def _(a, b, c) -> None:
    return None


@torch.library.custom_op("kernelwright::swiglu_bwd", mutates_args=("da", "db"))
def _swiglu_bwd_op(
    dc: torch.Tensor, a: torch.Tensor, b: torch.Tensor, da: torch.Tensor, db: torch.Tensor
) -> None:
    swiglu_bwd_launch(dc, a, b, da, db)


@_swiglu_bwd_op.register_fake
def _(dc, a, b, da, db) -> None:
    return None


@torch.library.custom_op("kernelwright::swiglu_fused_fwd", mutates_args=("c",))
def _swiglu_fused_fwd_op(x: torch.Tensor, c: torch.Tensor) -> None:
    swiglu_fused_fwd_launch(x, c)


@_swiglu_fused_fwd_op.register_fake
def _(x, c) -> None:
    return None


@torch.library.custom_op("kernelwright::swiglu_fused_bwd", mutates_args=("dx",))
def _swiglu_fused_bwd_op(dc: torch.Tensor, x: torch.Tensor, dx: torch.Tensor) -> None:
    swiglu_fused_bwd_launch(dc, x, dx)


@_swiglu_fused_bwd_op.register_fake
def _(dc, x, dx) -> None:
    return None


# --------------------------------------------------------------------------- autograd


class _SwiGLUFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate, up, in_place_backward):
        a2 = rows_view("swiglu", "gate", gate)  # [M, N]
        b2 = rows_view("swiglu", "up", up)  # [M, N]
        # out in gate's shape, returned as allocated (see rms_norm); written via a 2-D view
        out = empty(gate.shape, dtype=gate.dtype, device=gate.device)
        c = out.view(a2.shape)
        compiling = torch.compiler.is_compiling()
        if compiling:
            _swiglu_fwd_op(a2, b2, c)
        else:
            swiglu_fwd_launch(a2, b2, c)
        ctx.save_for_backward(a2, b2)
        ctx.shape = gate.shape
        # The backward may overwrite gate/up only when the [M, N] views are exactly their
        # elements and the two share none (see `swiglu`); never under torch.compile.
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
        dc2 = rows_view("swiglu", "dc", dc)  # copies a gradient whose last stride is not 1
        need_a, need_b = ctx.needs_input_grad[:2]
        in_place = ctx.in_place and storage_ptr(dc2) not in (storage_ptr(a2), storage_ptr(b2))
        da = a2 if in_place and need_a else empty(a2.shape, dtype=a2.dtype, device=a2.device)
        db = b2 if in_place and need_b else empty(b2.shape, dtype=b2.dtype, device=b2.device)
        if torch.compiler.is_compiling():
            _swiglu_bwd_op(dc2, a2, b2, da, db)
        else:
            swiglu_bwd_launch(dc2, a2, b2, da, db)
        return (
            da.view(ctx.shape) if need_a else None,
            db.view(ctx.shape) if need_b else None,
            None,
        )


class _SwiGLUFusedFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x2 = rows_view("swiglu_fused", "x", x)  # [M, 2N]
        out = empty((*x.shape[:-1], x.shape[-1] // 2), dtype=x.dtype, device=x.device)
        c = out.view(x2.shape[0], x2.shape[1] // 2)
        if torch.compiler.is_compiling():
            _swiglu_fused_fwd_op(x2, c)
        else:
            swiglu_fused_fwd_launch(x2, c)
        ctx.save_for_backward(x2)
        ctx.shape = x.shape
        return out

    @staticmethod
    def backward(ctx, dc):
        (x2,) = ctx.saved_tensors
        dc2 = rows_view("swiglu_fused", "dc", dc)
        dx = empty(x2.shape, dtype=x2.dtype, device=x2.device)  # [M, 2N] = [da | db]
        if torch.compiler.is_compiling():
            _swiglu_fused_bwd_op(dc2, x2, dx)
        else:
            swiglu_fused_bwd_launch(dc2, x2, dx)
        return dx.view(ctx.shape)


# --------------------------------------------------------------------------- public API


def swiglu(
    gate: torch.Tensor, up: torch.Tensor, *, in_place_backward: bool = False
) -> torch.Tensor:
    """silu(gate) * up, forward and backward in Triton, rounded as Hugging Face's MLP rounds.

    Args:
        gate: [..., N] float32/float16/bfloat16 (any leading dims, any layout), on a CUDA GPU
            (CPU under TRITON_INTERPRET=1).
        up: same shape, dtype and device as gate.
        in_place_backward: write the gradient of gate into gate's storage and that of up into
            up's, saving two [..., N] buffers (what Liger Kernel always does). UNSAFE when gate
            or up is read by anything after this forward — another op, a second backward, a
            residual — since it will see gradients instead of activations. Ignored under
            torch.compile, and when gate/up are not views the kernel can write through (a
            copy was needed, rows overlap, or gate and up share elements).
    """
    check_tensor("swiglu", "gate", gate)
    check_tensor("swiglu", "up", up)
    check_same_device("swiglu", gate=gate, up=up)
    if up.dtype != gate.dtype:
        raise TypeError(
            f"swiglu: argument 'up' has dtype {str(up.dtype).replace('torch.', '')} but 'gate' "
            f"has dtype {str(gate.dtype).replace('torch.', '')}; pass both in one dtype"
        )
    check_shape("swiglu", "up", up, gate.shape, "the shape of gate")
    return _SwiGLUFunction.apply(gate, up, bool(in_place_backward))


def swiglu_fused(x: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for x = [gate | up] along the last dim (a fused gate_up_proj output).

    Args:
        x: [..., 2N] float32/float16/bfloat16; the first N columns are gate, the last N up.
    Returns:
        [..., N] in x's dtype. The gradient of x is one [..., 2N] tensor.
    """
    check_tensor("swiglu_fused", "x", x)
    if x.shape[-1] % 2:
        raise ValueError(
            "swiglu_fused: argument 'x' must have an even last dimension ([..., 2N]: gate then "
            f"up), got shape {tuple(x.shape)}"
        )
    return _SwiGLUFusedFunction.apply(x)


class SwiGLU(torch.nn.Module):
    """The gated activation of a Llama-style MLP: `forward(gate, up) = silu(gate) * up`."""

    def __init__(self, *, in_place_backward: bool = False):
        super().__init__()
        self.in_place_backward = in_place_backward

    def forward(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return swiglu(gate, up, in_place_backward=self.in_place_backward)

    def extra_repr(self) -> str:
        return f"in_place_backward={self.in_place_backward}"


class SwiGLUFused(torch.nn.Module):
    """The same on a fused gate_up_proj output: `forward(x)` with x = [gate | up]."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return swiglu_fused(x)


# --------------------------------------------------------------------------- references


def swiglu_ref(
    gate: torch.Tensor, up: torch.Tensor, *, in_place_backward: bool = False
) -> torch.Tensor:
    """fp32 reference (differentiable), no intermediate rounding."""
    del in_place_backward  # changes where gradients are written, not their values
    return F.silu(gate.float()) * up.float()


def swiglu_fused_ref(x: torch.Tensor) -> torch.Tensor:
    """fp32 reference of `swiglu_fused` (differentiable)."""
    gate, up = x.float().chunk(2, dim=-1)
    return F.silu(gate) * up


def swiglu_eager(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """Eager PyTorch as Hugging Face writes it (the `torch` provider)."""
    return F.silu(gate) * up


def swiglu_fused_eager(x: torch.Tensor) -> torch.Tensor:
    """Eager PyTorch on a fused gate_up_proj output, as Phi-3 writes it."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up
