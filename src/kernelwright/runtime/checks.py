"""Input validation shared by the ops: clear errors instead of Triton compile traces."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kernelwright.runtime.device import interpreter_mode
from kernelwright.runtime.index_kernels import flag_launch, targets_launch
from kernelwright.runtime.launch import traced

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _dtype_names(dtypes: Sequence[torch.dtype]) -> str:
    return ", ".join(str(d).replace("torch.", "") for d in dtypes)


def check_tensor(
    op: str,
    name: str,
    t: object,
    *,
    dtypes: Sequence[torch.dtype] = FLOAT_DTYPES,
    min_dim: int = 1,
) -> torch.Tensor:
    """Check that `t` is a tensor the kernels can read: a float dtype, on a usable device."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: argument '{name}' must be a torch.Tensor, got {type(t).__name__}")
    dtype, device_type = t.dtype, t.device.type
    if device_type == "cuda" and dtype in dtypes and t.dim() >= min_dim and not interpreter_mode():
        return t  # the common call, answered with the fewest tensor queries
    if dtype not in dtypes:
        raise TypeError(
            f"{op}: argument '{name}' must have dtype in ({_dtype_names(dtypes)}), "
            f"got {str(t.dtype).replace('torch.', '')}"
        )
    if t.dim() < min_dim:
        raise ValueError(
            f"{op}: argument '{name}' must have at least {min_dim} dimension(s), "
            f"got shape {tuple(t.shape)}"
        )
    if t.device.type == "cuda":
        if interpreter_mode():
            raise RuntimeError(
                f"{op}: argument '{name}' is on {t.device} but TRITON_INTERPRET=1 is set; "
                "the interpreter runs on CPU tensors. Unset TRITON_INTERPRET to use the GPU."
            )
    elif t.device.type == "cpu":
        if not interpreter_mode():
            raise RuntimeError(
                f"{op}: argument '{name}' is on the CPU; kernelwright kernels run on a CUDA GPU, "
                "or on CPU tensors only through Triton's interpreter (TRITON_INTERPRET=1)."
            )
    else:
        raise RuntimeError(
            f"{op}: argument '{name}' is on {t.device}; expected a CUDA tensor"
            " (or a CPU tensor under TRITON_INTERPRET=1)."
        )
    return t


def check_in_place(op: str, name: str, t: torch.Tensor) -> None:
    """Refuse an in-place write over a leaf that requires grad (a parameter, an input) or a view
    of one, as PyTorch does: its values would be lost to what the kernel writes."""
    leaves = [u for u in (t, t._base) if u is not None and u.is_leaf and u.requires_grad]
    if leaves:
        view = "" if leaves[0] is t else "a view of "
        raise RuntimeError(
            f"{op}: in_place=True would write over '{name}', {view}a leaf tensor that requires "
            "grad (its values would be lost). Pass the output of a layer, or in_place=False."
        )


def check_same_device(op: str, **tensors: torch.Tensor | None) -> None:
    items = [(k, v) for k, v in tensors.items() if v is not None]
    first_name, first = items[0]
    for name, t in items[1:]:
        if t.device != first.device:
            raise RuntimeError(
                f"{op}: argument '{name}' is on {t.device} but '{first_name}' is on {first.device}"
            )


def check_shape(op: str, name: str, t: torch.Tensor, expected: Sequence[int], why: str) -> None:
    if tuple(t.shape) != tuple(expected):
        raise ValueError(
            f"{op}: argument '{name}' must have shape {tuple(expected)} ({why}), "
            f"got {tuple(t.shape)}"
        )


def rows_view(op: str, name: str, t: torch.Tensor) -> torch.Tensor:
    """`t` as a 2-D [rows, n] view whose last dimension is contiguous (copying only if needed).

    Leading dimensions of any rank fold into rows; a row stride other than n (a slice of a
    wider tensor) is kept and passed to the kernel instead of copying.
    """
    n = t.shape[-1]
    if t.dim() == 2 and t.stride(1) == 1 and t.shape[0] > 1:
        return t  # already [rows, n] with contiguous rows: the common call, kept cheap
    if n and t.is_contiguous():
        return t.view(-1, n)
    if t.stride(-1) != 1:
        t = t.contiguous()
    rows = 1
    for s in t.shape[:-1]:
        rows *= s
    t2 = t.reshape(rows, n)  # not reshape(-1, n): ambiguous when n == 0
    if t2.dim() == 2 and t2.shape[0] > 1 and t2.stride(1) != 1:
        t2 = t2.contiguous()
    return t2


def check_index_range(op: str, name: str, t: torch.Tensor, n: int) -> None:
    """Every value of the index tensor `t` lies in [0, n): a class index of a row of n columns.

    On a CUDA device (and under torch.compile) a device-side assert (`torch._assert_async`: no
    host sync, the run stops with the message at its next sync), as the library's
    cross_entropy checks its targets; elsewhere (CPU, the interpreter) a ValueError naming the
    first bad index and its position.
    """
    if traced(t) or t.dtype not in (torch.int64, torch.int32):
        ok = ((t >= 0) & (t < n)).all()
    else:  # eager: one launch checks every index (runtime/index_kernels.py)
        flat = t.reshape(-1)
        if not flat.is_contiguous():
            flat = flat.contiguous()
        ok = torch.empty((1,), dtype=torch.int32, device=t.device)
        targets_launch(flat, ok, ok, n, None, None, False)
    if t.device.type == "cuda" or traced(t):
        torch._assert_async(ok, f"{op}: an index in '{name}' is outside [0, {n})")
    elif not bool(ok):
        ok = (t >= 0) & (t < n)
        i = int((~ok).reshape(-1).nonzero()[0, 0])
        pos = [str(int(p)) for p in torch.unravel_index(torch.tensor(i), t.shape)]
        where = f"{name}[{', '.join(pos)}]" if pos else name
        raise ValueError(
            f"{op}: {where} = {int(t.reshape(-1)[i])} is outside [0, {n}): an index into a row "
            f"of {n} columns"
        )


_FLAGS: dict[torch.device, torch.Tensor] = {}


def index_flag(device: torch.device) -> torch.Tensor:
    """The device's index flag, an int32 [1] that is 0 between launches: a kernel that reads an
    index input sets it at an index outside the index's range, instead of a separate pass over
    the index before the launch; `check_index_flag` then asserts on it and resets it."""
    flag = _FLAGS.get(device)
    if flag is None:
        flag = _FLAGS[device] = torch.zeros((1,), dtype=torch.int32, device=device)
    return flag


def check_index_flag(flag: torch.Tensor, op: str, name: str, n: int) -> None:
    """After a kernel that set `flag` (from `index_flag`) at an index outside [0, n): on a CUDA
    device one launch reads it, resets it and stops the run with a device-side assert naming
    `op` and `name` (no host sync, as `check_index_range`); elsewhere (the interpreter) a set
    flag is reset and raises ValueError."""
    msg = f"{op}: an index in '{name}' is outside [0, {n})"
    if flag.device.type == "cuda":
        flag_launch(flag, msg)
    elif int(flag[0]):
        flag.zero_()
        raise ValueError(msg)


def check_chunk_size(op: str, chunk_size: int | None) -> None:
    """Tokens per chunk: None (chosen from the sizes) or an int >= 1."""
    ok = chunk_size is None or (
        isinstance(chunk_size, int) and not isinstance(chunk_size, bool) and chunk_size >= 1
    )
    if not ok:
        raise ValueError(f"{op}: chunk_size must be None (chosen from the sizes) or an int >= 1, "
                         f"got {chunk_size!r}")  # fmt: skip
