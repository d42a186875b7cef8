"""RMSNorm: y = x / sqrt(mean(x^2) + eps) * (offset + w), over the last dimension.

Casting modes reproduce where Hugging Face models cast (the kernel always accumulates in fp32):
- "llama": normalize in fp32, cast to the input dtype, then multiply by (offset + w) in the
  weight's dtype (LlamaRMSNorm: `weight * hidden.to(input_dtype)`).
- "gemma": everything in fp32, the offset added to the weight in fp32, one cast at the end
  (GemmaRMSNorm: `(x.float() * rstd) * (1.0 + weight.float())`).
- "none": every intermediate rounded to the input dtype, as code without casts computes it.

Layer order: kernels → launchers → custom ops → autograd Function → `rms_norm` → `RMSNorm`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernelwright.ops._partials import few_rows, sum_partials
from kernelwright.ops._pdl import wait_for_inputs
from kernelwright.runtime import device_info, lookup
from kernelwright.runtime.alloc import empty
from kernelwright.runtime.checks import check_same_device, check_shape, check_tensor, rows_view
from kernelwright.runtime.launch import LaunchConfig, pdl_args
from kernelwright.runtime.tables.rms_norm import DW_TABLE, FEW_ROWS, TABLE

CASTING_MODES = {"none": 0, "llama": 1, "gemma": 2}
# tl.constexpr globals: compiled kernels may read only constexpr globals.
_NONE, _LLAMA, _GEMMA = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)

# The one-row forward loads w before x for rows of up to this many columns (block_n), so w's
# latency overlaps x's (worth ~2% at 16384 x 4096 on an H200); for longer rows after the
# statistics, so that w's registers are not live across the loads and the reduction. Early
# everywhere: late was no faster at 2048-8192 columns (tune.py norm_affine, NOTES 42).
EARLY_WEIGHT_MAX_N = 2**31 - 1

# --------------------------------------------------------------------------- kernels


@triton.jit
def _weight_eff(w_ptr, cols, col_mask, offset, CASTING: tl.constexpr):
    # (offset + w) in the weight's dtype for llama/none, in fp32 for gemma.
    w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32) + offset
    if CASTING != _GEMMA:
        w = w.to(w_ptr.dtype.element_ty).to(tl.float32)
    return w


@triton.jit
def _normalize(x, rstd, x_dtype: tl.constexpr, CASTING: tl.constexpr):
    # x_hat as the model computes it: rounded to the input dtype unless the mode is gemma.
    if CASTING == _NONE:
        rstd = rstd.to(x_dtype).to(tl.float32)
    x_hat = x * rstd
    if CASTING != _GEMMA:
        x_hat = x_hat.to(x_dtype).to(tl.float32)
    return x_hat


@triton.jit
def _rms_norm_fwd_kernel(
    x_ptr,
    w_ptr,
    y_ptr,
    rstd_ptr,  # x, y: [M, N] with row strides; w: [N]; rstd: [M] fp32
    M,
    N,
    stride_x,
    stride_y,
    eps,
    offset,
    CASTING: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ROWS: tl.constexpr,
    EARLY_WEIGHT: tl.constexpr,  # w loaded before x (see EARLY_WEIGHT_MAX_N)
):
    # One program normalizes ROWS whole rows held in registers (BLOCK_N >= N).
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    if HAS_WEIGHT and EARLY_WEIGHT:
        w = _weight_eff(w_ptr, cols, col_mask, offset, CASTING)
    if ROWS == 1:
        # One row: a 1-D block, no row mask (the grid has exactly M programs).
        row = tl.program_id(0).to(tl.int64)  # int64: row * stride may pass 2^31
        x = tl.load(x_ptr + row * stride_x + cols, mask=col_mask, other=0.0).to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, axis=0) / N + eps)
        if HAS_WEIGHT and not EARLY_WEIGHT:
            w = _weight_eff(w_ptr, cols, col_mask, offset, CASTING)
        y = _normalize(x, rstd, x_ptr.dtype.element_ty, CASTING)
        if HAS_WEIGHT:
            y = y * w
        tl.store(y_ptr + row * stride_y + cols, y.to(y_ptr.dtype.element_ty), mask=col_mask)
        tl.store(rstd_ptr + row, rstd)
    else:
        rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)  # int64 offsets
        row_mask = rows < M
        mask = row_mask[:, None] & col_mask[None, :]
        x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
        x = x.to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, axis=1) / N + eps)  # [ROWS]
        if HAS_WEIGHT and not EARLY_WEIGHT:
            w = _weight_eff(w_ptr, cols, col_mask, offset, CASTING)
        y = _normalize(x, rstd[:, None], x_ptr.dtype.element_ty, CASTING)
        if HAS_WEIGHT:
            y = y * w[None, :]
        y_ptrs = y_ptr + rows[:, None] * stride_y + cols[None, :]
        tl.store(y_ptrs, y.to(y_ptr.dtype.element_ty), mask=mask)
        tl.store(rstd_ptr + rows, rstd, mask=row_mask)


@triton.jit
def _rms_norm_fwd_looped_kernel(
    x_ptr,
    w_ptr,
    y_ptr,
    rstd_ptr,
    M,
    N,
    stride_x,
    stride_y,
    eps,
    offset,
    CASTING: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # Rows too long for registers: one pass for sum(x^2), a second (mostly from L2) to write y.
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x
    y_row = y_ptr + row * stride_y
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        x = tl.load(x_row + cols, mask=cols < N, other=0.0).to(tl.float32)
        acc += x * x
    rstd = tl.rsqrt(tl.sum(acc, axis=0) / N + eps)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        col_mask = cols < N
        x = tl.load(x_row + cols, mask=col_mask, other=0.0).to(tl.float32)
        y = _normalize(x, rstd, x_ptr.dtype.element_ty, CASTING)
        if HAS_WEIGHT:
            y = y * _weight_eff(w_ptr, cols, col_mask, offset, CASTING)
        tl.store(y_row + cols, y.to(y_ptr.dtype.element_ty), mask=col_mask)
    tl.store(rstd_ptr + row, rstd)


@triton.jit
def _rms_norm_bwd_kernel(
    dy_ptr,
    x_ptr,
    w_ptr,
    rstd_ptr,
    dx_ptr,
    dw_partial_ptr,  # dw_partial: [programs, N] fp32
    M,
    N,
    stride_dy,
    stride_x,
    stride_dx,
    offset,
    CASTING: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    HAS_DW: tl.constexpr,  # off: dW left to the dw kernel (few rows, _partials.few_rows)
    BLOCK_N: tl.constexpr,
    ROWS: tl.constexpr,
    PREFETCH: tl.constexpr,
    GDC_WAIT: tl.constexpr,  # launched with PDL (ops/_pdl.py)
):
    # Persistent: program p takes row blocks p, p + P, ... and keeps its dW sum in registers.
    # g = dy * (offset + w);  dx = rstd * (g - x_hat * mean(g * x_hat));  dW = sum_rows(dy * x_hat)
    # PREFETCH: the next block's x, dy and rstd are loaded (in their own dtype) before this
    # block's reductions, so one block's memory latency hides behind the previous block's math.
    wait_for_inputs(GDC_WAIT)  # before any load or store
    pid = tl.program_id(0)
    step = tl.num_programs(0) * ROWS
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    if HAS_WEIGHT:
        w = _weight_eff(w_ptr, cols, col_mask, offset, CASTING)
    dw_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    if PREFETCH:
        first = tl.cast(pid, tl.int64) * ROWS + tl.arange(0, ROWS)
        mask0 = (first < M)[:, None] & col_mask[None, :]
        x_next = tl.load(x_ptr + first[:, None] * stride_x + cols[None, :], mask=mask0, other=0.0)
        dy_next = tl.load(
            dy_ptr + first[:, None] * stride_dy + cols[None, :], mask=mask0, other=0.0
        )
        rstd_next = tl.load(rstd_ptr + first, mask=first < M, other=0.0)
    for block in range(pid, tl.cdiv(M, ROWS), tl.num_programs(0)):
        rows = tl.cast(block, tl.int64) * ROWS + tl.arange(0, ROWS)
        row_mask = rows < M
        mask = row_mask[:, None] & col_mask[None, :]
        if PREFETCH:
            x, dy, rstd = x_next, dy_next, rstd_next
            nxt = rows + step
            nmask = (nxt < M)[:, None] & col_mask[None, :]
            x_next = tl.load(x_ptr + nxt[:, None] * stride_x + cols[None, :], mask=nmask, other=0.0)
            dy_ptrs = dy_ptr + nxt[:, None] * stride_dy + cols[None, :]
            dy_next = tl.load(dy_ptrs, mask=nmask, other=0.0)
            rstd_next = tl.load(rstd_ptr + nxt, mask=nxt < M, other=0.0)
        else:
            x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
            dy_ptrs = dy_ptr + rows[:, None] * stride_dy + cols[None, :]
            dy = tl.load(dy_ptrs, mask=mask, other=0.0)
            rstd = tl.load(rstd_ptr + rows, mask=row_mask, other=0.0)
        x = x.to(tl.float32)
        dy = dy.to(tl.float32)
        rstd = rstd[:, None]
        x_hat = x * rstd
        if HAS_DW:
            # dW sees x_hat as the forward multiplied it: rounded unless gemma.
            dw_acc += tl.sum(dy * _normalize(x, rstd, x_ptr.dtype.element_ty, CASTING), axis=0)
        g = dy
        if HAS_WEIGHT:
            g = dy * w[None, :]
        c = tl.sum(g * x_hat, axis=1)[:, None] / N
        dx = (g - x_hat * c) * rstd
        tl.store(
            dx_ptr + rows[:, None] * stride_dx + cols[None, :], dx.to(dx_ptr.dtype.element_ty), mask
        )
    if HAS_DW:
        tl.store(dw_partial_ptr + pid.to(tl.int64) * N + cols, dw_acc, mask=col_mask)


@triton.jit
def _rms_norm_dw_kernel(
    dy_ptr,
    x_ptr,
    rstd_ptr,
    dw_ptr,  # dy, x: [M, N] with row strides; rstd: [M] fp32; dw: [N], the weight's dtype
    M,
    N,
    stride_dy,
    stride_x,
    CASTING: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ROWS: tl.constexpr,
    STAGES: tl.constexpr,  # row blocks in flight (tl.range's software pipeline)
    GDC_WAIT: tl.constexpr,  # launched with PDL (ops/_pdl.py)
):
    # dW alone, for few rows (ops/_partials.few_rows): program c sums dy * x_hat (x_hat as the
    # forward multiplied it) over every [ROWS, BLOCK_N] tile of column block c, in fp32, and
    # stores dW itself: no partial rows. fused_add_rms_norm calls it with x = s. The sums stay
    # [ROWS, BLOCK_N] until the end: a sum over rows per tile would cross warps every step.
    wait_for_inputs(GDC_WAIT)  # before any load or store
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    acc = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
    for block in tl.range(0, tl.cdiv(M, ROWS), num_stages=STAGES):
        rows = tl.cast(block, tl.int64) * ROWS + tl.arange(0, ROWS)
        row_mask = rows < M
        mask = row_mask[:, None] & col_mask[None, :]
        dy = tl.load(dy_ptr + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0)
        x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
        rstd = tl.load(rstd_ptr + rows, mask=row_mask, other=0.0)[:, None]
        x_hat = _normalize(x.to(tl.float32), rstd, x_ptr.dtype.element_ty, CASTING)
        acc += dy.to(tl.float32) * x_hat  # 0 outside the mask
    tl.store(dw_ptr + cols, tl.sum(acc, axis=0).to(dw_ptr.dtype.element_ty), mask=col_mask)


@triton.jit
def _rms_norm_bwd_looped_kernel(
    dy_ptr,
    x_ptr,
    w_ptr,
    rstd_ptr,
    dx_ptr,
    dw_partial_ptr,
    M,
    N,
    stride_dy,
    stride_x,
    stride_dx,
    offset,
    CASTING: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    HAS_DW: tl.constexpr,
    BLOCK_N: tl.constexpr,
    GDC_WAIT: tl.constexpr,  # launched with PDL (ops/_pdl.py)
):
    # Long rows: pass 1 reduces sum(g * x_hat) over the row, pass 2 writes dx and adds this
    # row's dW contribution into the program's own fp32 partial row (no atomics).
    wait_for_inputs(GDC_WAIT)  # before any load or store
    pid = tl.program_id(0)
    dw_row = dw_partial_ptr + pid.to(tl.int64) * N
    for row in range(pid, M, tl.num_programs(0)):
        row64 = tl.cast(row, tl.int64)
        x_row = x_ptr + row64 * stride_x
        dy_row = dy_ptr + row64 * stride_dy
        rstd = tl.load(rstd_ptr + row64)
        acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        for start in range(0, N, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            col_mask = cols < N
            x = tl.load(x_row + cols, mask=col_mask, other=0.0).to(tl.float32)
            g = tl.load(dy_row + cols, mask=col_mask, other=0.0).to(tl.float32)
            if HAS_WEIGHT:
                g = g * _weight_eff(w_ptr, cols, col_mask, offset, CASTING)
            acc += g * x * rstd
        c = tl.sum(acc, axis=0) / N
        for start in range(0, N, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            col_mask = cols < N
            x = tl.load(x_row + cols, mask=col_mask, other=0.0).to(tl.float32)
            dy = tl.load(dy_row + cols, mask=col_mask, other=0.0).to(tl.float32)
            g = dy
            if HAS_WEIGHT:
                g = dy * _weight_eff(w_ptr, cols, col_mask, offset, CASTING)
            if HAS_DW:
                x_cast = _normalize(x, rstd, x_ptr.dtype.element_ty, CASTING)
                dw = tl.load(dw_row + cols, mask=col_mask, other=0.0)
                tl.store(dw_row + cols, dw + dy * x_cast, mask=col_mask)
            dx = (g - x * rstd * c) * rstd
            tl.store(dx_ptr + row64 * stride_dx + cols, dx.to(dx_ptr.dtype.element_ty), col_mask)


# --------------------------------------------------------------------------- launchers


def _config(kernel: str, x: torch.Tensor, config: LaunchConfig | None) -> LaunchConfig:
    m, n = x.shape  # [M, N]: the few-rows overrides key on M
    return config or lookup(TABLE, "rms_norm", kernel, device_info(x.device), n, m, FEW_ROWS)


def rms_norm_fwd_launch(
    x: torch.Tensor,  # [M, N], stride(1) == 1
    weight: torch.Tensor | None,
    y: torch.Tensor,  # [M, N], stride(1) == 1
    rstd: torch.Tensor,  # [M] fp32
    eps: float,
    offset: float,
    casting_mode: str,
    config: LaunchConfig | None = None,
) -> None:
    M, N = x.shape
    if M == 0:
        return
    cfg = _config("fwd", x, config)
    common = dict(
        CASTING=CASTING_MODES[casting_mode], HAS_WEIGHT=weight is not None, BLOCK_N=cfg.block_n
    )
    args = (x, weight if weight is not None else x, y, rstd, M, N, x.stride(0), y.stride(0))
    if cfg.block_n >= N:
        grid = (triton.cdiv(M, cfg.rows),)
        early = cfg.block_n <= EARLY_WEIGHT_MAX_N
        _rms_norm_fwd_kernel[grid](
            *args, eps, offset, ROWS=cfg.rows, EARLY_WEIGHT=early, num_warps=cfg.num_warps, **common
        )
    else:
        _rms_norm_fwd_looped_kernel[(M,)](*args, eps, offset, num_warps=cfg.num_warps, **common)


def rms_norm_bwd_launch(
    dy: torch.Tensor,  # [M, N], stride(1) == 1
    x: torch.Tensor,  # [M, N], stride(1) == 1
    weight: torch.Tensor | None,
    rstd: torch.Tensor,  # [M] fp32
    dx: torch.Tensor,  # [M, N], stride(1) == 1; may be dy itself (in-place backward)
    dw: torch.Tensor | None,  # [N], weight's dtype; None when dW is not wanted
    offset: float,
    casting_mode: str,
    config: LaunchConfig | None = None,
) -> None:
    M, N = x.shape
    if M == 0:
        if dw is not None:
            dw.zero_()
        return
    cfg = _config("bwd", x, config)
    fits = cfg.block_n >= N
    row_blocks = triton.cdiv(M, cfg.rows) if fits else M
    programs = max(1, min(row_blocks, device_info(x.device).sm_count * cfg.programs_per_sm))
    has_dw = weight is not None and dw is not None
    if has_dw and fits and few_rows(M, N, programs, dx.element_size(), _dw_block(x), x.device):
        # dW first: dx may be dy itself (in-place backward), and the dw kernel reads dy
        rms_norm_dw_launch(dy, x, rstd, dw, casting_mode)
        has_dw = False
    partial = None
    if has_dw:
        # One fp32 dW row per program, summed below: deterministic, no bf16 atomics.
        partial = empty((programs, N), dtype=torch.float32, device=x.device)
        if not fits:
            partial.zero_()
    args = (
        dy,
        x,
        weight if weight is not None else x,
        rstd,
        dx,
        partial if partial is not None else rstd,
    )
    args += (M, N, dy.stride(0), x.stride(0), dx.stride(0), offset)
    common = dict(
        CASTING=CASTING_MODES[casting_mode],
        HAS_WEIGHT=weight is not None,
        HAS_DW=has_dw,
        BLOCK_N=cfg.block_n,
        **pdl_args(device_info(x.device)),  # its launch overlaps the kernel before it
    )
    if fits:
        _rms_norm_bwd_kernel[(programs,)](
            *args,
            ROWS=cfg.rows,
            PREFETCH=cfg.num_stages > 1,
            num_warps=cfg.num_warps,
            **common,
        )
    else:
        _rms_norm_bwd_looped_kernel[(programs,)](*args, num_warps=cfg.num_warps, **common)
    if has_dw:
        sum_partials(partial, dw)  # fp32 sum over programs, one cast to the weight's dtype


def _dw_config(x: torch.Tensor, config: LaunchConfig | None = None) -> LaunchConfig:
    return config or lookup(DW_TABLE, "rms_norm", "bwd_dw", device_info(x.device), x.shape[-1])


def _dw_block(x: torch.Tensor) -> int:
    return _dw_config(x).block_n


def rms_norm_dw_launch(
    dy: torch.Tensor,  # [M, N], stride(1) == 1
    x: torch.Tensor,  # [M, N], stride(1) == 1 (fused_add_rms_norm: s)
    rstd: torch.Tensor,  # [M] fp32
    dw: torch.Tensor,  # [N], the weight's dtype
    casting_mode: str,
    config: LaunchConfig | None = None,
) -> None:
    """dW alone (the `dw` kernel): one program per column block of block_n, through every row;
    no partial rows."""
    M, N = x.shape
    cfg = _dw_config(x, config)
    _rms_norm_dw_kernel[(triton.cdiv(N, cfg.block_n),)](
        dy,
        x,
        rstd,
        dw,
        M,
        N,
        dy.stride(0),
        x.stride(0),
        CASTING=CASTING_MODES[casting_mode],
        BLOCK_N=cfg.block_n,
        ROWS=cfg.rows,
        STAGES=cfg.num_stages,
        num_warps=cfg.num_warps,
        **pdl_args(device_info(x.device)),
    )


# --------------------------------------------------------------------------- custom ops
# Registered so torch.compile(fullgraph=True) treats each launch as one opaque node. Eager calls
# skip the dispatcher and go straight to the launcher (saves ~10 µs of Python per call).


@torch.library.custom_op("kernelwright::rms_norm_fwd", mutates_args=("y", "rstd"))
def _rms_norm_fwd_op(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    y: torch.Tensor,
    rstd: torch.Tensor,
    eps: float,
    offset: float,
    casting_mode: str,
) -> None:
    rms_norm_fwd_launch(x, weight, y, rstd, eps, offset, casting_mode)


@_rms_norm_fwd_op.register_fake
def _(x, weight, y, rstd, eps, offset, casting_mode) -> None:
    return None


@torch.library.custom_op("kernelwright::rms_norm_bwd", mutates_args=("dx", "dw"))
def _rms_norm_bwd_op(
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor | None,
    rstd: torch.Tensor,
    dx: torch.Tensor,
    dw: torch.Tensor | None,
    offset: float,
    casting_mode: str,
) -> None:
    rms_norm_bwd_launch(dy, x, weight, rstd, dx, dw, offset, casting_mode)


@_rms_norm_bwd_op.register_fake
def _(dy, x, weight, rstd, dx, dw, offset, casting_mode) -> None:
    return None


# --------------------------------------------------------------------------- autograd


def _output_dtype(x: torch.Tensor, weight: torch.Tensor | None, casting_mode: str) -> torch.dtype:
    # As the HF modules return: gemma casts back to x's dtype, llama/none promote with the weight.
    if weight is None or casting_mode == "gemma":
        return x.dtype
    return torch.promote_types(x.dtype, weight.dtype)


class _RMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps, offset, casting_mode, in_place_backward):
        x2 = rows_view("rms_norm", "x", x)
        # y in x's shape, returned as allocated: a view made inside a custom Function could
        # not be modified in place by the caller. The kernel writes it through a 2-D view.
        y = empty(x.shape, dtype=_output_dtype(x, weight, casting_mode), device=x.device)
        y2 = y.view(x2.shape)
        rstd = empty(x2.shape[:1], dtype=torch.float32, device=x.device)
        if torch.compiler.is_compiling():
            _rms_norm_fwd_op(x2, weight, y2, rstd, eps, offset, casting_mode)
        else:
            rms_norm_fwd_launch(x2, weight, y2, rstd, eps, offset, casting_mode)
        ctx.save_for_backward(x2, weight, rstd)
        ctx.shape = x.shape
        ctx.x_dtype = x.dtype
        ctx.offset = offset
        ctx.casting_mode = casting_mode
        ctx.in_place_backward = in_place_backward
        return y

    @staticmethod
    def backward(ctx, dy):
        x2, weight, rstd = ctx.saved_tensors
        dy2 = rows_view("rms_norm", "dy", dy)
        compiling = torch.compiler.is_compiling()
        # In place writes dx over dy: only valid when nothing else reads dy (see rms_norm).
        in_place = (
            ctx.in_place_backward
            and not compiling
            and dy2.dtype == ctx.x_dtype
            and dy2.is_contiguous()  # never over an expanded (stride-0) gradient
        )
        dx = dy2 if in_place else empty(x2.shape, dtype=ctx.x_dtype, device=x2.device)
        dw = None
        if weight is not None and ctx.needs_input_grad[1]:
            dw = empty(weight.shape, dtype=weight.dtype, device=weight.device)
        if compiling:
            _rms_norm_bwd_op(dy2, x2, weight, rstd, dx, dw, ctx.offset, ctx.casting_mode)
        else:
            rms_norm_bwd_launch(dy2, x2, weight, rstd, dx, dw, ctx.offset, ctx.casting_mode)
        return dx.view(ctx.shape), dw, None, None, None, None


# --------------------------------------------------------------------------- public API


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    *,
    offset: float = 0.0,
    casting_mode: str = "llama",
    in_place_backward: bool = False,
) -> torch.Tensor:
    """RMSNorm over the last dimension of `x` (any leading dims), forward and backward in Triton.

    Args:
        x: [..., N] float32/float16/bfloat16, on a CUDA GPU (CPU under TRITON_INTERPRET=1).
        weight: [N] or None (no affine scale). Its gradient is reduced in fp32.
        eps: added to mean(x^2) before the reciprocal square root.
        offset: the scale is (offset + weight); Gemma uses 1.0 with zero-initialised weights.
        casting_mode: "llama", "gemma" or "none" — where the model casts (module docstring).
        in_place_backward: write dx over the incoming gradient dy to save one [M, N] buffer.
            UNSAFE when dy is also used elsewhere — e.g. `h = x + norm(x)` hands the same
            gradient tensor to both branches and would corrupt the residual gradient. Ignored
            under torch.compile.
    """
    check_tensor("rms_norm", "x", x)
    if x.shape[-1] == 0:
        raise ValueError(
            f"rms_norm: argument 'x' has an empty last dimension, shape {tuple(x.shape)}"
        )
    if weight is not None:
        check_tensor("rms_norm", "weight", weight)
        check_shape("rms_norm", "weight", weight, (x.shape[-1],), "the last dimension of x")
        check_same_device("rms_norm", x=x, weight=weight)
    if casting_mode not in CASTING_MODES:
        raise ValueError(
            f"rms_norm: casting_mode must be one of {sorted(CASTING_MODES)}, got {casting_mode!r}"
        )
    return _RMSNormFunction.apply(
        x, weight, float(eps), float(offset), casting_mode, bool(in_place_backward)
    )


class RMSNorm(torch.nn.Module):
    """Drop-in for LlamaRMSNorm (casting_mode="llama") and GemmaRMSNorm (offset=1, "gemma")."""

    def __init__(
        self,
        hidden_size: int,
        eps: float = 1e-6,
        *,
        offset: float = 0.0,
        casting_mode: str = "llama",
        elementwise_affine: bool = True,
        in_place_backward: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__()
        self.hidden_size = hidden_size
        self.eps = eps
        self.offset = offset
        self.casting_mode = casting_mode
        self.in_place_backward = in_place_backward
        if elementwise_affine:
            # With an offset the effective scale is offset + w: start at w = 0 (Gemma), else 1.
            init = torch.zeros if offset else torch.ones
            self.weight = torch.nn.Parameter(init(hidden_size, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(
            x,
            self.weight,
            self.eps,
            offset=self.offset,
            casting_mode=self.casting_mode,
            in_place_backward=self.in_place_backward,
        )

    def extra_repr(self) -> str:
        return (
            f"{self.hidden_size}, eps={self.eps}, offset={self.offset}, "
            f"casting_mode={self.casting_mode!r}"
        )


# --------------------------------------------------------------------------- references


def rms_norm_ref(
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    *,
    offset: float = 0.0,
    casting_mode: str = "llama",
    in_place_backward: bool = False,
) -> torch.Tensor:
    """fp32 reference (differentiable): what every casting mode computes without rounding."""
    del casting_mode, in_place_backward  # they change roundings only, covered by the tolerances
    x32 = x.float()
    y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * (offset + weight.float())
    return y


def rms_norm_eager(
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    *,
    offset: float = 0.0,
    casting_mode: str = "llama",
) -> torch.Tensor:
    """Eager PyTorch as Hugging Face models write it, per casting mode (the `torch` provider)."""
    if casting_mode == "gemma":
        x32 = x.float()
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
        if weight is not None:
            y = y * (offset + weight.float())
        return y.type_as(x)
    if casting_mode == "llama":
        x32 = x.to(torch.float32)
        y = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    else:
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    if weight is None:
        return y
    return (offset + weight) * y if offset else weight * y
