"""Measurements for the optimize workflow: benchmark points through the bench harness, and the
smoke test (correctness against the op's fp32 reference) every variant must pass.

`Bench` times the op's "kernelwright" provider (and PyTorch once, for the report) at the run's
points. On a GPU it is the harness's `measure` with a CUDA-event timer; in a dry run the timer
is a `FakeClock` and every row is marked `timing="placeholder"`. With `execute=False` (the
launch-parameter sweep of a dry run, and unit tests) nothing runs: the rows come from the clock
alone, which keeps the interpreter's milliseconds-per-program out of the inner loop.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from kernelwright import registry
from kernelwright.bench.db import new_run_id, record
from kernelwright.bench.harness import (
    BenchRow,
    RunContext,
    Timer,
    measure,
    shape_dims,
    with_bandwidth,
)
from kernelwright.bench.specs import BenchSpec
from kernelwright.profiles.optimization import Timing
from kernelwright.testing.compare import check_op
from kernelwright.workflows.optimize.clock import FakeClock

OURS = "kernelwright"
PLACEHOLDER = "placeholder"


@dataclass(frozen=True)
class Point:
    x_name: str
    x_value: int
    shape: dict[str, int]
    label: str  # "8192x4096"


def points_of(spec: BenchSpec, shapes: Sequence[dict[str, int]]) -> list[Point]:
    """Points for explicit shapes (x = the last dim, the row length the tables are keyed by)."""
    last = spec.dims[-1]
    return [Point(last, s[last], dict(s), spec.shape_label(s)) for s in shapes]


def row_problem(spec: BenchSpec, shape: dict[str, int]) -> tuple[int, int]:
    """[M, N] of the op's row view: N = the last dim, M = the product of the others."""
    n = shape[spec.dims[-1]]
    m = math.prod(shape[d] for d in spec.dims[:-1])
    return m, n


class Bench:
    def __init__(
        self,
        spec: BenchSpec,
        *,
        ctx: RunContext,
        timer: Timer,
        dtype: torch.dtype,
        clock: FakeClock | None = None,
        execute: bool = True,
    ):
        self.spec = spec
        self.ctx = ctx
        self.timer = timer
        self.dtype = dtype
        self.clock = clock  # set: placeholder timings
        self.execute = execute
        self.run_id = new_run_id()  # this optimize invocation's rows in the results database
        self._inputs: dict[str, dict[str, torch.Tensor]] = {}

    @property
    def placeholder(self) -> bool:
        return self.clock is not None

    def release(self) -> None:
        """Drop the cached inputs: one set per shape, kept for the whole run (drawing a GB-sized
        input on the CPU takes about a second, and every variant measures every shape)."""
        self._inputs.clear()
        if self.ctx.device.type == "cuda":
            torch.cuda.empty_cache()

    def _base(self, point: Point) -> dict[str, torch.Tensor]:
        if point.label not in self._inputs:
            with torch.no_grad():
                self._inputs[point.label] = self.spec.make_inputs(
                    point.shape, self.dtype, self.ctx.device
                )
        return self._inputs[point.label]

    def _row(self, point: Point, mode: str, provider: str) -> BenchRow:
        s, ctx = self.spec, self.ctx
        return BenchRow(
            op=s.op,
            mode=mode,
            provider=provider,
            x_name=point.x_name,
            x_value=point.x_value,
            shape=point.label,
            dims=shape_dims(s, point.shape),
            dtype=str(self.dtype).replace("torch.", ""),
            bytes=s.bytes(point.shape, self.dtype, mode),
            flops=s.flops(point.shape, self.dtype, mode) if s.flops is not None else 0,
            copy_gbps=ctx.copy_gbps,
            timing=PLACEHOLDER if self.placeholder else ctx.timing,
            gpu=ctx.gpu,
            torch=ctx.torch,
            triton=ctx.triton,
            commit=ctx.commit,
            timestamp=ctx.timestamp,
            arch=ctx.arch,
        )

    def record(self, rows: Sequence[BenchRow], tag: str) -> int:
        """Append a variant's rows to the results database (placeholder rows are not)."""
        return record(rows, source="optimize", run_id=self.run_id, tag=tag)

    def measure(self, point: Point, mode: str, provider: str = OURS) -> BenchRow:
        row = self._row(point, mode, provider)
        m, n = row_problem(self.spec, point.shape)
        if self.clock is not None:
            self.clock.at(m, n, mode, provider=provider, nbytes=row.bytes)
        if self.execute and not self._too_big_to_interpret(row):
            row = measure(
                self.spec,
                self.spec.provider(provider),
                mode,
                self._base(point),
                row,
                ctx=self.ctx,
                timer=self.timer,
            )
        else:
            row.ms_p20, row.ms_p50, row.ms_p80 = self.timer(_not_run, _not_run)
        if self.clock is not None:
            row.timing = PLACEHOLDER
            # the CPU allocator keeps no peak statistics: model what the op allocates
            row.peak_mem_mb = self.clock.peak_mb(m, n, mode, provider, row.bytes)
        return with_bandwidth(row)

    def _too_big_to_interpret(self, row: BenchRow) -> bool:
        """A dry run on the interpreter models a large point's time without running it (a
        --target shape of a GPU's size is past what the interpreter can run); small points still
        run, to show the op works."""
        return self.placeholder and self.ctx.device.type != "cuda" and row.bytes > INTERPRET_BYTES

    def run(
        self,
        points: Sequence[Point],
        modes: Sequence[str],
        provider: str = OURS,
        on_row: Callable[[BenchRow], None] | None = None,
    ) -> list[BenchRow]:
        rows = []
        for p in points:
            for mode in modes:
                row = self.measure(p, mode, provider)
                rows.append(row)
                if on_row is not None:
                    on_row(row)
        return rows


INTERPRET_BYTES = 16 << 20  # a point moving more than this is modelled, not interpreted


def _not_run() -> None:
    raise RuntimeError("a measurement with execute=False called the op")


def timing_of(row: BenchRow) -> Timing:
    return Timing(
        shape=row.shape,
        mode=row.mode,
        provider=row.provider,
        ms_p20=row.ms_p20,
        ms_p50=row.ms_p50,
        ms_p80=row.ms_p80,
        peak_mem_mb=row.peak_mem_mb,
        gbps=row.gbps,
        pct_copy_bw=row.pct_copy_bw,
        error=row.error,
    )


# --------------------------------------------------------------------------- smoke test


def smoke_shapes(
    spec: BenchSpec, points: Sequence[Point], *, rows: int, max_elements: int | None = None
) -> list[dict[str, int]]:
    """One small shape per distinct row length of the run: every measured table regime is
    exercised, with an odd row count (a partial last block of rows). max_elements: fewer rows
    where `rows` of them would hold more elements (never under 3)."""
    last = spec.dims[-1]
    out, seen = [], set()
    for p in points:
        n = p.shape[last]
        if n in seen:
            continue
        seen.add(n)
        m = rows if max_elements is None else max(3, min(rows, max_elements // max(n, 1)))
        small = {d: 1 for d in spec.dims[:-1]}
        small[spec.dims[0]] = m | 1  # odd
        small[last] = n
        out.append(small)
    return out


def smoke_test(
    spec: BenchSpec,
    op: str,
    shapes: Sequence[dict[str, int]],
    *,
    dtype: torch.dtype,
    device: torch.device,
) -> tuple[bool, str]:
    """Forward and backward of the op's "kernelwright" provider against `<op>_ref`.

    The reference runs through the very same provider builder with the op's function (as its
    registry entry names it) swapped for its reference while it is built, so it gets the same
    arguments; a call counter proves the swap took (a builder calling something else would
    compare the kernel with itself, a check that cannot fail). Returns (passed, a report of
    every shape).
    """
    entry = registry.get(op)
    ops = entry.load()
    provider = spec.provider(OURS)
    ref_fn = entry.ref()
    calls = [0]

    params = inspect.signature(ref_fn).parameters
    any_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())

    def counted(*args, **kwargs):
        calls[0] += 1
        # options the reference does not take (an in-place flag) change no numbers; a dropped
        # option that does would fail the check, the safe direction
        if not any_kw:
            kwargs = {k: v for k, v in kwargs.items() if k in params}
        return ref_fn(*args, **kwargs)

    def kernel(**inputs):
        return provider.build(inputs)()

    def reference(**inputs):
        original = getattr(ops, entry.function)
        setattr(ops, entry.function, counted)
        try:
            fn = provider.build(inputs)
        finally:
            setattr(ops, entry.function, original)
        return fn()

    lines, passed = [], True
    for i, shape in enumerate(shapes):
        label = spec.shape_label(shape)
        with torch.no_grad():
            inputs = spec.make_inputs(shape, dtype, device, seed=100 + i)
        # integer inputs (class targets, lengths) go through unchanged: check_op casts every
        # tensor input to fp32 for the reference
        floats = {k: v for k, v in inputs.items() if v.is_floating_point()}
        others = {k: v for k, v in inputs.items() if not v.is_floating_point()}
        try:
            report = check_op(
                kernel,
                reference,
                floats,
                kwargs=others,
                grad_inputs=spec.grad_inputs,
                dtype=dtype,
                label=f"{op} {label} {str(dtype).replace('torch.', '')}",
            )
        except Exception as e:  # a compile error or a crash is a failed smoke test, reported
            passed = False
            lines.append(f"{label}: FAIL — {type(e).__name__}: {str(e).splitlines()[0][:300]}")
            continue
        if calls[0] == 0:
            raise RuntimeError(
                f"smoke test of {op}: the '{OURS}' bench provider does not call "
                f"{entry.module}.{entry.function}, so it cannot be compared with {entry.reference}"
            )
        passed &= report.ok
        lines.append(report.table())
    return passed, "\n".join(lines)
