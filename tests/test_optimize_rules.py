"""The optimize workflow's rules as pure functions: target parsing, guardrails, verdicts, stop
rules, the planner, the table-file rewrite, occupancy and the placeholder clock."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kernelwright.profiles.optimization import StrategyRef, Timing, VariantRecord
from kernelwright.runtime.launch import LaunchConfig as C
from kernelwright.runtime.launch import two_pass_flags
from kernelwright.runtime.tables import rms_norm as rms_table
from kernelwright.workflows.optimize import detuned, parse_target
from kernelwright.workflows.optimize.clock import FakeClock
from kernelwright.workflows.optimize.guardrails import judge, noise, stop_reason
from kernelwright.workflows.optimize.resources import SMLimits, occupancy
from kernelwright.workflows.optimize.strategies import (
    BY_NAME,
    CATALOGUE,
    SWEEP,
    EditContext,
    ordered,
    plan_next,
    table_key,
)
from kernelwright.workflows.optimize.tables import (
    check_rewritten,
    installed,
    rewrite_table_source,
    to_profile,
)

# --------------------------------------------------------------------------- target


def test_target_parsing():
    t = parse_target("full < 0.3 ms at 8192x4096")
    assert (t.mode, t.ms, t.shape, t.inclusive) == ("full", 0.3, "8192x4096", False)
    assert t.met(0.29) and not t.met(0.3)
    t = parse_target("bwd <= 250 us at 4096x8192")
    assert (t.mode, t.shape, t.inclusive) == ("backward", "4096x8192", True)
    assert t.ms == pytest.approx(0.25) and t.met(0.25)
    assert parse_target("Forward<1ms at 1x2").mode == "forward"
    for bad in ("full < 0.3 at 8192x4096", "speed < 1 ms at 8x8", "full > 1 ms at 8x8", ""):
        with pytest.raises(ValueError, match="MODE < VALUE UNIT at SHAPE"):
            parse_target(bad)


# --------------------------------------------------------------------------- guardrails


def T(shape, mode, ms, mem=100.0, spread=0.0):
    return Timing(
        shape=shape,
        mode=mode,
        ms_p20=ms * (1 - spread),
        ms_p50=ms,
        ms_p80=ms * (1 + spread),
        peak_mem_mb=mem,
    )


def points(fwd, bwd, mem_f=100.0, mem_b=100.0, spread=0.0):
    return [
        T("8192x4096", "forward", fwd, mem_f, spread),
        T("8192x4096", "backward", bwd, mem_b, spread),
    ]


def test_non_target_metric_regression_over_5pct_is_rejected():
    parent = points(1.0, 2.0, 1000.0, 1000.0)
    # 20% faster, but 6% (60 MB) more memory on the backward: rejected for goal speed
    faster = points(0.8, 1.6, 1000.0, 1060.0)
    checks, g, verdict, reason = judge("speed", faster, parent, parent)
    assert g > 0.2 and verdict == "rejected" and "non-target" in reason
    assert not checks[0].passed and "memory +6.0%" in checks[0].detail
    # 4% more memory is within the limit
    _, _, verdict, _ = judge("speed", points(0.8, 1.6, 1000.0, 1040.0), parent, parent)
    assert verdict == "accepted"
    # +10% of a small peak is a few MB: under the absolute floor, not a regression
    small = points(1.0, 2.0, 50.0, 50.0)
    _, _, verdict, _ = judge("speed", points(0.8, 1.6, 50.0, 55.0), small, small)
    assert verdict == "accepted"
    # goal memory: time is the non-target metric
    _, _, verdict, reason = judge("memory", points(1.07, 2.0, 90.0, 90.0), parent, points(9, 9))
    assert verdict == "rejected" and "time" in reason


def test_one_pass_may_not_lose_over_10pct_to_gain_in_another():
    parent = points(1.0, 2.0)
    baseline = points(5.0, 5.0)  # far slower: only the pass-trade rule can reject
    checks, g, verdict, reason = judge("speed", points(1.12, 1.4), parent, baseline)
    assert g > 0 and verdict == "rejected" and "no pass slower" in reason
    assert "forward +12.0%" in checks[1].detail
    _, _, verdict, _ = judge("speed", points(1.08, 1.4), parent, baseline)
    assert verdict == "accepted"


def test_never_slower_than_baseline_beyond_noise():
    baseline = points(1.0, 2.0, spread=0.01)  # spread under the 2% floor: noise is 2%
    assert noise(baseline[0]) == pytest.approx(0.02)
    parent = points(1.5, 2.5)
    # a gain over the parent, but the forward is 3% slower than the baseline
    _, g, verdict, reason = judge("speed", points(1.03, 1.0), parent, baseline)
    assert g > 0 and verdict == "rejected" and "baseline" in reason
    # within a noisy baseline's own spread (p20-p80 = 10%) the same is accepted
    noisy = points(1.0, 2.0, spread=0.05)
    _, _, verdict, _ = judge("speed", points(1.03, 1.0), parent, noisy)
    assert verdict == "accepted"


def test_gain_under_1pct_is_not_accepted():
    parent = points(1.0, 2.0)
    _, g, verdict, reason = judge("speed", points(0.995, 1.99), parent, parent)
    assert 0 < g < 0.01 and verdict == "rejected" and "1% bar" in reason


def test_benchmark_errors_reject():
    parent = points(1.0, 2.0)
    bad = points(0.5, 1.0)
    bad[1].error = "OutOfResources: shared memory"
    _, _, verdict, reason = judge("speed", bad, parent, parent)
    assert verdict == "rejected" and "OutOfResources" in reason


def R(version, verdict, gain_pct=0.0, strategy="fewer_warps", table=None, measured=None):
    return VariantRecord(
        version=version,
        strategy=strategy,
        addresses="any",
        parent=0,
        placeholder=True,
        hypothesis="",
        change=[],
        expected="",
        table=table or {},
        smoke_passed=verdict != "discarded",
        verdict=verdict,
        gain_pct=gain_pct,
        measured=measured or [],
    )


def test_stop_rules():
    t = parse_target("forward < 0.5 ms at 8192x4096")
    best = points(1.0, 2.0)
    assert stop_reason([], max_variants=8, target=None, best=best) is None
    assert stop_reason([], max_variants=8, target=t, best=points(0.4, 2.0)).startswith("target")
    assert stop_reason([], max_variants=8, target=t, best=best) is None
    two_small = [R(1, "accepted", 30.0), R(2, "accepted", 0.5), R(3, "rejected", 12.0)]
    assert "two consecutive" in stop_reason(two_small, max_variants=8, target=None, best=best)
    # a big gain in between resets the count
    mixed = [R(1, "rejected"), R(2, "accepted", 5.0), R(3, "rejected")]
    assert stop_reason(mixed, max_variants=8, target=None, best=best) is None
    assert "budget" in stop_reason(mixed, max_variants=3, target=None, best=best)


# --------------------------------------------------------------------------- planner


def _ctx():
    rows = {
        "fwd": [(1024, C(block_n=1024, rows=4, num_warps=8)), (8192, C(block_n=8192))],
        "bwd": [(1024, C(block_n=1024, rows=4, num_warps=8, programs_per_sm=2))],
    }
    hit = {"fwd": {0: [1024]}, "bwd": {0: [1024]}}
    varied = {
        "fwd": {"block_n", "num_warps", "rows"},
        "bwd": {"block_n", "num_warps", "rows", "programs_per_sm"},
    }
    return EditContext(rows=rows, hit=hit, varied=varied)


def test_planner_v1_is_the_sweep_then_follows_the_notebooks():
    ctx = _ctx()
    strategies = ordered("latency-occupancy-bound")
    base_key = table_key(ctx.rows)
    assert plan_next([], strategies, ctx, base_key).strategy.name == "launch_sweep"
    sweep = R(1, "rejected", strategy="launch_sweep", table=to_profile(ctx.rows))
    first = plan_next([sweep], strategies, ctx, base_key)
    assert first.strategy.name == "more_rows_short_rows"
    assert first.change == ["fwd n<=1024: rows 4 -> 8", "bwd n<=1024: rows 4 -> 8"]
    assert first.rows["fwd"][1] == ctx.rows["fwd"][1]  # an unmeasured regime is not touched
    # it lost: not retried; the next strategy in order comes
    lost = R(2, "rejected", strategy="more_rows_short_rows", table=to_profile(first.rows))
    second = plan_next([sweep, lost], strategies, ctx, base_key)
    assert second.strategy.name == "fewer_warps"
    # fewer_warps won: it goes first again (on the new best), and more_warps (its undo) never
    won = R(3, "accepted", 4.0, strategy="fewer_warps", table=to_profile(second.rows))
    ctx2 = EditContext(rows=second.rows, hit=ctx.hit, varied=ctx.varied)
    third = plan_next([sweep, lost, won], strategies, ctx2, base_key)
    assert third.strategy.name == "fewer_warps" and "won before" in third.why
    names = [s.name for s in strategies]
    assert names.index("more_warps") > names.index("fewer_warps")


def test_planner_is_deterministic():
    ctx = _ctx()
    strategies = ordered("memory-bound")
    recs = [R(1, "accepted", 10.0, strategy="launch_sweep", table=to_profile(ctx.rows))]
    picks = {
        (c.strategy.name, table_key(c.rows))
        for c in (plan_next(recs, strategies, ctx, "x") for _ in range(5))
    }
    assert len(picks) == 1


def test_planner_skips_tables_already_measured():
    ctx = _ctx()
    strategies = [StrategyRef(name="more_partial_sums", addresses="", why="")]
    sweep = R(1, "accepted", 5.0, strategy="launch_sweep", table=to_profile(ctx.rows))
    choice = plan_next([sweep], strategies, ctx, "x")
    assert choice.strategy.name == "more_partial_sums"
    same = R(2, "accepted", 2.0, strategy="other", table=to_profile(choice.rows))
    assert plan_next([sweep, same], strategies, ctx, "x") is None


def _looped_ctx(varied=("evict_hints", "reverse_pass")):
    # a softmax-like forward: fused up to 65536, looped past it; measured at 20000 (looped by
    # a 4096 row), 50000 (fused) and 131072 (looped)
    rows = {
        "fwd": [
            (32768, C(block_n=4096, num_warps=16)),
            (65536, C(block_n=65536, num_warps=16)),
            (2**31 - 1, C(block_n=4096, num_warps=16)),
        ]
    }
    hit = {"fwd": {0: [20000], 1: [50000], 2: [131072]}}
    return EditContext(rows=rows, hit=hit, varied={"fwd": {"block_n", "num_warps", *varied}})


def test_kernel_code_strategies_are_table_edits():
    # every catalogue strategy but the sweep is automated: nothing is left "not automated"
    assert all(s.edit is not None for s in CATALOGUE if s.name != SWEEP)
    assert not any("not automated" in r.why for r in ordered("memory-bound"))
    ctx = _looped_ctx()
    ev = BY_NAME["eviction_hints"].edit(ctx)["fwd"]
    # on the two regimes whose measured rows are walked twice, never on the fused one
    assert [c.evict_hints for _, c in ev] == [True, False, True]
    assert all(not c.reverse_pass for _, c in ev)
    rev = BY_NAME["reverse_second_pass"].edit(ctx)["fwd"]
    assert [c.reverse_pass for _, c in rev] == [True, False, True]
    one = BY_NAME["one_pass"].edit(ctx)["fwd"]
    # 20000 fits a 32768 block at 16 warps (64 values a thread); 131072 is too long to hold
    assert one[0][1] == C(block_n=32768, num_warps=16)
    assert one[1:] == ctx.rows["fwd"][1:]
    # a kernel whose table never sets the flags does not read them: no edit
    plain = _looped_ctx(varied=())
    assert BY_NAME["eviction_hints"].edit(plain) == plain.rows
    # a flag already on is not "changed" again
    on = EditContext(rows={"fwd": ev}, hit=ctx.hit, varied=ctx.varied)
    assert BY_NAME["eviction_hints"].edit(on) == on.rows


def test_planner_reaches_the_l2_strategies_and_one_pass_undoes_the_split():
    ctx = _looped_ctx()
    names = ["eviction_hints", "reverse_second_pass", "one_pass", "split_long_rows"]
    strategies = [StrategyRef(name=n, addresses="", why="") for n in names]
    sweep = R(1, "accepted", 5.0, strategy="launch_sweep", table=to_profile(ctx.rows))
    first = plan_next([sweep], strategies, ctx, "x")
    assert first.strategy.name == "eviction_hints"
    assert first.change == [
        "fwd n<=32768: evict_hints False -> True",
        "fwd n<=2**31 - 1: evict_hints False -> True",
    ]
    lost = R(2, "rejected", strategy="eviction_hints", table=to_profile(first.rows))
    assert plan_next([sweep, lost], strategies, ctx, "x").strategy.name == "reverse_second_pass"
    won = R(2, "accepted", 3.0, strategy="one_pass", table=to_profile(first.rows))
    rest = [n for n in names if n != "one_pass"]
    strategies = [StrategyRef(name=n, addresses="", why="") for n in ["split_long_rows", *rest]]
    nxt = plan_next([sweep, won], strategies, ctx, "x")
    assert nxt.strategy.name != "split_long_rows"  # its opposite won


def test_two_pass_flags():
    assert two_pass_flags(C(block_n=4096)) == {"EVICT_1ST": "", "EVICT_2ND": "", "REVERSE": False}
    on = C(block_n=4096, evict_hints=True, reverse_pass=True)
    assert two_pass_flags(on) == {
        "EVICT_1ST": "evict_last",
        "EVICT_2ND": "evict_first",
        "REVERSE": True,
    }
    # no second pass in this launch: nothing is kept in L2 for it
    assert two_pass_flags(on, reuse=False)["EVICT_1ST"] == ""


# --------------------------------------------------------------------------- the table file


def test_table_rewrite_adds_then_replaces_an_arch_entry(tmp_path):
    src = Path(rms_table.__file__).read_text()
    entries = {
        "fwd": [(4096, C(block_n=4096, num_warps=8)), (2**31 - 1, C(block_n=8192, num_warps=16))],
        "bwd": [(2**31 - 1, C(block_n=4096, rows=2, num_warps=16, programs_per_sm=4))],
    }
    once = rewrite_table_source(src, "hopper", entries, "v1 (launch_sweep) on H100, test")
    check_rewritten(once, "hopper", entries)
    namespace: dict = {}
    exec(compile(once, "t", "exec"), namespace)
    for k in ("fwd", "bwd"):  # every other entry as it was
        assert namespace["TABLE"][k]["default"] == rms_table.TABLE[k]["default"]
        assert namespace["TABLE"][k]["interpreter"] == rms_table.TABLE[k]["interpreter"]
    assert "(2**31 - 1, C(block_n=8192, num_warps=16))," in once
    # the L2 flags are written when set and read back
    flagged = {"fwd": [(2**31 - 1, C(block_n=4096, num_warps=16, evict_hints=True))]}
    with_flags = rewrite_table_source(src, "hopper", flagged, "flags")
    check_rewritten(with_flags, "hopper", flagged)
    assert "C(block_n=4096, num_warps=16, evict_hints=True)" in with_flags
    # a second write replaces the entry and its comment instead of adding another
    entries2 = {"fwd": [(2**31 - 1, C(block_n=8192, num_warps=4))]}
    twice = rewrite_table_source(once, "hopper", entries2, "v2")
    check_rewritten(twice, "hopper", entries2)
    assert twice.count('"hopper": [') == 2 and twice.count("kernelwright optimize:") == 2
    assert "# kernelwright optimize: v2" in twice
    with pytest.raises(ValueError):
        check_rewritten(twice, "hopper", entries)
    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    if not Path(ruff).exists():
        pytest.skip("ruff is not installed: the format check needs it")
    f = tmp_path / "table.py"
    f.write_text(twice)
    out = subprocess.run([ruff, "format", "--check", "--line-length", "100", str(f)])
    assert out.returncode == 0, "the rewritten table is not ruff-formatted"


def test_installed_swaps_and_restores():
    table = {"fwd": {"default": [(10, C(block_n=16))]}}
    rows = {"fwd": [(10, C(block_n=32))]}
    with installed(table, rows, ["hopper", "interpreter"]):
        assert table["fwd"]["hopper"] == rows["fwd"] == table["fwd"]["interpreter"]
    assert table == {"fwd": {"default": [(10, C(block_n=16))]}}
    table["fwd"]["hopper"] = [(10, C(block_n=64))]
    with pytest.raises(RuntimeError), installed(table, rows, ["hopper"]):
        raise RuntimeError("a failing measurement")
    assert table["fwd"]["hopper"] == [(10, C(block_n=64))]


# --------------------------------------------------------------------------- hardware


def test_occupancy_from_the_resource_report():
    hopper = SMLimits()
    assert occupancy(32, 4, 0, hopper) == (1.0, "registers")  # 16 blocks by regs and threads
    occ, by = occupancy(128, 8, 0, hopper)  # 4096 regs/warp x 8 warps: 2 blocks
    assert occ == pytest.approx(0.25) and by == "registers"
    occ, by = occupancy(16, 1, 100 * 1024, hopper)
    assert by == "shared memory" and occ == pytest.approx(2 / 64)


def test_placeholder_clock_times_a_detuned_table_slower():
    table = {k: {"default": list(v["default"])} for k, v in rms_table.TABLE.items()}
    clock = FakeClock(table, "hopper")
    tuned = {n: clock.ms(8192, n, "full") for n in (1024, 4096, 16384)}
    for k in table:
        table[k]["hopper"] = detuned(table[k]["default"])
    for n, t in tuned.items():
        assert clock.ms(8192, n, "full") > 1.5 * t
    # as a harness timer: the modelled time of the point it was pointed at, never calling fn
    p20, p50, p80 = clock.at(8192, 4096, "full")(_never, _never)
    assert p50 == clock.ms(8192, 4096, "full") and p20 < p50 < p80


def _never():
    raise AssertionError("the placeholder clock must not run the op")


def test_ridge_is_the_measured_matmul_rate_over_the_copy_bandwidth():
    # 170 FLOP/byte: over the assumed ridge (150) with no matmul rate; under the measured one
    # (800 TFLOP/s over 4000 GB/s = 200 FLOP/byte), where 90% of copy bandwidth is memory-bound
    from kernelwright.bench.harness import BenchRow
    from kernelwright.workflows.optimize.profile_stage import classify

    row = BenchRow(op="x", mode="forward", provider="kernelwright", x_name="n", x_value=1,
                   shape="8x8", dtype="bfloat16", ms_p50=1.0, bytes=10**9, gbps=1000.0,
                   pct_copy_bw=90.0, copy_gbps=4000.0, flops=170 * 10**9, tflops=170.0)  # fmt: skip
    assumed, _ = classify([row], [])
    assert assumed.per_shape == {"8x8 forward": "compute-bound"}
    measured, roofline = classify([row], [], matmul_tflops=800.0)
    assert measured.per_shape == {"8x8 forward": "memory-bound"}
    assert roofline[0].pct_matmul == pytest.approx(21.2, abs=0.1)
    row.flops, row.tflops = 300 * 10**9, 300.0  # 300 FLOP/byte: over the measured ridge
    measured, _ = classify([row], [], matmul_tflops=800.0)
    assert measured.per_shape == {"8x8 forward": "compute-bound"}
    assert "38% of the matmul rate" in " ".join(measured.evidence)
