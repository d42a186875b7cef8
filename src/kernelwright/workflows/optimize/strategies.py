"""The strategy catalogue: named, data-driven edits of a launch-config table, keyed by the
bottleneck they address, and the planner that picks the next one from the lab notebooks.

A strategy changes only table rows that a benchmark shape of the run falls in ("regimes hit")
and only fields the kernel's table varies somewhere (a field a table never varies is one its
launcher ignores: `num_stages` in rms_norm's forward; its persistent backward reads it as
the row-block prefetch, so there it varies). The kernel-code strategies are table edits too:
the two-pass kernels take their cache-eviction hints and second-pass direction from the table
(`evict_hints`, `reverse_pass`), and "one pass instead of two" is a block wide enough to hold
the row (the row kernels' launchers take `block_n >= n` as their one-pass path; the smoke test
discards a config a kernel cannot run).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields

from kernelwright.profiles.optimization import StrategyRef, VariantRecord
from kernelwright.runtime.launch import LaunchConfig, Row
from kernelwright.workflows.optimize.tables import ArchRows, diff, to_profile

SWEEP = "launch_sweep"
MAX_WARPS, MAX_ROWS, MAX_PPS, MAX_STAGES = 32, 64, 32, 5
MAX_ONE_PASS = 65536  # the widest row a one-pass program holds (64 fp32 values a thread at 32)
L2_FLAGS = ("evict_hints", "reverse_pass")  # read only by the two-pass (looped) kernels
# the LaunchConfig fields beyond block_n and num_warps that a table may vary
VARIABLE_FIELDS = ("rows", "num_stages", "programs_per_sm", *L2_FLAGS)


@dataclass
class EditContext:
    rows: ArchRows  # the current best: kernel -> rows of the tuned arch
    hit: dict[str, dict[int, list[int]]]  # kernel -> regime index -> measured row lengths
    varied: dict[str, set[str]]  # kernel -> LaunchConfig fields its table varies


Edit = Callable[[EditContext], ArchRows]


@dataclass(frozen=True)
class Strategy:
    name: str
    addresses: tuple[str, ...]  # bottleneck classes; ("any",) for all
    why: str
    hypothesis: str
    expected: str
    edit: Edit | None  # None: a kernel change, not automated
    undoes: str = ""  # the strategy this one reverses (not tried after that one won)


def next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def per_thread(cfg: LaunchConfig, n: int) -> float:
    """Values one thread holds per step: the row chunk times rows, over the threads."""
    width = min(cfg.block_n, next_pow2(n))
    rows = cfg.rows if cfg.block_n >= n else 1
    return width * rows / (cfg.num_warps * 32)


def field_varied(rows_by_arch: dict[str, list[Row]], name: str) -> bool:
    default = next(f.default for f in fields(LaunchConfig) if f.name == name)
    return any(getattr(c, name) != default for rows in rows_by_arch.values() for _, c in rows)


def _map(ctx: EditContext, fn: Callable[[str, LaunchConfig, list[int]], LaunchConfig | None]):
    """Apply `fn(kernel, cfg, row lengths)` to every regime hit; None leaves a row alone."""
    out: ArchRows = {}
    for k, rows in ctx.rows.items():
        new = list(rows)
        for i, ns in ctx.hit.get(k, {}).items():
            max_n, cfg = rows[i]
            changed = fn(k, cfg, ns)
            if changed is not None:
                new[i] = (max_n, changed)
        out[k] = new
    return out


def _more_rows(ctx: EditContext) -> ArchRows:
    def f(k, cfg, ns):
        if "rows" not in ctx.varied[k] or max(ns) > 2048 or cfg.block_n < max(ns):
            return None
        if cfg.rows * 2 > MAX_ROWS or per_thread(cfg.with_(rows=cfg.rows * 2), max(ns)) > 128:
            return None
        return cfg.with_(rows=cfg.rows * 2)

    return _map(ctx, f)


def _fewer_rows(ctx: EditContext) -> ArchRows:
    def f(k, cfg, ns):
        if "rows" not in ctx.varied[k] or cfg.rows == 1 or max(ns) < 4096:
            return None
        return cfg.with_(rows=cfg.rows // 2)

    return _map(ctx, f)


def _fewer_warps(ctx: EditContext) -> ArchRows:
    def f(k, cfg, ns):
        fewer = cfg.with_(num_warps=cfg.num_warps // 2)
        if cfg.num_warps == 1 or per_thread(fewer, max(ns)) > 64:
            return None
        return fewer

    return _map(ctx, f)


def _more_warps(ctx: EditContext) -> ArchRows:
    def f(k, cfg, ns):
        more = cfg.with_(num_warps=cfg.num_warps * 2)
        if more.num_warps > MAX_WARPS or per_thread(cfg, max(ns)) < 16:
            return None
        return more

    return _map(ctx, f)


def _more_partials(ctx: EditContext) -> ArchRows:
    def f(k, cfg, ns):
        if "programs_per_sm" not in ctx.varied[k] or cfg.programs_per_sm * 2 > MAX_PPS:
            return None
        return cfg.with_(programs_per_sm=cfg.programs_per_sm * 2)

    return _map(ctx, f)


def _fewer_partials(ctx: EditContext) -> ArchRows:
    def f(k, cfg, ns):
        if "programs_per_sm" not in ctx.varied[k] or cfg.programs_per_sm == 1:
            return None
        return cfg.with_(programs_per_sm=cfg.programs_per_sm // 2)

    return _map(ctx, f)


def _split_long_rows(ctx: EditContext) -> ArchRows:
    def f(k, cfg, ns):
        # only rows that fit a program today and are long: the looped kernel takes them
        if max(ns) < 16384 or cfg.block_n < max(ns):
            return None
        return cfg.with_(block_n=next_pow2(max(ns)) // 2, rows=1)

    return _map(ctx, f)


def _flag_on(name: str) -> Edit:
    def edit(ctx: EditContext) -> ArchRows:
        def f(k, cfg, ns):
            # only regimes whose measured rows take the two-pass path read the flag (a split
            # row reads each row once: its kernels ignore it)
            skip = cfg.block_n >= max(ns) or cfg.split_row
            if name not in ctx.varied[k] or getattr(cfg, name) or skip:
                return None
            return cfg.with_(**{name: True})

        return _map(ctx, f)

    return edit


def _one_pass(ctx: EditContext) -> ArchRows:
    def f(k, cfg, ns):
        # rows walked in chunks today, short enough to hold whole: the fused kernel takes them
        width = next_pow2(max(ns))
        if cfg.block_n >= max(ns) or width > MAX_ONE_PASS:
            return None
        for warps in (4, 8, 16, 32):
            one = cfg.with_(block_n=width, rows=1, num_warps=warps)
            if per_thread(one, max(ns)) <= 64:
                return one
        return None

    return _map(ctx, f)


def _deeper_pipeline(ctx: EditContext) -> ArchRows:
    def f(k, cfg, ns):
        if "num_stages" not in ctx.varied[k] or cfg.num_stages + 1 > MAX_STAGES:
            return None
        return cfg.with_(num_stages=cfg.num_stages + 1)

    return _map(ctx, f)


MEM, COMP, LAT = "memory-bound", "compute-bound", "latency-occupancy-bound"

CATALOGUE: tuple[Strategy, ...] = (
    Strategy(
        SWEEP,
        ("any",),
        "always v1: an explicit sweep of the launch parameters per shape regime",
        "the table's configs are not the best this GPU offers for the shapes measured",
        "each regime takes its fastest config; regimes already tuned stay as they are",
        None,
    ),
    Strategy(
        "more_rows_short_rows",
        (LAT,),
        "short rows leave a program little work: more rows per program, fewer programs",
        "for rows <= 2048 a program is too small to hide memory latency",
        "faster short-row shapes (forward and backward), long rows unchanged",
        _more_rows,
        undoes="fewer_rows_long_rows",
    ),
    Strategy(
        "fewer_warps",
        (LAT, MEM),
        "fewer warps per program: more programs resident per SM, more loads in flight",
        "occupancy (programs per SM) limits the bandwidth, not the work per program",
        "a few % on memory-bound shapes if occupancy was the limit",
        _fewer_warps,
        undoes="more_warps",
    ),
    Strategy(
        "more_partial_sums",
        (LAT,),
        "more programs per SM in the persistent backward: more parallelism for dW",
        "the backward's grid is too small to fill the GPU",
        "a faster backward; more fp32 partial rows to sum (memory grows a little)",
        _more_partials,
        undoes="fewer_partial_sums",
    ),
    Strategy(
        "more_warps",
        (COMP,),
        "more warps per program: fewer values per thread, fewer registers, no spills",
        "register pressure (many values per thread) limits occupancy or spills",
        "faster long rows if registers were the limit",
        _more_warps,
        undoes="fewer_warps",
    ),
    Strategy(
        "split_long_rows",
        (COMP, LAT),
        "walk very long rows in chunks (the looped kernel) instead of holding them whole",
        "rows >= 16384 held whole cost registers and occupancy",
        "faster very long rows if registers were the limit; else slower (two passes)",
        _split_long_rows,
        undoes="one_pass",
    ),
    Strategy(
        "fewer_partial_sums",
        (MEM,),
        "fewer programs per SM in the persistent backward: fewer fp32 partial rows",
        "the partial-sum traffic (programs x N x 4 bytes, twice) is a visible share",
        "a slightly faster backward and less memory on short-token shapes",
        _fewer_partials,
        undoes="more_partial_sums",
    ),
    Strategy(
        "fewer_rows_long_rows",
        (MEM,),
        "fewer rows per program for rows >= 4096: more programs, better balance",
        "a few large programs leave SMs idle at the end of the grid (tail effect)",
        "a few % on long rows",
        _fewer_rows,
        undoes="more_rows_short_rows",
    ),
    Strategy(
        "deeper_pipeline",
        (MEM,),
        "one more software-pipelining stage (Hopper: more loads in flight per program)",
        "each program waits on its loads one chunk at a time",
        "faster looped kernels, if the launcher passes num_stages",
        _deeper_pipeline,
    ),
    Strategy(
        "eviction_hints",
        (MEM,),
        "cache-eviction hints in the two-pass kernels: evict_last on the statistics pass, "
        "evict_first on the write pass and its stores",
        "the second read of each row misses L2: streamed rows push out the rows still needed",
        "a few % to ~10% on rows walked twice (softmax past 65536 columns, cross-entropy)",
        _flag_on("evict_hints"),
    ),
    Strategy(
        "reverse_second_pass",
        (MEM,),
        "the write pass walks each row from its end, starting on the chunks read last",
        "the second read of each row misses L2: its first chunks were evicted first",
        "a few % on rows walked twice; more together with the eviction hints",
        _flag_on("reverse_pass"),
    ),
    Strategy(
        "one_pass",
        (MEM,),
        "one pass over each row instead of two: a block wide enough to hold the row",
        "the second read of rows walked in chunks costs bandwidth (up to 1/3 of the traffic)",
        "faster rows up to 65536 wide, if registers allow (else slower: spills)",
        _one_pass,
        undoes="split_long_rows",
    ),
)

BY_NAME = {s.name: s for s in CATALOGUE}


def ordered(bottleneck: str) -> list[StrategyRef]:
    """The profile's strategy list: the sweep, then those for the bottleneck, then the rest."""
    first = [s for s in CATALOGUE if s.name == SWEEP]
    matching = [s for s in CATALOGUE if bottleneck in s.addresses and s.name != SWEEP]
    rest = [s for s in CATALOGUE if s not in first and s not in matching]
    out = []
    for s in first + matching + rest:
        out.append(StrategyRef(name=s.name, addresses=", ".join(s.addresses), why=s.why))
    return out


def table_key(rows: ArchRows) -> str:
    return json.dumps({k: [r.model_dump() for r in v] for k, v in to_profile(rows).items()})


@dataclass(frozen=True)
class Choice:
    strategy: Strategy
    rows: ArchRows  # the proposed table (for the sweep: the current best, to be swept)
    change: list[str]
    why: str  # what in the notebooks led here


def plan_next(
    records: Sequence[VariantRecord],
    strategies: Sequence[StrategyRef],
    ctx: EditContext,
    baseline_key: str,
) -> Choice | None:
    """The next variant, from the profile's ordered strategies and every earlier notebook.

    v1 is the sweep. After it: a strategy that won is tried again first (on the new best);
    one that lost is not retried; one whose opposite won is skipped; a strategy whose edit is
    empty or gives a table already measured is skipped. Deterministic in its inputs.
    """
    if not records:
        return Choice(BY_NAME[SWEEP], ctx.rows, [], "v1 is always the launch-parameter sweep")
    tried = {table_key_of(r) for r in records} | {baseline_key}
    won = [r.strategy for r in records if r.verdict == "accepted"]
    lost = {r.strategy for r in records if r.verdict != "accepted"}
    order = [s.name for s in strategies if s.name in BY_NAME]
    # momentum: strategies that won come first, most recent win first
    for name in reversed(won):
        if name in order:
            order.remove(name)
            order.insert(0, name)
    for name in order:
        s = BY_NAME[name]
        if s.edit is None or name == SWEEP:
            continue
        if name in lost and name not in won:
            continue
        if s.undoes and s.undoes in won:
            continue
        rows = s.edit(ctx)
        change = diff(ctx.rows, rows)
        if not change or table_key(rows) in tried:
            continue
        why = "it won before: tried again on the new best" if name in won else "next in order"
        return Choice(s, rows, change, why)
    return None


def table_key_of(r: VariantRecord) -> str:
    return json.dumps({k: [row.model_dump() for row in v] for k, v in r.table.items()})
