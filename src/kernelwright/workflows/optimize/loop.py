"""Stage 2 — the variant loop: plan (from the notebooks on disk), smoke-test, benchmark, judge.

Every variant vN leaves `vN.json` (the structured record the planner reads back), `vN_notes.md`
(the lab notebook), `vN_table.py` (its table entry, as Finalize would write it) and, when
benchmarked, `vN_bench.csv`. v1 is always `launch_sweep`: for every table row a benchmark shape
falls in, an explicit grid of launch parameters is timed on those shapes and the fastest config
that is nowhere slower than the current one (beyond noise) is kept.
"""

from __future__ import annotations

import copy
import csv
import math
from dataclasses import dataclass
from pathlib import Path

from kernelwright.bench.report import geomean, write_csv
from kernelwright.profiles.optimization import OptimizationProfile, Timing, VariantRecord
from kernelwright.runtime.fanout import Fanout
from kernelwright.runtime.launch import LaunchConfig
from kernelwright.workflows.optimize import notebook
from kernelwright.workflows.optimize.clock import is_backward_kernel
from kernelwright.workflows.optimize.guardrails import (
    NOISE_FLOOR,
    NON_TARGET_LIMIT,
    best_record,
    gain,
    judge,
    memory_regressed,
    objective,
    stop_reason,
)
from kernelwright.workflows.optimize.measure import (
    row_problem,
    smoke_shapes,
    smoke_test,
    timing_of,
)
from kernelwright.workflows.optimize.setup import Progress, Setup
from kernelwright.workflows.optimize.strategies import (
    BY_NAME,
    L2_FLAGS,
    SWEEP,
    EditContext,
    next_pow2,
    per_thread,
    plan_next,
    table_key,
)
from kernelwright.workflows.optimize.sweep_task import SweepTask, measure_candidate
from kernelwright.workflows.optimize.tables import (
    MAX_N_OPEN,
    ArchRows,
    diff,
    from_profile,
    installed,
    max_n_label,
    regime_index,
    render_entry,
    to_profile,
)

WARPS = (1, 2, 4, 8, 16, 32)
SHORT_ROWS = 4096  # row lengths up to this sweep rows per program up to 16; longer: 1 or 2


# --------------------------------------------------------------------------- records on disk


def record_path(ws: Path, version: int) -> Path:
    return ws / f"v{version}.json"


def read_records(ws: Path) -> list[VariantRecord]:
    """Every notebook record in the workspace, v1, v2, ... (a gap ends the list)."""
    out = []
    v = 1
    while record_path(ws, v).exists():
        out.append(VariantRecord.model_validate_json(record_path(ws, v).read_text()))
        v += 1
    return out


def clear_variants(ws: Path) -> None:
    """Remove an earlier run's notebooks so the planner cannot read stale ones."""
    for pattern in ("v[0-9]*.json", "v[0-9]*_notes.md", "v[0-9]*_table.py", "v[0-9]*_*.csv"):
        for f in ws.glob(pattern):
            f.unlink()
    for name in ("comparison.md", "report.md", "proposed_table.py"):
        (ws / name).unlink(missing_ok=True)


def write_record(ws: Path, r: VariantRecord, arch: str, sweep_md: list[str]) -> None:
    record_path(ws, r.version).write_text(r.model_dump_json(indent=2))
    (ws / f"v{r.version}_notes.md").write_text(notebook.variant_md(r, sweep_md))
    entry = "".join(
        f"# {k}\n" + render_entry(arch, rows, "", "C", "")
        for k, rows in from_profile(r.table).items()
    )
    (ws / f"v{r.version}_table.py").write_text(
        f"# v{r.version} ({r.strategy}): TABLE[kernel][{arch!r}] per kernel\n{entry}"
    )


# --------------------------------------------------------------------------- helpers


def regimes_hit(setup: Setup, rows: ArchRows) -> dict[str, dict[int, list[int]]]:
    """kernel -> table row index -> the row lengths of the benchmark points it serves."""
    hit: dict[str, dict[int, list[int]]] = {}
    for k, krows in rows.items():
        for p in setup.points:
            n = row_problem(setup.spec, p.shape)[1]
            ns = hit.setdefault(k, {}).setdefault(regime_index(krows, n), [])
            if n not in ns:
                ns.append(n)
    return hit


def measure_rows(setup: Setup, rows: ArchRows, progress: Progress, tag: str) -> list[Timing]:
    with installed(setup.table, rows, setup.install_archs):
        unit = "ms (placeholder)" if setup.placeholder else "ms"

        def on_row(r) -> None:
            status = f"{r.ms_p50:.4f} {unit}" if r.ok else f"error: {r.error}"
            progress(f"  {tag} {r.shape} {r.mode}: {status}")

        bench_rows = setup.bench.run(setup.points, setup.modes, on_row=on_row)
    write_csv(bench_rows, setup.workspace / f"{tag}_bench.csv")
    setup.bench.record(bench_rows, tag)
    return [timing_of(r) for r in bench_rows]


def run_smoke(setup: Setup, rows: ArchRows, *, first_only: bool = False) -> tuple[bool, str]:
    """The smoke test with `rows` installed; `first_only`: the shortest row length alone."""
    # small row counts: the interpreter runs every program, and every tile of a long row, one
    # op at a time, so its shapes are capped in elements; on the GPU a few hundred rows still
    # give several row blocks per program
    on_gpu = setup.device.type == "cuda"
    cap = None if on_gpu else 1 << 19
    shapes = smoke_shapes(setup.spec, setup.points, rows=263 if on_gpu else 37, max_elements=cap)
    if first_only:
        last = setup.spec.dims[-1]
        shapes = [min(shapes, key=lambda s: s[last])]
    with installed(setup.table, rows, setup.install_archs):
        return smoke_test(setup.spec, setup.opts.op, shapes, dtype=setup.dtype, device=setup.device)


# --------------------------------------------------------------------------- the sweep


@dataclass
class SweepResult:
    rows: ArchRows
    lines: list[str]  # Markdown for the notebook
    csv_rows: list[dict]


def candidates(cur: LaunchConfig, max_n: int, n_max: int, varied: set[str]) -> list[LaunchConfig]:
    """The explicit grid for one table row: block sizes x rows per program x warps, pruned to
    2..128 values per thread (fewer: no vector loads; more: spills)."""
    # a row that fits a program must fit for every length the table row serves, not only the
    # lengths measured: block_n covers max_n (the open-ended last row: the lengths measured)
    fit = next_pow2(max_n if max_n < MAX_N_OPEN else n_max)
    blocks = [fit] + ([fit // 2, fit // 4] if fit >= 16384 else [])
    if "rows" in varied:
        row_opts = (1, 2, 4, 8, 16) if n_max <= SHORT_ROWS else (1, 2)
    else:
        row_opts = (cur.rows,)
    out = []
    for b in blocks:
        looped = b < n_max
        for r in (1,) if looped and "rows" in varied else row_opts:
            for w in WARPS:
                c = cur.with_(block_n=b, rows=r, num_warps=w)
                if c != cur and 2 <= per_thread(c, n_max) <= 128 and c not in out:
                    out.append(c)
    return out


# fields the sweep steps through after the block/rows/warps grid, each around the best so far
FIELD_STEPS = (
    ("programs_per_sm", (1, 2, 4, 8, 16)),
    ("num_stages", (1, 2, 3)),
    ("evict_hints", (False, True)),
    ("reverse_pass", (False, True)),
)


def launch_sweep(setup: Setup, rows: ArchRows, progress: Progress) -> SweepResult:
    rows = {k: list(v) for k, v in rows.items()}
    hit = regimes_hit(setup, rows)
    lines, csv_rows = [], []
    bench = setup.sweep_bench
    for kernel in setup.kernels:
        mode = "backward" if is_backward_kernel(kernel) else "forward"
        for idx, ns in sorted(hit[kernel].items()):
            max_n, cur = rows[kernel][idx]
            pts = [p for p in setup.points if row_problem(setup.spec, p.shape)[1] in ns]
            label = f"{kernel} n<={max_n_label(max_n)}"
            timed: dict[LaunchConfig, tuple[list[float], list[float]] | str] = {}

            def time_config(
                cfg: LaunchConfig,
                pts=pts,
                kernel=kernel,
                idx=idx,
                max_n=max_n,
                mode=mode,
                timed=timed,
            ):
                trial = {k: list(v) for k, v in rows.items()}
                trial[kernel][idx] = (max_n, cfg)
                with installed(setup.table, {kernel: trial[kernel]}, setup.install_archs):
                    got = [bench.measure(p, mode) for p in pts]
                bad = [r.error for r in got if not r.ok]
                timed[cfg] = (
                    bad[0] if bad else ([r.ms_p50 for r in got], [r.peak_mem_mb for r in got])
                )

            where: dict[LaunchConfig, tuple[str, str]] = {}  # config -> (GPU, its index)

            def time_configs(
                cfgs,
                time_config=time_config,
                job=(kernel, idx, max_n, mode, pts, label),
                timed=timed,
                where=where,
            ) -> bool:
                """Time `cfgs` (here, or one per GPU at once); True if the deadline cut it."""
                fan = setup.fanout
                if fan is None or fan.sequential:
                    for cfg in cfgs:
                        if setup.past_deadline():
                            return True
                        time_config(cfg)
                        where[cfg] = (setup.ctx.gpu, "")
                    return False
                return _fan_out(setup, fan, rows, job, cfgs, timed, where)

            grid = [cur, *candidates(cur, max_n, max(ns), setup.varied[kernel])]
            progress(f"[v1 sweep] {label}: {len(grid)} configs on {len(pts)} shape(s) ({mode})")
            stopped = time_configs(grid)
            best = _pick(cur, timed, setup.opts.goal)
            # then one field at a time, around the three best so far — the best at one
            # partial-sum count need not be the best at another. The L2 flags only where the
            # measured rows take the two-pass path (elsewhere, split rows included, the
            # launcher ignores them).
            for name, values in FIELD_STEPS:
                if name in setup.varied[kernel] and not stopped:
                    step = []
                    for base in _top(cur, timed, setup.opts.goal, 3):
                        if name in L2_FLAGS and (base.block_n >= max(ns) or base.split_row):
                            continue
                        for v in values:
                            cfg = base.with_(**{name: v})
                            if cfg not in timed and cfg not in step:
                                step.append(cfg)
                    time_configs(step)
                    best = _pick(cur, timed, setup.opts.goal)
            rows[kernel][idx] = (max_n, best)
            ranked = sorted(
                ((c, t[0]) for c, t in timed.items() if isinstance(t, tuple)),
                key=lambda ct: geomean(ct[1]),
            )
            failed = [(c, t) for c, t in timed.items() if isinstance(t, str)]
            lines += [f"**{label}** ({', '.join(p.label for p in pts)}, {mode}):"]
            lines += [f"kept `{_short(best)}`" + (" (unchanged)" if best == cur else "")]
            if stopped:
                lines += ["(the time budget ran out: part of the grid was not timed)"]
            lines += ["", "| config | ms per shape |", "|---|---|"]
            shown = ranked[:6] + [(c, t) for c, t in ranked[6:] if c == cur]
            for c, t in shown:
                mark = " (current)" if c == cur else ""
                lines.append(f"| `{_short(c)}`{mark} | {', '.join(f'{x:.4f}' for x in t)} |")
            if failed:
                lines.append(
                    f"| {len(failed)} failed | e.g. `{_short(failed[0][0])}`: {failed[0][1]} |"
                )
            lines.append("")
            for c, t in timed.items():
                csv_rows.append(
                    {
                        "kernel": kernel,
                        "max_n": max_n,
                        "config": _short(c),
                        "ms": ";".join(f"{x:.5f}" for x in t[0]) if isinstance(t, tuple) else "",
                        "peak_mb": ";".join(f"{x:.1f}" for x in t[1])
                        if isinstance(t, tuple)
                        else "",
                        "error": t if isinstance(t, str) else "",
                        "kept": c == best,
                        "gpu": where.get(c, ("", ""))[0],
                        "device": where.get(c, ("", ""))[1],
                    }
                )
    return SweepResult(rows, lines, csv_rows)


def _fan_out(
    setup: Setup,
    fan: Fanout,
    rows: ArchRows,
    job: tuple,
    cfgs: list[LaunchConfig],
    timed: dict,
    where: dict,
) -> bool:
    """Time `cfgs` one per worker at a time; True if the deadline left some untimed. The table
    each worker serves is this process's, with the candidate installed (as `time_config`
    installs it here). `job`: (kernel, table row index, its max_n, mode, points, label)."""
    kernel, idx, max_n, mode, pts, label = job
    tasks = []
    for cfg in cfgs:
        trial = list(rows[kernel])
        trial[idx] = (max_n, cfg)
        with installed(setup.table, {kernel: trial}, setup.install_archs):
            snapshot = copy.deepcopy(setup.table)
        tasks.append(
            SweepTask(
                op=setup.opts.op,
                dtype=setup.opts.dtype,
                table=snapshot,
                points=tuple(pts),
                mode=mode,
                dry_run=setup.placeholder,
                arch=setup.arch,
                hide_host=setup.opts.hide_host,
            )
        )
    labels = [f"{label} {_short(c)}" for c in cfgs]
    results = fan.run(measure_candidate, tasks, labels=labels, stop=setup.past_deadline)
    stopped = False
    for cfg, r in zip(cfgs, results, strict=True):
        if r.skipped:
            stopped = True
            continue
        where[cfg] = (r.gpu, r.device)
        if not r.ok:  # the task itself failed (not a row): the config is out, with the reason
            timed[cfg] = r.error.splitlines()[0] if r.error else "failed"
            continue
        bad = [row.error for row in r.value if not row.ok]
        timed[cfg] = (
            bad[0] if bad else ([x.ms_p50 for x in r.value], [x.peak_mem_mb for x in r.value])
        )
    return stopped


def _short(c: LaunchConfig) -> str:
    flags = "".join(f" {f}" for f in L2_FLAGS if getattr(c, f))
    return (
        f"block_n={c.block_n} warps={c.num_warps} rows={c.rows} stages={c.num_stages} "
        f"pps={c.programs_per_sm}{flags}"
    )


def _score(ms: list[float], mem: list[float], goal: str) -> float:
    if goal == "speed":
        return geomean(ms)
    if goal == "memory":
        return geomean(mem)
    return geomean([math.sqrt(t * m) for t, m in zip(ms, mem, strict=True)])


def _top(cur: LaunchConfig, timed: dict, goal: str, k: int) -> list[LaunchConfig]:
    """The k best eligible configs (see `_pick`), best first."""
    out, left = [], dict(timed)
    while len(out) < k:
        best = _pick(cur, left, goal)
        if best in out:
            break
        out.append(best)
        if best == cur:
            break
        left.pop(best)
    return out


def _pick(cur: LaunchConfig, timed: dict, goal: str) -> LaunchConfig:
    """The config with the best objective (geomean over the regime's shapes) that keeps the
    variant guardrails against the current one: no shape slower beyond the noise floor, no
    peak memory more than 5% higher. The current config if none qualifies or it failed."""
    base = timed.get(cur)
    if not isinstance(base, tuple):
        return cur
    base_ms, base_mem = base
    if goal != "speed" and not all(math.isfinite(m) and m > 0 for m in base_mem):
        goal = "speed"  # no memory statistics on this device: rank by time alone
    best, best_s = cur, _score(base_ms, base_mem, goal)
    for c, t in timed.items():
        if not isinstance(t, tuple):
            continue
        ms, mem = t
        if any(x > b * (1 + NOISE_FLOOR) for x, b in zip(ms, base_ms, strict=True)):
            continue
        if any(
            math.isfinite(x)
            and math.isfinite(b)
            and x > b * (1 + NON_TARGET_LIMIT)
            and memory_regressed(x, b)
            for x, b in zip(mem, base_mem, strict=True)
        ):
            continue
        s = _score(ms, mem, goal)
        if s < best_s:
            best, best_s = c, s
    return best


# --------------------------------------------------------------------------- the loop


def run_loop(
    setup: Setup, profile: OptimizationProfile, progress: Progress
) -> tuple[list[VariantRecord], str]:
    """Run variants until a stop rule fires; returns (all records, why it stopped)."""
    ws = setup.workspace
    baseline_rows = from_profile(profile.baseline_table)
    baseline_key = table_key(baseline_rows)
    while True:
        # the notebooks on disk are the loop's memory: read back before every choice (a
        # resumed run, or a person who edited a verdict, is planned from what is written)
        records = read_records(ws)
        best = best_record(records)
        parent_rows = from_profile(best.table) if best else baseline_rows
        parent_timings = best.measured if best else profile.baseline
        reason = stop_reason(
            records,
            max_variants=profile.max_variants,
            target=setup.target,
            best=parent_timings,
        )
        if reason is None and setup.past_deadline():
            reason = f"time budget spent ({setup.opts.deadline_s:.0f} s)"
        if reason is not None:
            break
        ctx = EditContext(
            rows=parent_rows, hit=regimes_hit(setup, parent_rows), varied=setup.varied
        )
        choice = plan_next(records, profile.strategies, ctx, baseline_key)
        if choice is None:
            reason = "no strategy left in the catalogue for this table"
            break
        version = len(records) + 1
        parent = best.version if best else 0
        progress(f"[Stage 2] v{version}: {choice.strategy.name} ({choice.why})")
        sweep_md: list[str] = []
        rows, change = choice.rows, choice.change
        if choice.strategy.name == SWEEP:
            result = launch_sweep(setup, parent_rows, progress)
            rows, sweep_md = result.rows, result.lines
            change = diff(parent_rows, rows)
            _write_sweep_csv(ws / f"v{version}_sweep.csv", result.csv_rows)
        record = _evaluate(
            setup,
            profile,
            version,
            parent,
            choice.strategy.name,
            rows,
            change,
            parent_timings,
            progress,
        )
        record.learnings = _learnings(record, records, choice.why)
        write_record(ws, record, setup.arch, sweep_md)
        progress(f"  v{version}: {record.verdict} — {record.reason}")
    best = best_record(records)
    (ws / "comparison.md").write_text(
        notebook.comparison_md(profile, records, reason, best.version if best else 0)
    )
    return records, reason


def _evaluate(
    setup: Setup,
    profile: OptimizationProfile,
    version: int,
    parent: int,
    strategy: str,
    rows: ArchRows,
    change: list[str],
    parent_timings: list[Timing],
    progress: Progress,
) -> VariantRecord:
    s = BY_NAME[strategy]
    base = dict(
        version=version,
        strategy=strategy,
        addresses=", ".join(s.addresses),
        parent=parent,
        placeholder=setup.placeholder,
        hypothesis=s.hypothesis,
        change=change,
        expected=s.expected,
        table=to_profile(rows),
    )
    if not change:
        return VariantRecord(
            **base,
            smoke_passed=True,
            smoke_detail="nothing to test: the table did not change",
            verdict="rejected",
            reason="no change: the current configs were already the best found",
        )
    passed, detail = run_smoke(setup, rows)
    if not passed:
        return VariantRecord(
            **base,
            smoke_passed=False,
            smoke_detail=detail,
            verdict="discarded",
            reason="the smoke test failed (wrong numbers or a crash): discarded unbenchmarked",
        )
    measured = measure_rows(setup, rows, progress, f"v{version}")
    checks, g, verdict, reason = judge(profile.goal, measured, parent_timings, profile.baseline)
    vs0 = gain(objective(profile.baseline, profile.goal), objective(measured, profile.goal))
    return VariantRecord(
        **base,
        smoke_passed=True,
        smoke_detail=detail,
        measured=measured,
        objective=objective(measured, profile.goal),
        gain_pct=round(100 * g, 3) if math.isfinite(g) else 0.0,
        vs_baseline_pct=round(100 * vs0, 3) if math.isfinite(vs0) else 0.0,
        guardrails=checks,
        verdict=verdict,
        reason=reason,
    )


def _learnings(r: VariantRecord, earlier: list[VariantRecord], why: str) -> list[str]:
    out = [f"chosen because: {why}"]
    if r.verdict == "accepted":
        out.append(f"{r.strategy} helps here ({r.gain_pct:+.2f}%): try it again on this base")
    elif r.verdict == "discarded":
        out.append(f"{r.strategy} produced configs that fail the smoke test: do not retry")
    else:
        out.append(f"{r.strategy} did not pay off ({r.reason}): not retried")
    worse = [c.detail for c in r.guardrails if not c.passed]
    out += [f"guardrail evidence: {w}" for w in worse]
    if earlier:
        out.append(f"{sum(e.verdict == 'accepted' for e in earlier)} earlier variant(s) accepted")
    return out


def _write_sweep_csv(path: Path, rows: list[dict]) -> None:
    if not rows:
        return
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
