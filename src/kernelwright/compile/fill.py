"""The benchmark shape that fills a call site's shape bucket (`registry bench OP --shape`).

A call site is keyed by its main input's shape, [..., n], through `select.bucket_of`; a bench
row by its spec's named dims, through `select.row_bucket` and the op's `bucket` mapping. To
measure a site, its shape becomes the spec's dims:

- when the op maps no dims (`OpEntry.bucket` None) and the site has one dim per spec dim, the
  site's dims in the spec's order (8192x4096 -> tokens 8192, hidden 4096);
- otherwise n is the site's last dim, the bucket's first row dim takes the site's rows (the
  product of its leading dims) over the other row dims, and every other dim is the spec's
  first benchmarked shape's (its quick sweep on a GPU, its interpreter sweep on the CPU);
- a row dim the spec derives (jagged_mean's total, the rows its drawn lengths hold) is reached
  by scaling the spec's dims outside the bucket (jagged_mean's segments, then max_len).

The shape is checked to land in the site's bucket; one that cannot is an error saying why.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

from kernelwright import registry
from kernelwright.bench.specs import BenchSpec, get_spec
from kernelwright.compile.select import bucket_of, derived_dims, pow2, row_bucket


class SiteShapeError(ValueError):
    """A call-site shape the op's benchmark cannot be run at."""


def template(spec: BenchSpec, *, interpreter: bool) -> dict[str, int]:
    """The spec's first benchmarked shape on this kind of device."""
    sweeps = spec.sweeps_for(quick=True, interpreter=interpreter)
    for s in sweeps:
        for _, shape in s.shapes():
            return dict(shape)
    raise SiteShapeError(f"{spec.op}: its benchmark spec has no shape to start from")


def bench_dims(op: str, shape: Sequence[int], *, interpreter: bool) -> dict[str, int]:
    """The named dims of `op`'s benchmark whose rows land in the bucket of a site of `shape`."""
    entry = registry.get(op)
    if entry.bench is None:
        raise SiteShapeError(f"{op} has no benchmark spec: nothing measures its implementations")
    spec = get_spec(entry.bench)
    shape = tuple(int(s) for s in shape)
    if not shape or any(s < 1 for s in shape):
        raise SiteShapeError(f"{op}: a site's shape has positive dims, got {shape}")
    want = bucket_of(shape)
    if entry.bucket is None and len(shape) == len(spec.dims):
        dims = dict(zip(spec.dims, shape, strict=True))
    else:
        row_dims, n_dim = entry.bucket or (spec.dims[:-1], spec.dims[-1])
        dims = template(spec, interpreter=interpreter)
        dims[n_dim] = shape[-1]
        rows = math.prod(shape[:-1])
        given = [d for d in row_dims if d in spec.dims]
        if given and given[0] == row_dims[0]:
            others = math.prod(dims[d] for d in given[1:])
            dims[given[0]] = max(1, round(rows / others))
        if len(given) < len(row_dims):  # a derived row dim: scale the first free dim
            _reach(entry, spec, dims, rows, [*row_dims, n_dim])
    got = row_bucket(entry, {"dims": json.dumps(dims)})
    if got != want:
        raise SiteShapeError(
            f"{op}: no benchmark shape of its spec lands in the site's bucket {want} "
            f"(the nearest, {_label(spec, dims)}, is in {got})"
        )
    return dims


def _reach(entry, spec: BenchSpec, dims: dict[str, int], rows: int, bucket: list[str]) -> None:
    """Scale the spec's dims outside the bucket, first one first, until the rows the spec
    derives are about `rows` (a dim scaled down to 1 hands over to the next)."""
    row_dims = (entry.bucket or ((), ""))[0]

    def have() -> int:
        derived = derived_dims(spec.op, tuple(sorted(dims.items())))
        return math.prod({**derived, **dims}.get(d, 1) for d in row_dims)

    for free in (d for d in spec.dims if d not in bucket):
        for _ in range(8):
            now = have()
            if now < 1 or pow2(now) == pow2(rows):
                return
            scaled = max(1, round(dims[free] * rows / now))
            if scaled == dims[free]:
                break
            dims[free] = scaled


def _label(spec: BenchSpec, dims: dict[str, int]) -> str:
    return ", ".join(f"{d} {dims[d]}" for d in spec.dims)
