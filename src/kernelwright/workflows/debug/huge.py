"""The `huge` shape regime: the largest input past 2^31 elements (shapes.py says which tensor
per family), where an offset computed in int32 wraps.

Where it runs: on a CUDA device with the memory it needs free. Elsewhere its probe is "not
tried" and says why (Triton's interpreter runs every program instance one after another, far
too slow for 2^31 elements; a GPU short of memory). The need is estimated without making the
inputs: the inputs maker and the reference run at 1 and 2 rows of the regime's shape on the
CPU, and every tensor's size is extrapolated linearly to the regime's row count (the makers'
tensors are each per-row or fixed). Estimated: the inputs, the op's outputs, the output
gradients and the input gradients in the probe's dtype, plus the reference's share: a few
GiB of chunk scratch when it runs in chunks (below), else fp32 copies of the inputs and
outputs, their gradients and an intermediate each.

How it compares: a maker whose rows are independent (every one but `jagged`, whose rows are
tied into segments) and an op whose outputs are all per-row (their first dim is the row count;
not a mean loss) is taken to compute row by row. The op then runs on the whole input and the
reference on chunks of rows (`numerics.compare(..., rows=...)`): every row is compared, the
outputs and the row inputs' gradients slice by slice, the other inputs' gradients (a weight's)
summed over the chunks. Otherwise the whole fp32 reference runs, if the estimate fits.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from pathlib import Path

import torch

from kernelwright.workflows.debug import shapes as S

GIB = 2**30
# makers of kernelwright.testing.cases whose rows are independent (a created op's BENCH maker
# is, too: debug takes created ops over the last dim or elementwise)
ROW_WISE = ("x", "x_weight", "x_residual_weight", "x_weight_bias", "gate_up", "gate_up_fused",
            "rope", "logits_target", "hidden_weight_target")  # fmt: skip
CHUNK_SCRATCH = 3 * GIB  # the reference's share when it runs in chunks of 2^26 elements
HOST_FACTOR = 3  # the makers draw in fp32 on the CPU, then cast and shift zeros: 3 copies
INTERPRETER = (
    "the interpreter cannot run 2^31 elements in reasonable time (it runs every program "
    "instance one after another on the CPU, milliseconds each)"
)


@dataclass(frozen=True)
class Plan:
    """What a huge probe of one case costs and how it compares."""

    rows: tuple[str, ...]  # inputs split into chunks of rows (empty: the whole reference)
    largest: int  # elements of the largest input
    device_bytes: int  # estimated peak on the device
    host_bytes: int  # to make the inputs on the CPU

    @property
    def chunked(self) -> bool:
        return bool(self.rows)


def row_wise(inputs: str) -> bool:
    """Whether the rows of this inputs maker ("module:attr" or "bench:module") are independent."""
    if inputs.startswith("bench:"):
        return True
    module, _, name = inputs.partition(":")
    return module == "kernelwright.testing.cases" and name in ROW_WISE


def _tensors(x) -> list[torch.Tensor]:
    pieces = list(x) if isinstance(x, (tuple, list)) else [x]
    return [p for p in pieces if isinstance(p, torch.Tensor)]


def _fp32(inputs: dict, wanted) -> dict:
    return {
        k: v.detach().float().requires_grad_(k in wanted)
        if isinstance(v, torch.Tensor) and v.is_floating_point()
        else v
        for k, v in inputs.items()
    }


def plan(maker, ref, kwargs, inputs_spec, grad_inputs, shape, dtype, seed) -> Plan:
    """The huge probe of `shape` (in the maker's convention, its first dim the row count) for
    one case: made and run at 1 and 2 rows on the CPU, extrapolated to shape[0] rows."""
    n = int(shape[0])
    cpu = torch.device("cpu")
    small = [maker((k, *shape[1:]), dtype, cpu, seed) for k in (1, 2)]
    item = torch.empty((), dtype=dtype).element_size()

    def grow(a: torch.Tensor, b: torch.Tensor) -> tuple[int, bool]:
        # (elements at n rows, whether the tensor is per-row)
        per_row = b.numel() == 2 * a.numel() and b.dim() >= 1 and b.shape[0] == 2
        return (a.numel() + (n - 1) * (b.numel() - a.numel()), per_row)

    in_bytes = grad_bytes = largest = 0
    rows: list[str] = []
    floats = [k for k, v in small[0].items() if isinstance(v, torch.Tensor)
              and v.is_floating_point()]  # fmt: skip
    wanted = floats if grad_inputs is None else [k for k in grad_inputs if k in floats]
    for name, a in small[0].items():
        if not isinstance(a, torch.Tensor):
            continue
        elements, per_row = grow(a, small[1][name])
        largest = max(largest, elements)
        in_bytes += elements * a.element_size()
        if name in wanted:
            grad_bytes += elements * a.element_size()
        if per_row:
            rows.append(name)
    out_bytes, outputs_per_row = 0, True
    try:
        with torch.no_grad():
            outs = [_tensors(ref(**_fp32(s, ()), **kwargs)) for s in small]
    except Exception:  # noqa: BLE001  the reference refuses 1 row: no telling, no chunks
        outs, outputs_per_row = None, False
    if outs is not None:
        for a, b in zip(*outs, strict=False):
            elements, per_row = grow(a, b)
            outputs_per_row &= per_row
            out_bytes += elements * (item if a.is_floating_point() else a.element_size())
    chunked = bool(rows) and outputs_per_row and row_wise(inputs_spec)
    if not out_bytes:  # the reference's outputs unknown: as large as the inputs
        out_bytes = in_bytes
    op = in_bytes + 2 * out_bytes + grad_bytes  # inputs, outputs, dy, input gradients
    # the reference's share: chunk scratch, or fp32 copies of the inputs and outputs, their
    # gradients and an intermediate each
    reference = CHUNK_SCRATCH if chunked else 4 * (in_bytes + out_bytes) * 4 // item
    device_bytes = int((op + reference) * 1.1) + GIB
    host_bytes = HOST_FACTOR * (in_bytes * 4 // item)
    return Plan(tuple(rows) if chunked else (), largest, device_bytes, host_bytes)


def _host_free() -> int | None:
    meminfo = Path("/proc/meminfo")
    if not meminfo.is_file():
        return None
    for line in meminfo.read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


def gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


def free_device_memory(device: torch.device) -> int:
    """Free bytes on a CUDA device once this process's cached blocks are given back."""
    gc.collect()
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info(device)
    return free


def not_tried(plan: Plan, device: torch.device, interpreter: bool) -> str:
    """Why the huge probe cannot run here ("" when it can)."""
    need = f"needs a CUDA device with >= {gib(plan.device_bytes)} free"
    elements = f"{plan.largest:,} elements ({plan.largest / S.HUGE:.2f} x 2^31)"
    if device.type != "cuda" or interpreter:
        return f"{elements} {need}; {INTERPRETER}"
    free = free_device_memory(device)
    if free < plan.device_bytes:
        name = torch.cuda.get_device_name(device)
        return f"{elements} {need} ({gib(free)} free on {name})"
    host = _host_free()
    if host is not None and host < plan.host_bytes:
        return (
            f"{elements} needs {gib(plan.host_bytes)} of host memory to make the "
            f"inputs ({gib(host)} available)"
        )
    return ""


def describe(plan: Plan) -> str:
    how = (
        f"the reference on chunks of rows (inputs {', '.join(plan.rows)}), every row compared"
        if plan.chunked
        else "the whole fp32 reference"
    )
    return f"{plan.largest:,} elements; {how}; estimated {gib(plan.device_bytes)}"


def out_of_memory(plan: Plan, e: BaseException) -> str:
    first = str(e).splitlines()[0] if str(e) else type(e).__name__
    return f"ran out of device memory (estimated {gib(plan.device_bytes)}): {first}"
