"""Jagged mean: batched mean pooling over variable-length segments of rows.

values [total, D] holds B segments back to back; offsets [B + 1] (int32/int64, offsets[0] = 0,
non-decreasing, offsets[B] = total) marks where each starts:
    out[b] = mean(values[offsets[b]:offsets[b + 1]], dim=0)        # [B, D], fp32 accumulation
An empty segment gives a row of zeros (its gradient has no rows to reach). The backward spreads
each segment's gradient evenly over its rows:
    dvalues[i] = dout[b] / len(b)      for offsets[b] <= i < offsets[b + 1]
Every row belongs to exactly one segment, so the backward writes each row once, without atomics.

One launch per direction whatever the lengths: one program per (segment, column tile), looping
over the segment's rows a row chunk at a time (no padding to the longest segment, no per-length
buckets). Layout: kernels → launchers → custom ops → autograd Function → `jagged_mean` →
`JaggedMean` → references.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from kernelwright.runtime import device_info, lookup
from kernelwright.runtime.alloc import empty
from kernelwright.runtime.checks import check_same_device, check_tensor, rows_view
from kernelwright.runtime.fastlaunch import fast
from kernelwright.runtime.launch import LaunchConfig, cdiv, traced
from kernelwright.runtime.tables.jagged_mean import STAGED_BYTES, TABLE

OFFSET_DTYPES = (torch.int32, torch.int64)

# --------------------------------------------------------------------------- kernels


@triton.jit
def _segment_tile(offsets_ptr, D, BLOCK_D: tl.constexpr):
    # A 1-D grid: the column tiles of one segment on consecutive programs, so neighbouring
    # programs read neighbouring memory. Bounds in int64: row * stride may pass 2^31.
    pid = tl.program_id(0)
    n_tiles = tl.cdiv(D, BLOCK_D)
    seg = pid // n_tiles
    cols = (pid % n_tiles) * BLOCK_D + tl.arange(0, BLOCK_D)
    start = tl.load(offsets_ptr + seg).to(tl.int64)
    end = tl.load(offsets_ptr + seg + 1).to(tl.int64)
    return seg.to(tl.int64), cols, cols < D, start, end


@fast
@triton.jit
def _jagged_mean_fwd_kernel(
    v_ptr, offsets_ptr, out_ptr,  # values [total, D] (row stride), offsets [B + 1], out [B, D]
    D, stride_v, stride_out,
    BLOCK_D: tl.constexpr,
    BLOCK_R: tl.constexpr,
    STAGES: tl.constexpr,
):  # fmt: skip
    seg, cols, col_mask, start, end = _segment_tile(offsets_ptr, D, BLOCK_D)
    n = end - start
    # Row chunks summed element-wise into a [BLOCK_R, BLOCK_D] fp32 tile, reduced over rows
    # once at the end: one add per element in the loop, one tree reduction per program.
    # STAGES > 1: the compiler stages the next STAGES - 1 chunks' loads in shared memory
    # (cp.async) while this one is summed, so a program keeps loads in flight through its loop.
    acc = tl.zeros([BLOCK_R, BLOCK_D], dtype=tl.float32)
    for r in tl.range(0, n, BLOCK_R, num_stages=STAGES):
        rows = start + r + tl.arange(0, BLOCK_R)  # int64
        mask = (rows < end)[:, None] & col_mask[None, :]
        x = tl.load(v_ptr + rows[:, None] * stride_v + cols[None, :], mask=mask, other=0.0)
        acc += x.to(tl.float32)
    # Empty segment: the loop never ran, acc = 0, and 0 / 1 = 0.
    # div_rn: IEEE division, as torch divides (plain / compiles to an approximate divide)
    mean = tl.math.div_rn(tl.sum(acc, axis=0), tl.maximum(n, 1).to(tl.float32))
    tl.store(out_ptr + seg * stride_out + cols, mean.to(out_ptr.dtype.element_ty), mask=col_mask)


@fast
@triton.jit
def _jagged_mean_bwd_kernel(
    dout_ptr, offsets_ptr, dv_ptr,  # dout [B, D] (row stride, may be 0), dvalues [total, D]
    D, stride_dout, stride_dv,
    BLOCK_D: tl.constexpr,
    BLOCK_R: tl.constexpr,
):  # fmt: skip
    seg, cols, col_mask, start, end = _segment_tile(offsets_ptr, D, BLOCK_D)
    n = end - start
    # d mean / d x_i = 1 / n for each of the segment's n rows: one gradient row, loaded once,
    # scaled in fp32, rounded once, then stored over every row of the segment.
    dy = tl.load(dout_ptr + seg * stride_dout + cols, mask=col_mask, other=0.0).to(tl.float32)
    # div_rn: IEEE division, so grad / n rounds as torch rounds it
    g = tl.math.div_rn(dy, tl.maximum(n, 1).to(tl.float32)).to(dv_ptr.dtype.element_ty)
    tile = tl.broadcast_to(g[None, :], (BLOCK_R, BLOCK_D))
    for r in range(0, n, BLOCK_R):
        rows = start + r + tl.arange(0, BLOCK_R)  # int64
        mask = (rows < end)[:, None] & col_mask[None, :]
        tl.store(dv_ptr + rows[:, None] * stride_dv + cols[None, :], tile, mask=mask)


# --------------------------------------------------------------------------- launchers


def _config(kernel: str, t: torch.Tensor, d: int, config: LaunchConfig | None) -> LaunchConfig:
    return config or lookup(TABLE, "jagged_mean", kernel, device_info(t.device), d)


def _grid(b: int, d: int, cfg: LaunchConfig) -> tuple[int]:
    # One program per (segment, column tile); see _segment_tile. Axis 0 takes up to 2^31 - 1.
    programs = b * cdiv(d, cfg.block_n)
    if programs >= 2**31:
        raise ValueError(f"jagged_mean: {b} segments x {d} needs {programs} programs, too many")
    return (programs,)


def jagged_mean_fwd_launch(
    values: torch.Tensor,  # [total, D], stride(1) == 1
    offsets: torch.Tensor,  # [B + 1] int32/int64, contiguous
    out: torch.Tensor,  # [B, D], stride(1) == 1
    config: LaunchConfig | None = None,
) -> None:
    B, D = out.shape
    if B == 0 or D == 0:
        return
    cfg = _config("fwd", values, D, config)
    _jagged_mean_fwd_kernel[_grid(B, D, cfg)](
        values, offsets, out, D, values.stride(0), out.stride(0),
        BLOCK_D=cfg.block_n, BLOCK_R=cfg.rows, STAGES=_stages(cfg, values.element_size()),
        num_warps=cfg.num_warps,
    )  # fmt: skip


def _stages(cfg: LaunchConfig, itemsize: int) -> int:
    """The forward loop's staging depth: the table's, cut so that the chunks staged ahead
    (STAGES - 1 of rows x block_n values) fit STAGED_BYTES of shared memory whatever the dtype
    and GPU (fp32 values need twice the bytes the bf16-tuned rows planned for)."""
    chunk = cfg.rows * cfg.block_n * itemsize
    return max(1, min(cfg.num_stages, 1 + STAGED_BYTES // chunk))


def jagged_mean_bwd_launch(
    dout: torch.Tensor,  # [B, D], stride(1) == 1
    offsets: torch.Tensor,  # [B + 1] int32/int64, contiguous
    dvalues: torch.Tensor,  # [total, D], stride(1) == 1
    config: LaunchConfig | None = None,
) -> None:
    B, D = dout.shape
    if B == 0 or D == 0 or dvalues.shape[0] == 0:
        return
    cfg = _config("bwd", dvalues, D, config)
    _jagged_mean_bwd_kernel[_grid(B, D, cfg)](
        dout, offsets, dvalues, D, dout.stride(0), dvalues.stride(0),
        BLOCK_D=cfg.block_n, BLOCK_R=cfg.rows, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip


# --------------------------------------------------------------------------- custom ops
# Registered so torch.compile(fullgraph=True) treats each launch as one opaque node. Eager calls
# skip the dispatcher and go straight to the launcher.


@torch.library.custom_op("kernelwright::jagged_mean_fwd", mutates_args=("out",))
def _jagged_mean_fwd_op(values: torch.Tensor, offsets: torch.Tensor, out: torch.Tensor) -> None:
    jagged_mean_fwd_launch(values, offsets, out)


@_jagged_mean_fwd_op.register_fake
def _(values, offsets, out) -> None:
    return None


@torch.library.custom_op("kernelwright::jagged_mean_bwd", mutates_args=("dvalues",))
def _jagged_mean_bwd_op(dout: torch.Tensor, offsets: torch.Tensor, dvalues: torch.Tensor) -> None:
    jagged_mean_bwd_launch(dout, offsets, dvalues)


@_jagged_mean_bwd_op.register_fake
def _(dout, offsets, dvalues) -> None:
    return None


# --------------------------------------------------------------------------- autograd


class _JaggedMeanFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, values, offsets):
        v2 = rows_view("jagged_mean", "values", values)  # row stride kept; copies if stride(1) != 1
        out = empty(
            (offsets.shape[0] - 1, values.shape[1]), dtype=values.dtype, device=values.device
        )
        if traced(values):
            _jagged_mean_fwd_op(v2, offsets, out)
        else:
            jagged_mean_fwd_launch(v2, offsets, out)
        ctx.save_for_backward(offsets)  # values themselves are not needed: d mean is 1 / n
        ctx.values_shape = values.shape
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        (offsets,) = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None
        dout2 = rows_view("jagged_mean", "dout", dout)  # copies an expanded (stride-0) gradient
        dvalues = empty(ctx.values_shape, dtype=dout.dtype, device=dout.device)
        if traced(dout):
            _jagged_mean_bwd_op(dout2, offsets, dvalues)
        else:
            jagged_mean_bwd_launch(dout2, offsets, dvalues)
        return dvalues, None


# --------------------------------------------------------------------------- public API


def _check_offsets(values: torch.Tensor, offsets: object) -> torch.Tensor:
    if not isinstance(offsets, torch.Tensor):
        raise TypeError(
            f"jagged_mean: argument 'offsets' must be a torch.Tensor, got {type(offsets).__name__}"
        )
    if offsets.dtype not in OFFSET_DTYPES:
        raise TypeError(
            "jagged_mean: argument 'offsets' must have dtype int32 or int64, "
            f"got {str(offsets.dtype).replace('torch.', '')}"
        )
    if offsets.dim() != 1 or offsets.shape[0] == 0:
        raise ValueError(
            "jagged_mean: argument 'offsets' must be 1-D with B + 1 >= 1 entries "
            f"([0, end of segment 0, ..., total]), got shape {tuple(offsets.shape)}"
        )
    check_same_device("jagged_mean", values=values, offsets=offsets)
    return offsets.contiguous()


def _validate_offsets_values(offsets: torch.Tensor, total: int) -> None:
    # One device->host sync for all three conditions; details only once something is wrong.
    bad = (offsets[0] != 0) | (offsets[-1] != total)
    if offsets.shape[0] > 1:
        bad = bad | (offsets[1:] < offsets[:-1]).any()
    if not bool(bad):
        return
    first, last = int(offsets[0]), int(offsets[-1])
    if first != 0:
        raise ValueError(f"jagged_mean: offsets[0] must be 0, got {first}")
    if last != total:
        raise ValueError(
            f"jagged_mean: offsets[-1] must equal the number of rows of values ({total}), "
            f"got {last}"
        )
    i = int((offsets[1:] < offsets[:-1]).nonzero()[0, 0])
    raise ValueError(
        f"jagged_mean: offsets must be non-decreasing, got offsets[{i}] = {int(offsets[i])} > "
        f"offsets[{i + 1}] = {int(offsets[i + 1])}"
    )


def jagged_mean(values: torch.Tensor, offsets: torch.Tensor, *, validate: bool = True):
    """Mean of each segment of rows: out[b] = values[offsets[b]:offsets[b + 1]].mean(0).

    Args:
        values: [total, D] float32/float16/bfloat16 on a CUDA GPU (CPU under
            TRITON_INTERPRET=1). Rows may be strided (a column slice of a wider tensor).
        offsets: [B + 1] int32/int64 on values' device: offsets[0] = 0, non-decreasing,
            offsets[B] = total. Segment b is rows offsets[b] .. offsets[b + 1] - 1. It gets no
            gradient.
        validate: check the offsets' values (first 0, last = total, non-decreasing). This reads
            them back to the host — one device sync per call, which also waits for queued
            work. Pass False in a hot loop once the offsets are known good; invalid offsets
            then read and write out of bounds. Skipped under torch.compile (no sync in a graph).
    Returns:
        [B, D] in values' dtype, accumulated in fp32; zeros for empty segments.
    """
    check_tensor("jagged_mean", "values", values)
    if values.dim() != 2:
        raise ValueError(
            f"jagged_mean: argument 'values' must be 2-D [total, D], got shape "
            f"{tuple(values.shape)}; flatten the feature dims first"
        )
    offsets = _check_offsets(values, offsets)
    if validate and not traced(values):
        _validate_offsets_values(offsets, values.shape[0])
    return _JaggedMeanFunction.apply(values, offsets)


class JaggedMean(torch.nn.Module):
    """Mean pooling over jagged segments: `forward(values, offsets)` (see `jagged_mean`)."""

    def __init__(self, *, validate: bool = True):
        super().__init__()
        self.validate = validate

    def forward(self, values: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return jagged_mean(values, offsets, validate=self.validate)

    def extra_repr(self) -> str:
        return f"validate={self.validate}"


# --------------------------------------------------------------------------- references


def jagged_mean_ref(
    values: torch.Tensor, offsets: torch.Tensor, *, validate: bool = True
) -> torch.Tensor:
    """fp32 reference (differentiable): a plain loop over segments, zeros for empty ones."""
    del validate  # checks only; the values are the same
    bounds = [int(o) for o in offsets.tolist()]  # any dtype (check_op hands it fp32)
    v = values.float()
    rows = [
        v[s:e].sum(0) / (e - s) if e > s else v.new_zeros(v.shape[1])
        for s, e in zip(bounds[:-1], bounds[1:], strict=True)
    ]
    return torch.stack(rows) if rows else v.new_zeros(0, v.shape[1])


def jagged_mean_loop(values: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """The per-segment Python loop people write (the `loop` provider): B launches, one sync."""
    bounds = offsets.tolist()
    rows = [
        values[s:e].mean(0) if e > s else values.new_zeros(values.shape[1])
        for s, e in zip(bounds[:-1], bounds[1:], strict=True)
    ]
    return torch.stack(rows) if rows else values.new_zeros(0, values.shape[1])


def jagged_mean_vectorized(values: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Vectorized PyTorch (the `torch` provider): segment ids, then an fp32 index_add_.

    No host sync and static shapes, so torch.compile takes it whole. Segment ids by
    searchsorted: row i belongs to the last segment b with offsets[b] <= i (right=True skips
    empty segments, which share their offset with the next one).
    """
    total, d = values.shape
    rows = torch.arange(total, device=values.device, dtype=offsets.dtype)
    seg = torch.searchsorted(offsets, rows, right=True) - 1  # [total]
    b = offsets.shape[0] - 1
    sums = values.new_zeros((b, d), dtype=torch.float32).index_add_(0, seg, values.float())
    counts = (offsets[1:] - offsets[:-1]).clamp(min=1).to(torch.float32)  # [B]
    return (sums / counts[:, None]).to(values.dtype)


def jagged_mean_segment_reduce(values: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """PyTorch's own segmented reduction (the `torch_segment_reduce` provider).

    `torch.segment_reduce(..., "mean", offsets=...)`: one kernel for all segments, accumulating
    in the input dtype. `initial=0` makes empty segments zero, as jagged_mean does.
    """
    return torch.segment_reduce(values, "mean", offsets=offsets, axis=0, initial=0.0)
