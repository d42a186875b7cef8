"""One launch-sweep candidate, measured in a fan-out worker (runtime/fanout.py).

The parent sends the op's whole launch table as it would measure with it — the candidate
installed, and whatever this run (or a planted regression) installed in-process — with the
points and the mode. The worker serves that table from its own copy of the op's `TABLE` dict
while it measures, and returns the rows; the rows record the worker's GPU. A worker keeps one
`Bench` per op and timing for its life: inputs drawn once per shape, the copy bandwidth
measured once on its GPU.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from kernelwright import registry
from kernelwright.bench.harness import BenchRow
from kernelwright.bench.specs import get_spec
from kernelwright.runtime import default_device
from kernelwright.runtime.launch import Table
from kernelwright.workflows.optimize.measure import Bench, Point
from kernelwright.workflows.optimize.setup import DTYPES, timing
from kernelwright.workflows.optimize.tables import get_table


@dataclass(frozen=True)
class SweepTask:
    op: str
    dtype: str  # a key of setup.DTYPES
    table: Table  # the op's whole table, as the parent would measure with it
    points: tuple[Point, ...]
    mode: str
    dry_run: bool  # placeholder clock, nothing executed (as the parent's sweep bench)
    arch: str  # the table key tuned (the placeholder clock's model GPU)
    hide_host: bool


_BENCHES: dict[tuple, Bench] = {}  # this worker's benches, by (op, dtype, dry_run, arch, ...)


def _bench(t: SweepTask) -> Bench:
    key = (t.op, t.dtype, t.dry_run, t.arch, t.hide_host)
    if key not in _BENCHES:
        device, dtype = default_device(), DTYPES[t.dtype]
        spec = get_spec(registry.get(t.op).bench or t.op)
        ctx, timer, clock = timing(
            device, get_table(t.op), t.arch, dtype, dry_run=t.dry_run, hide_host=t.hide_host
        )
        _BENCHES[key] = Bench(
            spec, ctx=ctx, timer=timer, dtype=dtype, clock=clock, execute=not t.dry_run
        )
    return _BENCHES[key]


@contextmanager
def serving(table: Table, entries: Table) -> Iterator[None]:
    """Serve `entries` (every kernel's rows per arch) from `table`, in place, then restore."""
    saved = {k: table[k] for k in entries}
    try:
        for k, per_arch in entries.items():
            table[k] = copy.deepcopy(per_arch)
        yield
    finally:
        table.update(saved)


def measure_candidate(t: SweepTask) -> list[BenchRow]:
    """The candidate's rows at every point (a row's `error` says where it failed)."""
    bench = _bench(t)
    with serving(get_table(t.op), t.table):
        return [bench.measure(p, t.mode) for p in t.points]
