"""The variant loop's rules: objective, guardrails, verdict and when to stop. Pure functions of
measurements, so the CPU suite tests them with made-up numbers.

- objective: the geometric mean, over every measured (shape, mode), of the goal's metric —
  p50 time for "speed", peak memory for "memory", sqrt(time x memory) for "balanced". Lower wins.
- guardrails (a variant failing one is rejected, whatever it gains):
  1. the non-target metric (memory for "speed", time for "memory"; both for "balanced") may not
     regress by more than 5% at any (shape, mode) against the variant it was built on (memory:
     and by more than MEMORY_FLOOR_MB);
  2. one pass (forward / backward) may not get more than 10% slower at any shape to gain in
     another;
  3. no (shape, mode) may be slower than the baseline (v0) by more than noise — the baseline's
     own p20-p80 spread, at least 2%.
- accepted: every guardrail holds and the objective improves by at least 1% over the parent.
- stop: at the variant budget, after two consecutive variants under 1% gain (a rejected variant
  gains nothing), or when the target is met.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from kernelwright.bench.report import geomean
from kernelwright.profiles.optimization import GuardrailCheck, Timing, VariantRecord
from kernelwright.workflows.optimize.target import Target

NOISE_FLOOR = 0.02
NON_TARGET_LIMIT = 0.05
# Peak memory of one op call is a small number next to a training step's; a few MB (the fp32
# partial sums of a persistent backward, an allocator block of 2 MB) is not a regression
# worth giving up speed for. Memory counts as regressed past 5% AND past this many MB.
MEMORY_FLOOR_MB = 16.0
PASS_TRADE_LIMIT = 0.10
MIN_GAIN = 0.01
PASSES = ("forward", "backward")

Key = tuple[str, str]  # (shape, mode)


def by_key(timings: Iterable[Timing]) -> dict[Key, Timing]:
    return {(t.shape, t.mode): t for t in timings if t.provider == "kernelwright"}


def _metric(t: Timing, goal: str) -> float:
    if goal == "speed":
        return t.ms_p50
    if goal == "memory":
        return t.peak_mem_mb
    return math.sqrt(t.ms_p50 * t.peak_mem_mb)


def objective(timings: Iterable[Timing], goal: str) -> float:
    """Geometric mean of the goal's metric over every (shape, mode); NaN if one is missing."""
    return geomean([_metric(t, goal) for t in by_key(timings).values()])


def gain(parent: float, child: float) -> float:
    """Fractional improvement of a lower-is-better objective (0.1: 10% better)."""
    if not (math.isfinite(parent) and math.isfinite(child)) or child <= 0:
        return math.nan
    return parent / child - 1.0


def noise(t: Timing) -> float:
    """Relative timing noise of one measurement: its p20-p80 spread, at least the floor."""
    if t.ms_p50 > 0 and math.isfinite(t.ms_p80) and math.isfinite(t.ms_p20):
        return max(NOISE_FLOOR, (t.ms_p80 - t.ms_p20) / t.ms_p50)
    return NOISE_FLOOR


def _rel(new: float, old: float) -> float:
    return new / old - 1.0 if math.isfinite(new) and math.isfinite(old) and old > 0 else math.nan


def memory_regressed(new: float, old: float, metric: str = "memory") -> bool:
    """Past the absolute floor (time has none: its relative limit is the whole rule)."""
    return metric != "memory" or new - old > MEMORY_FLOOR_MB


def check_non_target(goal: str, variant: dict, parent: dict) -> GuardrailCheck:
    metrics = {"speed": ["memory"], "memory": ["time"], "balanced": ["time", "memory"]}[goal]
    worst: list[str] = []
    unmeasured = 0
    for key, t in variant.items():
        p = parent.get(key)
        if p is None:
            continue
        for metric in metrics:
            new, old = (t.ms_p50, p.ms_p50) if metric == "time" else (t.peak_mem_mb, p.peak_mem_mb)
            r = _rel(new, old)
            if math.isnan(r):
                unmeasured += 1
            elif r > NON_TARGET_LIMIT and memory_regressed(new, old, metric):
                worst.append(f"{key[0]} {key[1]} {metric} +{100 * r:.1f}%")
    name = f"non-target metric ({' and '.join(metrics)}) within +{100 * NON_TARGET_LIMIT:.0f}%"
    if worst:
        return GuardrailCheck(name=name, passed=False, detail="; ".join(worst))
    detail = "every point within the limit"
    if unmeasured:
        detail += f" ({unmeasured} point(s) not measured on this device: not checked)"
    return GuardrailCheck(name=name, passed=True, detail=detail)


def check_pass_trade(variant: dict, parent: dict) -> GuardrailCheck:
    name = f"no pass slower by more than {100 * PASS_TRADE_LIMIT:.0f}% to gain in another"
    slower, faster = [], False
    for key, t in variant.items():
        p = parent.get(key)
        if p is None or key[1] not in PASSES:
            continue
        r = _rel(t.ms_p50, p.ms_p50)
        if r > PASS_TRADE_LIMIT:
            slower.append(f"{key[0]} {key[1]} +{100 * r:.1f}%")
        elif r < 0:
            faster = True
    if slower and faster:
        return GuardrailCheck(name=name, passed=False, detail="; ".join(slower))
    if slower:  # slower everywhere it moved: no gain elsewhere to trade it for
        detail = "no pass got faster, so no trade (slower: " + "; ".join(slower) + ")"
        return GuardrailCheck(name=name, passed=True, detail=detail)
    return GuardrailCheck(name=name, passed=True, detail="no such trade")


def check_vs_baseline(variant: dict, baseline: dict) -> GuardrailCheck:
    name = "no shape slower than the baseline by more than noise"
    bad = []
    for key, t in variant.items():
        b = baseline.get(key)
        if b is None:
            continue
        r, limit = _rel(t.ms_p50, b.ms_p50), noise(b)
        if r > limit:
            bad.append(f"{key[0]} {key[1]} +{100 * r:.1f}% (noise {100 * limit:.1f}%)")
    return GuardrailCheck(name=name, passed=not bad, detail="; ".join(bad) or "none slower")


def judge(
    goal: str,
    variant: Sequence[Timing],
    parent: Sequence[Timing],
    baseline: Sequence[Timing],
) -> tuple[list[GuardrailCheck], float, str, str]:
    """(guardrail checks, gain over the parent, verdict, reason) of a measured variant."""
    v, p, b = by_key(variant), by_key(parent), by_key(baseline)
    errors = [f"{k[0]} {k[1]}: {t.error}" for k, t in v.items() if t.error]
    checks = [check_non_target(goal, v, p), check_pass_trade(v, p), check_vs_baseline(v, b)]
    g = gain(objective(parent, goal), objective(variant, goal))
    if errors:
        return checks, g, "rejected", "benchmark errors: " + "; ".join(errors)
    broken = [f"{c.name} ({c.detail})" for c in checks if not c.passed]
    if broken:
        return checks, g, "rejected", "a guardrail does not hold: " + "; ".join(broken)
    bar = f"an accepted variant must clear the {100 * MIN_GAIN:.0f}% bar"
    if not math.isfinite(g):
        return checks, g, "rejected", f"the objective could not be measured here; {bar}"
    if g < MIN_GAIN:
        return checks, g, "rejected", f"the objective moved {100 * g:+.2f}%; {bar}"
    return checks, g, "accepted", f"objective {100 * g:+.2f}% over its parent; guardrails hold"


def realized_gain(r: VariantRecord) -> float:
    return r.gain_pct / 100.0 if r.verdict == "accepted" else 0.0


def best_record(records: Sequence[VariantRecord]) -> VariantRecord | None:
    """The last accepted variant: each accepted one improved on the one before."""
    accepted = [r for r in records if r.verdict == "accepted"]
    return accepted[-1] if accepted else None


def target_met(target: Target | None, timings: Sequence[Timing]) -> bool:
    if target is None:
        return False
    t = by_key(timings).get((target.shape, target.mode))
    return t is not None and math.isfinite(t.ms_p50) and target.met(t.ms_p50)


def stop_reason(
    records: Sequence[VariantRecord],
    *,
    max_variants: int,
    target: Target | None,
    best: Sequence[Timing],
) -> str | None:
    """Why the loop stops now, or None to go on."""
    if target_met(target, best):
        return f"target met: {target}"
    if len(records) >= max_variants:
        return f"variant budget spent ({max_variants})"
    if len(records) >= 2 and all(realized_gain(r) < MIN_GAIN for r in records[-2:]):
        return "two consecutive variants under 1% gain"
    return None
