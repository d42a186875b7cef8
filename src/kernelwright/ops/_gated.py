"""The gated-activation family: one forward and one backward kernel, switched by `ACTIVATION`.

    gated (swiglu, geglu):   c = act(gate) * up      act = silu, gelu_tanh or gelu_erf
    single (relu_squared):   c = act(x)              act = relu_squared
    clamped (swiglu_clamped): c = act(min(gate, L)) * (clamp(up, -L, L) + offset)
                                                     act = silu_clamped, g * sigmoid(alpha g)

The clamped form's alpha, L (limit) and offset are runtime scalars; its gate and up may be
views whose columns are 2 apart (GPT-OSS's interleaved [gate0, up0, gate1, up1, ...]): the
`COLS` constexpr is the column stride of gate, up and their gradients.

The public modules (ops/swiglu.py, ops/geglu.py, ops/relu_squared.py, ops/swiglu_clamped.py)
hold the numerics of
each op, its public function, module and reference; this module holds what they share: the
kernels, the launchers (each activation reads its own op's launch table), the custom ops and
the autograd Functions.

Numerics as Hugging Face writes the MLP, `act_fn(gate_proj(x)) * up_proj(x)`: in fp32, the
activation rounded to the input dtype (the model's activation tensor), times up in fp32,
rounded once. The backward recomputes act from gate (only the inputs are saved) and rounds
where eager autograd does:
    h = round(act(a)),  dh = round(dc * b),  da = dh * act'(a),  db = dc * h
A single-input activation rounds once each way: c = round(act(a)), da = round(dc * act'(a)).

Layer order: activation formulas (ops/_activations.py) → kernels (ops/_gated_kernels.py) →
launchers → custom ops → autograd Functions → the entry points the public functions call.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from kernelwright.ops._elementwise import (
    _cols,
    _empty_as,
    _every_other,
    _halves,
    elementwise_grid,
    retiled_shape,
)
from kernelwright.ops._gated_kernels import _gated_bwd_kernel, _gated_fwd_kernel
from kernelwright.runtime import device_info, lookup
from kernelwright.runtime.alias import disjoint, storage_ptr, writes_through
from kernelwright.runtime.alloc import empty, empty_like
from kernelwright.runtime.checks import check_same_device, check_shape, check_tensor, rows_view
from kernelwright.runtime.launch import LaunchConfig, PlanCache, Table, traced
from kernelwright.runtime.tables.geglu import TABLE as GEGLU_TABLE
from kernelwright.runtime.tables.relu_squared import TABLE as RELU_SQUARED_TABLE
from kernelwright.runtime.tables.swiglu import TABLE as SWIGLU_TABLE

# activation -> the op it serves: that op's launch table and the name its errors carry
ACTIVATIONS: dict[str, str] = {
    "silu": "swiglu",
    "gelu_tanh": "geglu",
    "gelu_erf": "geglu",
    "relu_squared": "relu_squared",
    "silu_clamped": "swiglu_clamped",
}
GATED = ("silu", "gelu_tanh", "gelu_erf", "silu_clamped")  # the others take one input, no up
CLAMPED = "silu_clamped"  # the activation with runtime scalars (alpha, limit, offset)
_TABLES: dict[str, Table] = {
    "swiglu": SWIGLU_TABLE,
    "swiglu_clamped": SWIGLU_TABLE,  # the same memory-bound elementwise pass, one more input
    "geglu": GEGLU_TABLE,
    "relu_squared": RELU_SQUARED_TABLE,
}

# --------------------------------------------------------------------------- launchers


_PLANS = PlanCache()  # (kernel, activation, M, N, device, dense, cols) -> `_plan`'s plan
_NO_SCALARS = (None, None, None)
Scalars = tuple[float, float, float]  # silu_clamped's (alpha, limit, offset)


def _scalars(activation: str, scalars) -> tuple:
    """The kernel's (alpha, limit, offset): floats for silu_clamped, Nones for the others."""
    if activation != CLAMPED:
        return _NO_SCALARS
    if scalars is None:
        raise ValueError("swiglu_clamped: the launch needs scalars=(alpha, limit, offset)")
    return tuple(float(v) for v in scalars)


def _plan(
    kernel: str,
    activation: str,
    m: int,
    n: int,
    device: torch.device,
    dense: bool,
    config,
    cols: int = 1,
) -> tuple[tuple[int], int, int, dict]:
    """(grid, M, N, constexprs) of a launch over [m, n] tensors: M x N is the retiled view
    (`_elementwise.retiled_shape`) where every tensor is `dense` (contiguous) and it applies.
    Memoized where the activation's op's table chooses the config."""
    op = ACTIVATIONS.get(activation)
    if op is None:
        raise ValueError(f"unknown activation {activation!r}; one of {tuple(ACTIVATIONS)}")
    table = _TABLES[op]
    key = (kernel, activation, m, n, device, dense, cols)
    plan = _PLANS.get_for(key, table, kernel) if config is None else None
    if plan is None:
        info = device_info(device)
        cfg = config or lookup(table, op, kernel, info, n)
        M, N = retiled_shape(m, n, cfg) if dense else (m, n)
        constexprs = dict(
            ACTIVATION=activation, COLS=cols,
            BLOCK_N=cfg.block_n, ROWS=cfg.rows, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )  # fmt: skip
        plan = elementwise_grid(op, M, N, cfg), M, N, constexprs
        if config is None:
            _PLANS.put_for(key, table, kernel, info.arch, plan)
    return plan


def gated_fwd_launch(
    activation: str,
    a: torch.Tensor,  # gate (or the single input) [M, N], stride(1) 1 (or 2 for silu_clamped)
    b: torch.Tensor | None,  # up [M, N], a's column stride; None for a single-input activation
    c: torch.Tensor,  # out [M, N], stride(1) == 1
    config: LaunchConfig | None = None,
    scalars: Scalars | None = None,  # silu_clamped's (alpha, limit, offset)
) -> None:
    M, N = a.shape
    dense = a.is_contiguous() and c.is_contiguous() and (b is None or b.is_contiguous())
    cols = 1 if dense else _cols(a, b)
    _fwd_launch(activation, a, b, c, M, N, dense, config, _scalars(activation, scalars), cols)


def _fwd_launch(
    activation: str, a, b, c, m: int, n: int, dense: bool, config, scalars=_NO_SCALARS, cols=1
) -> None:
    """`gated_fwd_launch` over m rows of n: [m, n] views, or where `dense`, contiguous tensors
    of any rank (rows n apart), launched on as they are."""
    if m == 0 or n == 0:
        return
    grid, M, N, constexprs = _plan("fwd", activation, m, n, a.device, dense, config, cols)
    if dense:  # one block each: [M, N] with row stride N (retiled or not)
        sa, sb, sc = N, None if b is None else N, N
    else:
        sa, sb, sc = a.stride(0), None if b is None else b.stride(0), c.stride(0)
    _gated_fwd_kernel[grid](a, b, c, M, N, sa, sb, sc, *scalars, **constexprs)


def gated_bwd_launch(
    activation: str,
    dc: torch.Tensor,  # [M, N], stride(1) == 1 (row stride may be 0: an expanded gradient)
    a: torch.Tensor,  # gate [M, N]
    b: torch.Tensor | None,  # up [M, N]; None for a single-input activation
    da: torch.Tensor,  # [M, N], a's column stride; may be a itself (in-place backward)
    db: torch.Tensor | None,  # [M, N]; may be b itself; None when b is
    config: LaunchConfig | None = None,
    scalars: Scalars | None = None,  # silu_clamped's (alpha, limit, offset)
) -> None:
    M, N = a.shape
    dense = dc.is_contiguous() and a.is_contiguous() and da.is_contiguous()
    dense = dense and (b is None or b.is_contiguous()) and (db is None or db.is_contiguous())
    cols = 1 if dense else _cols(a, b, da, db)
    scalars = _scalars(activation, scalars)
    _bwd_launch(activation, dc, a, b, da, db, M, N, dense, config, scalars, cols)


def _bwd_launch(
    activation: str, dc, a, b, da, db, m: int, n: int, dense: bool, config,
    scalars=_NO_SCALARS, cols=1,
) -> None:  # fmt: skip
    """`gated_bwd_launch` over m rows of n, as `_fwd_launch`."""
    if m == 0 or n == 0:
        return
    grid, M, N, constexprs = _plan("bwd", activation, m, n, a.device, dense, config, cols)
    if dense:
        strides = (N, N, None, N, None) if b is None else (N,) * 5
    else:
        strides = (dc.stride(0), a.stride(0), None if b is None else b.stride(0), da.stride(0))
        strides += (None if db is None else db.stride(0),)
    _gated_bwd_kernel[grid](dc, a, b, da, db, M, N, *strides, *scalars, **constexprs)


def gated_fused_fwd_launch(
    activation: str,
    x: torch.Tensor,  # [M, 2N] = [gate | up] (or interleaved), stride(1) == 1
    c: torch.Tensor,  # [M, N]
    config: LaunchConfig | None = None,
    scalars: Scalars | None = None,
    interleaved: bool = False,
) -> None:
    a, b = _halves(x, interleaved)
    gated_fwd_launch(activation, a, b, c, config, scalars)


def gated_fused_bwd_launch(
    activation: str,
    dc: torch.Tensor,  # [M, N]
    x: torch.Tensor,  # [M, 2N]
    dx: torch.Tensor,  # [M, 2N]: [da | db] (or interleaved, as x)
    config: LaunchConfig | None = None,
    scalars: Scalars | None = None,
    interleaved: bool = False,
) -> None:
    (a, b), (da, db) = _halves(x, interleaved), _halves(dx, interleaved)
    gated_bwd_launch(activation, dc, a, b, da, db, config, scalars)


# --------------------------------------------------------------------------- custom ops
# Registered so torch.compile(fullgraph=True) treats each launch as one opaque node. Eager calls
# skip the dispatcher and go straight to the launcher. The fused ops take the whole [M, 2N]
# tensors and slice inside the launcher: a custom op may not mutate two aliases of one base.


# `scalars`: silu_clamped's [alpha, limit, offset], None for the other activations.


def _opt(scalars: list[float] | None) -> Scalars | None:
    return None if scalars is None else tuple(scalars)


@torch.library.custom_op("kernelwright::gated_fwd", mutates_args=("c",))
def _fwd_op(
    a: torch.Tensor,
    b: torch.Tensor | None,
    c: torch.Tensor,
    activation: str,
    scalars: list[float] | None = None,
) -> None:
    gated_fwd_launch(activation, a, b, c, scalars=_opt(scalars))


@_fwd_op.register_fake
def _(a, b, c, activation, scalars=None) -> None:
    return None


@torch.library.custom_op("kernelwright::gated_bwd", mutates_args=("da", "db"))
def _bwd_op(
    dc: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor | None,
    da: torch.Tensor,
    db: torch.Tensor | None,
    activation: str,
    scalars: list[float] | None = None,
) -> None:
    gated_bwd_launch(activation, dc, a, b, da, db, scalars=_opt(scalars))


@_bwd_op.register_fake
def _(dc, a, b, da, db, activation, scalars=None) -> None:
    return None


@torch.library.custom_op("kernelwright::gated_fused_fwd", mutates_args=("c",))
def _fused_fwd_op(
    x: torch.Tensor,
    c: torch.Tensor,
    activation: str,
    scalars: list[float] | None = None,
    interleaved: bool = False,
) -> None:
    gated_fused_fwd_launch(activation, x, c, scalars=_opt(scalars), interleaved=interleaved)


@_fused_fwd_op.register_fake
def _(x, c, activation, scalars=None, interleaved=False) -> None:
    return None


@torch.library.custom_op("kernelwright::gated_fused_bwd", mutates_args=("dx",))
def _fused_bwd_op(
    dc: torch.Tensor,
    x: torch.Tensor,
    dx: torch.Tensor,
    activation: str,
    scalars: list[float] | None = None,
    interleaved: bool = False,
) -> None:
    gated_fused_bwd_launch(activation, dc, x, dx, scalars=_opt(scalars), interleaved=interleaved)


@_fused_bwd_op.register_fake
def _(dc, x, dx, activation, scalars=None, interleaved=False) -> None:
    return None


# --------------------------------------------------------------------------- autograd


def _pair_views(activation: str, gate: torch.Tensor, up: torch.Tensor):
    """[M, N] views of gate and up with one column stride: 1 (rows_view, copying what it must),
    or for silu_clamped 2 where both are interleaved halves (no copy)."""
    if activation == CLAMPED:
        a2, b2 = _every_other(gate), _every_other(up)
        if a2 is not None and b2 is not None:
            return a2, b2
    op = ACTIVATIONS[activation]
    return rows_view(op, "gate", gate), rows_view(op, "up", up)


def _listed(scalars) -> list[float] | None:
    return None if scalars is None else list(scalars)


class _GatedFunction(torch.autograd.Function):
    # act(gate) * up on two separate tensors.
    @staticmethod
    def forward(ctx, gate, up, activation, in_place_backward, scalars=None):
        a2, b2 = _pair_views(activation, gate, up)  # [M, N] each
        # out in gate's shape, returned as allocated (see rms_norm); written via a 2-D view
        out = empty(gate.shape, dtype=gate.dtype, device=gate.device)
        c = out.view(a2.shape)
        compiling = traced(gate)
        if compiling:
            _fwd_op(a2, b2, c, activation, _listed(scalars))
        else:
            gated_fwd_launch(activation, a2, b2, c, scalars=scalars)
        ctx.save_for_backward(a2, b2)
        ctx.shape = gate.shape
        ctx.activation = activation
        ctx.scalars = scalars
        # The backward may overwrite gate/up only when the [M, N] views are exactly their
        # elements and the two share none (see `gated`); never under torch.compile.
        ctx.in_place = (
            in_place_backward
            and not compiling
            and writes_through(gate, a2)
            and writes_through(up, b2)
            and disjoint(a2, b2)
        )
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dc):
        a2, b2 = ctx.saved_tensors
        op = ACTIVATIONS[ctx.activation]
        dc2 = rows_view(op, "dc", dc)  # copies a gradient whose last stride is not 1
        need_a, need_b = ctx.needs_input_grad[:2]
        in_place = ctx.in_place and storage_ptr(dc2) not in (storage_ptr(a2), storage_ptr(b2))
        da = a2 if in_place and need_a else _empty_as(a2)
        db = b2 if in_place and need_b else _empty_as(b2)
        if traced(dc):
            _bwd_op(dc2, a2, b2, da, db, ctx.activation, _listed(ctx.scalars))
        else:
            gated_bwd_launch(ctx.activation, dc2, a2, b2, da, db, scalars=ctx.scalars)
        return (
            da.view(ctx.shape) if need_a else None,
            db.view(ctx.shape) if need_b else None,
            None,
            None,
            None,
        )


class _FusedFunction(torch.autograd.Function):
    # act(gate) * up for x = [gate | up] along the last dim (or its even/odd columns when
    # interleaved): out [..., N] from x [..., 2N].
    @staticmethod
    def forward(ctx, x, activation, scalars=None, interleaved=False):
        op = ACTIVATIONS[activation] + "_fused"
        x2 = rows_view(op, "x", x)  # [M, 2N]
        n = x.shape[-1] // 2
        out = empty((*x.shape[:-1], n), dtype=x.dtype, device=x.device)
        c = out.view(x2.shape[0], n)
        if traced(x):
            _fused_fwd_op(x2, c, activation, _listed(scalars), interleaved)
        else:
            gated_fused_fwd_launch(activation, x2, c, scalars=scalars, interleaved=interleaved)
        ctx.save_for_backward(x2)  # x only: the activation is recomputed, out is never kept
        ctx.shape = x.shape
        ctx.activation = activation
        ctx.op = op
        ctx.scalars, ctx.interleaved = scalars, interleaved
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dc):
        (x2,) = ctx.saved_tensors
        dc2 = rows_view(ctx.op, "dc", dc)  # copies a gradient whose last stride is not 1
        dx = empty_like(x2)  # [M, 2N] = [da | db], or interleaved as x
        scalars, interleaved = ctx.scalars, ctx.interleaved
        if traced(dc):
            _fused_bwd_op(dc2, x2, dx, ctx.activation, _listed(scalars), interleaved)
        else:
            gated_fused_bwd_launch(
                ctx.activation, dc2, x2, dx, scalars=scalars, interleaved=interleaved
            )
        return dx.view(*ctx.shape), None, None, None


class _SingleFunction(torch.autograd.Function):
    # act(x) for a single-input activation: out (and dx) in x's shape, returned as allocated.
    # A contiguous x (and gradient) is launched on as it is (rows n apart, whatever its rank),
    # anything else through [M, N] views.
    @staticmethod
    def forward(ctx, x, activation):
        out = empty_like(x)
        compiling = traced(x)
        if not compiling and x.is_contiguous():
            n = x.shape[-1]
            if n:
                _fwd_launch(activation, x, None, out, x.numel() // n, n, True, None)
            saved = x
        else:
            saved = rows_view(ACTIVATIONS[activation], "x", x)  # [M, N]
            c = out if saved is x else out.view(*saved.shape)  # ints: n may be 0
            if compiling:
                _fwd_op(saved, None, c, activation)
            else:
                gated_fwd_launch(activation, saved, None, c)
        ctx.save_for_backward(saved)  # x only: the activation is recomputed, out is never kept
        ctx.shape = x.shape
        ctx.activation = activation
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dc):
        (x,) = ctx.saved_tensors  # x itself (contiguous), or its [M, N] view
        activation = ctx.activation
        dx = empty_like(x)  # contiguous, in the saved tensor's shape
        compiling = traced(dc)
        if not compiling and x.is_contiguous() and dc.is_contiguous():
            n = x.shape[-1]
            if n:
                _bwd_launch(activation, dc, x, None, dx, None, x.numel() // n, n, True, None)
        else:
            op = ACTIVATIONS[activation]
            x2, dx2 = rows_view(op, "x", x), rows_view(op, "dx", dx)  # dx2: a view (contiguous)
            dc2 = rows_view(op, "dc", dc)  # copies a gradient whose last stride is not 1
            if compiling:
                _bwd_op(dc2, x2, None, dx2, None, activation)
            else:
                gated_bwd_launch(activation, dc2, x2, None, dx2, None)
        # a saved [M, N] view has x's shape when x is 2-D
        shape = ctx.shape
        return (dx if dx.dim() == len(shape) else dx.view(*shape)), None


# --------------------------------------------------------------------------- entry points


def gated(
    activation: str,
    gate: torch.Tensor,
    up: torch.Tensor,
    in_place_backward: bool,
    scalars: Scalars | None = None,
) -> torch.Tensor:
    """act(gate) * up for `activation` in GATED, after the argument checks (errors name the
    op). `in_place_backward` writes the gradients into gate's and up's storage where the
    kernel can write through both (see `kernelwright.ops.swiglu.swiglu`)."""
    op = ACTIVATIONS[activation]
    check_tensor(op, "gate", gate)
    check_tensor(op, "up", up)
    check_same_device(op, gate=gate, up=up)
    if up.dtype != gate.dtype:
        raise TypeError(
            f"{op}: argument 'up' has dtype {str(up.dtype).replace('torch.', '')} but 'gate' "
            f"has dtype {str(gate.dtype).replace('torch.', '')}; pass both in one dtype"
        )
    check_shape(op, "up", up, gate.shape, "the shape of gate")
    return _GatedFunction.apply(gate, up, activation, bool(in_place_backward), scalars)


def gated_fused(
    activation: str,
    x: torch.Tensor,
    scalars: Scalars | None = None,
    interleaved: bool = False,
) -> torch.Tensor:
    """act(gate) * up for x = [gate | up] along the last dim (or its even and odd columns,
    `interleaved`), after the argument checks."""
    op = ACTIVATIONS[activation] + "_fused"
    check_tensor(op, "x", x)
    if x.shape[-1] % 2:
        raise ValueError(
            f"{op}: argument 'x' must have an even last dimension ([..., 2N]: gate then "
            f"up), got shape {tuple(x.shape)}"
        )
    return _FusedFunction.apply(x, activation, scalars, bool(interleaved))


def single(activation: str, x: torch.Tensor) -> torch.Tensor:
    """act(x) for a single-input `activation` (not in GATED), after the argument checks."""
    check_tensor(ACTIVATIONS[activation], "x", x)
    return _SingleFunction.apply(x, activation)
