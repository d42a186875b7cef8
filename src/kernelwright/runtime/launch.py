"""Launch-config tables: launch parameters as data, keyed by architecture and shape regime.

Each op keeps its tables in `kernelwright/runtime/tables/<op>.py`: for every kernel, a list of
rows `(max_n, LaunchConfig)` per architecture, sorted by `max_n`. The first row whose `max_n`
is at least the row length wins. Kernels never choose their own block sizes, so the optimize
workflow can retune an op by rewriting its table alone.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

import torch

from kernelwright.runtime.device import DeviceInfo


def cdiv(a: int, b: int) -> int:
    """Ceiling division of host ints (triton.cdiv is a constexpr function: slower per call).
    A `tl.constexpr` (a table value shared with the kernels) counts as its value."""
    return -(-getattr(a, "value", a) // getattr(b, "value", b))


def next_pow2(n: int) -> int:
    """The smallest power of two >= n (at least 1), for host ints (or a `tl.constexpr`)."""
    n = getattr(n, "value", n)
    return 1 << (n - 1).bit_length() if n > 1 else 1


_EAGER_TYPES = (torch.Tensor, torch.nn.Parameter)


def traced(t: torch.Tensor) -> bool:
    """Whether `t` belongs to a graph being traced rather than to an eager call: Dynamo is
    tracing, or `t` is a fake or functional tensor (the AOT tracing Inductor runs on a graph a
    backend such as kernelwright.compile hands on). Launches must then go through the
    registered custom ops: a traced tensor has no data for Triton to read."""
    return torch.compiler.is_compiling() or type(t) not in _EAGER_TYPES


def broadcast_shape(shapes) -> torch.Size:
    """torch.broadcast_shapes for an eager call's concrete shapes, in plain ints: the torch
    function checks each size symbolically, host work on every call of an op. While a graph is
    traced the torch function runs, since sizes may be symbolic."""
    shapes = list(shapes)
    if torch.compiler.is_compiling():
        return torch.broadcast_shapes(*shapes)
    first = shapes[0]
    if all(s == first for s in shapes):
        return torch.Size(first)
    out = [1] * max(len(s) for s in shapes)
    for s in shapes:
        for i, d in enumerate(s, len(out) - len(s)):
            if d != 1 and d != out[i]:
                if out[i] != 1:
                    raise RuntimeError(
                        f"shapes {[tuple(s) for s in shapes]} do not broadcast: size {d} "
                        f"against {out[i]} at dim {i}"
                    )
                out[i] = d
    return torch.Size(out)


class PlanCache(dict):
    """Launch plans (grid, integer arguments, constexprs) memoized by a key of everything they
    are derived from: the call's sizes, strides, dtypes, device and options. A hit costs one
    dict lookup instead of the table lookups and arithmetic of building the plan again, which
    matters in a training loop where the launch itself is host-bound. Bounded: cleared when
    full (shapes that vary every call, such as sequence lengths, would otherwise grow it)."""

    def __init__(self, limit: int = 4096):
        super().__init__()
        self.limit = limit

    def put(self, key, plan):
        if len(self) >= self.limit:
            self.clear()
        self[key] = plan
        return plan

    # Plans read from a launch table: kept with the rows they were read from, and used only
    # while the table still serves those very rows (the optimize workflow measures a variant
    # by swapping `table[kernel][arch]` in place; a test may do the same).

    def get_for(self, key, table: Table, kernel: str):
        """The plan `put_for` kept under `key`, or None: none kept, or `table[kernel]` no
        longer serves the rows it was built from."""
        hit = self.get(key)
        if hit is not None and table_rows(table, kernel, hit[1]) is hit[0]:
            return hit[2]
        return None

    def put_for(self, key, table: Table, kernel: str, arch: str, plan):
        """Keep `plan`, built from `table[kernel]`'s rows for `arch`, under `key`."""
        self.put(key, (table_rows(table, kernel, arch), arch, plan))
        return plan


@dataclass(frozen=True)
class LaunchConfig:
    block_n: int  # columns one program handles per step (a power of two)
    num_warps: int = 4
    rows: int = 1  # rows one program handles per step
    num_stages: int = 1
    programs_per_sm: int = 1  # persistent kernels launch sm_count * programs_per_sm programs
    # Two-pass (looped) row kernels only, ignored elsewhere: keep the row in L2 between the
    # statistics pass and the write pass. `evict_hints`: the first read is marked evict_last,
    # the second read and the stores evict_first. `reverse_pass`: the second pass walks the
    # row from its end, so it starts on the chunks read last (the likeliest still in L2).
    evict_hints: bool = False
    reverse_pass: bool = False
    # Row kernels with a split form (softmax): a row wider than `block_n` is split over
    # cdiv(n, block_n) programs that each hold one chunk and wait for each other's statistics
    # (ops/_split.py: one read of the row) instead of one program reading it twice.
    split_row: bool = False
    # Split rows with the exchange in their output only: each program prefetches its row's
    # counter line into L2 after its loads (ops/_split.py), so its first count does not wait on
    # DRAM. A choice per kernel: it pays where the count would otherwise miss L2.
    split_prefetch: bool = False

    def with_(self, **changes) -> LaunchConfig:
        return replace(self, **changes)


def two_pass_flags(cfg: LaunchConfig, reuse: bool = True) -> dict[str, object]:
    """The constexprs of a two-pass row kernel for `cfg`'s L2 fields: the eviction policy of
    the first read (`EVICT_1ST`), of the second read and the stores (`EVICT_2ND`), and the
    second pass's direction (`REVERSE`). `reuse=False` (no second pass in this launch): no
    evict_last on the first read, which would only crowd L2."""
    hints = cfg.evict_hints
    return {
        "EVICT_1ST": "evict_last" if hints and reuse else "",
        "EVICT_2ND": "evict_first" if hints else "",
        "REVERSE": cfg.reverse_pass,
    }


def use_pdl(device: DeviceInfo) -> bool:
    """Whether a kernel that consumes the previous kernel's output may be launched with
    programmatic dependent launch (PDL, sm_90 and later): the GPU stages its launch while the
    previous kernel drains, and the kernel's `griddepcontrol.wait` holds its loads until that
    kernel has finished and its writes are visible. `KERNELWRIGHT_PDL=0` turns it off. Not on
    ROCm, whose GPUs also report a "cuda" device (an MI300's capability reads 9.4)."""
    if os.environ.get("KERNELWRIGHT_PDL", "1") == "0" or torch.version.hip is not None:
        return False
    capability = device.capability or (0, 0)
    return device.backend == "cuda" and capability >= (9, 0)


def pdl_args(device: DeviceInfo) -> dict[str, object]:
    """Call arguments of a kernel with a `GDC_WAIT` constexpr (ops/_pdl.py) on `device`: the
    wait, and `launch_pdl=True` with it, where `use_pdl` allows; otherwise neither."""
    on = use_pdl(device)
    return {"GDC_WAIT": True, "launch_pdl": True} if on else {"GDC_WAIT": False}


Row = tuple[int, LaunchConfig]
# Tables: {kernel name: {arch: [rows]}}. "default" serves any architecture not listed.
Table = dict[str, dict[str, list[Row]]]
# Few-rows overrides, beside a table: {kernel: {arch: [(max_m, max_n, cfg)]}}. A row replaces the
# table's row whose bound is `max_n` when the call has at most `max_m` rows (a table's rows are
# sized for calls with many rows; with few, another split of the work uses the SMs better). Kept
# out of TABLE, which the optimize workflow retunes and models as serving every shape.
FewRows = dict[str, dict[str, list[tuple[int, int, LaunchConfig]]]]


def table_rows(table: Table, kernel: str, arch: str) -> list[Row]:
    """The rows `lookup` uses for `kernel` on `arch`: its own entry, else "default"."""
    per_arch = table[kernel]
    return per_arch.get(arch) or per_arch["default"]


def lookup(
    table: Table,
    op: str,
    kernel: str,
    device: DeviceInfo,
    n: int,
    m: int | None = None,
    few_rows: FewRows | None = None,
) -> LaunchConfig:
    """The launch config for `kernel` of `op` at row length `n` on `device`; with `m` (the row
    count) and `few_rows`, a few-rows override of that row where one applies."""
    per_arch = table[kernel]
    arch = device.arch if device.arch in per_arch else "default"
    rows = table_rows(table, kernel, arch)
    for max_n, cfg in rows:
        if n <= max_n:
            overrides = (few_rows or {}).get(kernel, {}).get(arch, [])
            for max_m, regime, small in overrides:
                if m is not None and regime == max_n and m <= max_m:
                    return small
            return cfg
    raise ValueError(
        f"{op}: no launch config for kernel '{kernel}' at row length {n} on {device.arch}; "
        f"the table ends at {rows[-1][0]}. Extend kernelwright/runtime/tables/{op}.py."
    )
