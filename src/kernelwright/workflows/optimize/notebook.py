"""The Markdown a reviewer reads: profile.md, the lab notebooks vN_notes.md, comparison.md and
report.md. Each renders structured data (the profile, `VariantRecord`s) — the planner reads
that data (vN.json), never this text."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from kernelwright.profiles.optimization import (
    ConfigRow,
    OptimizationProfile,
    Timing,
    VariantRecord,
)
from kernelwright.workflows.optimize.guardrails import by_key
from kernelwright.workflows.optimize.strategies import L2_FLAGS
from kernelwright.workflows.optimize.tables import MAX_N_OPEN

BANNER = (
    "> **PLACEHOLDER TIMINGS** — a dry run: every time below comes from a model of the launch "
    "configs, not from a GPU. Correctness was checked (interpreter); speed was not.\n"
)


def _f(v: float, spec: str = ".4f") -> str:
    return format(v, spec) if isinstance(v, (int, float)) and math.isfinite(v) else "—"


def _device(p: OptimizationProfile) -> str:
    """The device's name and the architecture the timings were taken on, the architecture left
    out where the name already says it (the interpreter's)."""
    arch = p.device_arch
    return p.gpu if arch.lower() in p.gpu.lower() else f"{p.gpu} ({arch})"


def table_md(rows: dict[str, list[ConfigRow]]) -> list[str]:
    out = [
        "| kernel | max_n | block_n | num_warps | rows | num_stages | programs_per_sm | L2 flags |"
    ]
    out.append("|---|---|---|---|---|---|---|---|")
    for k, rs in rows.items():
        for r in rs:
            flags = [f for f in L2_FLAGS if getattr(r, f)]
            max_n = "∞" if r.max_n == MAX_N_OPEN else r.max_n  # the open-ended last row
            out.append(
                f"| {k} | {max_n} | {r.block_n} | {r.num_warps} | {r.rows} | {r.num_stages} "
                f"| {r.programs_per_sm} | {', '.join(flags) or '—'} |"
            )
    return out


def timings_md(timings: Sequence[Timing]) -> list[str]:
    out = ["| shape | mode | p50 ms | p20-p80 ms | peak MB | GB/s | % copy bw |"]
    out.append("|---|---|---|---|---|---|---|")
    for t in timings:
        band = f"{_f(t.ms_p20)}-{_f(t.ms_p80)}"
        out.append(
            f"| {t.shape} | {t.mode} | {_f(t.ms_p50)} | {band} | {_f(t.peak_mem_mb, '.1f')} "
            f"| {_f(t.gbps, '.0f')} | {_f(t.pct_copy_bw, '.0f')} |"
            + (f" error: {t.error}" if t.error else "")
        )
    return out


def profile_md(p: OptimizationProfile) -> str:
    lines = [f"# optimize {p.op}: profile", ""]
    if p.placeholder:
        lines += [BANNER]
    lines += [
        f"- {'device' if p.device_arch == 'interpreter' else 'GPU'}: {_device(p)}, "
        f"tuning the `{p.arch}` table entry",
        f"- goal: {p.goal}, scope: {p.scope} (kernels {', '.join(p.kernels)}; modes "
        f"{', '.join(p.modes)}), variant budget {p.max_variants}"
        + (f", target {p.target}" if p.target else ""),
        f"- dtype {p.dtype}; copy bandwidth {p.copy_gbps:.0f} GB/s; matmul rate "
        + (f"{p.matmul_tflops:.0f} TFLOP/s" if p.matmul_tflops else "not measured (no GPU)")
        + f"; timing: {p.timing}",
        f"- snapshots: `{p.table_snapshot}`, `{p.source_snapshot}`",
        "",
        "## Baseline (v0)",
        "",
        *timings_md(p.baseline),
        "",
    ]
    if p.peers:
        lines += ["PyTorch eager at the same points:", "", *timings_md(p.peers), ""]
    lines += ["## Launch table in effect", "", *table_md(p.baseline_table), ""]
    lines += ["## Compiler resources", ""]
    if p.resources:
        lines += ["| kernel | constants | warps | regs/thread | spills | shared B | occupancy |"]
        lines += ["|---|---|---|---|---|---|---|"]
        for k in p.resources:
            lines.append(
                f"| {k.kernel} | {k.constants} | {k.num_warps} | {k.registers_per_thread} | "
                f"{k.spills} | {k.shared_bytes} | {k.occupancy:.0%} ({k.limited_by}) |"
            )
    else:
        lines.append(p.resources_note)
    lines += ["", "## Nsight Compute", ""]
    lines += [f"- {k}: {v}" for k, v in p.ncu.items()] or [p.ncu_note]
    lines += ["", "## Roofline", ""]
    lines += ["| shape | mode | bytes | FLOPs | ms | GB/s | % copy bw | TFLOP/s | % matmul |"]
    lines += ["|---|---|---|---|---|---|---|---|---|"]
    for r in p.roofline:
        lines.append(
            f"| {r.shape} | {r.mode} | {r.bytes} | {r.flops} | {_f(r.ms)} | {_f(r.gbps, '.0f')} "
            f"| {_f(r.pct_copy_bw, '.0f')} | {_f(r.tflops, '.1f')} | {_f(r.pct_matmul, '.0f')} |"
        )
    lines += ["", f"## Bottleneck: {p.bottleneck.cls}", ""]
    lines += [f"- {e}" for e in p.bottleneck.evidence]
    lines += ["", "## Strategies, in the order the variant loop tries them", ""]
    lines += [f"{i}. `{s.name}` ({s.addresses}): {s.why}" for i, s in enumerate(p.strategies, 1)]
    lines += ["", "## Notes", ""] + [f"- {n}" for n in p.notes]
    lines += [
        "",
        "Edit profile.yaml to reorder or drop strategies, change the budget or the target; "
        "then resume.",
        "",
    ]
    return "\n".join(lines)


def variant_md(r: VariantRecord, sweep_md: Sequence[str] = ()) -> str:
    lines = [f"# v{r.version}: {r.strategy} — {r.verdict.upper()}", ""]
    if r.placeholder:
        lines += [BANNER]
    lines += [
        f"Built on v{r.parent}. Addresses: "
        + ("any bottleneck." if r.addresses == "any" else f"{r.addresses}."),
        "",
        "## Hypothesis",
        "",
        r.hypothesis,
        "",
        "## Change",
        "",
        *([f"- {c}" for c in r.change] or ["- none"]),
        "",
        "## Expected effect",
        "",
        r.expected,
        "",
    ]
    if sweep_md:
        lines += ["## Sweep", "", *sweep_md, ""]
    lines += ["## Smoke test", "", "passed" if r.smoke_passed else "FAILED — discarded", ""]
    if r.smoke_detail:
        lines += ["```", r.smoke_detail, "```", ""]
    lines += ["## Measured result", ""]
    if r.measured:
        lines += timings_md(r.measured)
        lines += [
            "",
            f"objective {_f(r.objective, '.5f')}: {r.gain_pct:+.2f}% over v{r.parent}"
            + (f", {r.vs_baseline_pct:+.2f}% over v0" if r.parent else ""),
        ]
    else:
        lines.append("not benchmarked")
    lines += ["", "## Guardrail checks", ""]
    lines += [f"- [{'x' if c.passed else ' '}] {c.name}: {c.detail}" for c in r.guardrails]
    if not r.guardrails:
        lines.append("- not reached")
    lines += ["", f"## Verdict: {r.verdict}", "", r.reason, "", "## Learnings", ""]
    lines += [f"- {x}" for x in r.learnings] or ["- none"]
    lines.append("")
    return "\n".join(lines)


def comparison_md(
    p: OptimizationProfile, records: Sequence[VariantRecord], stop: str, winner: int
) -> str:
    lines = [f"# optimize {p.op}: every variant", ""]
    if p.placeholder:
        lines += [BANNER]
    lines += [f"Stopped: {stop}. Winner: v{winner}" + (" (the baseline)" if not winner else "")]
    lines += ["", "| v | strategy | verdict | gain vs parent | vs v0 | reason |"]
    lines += ["|---|---|---|---|---|---|"]
    lines.append("| 0 | baseline | — | — | — | the table as found |")
    for r in records:
        lines.append(
            f"| {r.version} | {r.strategy} | {r.verdict} | {r.gain_pct:+.2f}% | "
            f"{r.vs_baseline_pct:+.2f}% | {r.reason} |"
        )
    keys = list(by_key(p.baseline))
    if keys:
        head = ["shape", "mode", "v0", *[f"v{r.version}" for r in records if r.measured]]
        lines += ["", "p50 ms per point:", "", "| " + " | ".join(head) + " |"]
        lines.append("|" + "---|" * len(head))
        base = by_key(p.baseline)
        per = [by_key(r.measured) for r in records if r.measured]
        for key in keys:
            cells = [key[0], key[1], _f(base[key].ms_p50)]
            cells += [_f(m[key].ms_p50) if key in m else "—" for m in per]
            lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    return "\n".join(lines)


def report_md(
    p: OptimizationProfile,
    records: Sequence[VariantRecord],
    *,
    stop: str,
    winner: VariantRecord | None,
    applied: str,
    plots: Sequence[Path],
    written: bool = False,
) -> str:
    """`written`: the winner's table is in the library now (else it was only proposed)."""
    tuned = f", the `{p.arch}` table entry" if p.arch != p.device_arch else ""
    lines = [f"# optimize {p.op} on {_device(p)}{tuned}", ""]
    if p.placeholder:
        lines += [BANNER]
    lines += [
        f"goal {p.goal}, scope {p.scope}, {len(records)} variant(s); stopped: {stop}.",
        "",
        f"**Winner:** v{winner.version} ({winner.strategy}), {winner.vs_baseline_pct:+.2f}% on "
        f"the objective over v0."
        if winner
        else "**No variant beat the baseline**: the table stays as it was.",
        "",
        f"**Applied:** {applied}",
        "",
        "## Before / after per shape",
        "",
    ]
    base = by_key(p.baseline)
    after = by_key(winner.measured) if winner else base
    peers = {(t.shape, t.mode): t for t in p.peers}
    lines += ["| shape | mode | before ms | after ms | speed-up | PyTorch ms |"]
    lines += ["|---|---|---|---|---|---|"]
    for key, b in base.items():
        a = after.get(key, b)
        ratio = b.ms_p50 / a.ms_p50 if a.ms_p50 > 0 else math.nan
        peer = peers.get(key)
        lines.append(
            f"| {key[0]} | {key[1]} | {_f(b.ms_p50)} | {_f(a.ms_p50)} | {_f(ratio, '.2f')}x | "
            f"{_f(peer.ms_p50) if peer else '—'} |"
        )
    if winner:
        title = "Table (dry run: not applied)" if p.placeholder else "Table (not applied)"
        lines += ["", f"## {'Table applied' if written else title}", "", *table_md(winner.table)]
    lines += ["", "## Variants", ""]
    lines += [f"- v{r.version} `{r.strategy}`: {r.verdict} — {r.reason}" for r in records] or [
        "- none tried"
    ]
    if plots:
        lines += ["", "## Plots", ""] + [f"![{q.stem}](plots/{q.name})" for q in plots]
    lines += ["", "Notebooks: `v*_notes.md`; all variants: `comparison.md`.", ""]
    return "\n".join(lines)
