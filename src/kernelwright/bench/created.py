"""Benchmark specs of created ops: the generated kernel against a reference, shaped by the
profile's inputs and layout.

A created op (from `kernelwright create`) declares its benchmark as data — inputs and how they
broadcast, outputs, the [rows, cols] sweep, the layout of its row — in its generated module
(`BENCH`); `spec_of(entry)` turns that into a `BenchSpec`, so `kernelwright bench` and
`kernelwright optimize` measure a created op as they do the library's. The create workflow's
own benchmark (the user's reference, eager and compiled) uses `make_spec` too.

Shapes are the kernel's [rows, cols] view: a full-size input is [rows, cols], a per-row one
[rows, 1], a per-feature one [cols] (with the reference's leading singleton dims), a scalar
keeps the reference's shape. A kernel whose row is several dims, or not the last one (a norm
over channels, a loss over every dim), runs at the traced rank instead (`Layout`): the rows go
into the first kept dim, the row's length into the last reduced dim.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from kernelwright import registry
from kernelwright.bench.specs.base import BenchSpec, Provider, Sweep, compiled
from kernelwright.bench.specs.base import call as caller

# quick runs (the create workflow's default on a GPU): the reference sweep's default token
# count and its largest one, at the profile's column count
QUICK_ROWS = (8192, 32768)
LONG_ROW, LONG_ROW_COUNT = 393216, 1024  # 768 MiB in bf16


@dataclass(frozen=True)
class BenchInput:
    name: str
    broadcast: str  # "full" | "row" | "col" | "scalar"
    example_shape: tuple[int, ...]
    requires_grad: bool
    dtype: str = "same"  # "same" (the benchmark dtype) | "fp32" | "int" (a column index)
    parts: int = 1  # read in this many equal parts of its last dim (each a [rows, cols] view)


@dataclass(frozen=True)
class Layout:
    """The kernel's row in the reference's tensors: the traced shape of the main input, the
    reduced dims (non-negative; the last dim alone for element-wise and last-dim kernels) and
    each output's kind ("full", "row" one value per row, "row1" the same kept as size 1)."""

    traced: tuple[int, ...]
    block: tuple[int, ...]
    out_kinds: tuple[str, ...] = ("full",)
    long_rows: bool = False  # a row kernel that runs rows longer than one program holds
    float_outs: tuple[int, ...] | None = None  # the outputs a backward runs through (not indices)

    @property
    def classic(self) -> bool:
        return self.block == (len(self.traced) - 1,)

    def full(self, rows: int, cols: int) -> tuple[int, ...]:
        if self.classic:
            return (rows, cols)
        shape = list(self.traced)
        kept = [d for d in range(len(shape)) if d not in self.block]
        if kept:  # the rows into the first kept dim
            shape[kept[0]] = max(1, rows // math.prod(shape[d] for d in kept[1:]))
        else:  # every dim is reduced (a loss): one row of rows * cols elements
            cols = rows * cols
        shape[self.block[-1]] = max(1, cols // math.prod(shape[d] for d in self.block[:-1]))
        return tuple(shape)

    def row_len(self, full: Sequence[int]) -> int:
        return full[-1] if self.classic else math.prod(full[d] for d in self.block)


def input_shape(
    spec: BenchInput, rows: int, cols: int, layout: Layout | None = None
) -> tuple[int, ...]:
    ex = spec.example_shape
    if layout is None or layout.classic:
        if spec.broadcast == "full":
            return (rows, cols * spec.parts)
        if spec.broadcast == "row":  # [rows, 1], or [rows] when traced without the row's dim
            dropped = layout is not None and len(ex) == len(layout.traced) - 1
            return (rows,) if dropped else (rows, 1)
        if spec.broadcast == "col":
            return (1,) * max(len(ex) - 1, 0) + (cols,)
        return ex  # scalar: () or all ones
    full = layout.full(rows, cols)
    if spec.broadcast == "full":
        return full
    if spec.broadcast in ("row", "col"):  # 1 on the other dims, at the traced rank
        kept = spec.broadcast == "row"
        size = tuple(1 if (d in layout.block) == kept else s for d, s in enumerate(full))
        return size[len(size) - len(ex) :]
    return ex


def _sweeps(points: Sequence[dict[str, int]]) -> tuple[Sweep, ...]:
    """The profile's [rows, cols] points as harness sweeps: one per fixed column count (rows
    vary) and one per fixed row count for the points left (columns vary)."""
    by_cols: dict[int, list[int]] = {}
    for p in points:
        by_cols.setdefault(p["cols"], []).append(p["rows"])
    sweeps, rest = [], []
    for cols, rows in by_cols.items():
        if len(rows) > 1:
            sweeps.append(Sweep("rows", tuple(rows), {"cols": cols}))
        else:
            rest.append({"rows": rows[0], "cols": cols})
    by_rows: dict[int, list[int]] = {}
    for p in rest:
        by_rows.setdefault(p["rows"], []).append(p["cols"])
    sweeps += [Sweep("cols", tuple(c), {"rows": r}) for r, c in by_rows.items()]
    return tuple(sweeps)


def _quick(points: Sequence[dict[str, int]], long_rows: bool = False) -> tuple[Sweep, ...]:
    cols = max(set(p["cols"] for p in points), key=lambda c: sum(q["cols"] == c for q in points))
    sweeps = (Sweep("rows", QUICK_ROWS, {"cols": cols}),)
    if long_rows:  # rows of 393,216 columns (a long-context softmax): the looped kernels
        sweeps += (Sweep("cols", (LONG_ROW,), {"rows": LONG_ROW_COUNT}),)
    return sweeps


def make_spec(
    name: str,
    fn: Callable[..., object],
    reference: Callable[..., object] | None,
    inputs: Sequence[BenchInput],
    n_outputs: int,
    points: Sequence[dict[str, int]],
    *,
    reference_error: str = "",
    layout: Layout | None = None,
    module: str | None = None,
    function: str | None = None,
) -> BenchSpec:
    """A harness spec for the generated `fn` against `reference` (the user's code). With
    `module`, the kernel is looked up there as `function` when a provider is built."""
    names = tuple(i.name for i in inputs)
    kinds = layout.out_kinds if layout is not None else ("full",) * n_outputs

    def make_inputs(shape, dtype, device, *, seed: int = 0):
        gen = torch.Generator(device=device).manual_seed(seed)
        out = {}
        full = layout.full(shape["rows"], shape["cols"]) if layout else None
        for i in inputs:
            dt = torch.float32 if i.dtype == "fp32" else dtype
            s = input_shape(i, shape["rows"], shape["cols"], layout)
            if i.dtype == "int":  # a column of the row
                n = layout.row_len(full) if layout else shape["cols"]
                out[i.name] = torch.randint(0, n, s, device=device, generator=gen)
                continue
            out[i.name] = torch.randn(s, dtype=dt, device=device, generator=gen)
        return out

    def nbytes(shape, dtype, mode: str) -> int:
        # minimal traffic: the forward reads every input once and writes every output once;
        # the backward reads the inputs (recomputing intermediates), reads dy per output and
        # writes one gradient per differentiable input. full = both.
        rows, cols = shape["rows"], shape["cols"]
        size = torch.empty((), dtype=dtype).element_size()
        ins = [math.prod(input_shape(i, rows, cols, layout)) * (8 if i.dtype == "int" else size)
               for i in inputs]  # fmt: skip
        full = math.prod(layout.full(rows, cols)) if layout else rows * cols
        per_row = full // (layout.row_len(layout.full(rows, cols)) if layout else cols)
        out = sum((full if k == "full" else per_row) * size for k in kinds)
        fwd = sum(ins) + out
        bwd = sum(ins) + out + sum(b for b, i in zip(ins, inputs, strict=True) if i.requires_grad)
        return {"forward": fwd, "backward": bwd, "full": fwd + bwd}[mode]

    def call_fn(f: Callable[..., object]):
        def build(inp):
            a = tuple(inp[n] for n in names)
            return lambda: f(*a)

        return build

    def missing(inp):
        raise RuntimeError(f"the reference could not be loaded: {reference_error}")

    ours = caller(module, function, names) if module else call_fn(fn)
    providers = [Provider("kernelwright", ours)]
    if reference is not None:
        providers += [
            Provider("torch", call_fn(reference)),
            Provider("torch_compile", call_fn(compiled(reference)), compiled=True),
        ]
    else:
        providers += [Provider("torch", missing), Provider("torch_compile", missing)]
    tiny = (Sweep("rows", (4, 9), {"cols": 96}),)
    return BenchSpec(
        op=name,
        dims=("rows", "cols"),
        providers=tuple(providers),
        make_inputs=make_inputs,
        grad_inputs=tuple(i.name for i in inputs if i.requires_grad),
        bytes=nbytes,
        sweeps=_sweeps(points),
        quick_sweeps=_quick(points, layout is not None and layout.long_rows),
        interpreter_sweeps=tiny,
        backward_through=(
            layout.float_outs
            if layout and layout.float_outs is not None
            else tuple(range(n_outputs))
        ),  # fmt: skip
        notes={
            "torch": "the reference from the profile's source, eager, in the benchmark dtype",
            "torch_compile": "the same reference under torch.compile (static shapes)",
        },
    )


def spec_of(entry: registry.OpEntry) -> BenchSpec:
    """The benchmark of a created op, from the `BENCH` data its generated module declares:
    the kernel against the profile's traced reference (`<op>_ref`, eager), both on the
    benchmark dtype's inputs."""
    mod = entry.load()
    data = getattr(mod, "BENCH", None)
    if not isinstance(data, dict):
        raise registry.UnknownOpError(
            f"{entry.name}: its module declares no BENCH (created before ops carried their "
            "benchmark); regenerate it with `kernelwright create --from-profile`"
        )
    inputs = [BenchInput(*i) for i in data["inputs"]]
    return make_spec(
        entry.name,
        getattr(mod, entry.function),
        getattr(mod, entry.reference),
        inputs,
        data["n_outputs"],
        data["sweep"],
        layout=Layout(*data["layout"]),
        module=entry.module,
        function=entry.function,
    )
