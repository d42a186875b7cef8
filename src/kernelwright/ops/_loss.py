"""The host side cross_entropy and fused_linear_cross_entropy share: argument checks, the
targets and the "mean" denominator on the device, and the reduction of the per-row losses.

Target values and `num_items_in_batch` are checked without a host sync where they live on a
CUDA device (`checked_targets`, `check_loss_values`): a target outside [0, V) that is not
`ignore_index` would otherwise give a NaN loss, and a zero denominator an infinite one. In an
eager call the check, the denominator and the sum of the rows are one small kernel each
(runtime/index_kernels.py).
"""

from __future__ import annotations

import torch

from kernelwright.runtime.checks import check_tensor
from kernelwright.runtime.index_kernels import sum_rows_launch, targets_launch
from kernelwright.runtime.launch import traced

REDUCTIONS = ("mean", "sum", "none")


def check_loss_args(
    op: str,
    V: int,
    target: torch.Tensor,
    n_rows: int,
    class_weight: torch.Tensor | None,
    reduction: str,
    label_smoothing: float,
    lse_square_scale: float,
    softcap: float | None,
    num_items_in_batch,
) -> None:
    """Validation shared with fused_linear_cross_entropy."""
    if not isinstance(target, torch.Tensor):
        raise TypeError(f"{op}: argument 'target' must be a torch.Tensor")
    if target.dtype not in (torch.int64, torch.int32):
        raise TypeError(
            f"{op}: argument 'target' must hold class indices as int64 or int32, "
            f"got {str(target.dtype).replace('torch.', '')}"
        )
    if target.numel() != n_rows:
        raise ValueError(
            f"{op}: argument 'target' must have one class index per row of logits "
            f"({n_rows}), got shape {tuple(target.shape)}"
        )
    if reduction not in REDUCTIONS:
        raise ValueError(f"{op}: reduction must be one of {REDUCTIONS}, got {reduction!r}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"{op}: label_smoothing must be in [0, 1], got {label_smoothing}")
    if lse_square_scale < 0.0:
        raise ValueError(f"{op}: lse_square_scale must be >= 0, got {lse_square_scale}")
    if softcap is not None and not softcap > 0.0:
        raise ValueError(f"{op}: softcap must be > 0 (or None), got {softcap}")
    if num_items_in_batch is not None and reduction != "mean":
        raise ValueError(
            f"{op}: num_items_in_batch replaces the denominator of reduction='mean'; "
            f"got reduction={reduction!r}"
        )
    if class_weight is not None:
        check_tensor(op, "weight", class_weight)
        if tuple(class_weight.shape) != (V,):
            raise ValueError(
                f"{op}: class weights must have shape ({V},) (one per class), "
                f"got {tuple(class_weight.shape)}"
            )


def checked_targets(
    op: str,
    target: torch.Tensor,
    class_weight: torch.Tensor | None,
    reduction: str,
    num_items_in_batch,
    ignore_index: int,
    V: int,
    device: torch.device,
):
    """The targets checked (`check_loss_values`), then (target [M] contiguous, fp32 weights,
    their sum, 1 / denominator or None) on `device`.

    The denominator of "mean" is computed on the device (no host sync): the count of
    non-ignored rows, their summed class weight, or `num_items_in_batch`. In an eager call
    without class weights or a tensor `num_items_in_batch` (the usual training step), one launch
    checks the targets and counts them (runtime/index_kernels.py); on a CUDA device its verdict
    is a device-side assert (no host sync), elsewhere a failed check falls back to
    `check_loss_values` for the error naming the target.
    """
    n = num_items_in_batch
    t = target.reshape(-1)
    if not t.is_contiguous():
        t = t.contiguous()
    if traced(target) or class_weight is not None or isinstance(n, torch.Tensor):
        check_loss_values(op, target, V, ignore_index, n)
        return (
            t,
            *_weights_and_denominator(t, class_weight, reduction, n, ignore_index, V, device),
        )
    if n is not None and not n > 0:
        check_loss_values(op, target, V, ignore_index, n)  # raises, naming num_items_in_batch
    ok = torch.empty((1,), dtype=torch.int32, device=device)
    mean = reduction == "mean"
    inv = torch.empty((1,), dtype=torch.float32, device=device) if mean else None
    targets_launch(t, ok, inv if mean else ok, V, ignore_index, n if mean else None, mean)
    if _on_device(ok):
        torch._assert_async(ok, _bad_target_message(op, V, ignore_index))
    elif not bool(ok):
        check_loss_values(op, target, V, ignore_index, None)  # raises, naming the target
    return t, None, None, inv


def _weights_and_denominator(t, class_weight, reduction, n, ignore_index, V, device):
    # fp32 class weights, their sum, 1 / the "mean" denominator (torch ops, on the device)
    w = wsum = None
    if class_weight is not None:
        w = class_weight.to(device=device, dtype=torch.float32).contiguous()
        wsum = w.sum().reshape(1)
    if reduction != "mean":
        return w, wsum, None
    if n is not None:
        if isinstance(n, torch.Tensor):
            denom = n.to(device=device, dtype=torch.float32).reshape(1)
        else:
            denom = torch.full((1,), float(n), device=device)
    else:
        valid = t != ignore_index
        if w is None:
            denom = valid.sum(dtype=torch.float32).reshape(1)
        else:
            # Out-of-range targets read class 0 here; their rows are NaN anyway.
            safe = torch.where(valid & (t >= 0) & (t < V), t, 0)
            denom = (w.gather(0, safe) * valid).sum().reshape(1)
    return w, wsum, 1.0 / denom


def reduce_rows(
    rows: torch.Tensor, reduction: str, inv: torch.Tensor | None, shape
) -> torch.Tensor:
    if reduction == "none":
        return rows.view(shape)
    if not traced(rows) and rows.dtype == torch.float32 and rows.is_contiguous():
        # the sum and the mean's scale in one launch
        out = torch.empty((), dtype=torch.float32, device=rows.device)
        sum_rows_launch(rows, inv if reduction == "mean" else None, out)
        return out
    total = rows.sum()
    return total * inv.reshape(()) if reduction == "mean" else total


def _bad_target_message(op: str, V: int, ignore_index: int) -> str:
    return (
        f"{op}: a target is outside [0, {V}) (V = {V} classes) and is not "
        f"ignore_index ({ignore_index})"
    )


def _on_device(t: torch.Tensor) -> bool:
    """Whether a check of `t`'s values must not read them back: a CUDA tensor (a host sync
    would stall the launch queue), or a graph being compiled (no data-dependent branch)."""
    return t.device.type == "cuda" or traced(t)


def check_loss_values(
    op: str, target: torch.Tensor, V: int, ignore_index: int, num_items_in_batch
) -> None:
    """Every target is a class index in [0, V) or `ignore_index`, and `num_items_in_batch`
    (when given) is positive.

    On a CUDA device (and under torch.compile) these are device-side asserts
    (`torch._assert_async`): no host sync, and the run stops with the message at its next
    sync, as PyTorch's own cross-entropy does on a GPU. The target check costs one pass over
    the targets (8 bytes a token, against the 2 * V bytes a token the loss reads and writes
    at least) and a few small launches. Elsewhere (CPU, the interpreter) a ValueError names the
    first bad target, its position, V and `ignore_index`.
    """
    ok = ((target >= 0) & (target < V)) | (target == ignore_index)
    if _on_device(target):
        torch._assert_async(ok.all(), _bad_target_message(op, V, ignore_index))
    elif not bool(ok.all()):
        i = int((~ok).reshape(-1).nonzero()[0, 0])
        pos = [str(int(p)) for p in torch.unravel_index(torch.tensor(i), target.shape)]
        where = f"target[{', '.join(pos)}]" if pos else "target"
        raise ValueError(
            f"{op}: {where} = {int(target.reshape(-1)[i])} is not a "
            f"class index: targets must lie in [0, V) with V = {V} classes, or equal "
            f"ignore_index ({ignore_index})"
        )
    if num_items_in_batch is None:
        return
    n = num_items_in_batch
    if not isinstance(n, torch.Tensor):
        if not n > 0:
            raise ValueError(
                f"{op}: num_items_in_batch must be > 0 (the mean's denominator), got {n}"
            )
        return
    if n.numel() != 1:
        raise ValueError(
            f"{op}: num_items_in_batch must be one number, got a tensor of shape {tuple(n.shape)}"
        )
    if _on_device(n):
        torch._assert_async(
            n.reshape(()) > 0, f"{op}: num_items_in_batch must be > 0 (the mean's denominator)"
        )
    elif not bool(n.reshape(()) > 0):
        raise ValueError(
            f"{op}: num_items_in_batch must be > 0 (the mean's denominator), got {n.item()}"
        )
