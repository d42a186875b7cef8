"""Which implementation of an op a call site gets, and why.

    from kernelwright.compile.select import choose
    c = choose("rms_norm", dtype="bfloat16", shape=(8192, 4096), device="cuda")
    c.impl, c.reason, c.measured, c.bucket    # "liger", "fastest measured in ...", True, ...
    c.fn()                                    # the callable (None for "inductor")

1. Capability: each implementation of the op's registry entry (`OpEntry.impls`) is checked
   against the site (dtype, shape, device, GPU arch); a rejected one gets its reason.
2. Measurement: the results database's rows of the op on this GPU arch and dtype whose shape
   falls in the site's shape bucket (`bucket_of`) time the capable implementations (each
   implementation's `provider` names the rows that time it; Inductor's are `torch_compile`'s).
   Mode "full" (forward + backward, a training step) is preferred over "forward"; GPU-only
   timings are preferred over host-inclusive ones, and the two are never compared with each
   other; interpreter rows are not speeds and never count. A provider's time in a bucket is
   the median ms_p50 of its rows there; the fastest wins.
3. Default: with no measurement for the bucket, kernelwright's kernel when capable (a created
   op's kernel for a created op), else Inductor (the original graph, left alone); the reason
   names the command that measures the site (`fill_command`: `registry bench OP --shape`).

`among` restricts the choice to the implementations a caller can use (the graph pass inserts
the op's own kernel or leaves the site to Inductor, `INSERTABLE`, and calls Liger's function
where compile/liger.py takes the site); every capable one is still timed, and when the fastest
is not among them the reason says so, with the caller's `why_not` for it when given, and the
fastest of those that are wins ("liger measured fastest; not insertable here (liger_kernel is
not installed); chose ...").

Deterministic: the same database and site give the same choice — ties go to the order of the
entry's implementations (kernelwright, created, liger, inductor). A database that is not a
results database (not SQLite, or another schema) is an error naming the file, never a default.
"""

from __future__ import annotations

import functools
import json
import math
import sqlite3
import statistics
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from kernelwright import registry
from kernelwright.bench.db import Filters, ResultsDB, ResultsDBError, db_path
from kernelwright.registry.entry import Impl, OpEntry

MODES = ("full", "forward")  # preferred first: selection is for training
GPU_ONLY, HOST_INCLUSIVE = "GPU-only", "host-inclusive"
INTERPRETER = "cpu-interpreter"
DTYPE_NAMES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32"}
# What the graph pass can put at any site: the op's own kernel, or the graph left to Inductor.
# It adds "liger" per site, where Liger's adapter takes the site (compile/liger.py).
INSERTABLE = ("kernelwright", "created", "inductor")


class Bucket(NamedTuple):
    """A shape bucket: rows (the product of the leading dims) and n (the last dim), each
    rounded to the nearest power of two in log2 space (5700 -> 4096, 5900 -> 8192: the
    boundary is 4096 x sqrt(2))."""

    rows: int
    n: int

    def __str__(self) -> str:
        return f"rows~{self.rows} n~{self.n}"


def pow2(x: int) -> int:
    """The power of two nearest `x` in log2 space (x >= 1; 0 -> 1)."""
    return 1 << max(0, round(math.log2(x))) if x >= 1 else 1


def bucket_of(shape: Sequence[int]) -> Bucket:
    """The bucket of a call site's main input of shape `shape` ([..., n])."""
    if not shape:
        return Bucket(1, 1)
    return Bucket(pow2(math.prod(shape[:-1])), pow2(int(shape[-1])))


def row_bucket(entry: OpEntry, row: dict) -> Bucket | None:
    """The bucket of a bench row: its named dims mapped by `entry.bucket` (default: every dim
    but the last are rows, the last is n); without dims, its "AxB" shape string read the same
    way. A dim `entry.bucket` names that the row lacks comes from its bench spec's
    `derived_dims` (jagged_mean's "total": the rows its lengths draw holds, the measure a call
    site has). None when none of these can be read."""
    dims: dict[str, int] = {}
    try:
        dims = {str(k): int(v) for k, v in json.loads(row.get("dims") or "{}").items()}
    except (ValueError, TypeError, AttributeError):
        dims = {}
    if dims and entry.bucket is not None:
        row_dims, n_dim = entry.bucket
        if not all(d in dims for d in (*row_dims, n_dim)):
            dims = {**derived_dims(entry.bench or entry.name, tuple(sorted(dims.items()))), **dims}
        if n_dim in dims and all(d in dims for d in row_dims):
            return Bucket(pow2(math.prod(dims[d] for d in row_dims)), pow2(dims[n_dim]))
    if dims and entry.bucket is None:
        return bucket_of(list(dims.values()))
    parts = str(row.get("shape", "")).split("x")
    if entry.bucket is None and parts and all(p.isdigit() for p in parts):
        return bucket_of([int(p) for p in parts])
    return None


@functools.lru_cache(maxsize=256)
def derived_dims(spec_name: str, dims: tuple[tuple[str, int], ...]) -> dict[str, int]:
    """The dims the bench spec `spec_name` derives from a shape's named `dims` ({} when it
    derives none or cannot read them)."""
    from kernelwright.bench.specs import SPECS

    spec = SPECS.get(spec_name)
    if spec is None or spec.derived_dims is None:
        return {}
    try:
        return {str(k): int(v) for k, v in spec.derived_dims(dict(dims)).items()}
    except (KeyError, ValueError, TypeError):
        return {}


def timing_class(timing: str) -> str | None:
    """GPU_ONLY or HOST_INCLUSIVE for a CUDA-event timing; None for the others (interpreter,
    placeholder), which are not speeds."""
    if timing.startswith("cuda_events_gpu_only"):
        return GPU_ONLY
    if timing.startswith("cuda_events"):
        return HOST_INCLUSIVE
    return None


def dtype_name(dtype: Any) -> str:
    """ "bfloat16" from torch.bfloat16, "bf16" or "bfloat16"."""
    text = str(dtype).removeprefix("torch.")
    return DTYPE_NAMES.get(text, text)


@dataclass(frozen=True)
class Choice:
    """The implementation a call site gets. `impl` names one of the op entry's `impls`;
    `reason` says why in a sentence; `measured` is True when timings decided it; `rejected`
    lists (implementation, why not capable); `timings` the medians compared (ms)."""

    op: str
    impl: str
    reason: str
    measured: bool
    bucket: Bucket
    rejected: tuple[tuple[str, str], ...] = ()
    timings: tuple[tuple[str, float], ...] = ()
    _entry: OpEntry | None = field(default=None, repr=False, compare=False)

    @property
    def implementation(self) -> Impl:
        entry = self._entry or registry.get(self.op)
        return entry.impl(self.impl)

    def fn(self) -> Any:
        """The chosen callable, imported now; None for "inductor" (leave the graph alone)."""
        return self.implementation.load()

    def describe(self) -> str:
        return f"{self.op} [{self.bucket}] -> {self.impl}: {self.reason}"


class NoCapableImpl(ValueError):
    """No implementation of the op, Inductor included, takes the site (a bad site)."""


def choose(
    op: str,
    *,
    dtype: Any,
    shape: Sequence[int],
    device: str,
    arch: str | None = None,
    last_dim_contiguous: bool = True,
    db: str | Path | ResultsDB | None = None,
    among: Collection[str] | None = None,
    ruled_out: Mapping[str, str] | None = None,
    why_not: Mapping[str, str] | None = None,
) -> Choice:
    """The implementation of `op` for one call site (see the module's docstring).

    device: "cuda" or "cpu-interpreter" (a torch.device or "cpu" is read as such). arch: the
    GPU's ("sm_90"); default: the current CUDA device's on "cuda". db: the results database
    (default: $KERNELWRIGHT_RESULTS_DB, else kernelwright-runs/results.db); a missing file
    means no measurement, a file that is not a results database raises `ResultsDBError`.
    among: the implementation names that may be chosen (None: all; the pass gives INSERTABLE).
    ruled_out: implementation name -> why it cannot take this site, rejected as a capability
    check would (the pass: a created kernel whose constants differ from the site's).
    why_not: why an implementation left out of `among` cannot be used at this site (the pass:
    Liger's adapter), named in the reason when it measured fastest.
    """
    entry = registry.get(op)
    device = _device_name(device)
    arch = _arch(device, arch)
    dtype = dtype_name(dtype)
    shape = tuple(int(s) for s in shape)
    bucket = bucket_of(shape)
    site = {
        "dtype": dtype,
        "shape": shape,
        "device": device,
        "arch": arch,
        "last_dim_contiguous": last_dim_contiguous,
    }
    capable: list[Impl] = []
    rejected: list[tuple[str, str]] = []
    for impl in entry.impls:
        why = (ruled_out or {}).get(impl.name) or impl.unsupported(**site)
        if why is None:
            capable.append(impl)
        else:
            rejected.append((impl.name, why))
    if not capable:
        raise NoCapableImpl(
            f"{op}: no implementation takes dtype {dtype}, shape {shape} on {device}: "
            + "; ".join(f"{n}: {w}" for n, w in rejected)
        )
    made = {"op": op, "bucket": bucket, "rejected": tuple(rejected), "_entry": entry}
    rows, missing = _rows(db, op)
    times, label = _timings(entry, capable, rows, arch=arch, dtype=dtype, bucket=bucket)
    usable = [i for i in capable if among is None or i.name in among]
    if not usable:
        raise NoCapableImpl(
            f"{op}: none of {', '.join(among or ())} takes dtype {dtype}, shape {shape} on "
            f"{device}: " + "; ".join(f"{n}: {w}" for n, w in rejected)
        )
    order = {impl.name: i for i, impl in enumerate(entry.impls)}

    def speed(name: str) -> tuple[float, int]:
        return times[name], order[name]

    fastest = min(times, key=speed, default=None)
    # the fastest measured one the caller can use; a faster one it cannot is named
    best = min((n for n in times if n in {i.name for i in usable}), key=speed, default=None)
    over = ""
    if fastest != best:
        why = (why_not or {}).get(fastest)
        over = f"not insertable here ({why})" if why else "not insertable by the pass"
        over = f"{fastest} measured fastest; {over}; "
    timed = tuple(sorted(times.items(), key=_by_time))
    if best is not None:
        head = f"{over}chose {best}, the fastest it can insert" if over else "fastest"
        others = ", ".join(f"{n} {t:.4g} ms" for n, t in timed)
        reason = f"{head} measured in {bucket} on {arch} {dtype} ({label}): {others}"
        return Choice(impl=best, reason=reason, measured=True, timings=timed, **made)
    default = _default(usable)
    if over:  # measured, but none of those the caller can use
        reason = f"{over}chose {default.name}, the default (not measured in {bucket})"
        return Choice(impl=default.name, reason=reason, measured=False, timings=timed, **made)
    where = f"no results database at {missing}" if missing else f"no measurement for {bucket}"
    named = None if db is None else db.path if isinstance(db, ResultsDB) else db_path(db)
    fill = f"`{fill_command(op, shape, dtype, named)}` fills it"
    if entry.bench is None:  # nothing can fill it: no command to suggest
        fill = "no benchmark spec times its implementations"
    elif device == INTERPRETER:  # its own rows never count: the advice is a GPU's
        fill = f"interpreter timings are not speeds; on a GPU, {fill}"
    reason = f"{where}: default; {fill}"
    return Choice(impl=default.name, reason=reason, measured=False, **made)


def fill_command(op: str, shape: Sequence[int], dtype: Any, db: Path | None = None) -> str:
    """The command that measures `op`'s implementations at a call site's shape and dtype (into
    `db`, when the caller named a database)."""
    short = {v: k for k, v in DTYPE_NAMES.items() if k != "half"}
    name = dtype_name(dtype)
    dims = "x".join(str(int(s)) for s in shape)
    where = f" --db {db}" if db is not None else ""
    return f"kernelwright registry bench {op} --shape {dims} --dtype {short.get(name, name)}{where}"


def _by_time(item: tuple[str, float]) -> tuple[float, str]:
    return item[1], item[0]


def _default(capable: list[Impl]) -> Impl:
    """The op's own kernel (kernelwright's, or a created op's) when capable, else Inductor."""
    for impl in capable:
        if impl.name in ("kernelwright", "created"):
            return impl
    return next((i for i in capable if i.name == "inductor"), capable[0])


def _device_name(device: Any) -> str:
    text = str(getattr(device, "type", device))
    return INTERPRETER if text in ("cpu", INTERPRETER) else text


def _arch(device: str, arch: str | None) -> str:
    if arch:
        return arch
    if device != "cuda":
        return INTERPRETER
    import torch

    from kernelwright.bench.context import arch_of

    if not torch.cuda.is_available():
        return "unknown"
    return arch_of(torch.device("cuda"))


def open_db(db: str | Path | ResultsDB | None) -> ResultsDB | None:
    """The results database to read, or None when its file does not exist or is empty (0 bytes:
    nothing measured yet). A file that is not a results database raises `ResultsDBError`
    naming it."""
    path = db.path if isinstance(db, ResultsDB) else db_path(db)
    if path.is_file() and path.stat().st_size == 0:
        return None
    if isinstance(db, ResultsDB):
        return ResultsDB.existing(db.path)
    if not path.exists():
        return None
    return ResultsDB.existing(path)


def check_db(db: str | Path | ResultsDB | None) -> None:
    """Raise `ResultsDBError` naming the file when `db` exists and is not a readable results
    database (what `choose` would raise at the first site); a missing file passes."""
    results = open_db(db)
    if results is not None:
        _read(results, lambda: results.distinct("op"))


def _read(results: ResultsDB, query):
    try:
        return query()
    except sqlite3.DatabaseError as e:  # a results file without its tables
        raise ResultsDBError(f"{results.path} is not a readable results database ({e})") from e


def _rows(db: str | Path | ResultsDB | None, op: str) -> tuple[list[dict], Path | None]:
    """The op's rows and, when the database file is missing, its path."""
    results = open_db(db)
    if results is None:
        return [], db_path(db.path if isinstance(db, ResultsDB) else db)
    if op not in _read(results, lambda: results.distinct("op")):
        return [], None
    return _read(results, lambda: results.query(Filters(op=op))), None


def _timings(
    entry: OpEntry,
    capable: list[Impl],
    rows: list[dict],
    *,
    arch: str,
    dtype: str,
    bucket: Bucket,
) -> tuple[dict[str, float], str]:
    """Capable implementation -> median ms_p50 in the bucket, from one mode and one timing
    class (the first of MODES, GPU-only before host-inclusive, with any rows); and that
    (mode, class) as a label."""
    by_provider = {impl.provider: impl.name for impl in capable}
    found: dict[tuple[str, str], dict[str, list[float]]] = {}
    for r in rows:
        kind = timing_class(str(r.get("timing", "")))
        ms = r.get("ms_p50")
        if kind is None or r.get("error") or not isinstance(ms, float) or not math.isfinite(ms):
            continue
        if r.get("arch") != arch or r.get("dtype") != dtype or r.get("mode") not in MODES:
            continue
        name = by_provider.get(r.get("provider", ""))
        if name is None or row_bucket(entry, r) != bucket:
            continue
        found.setdefault((r["mode"], kind), {}).setdefault(name, []).append(ms)
    for mode in MODES:
        for kind in (GPU_ONLY, HOST_INCLUSIVE):
            got = found.get((mode, kind))
            if got:
                return {n: statistics.median(v) for n, v in got.items()}, f"{mode}, {kind}"
    return {}, ""
