"""Stage 3 — Finalize: the winner into the library table (gated by the op's tests), plots, report.

The winner's rows go into `TABLE[kernel][arch]` of `runtime/tables/<op>.py`, written as an arch
key. The file is backed up in the workspace first; the op's full test file then runs in a fresh
process (it imports the rewritten table) and decides: on failure the backup goes back, byte for
byte. A dry run (or `write_library=False`) writes the proposed file into the workspace only.
"""

from __future__ import annotations

import math
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

from kernelwright.profiles.optimization import OptimizationProfile, Timing, VariantRecord
from kernelwright.workflows.optimize import notebook
from kernelwright.workflows.optimize.guardrails import best_record
from kernelwright.workflows.optimize.resources import env_with_src
from kernelwright.workflows.optimize.setup import GateResult, Progress, Setup
from kernelwright.workflows.optimize.tables import (
    ArchRows,
    check_rewritten,
    from_profile,
    install,
    rewrite_table_source,
    write_entry,
)

GATE_TIMEOUT_S = 1800


@dataclass
class FinalizeResult:
    winner: VariantRecord | None
    rows: ArchRows  # the rows the run ends with (the winner's, or the baseline's)
    applied: str  # what happened to the library, in words
    library_written: bool = False
    gate: GateResult | None = None
    report: Path | None = None
    plots: list[Path] = field(default_factory=list)


def run_gate(setup: Setup) -> GateResult:
    """The op's full test file, in a fresh interpreter that imports the rewritten table."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", str(setup.test_file)]
    env = env_with_src()
    try:
        proc = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            cwd=setup.test_file.parents[1],
            env=env,
            timeout=GATE_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return GateResult(False, f"{' '.join(cmd)}: timed out after {GATE_TIMEOUT_S} s")
    tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
    return GateResult(proc.returncode == 0, f"$ {' '.join(cmd)}  (exit {proc.returncode})\n{tail}")


def plot(profile: OptimizationProfile, winner: VariantRecord | None, out_dir: Path) -> list[Path]:
    """Per mode: p50 time per shape of the original table, the optimized one and PyTorch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    series: dict[str, Sequence[Timing]] = {"original": profile.baseline}
    if winner is not None:
        series[f"optimized (v{winner.version})"] = winner.measured
    if profile.peers:
        series["PyTorch eager"] = profile.peers
    written = []
    for mode in profile.modes:
        shapes = [t.shape for t in profile.baseline if t.mode == mode]
        if not shapes:
            continue
        fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(shapes) + 3), 4.5))
        width = 0.8 / len(series)
        for i, (name, timings) in enumerate(series.items()):
            ms = {t.shape: t.ms_p50 for t in timings if t.mode == mode}
            xs = [j + i * width for j in range(len(shapes))]
            ax.bar(xs, [ms.get(s, math.nan) for s in shapes], width, label=name)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(shapes))], shapes, rotation=20)
        ax.set_ylabel("time, p50 [ms]")
        ax.set_yscale("log")
        ax.legend(fontsize=8)
        ax.grid(True, axis="y", alpha=0.3)
        note = " — PLACEHOLDER TIMINGS, NOT SPEEDS" if profile.placeholder else ""
        ax.set_title(f"{profile.op} {mode}, {profile.dtype}, {profile.gpu}{note}", fontsize=9)
        fig.tight_layout()
        path = out_dir / f"{profile.op}_{mode}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def finalize(
    setup: Setup,
    profile: OptimizationProfile,
    records: Sequence[VariantRecord],
    stop: str,
    progress: Progress,
) -> FinalizeResult:
    ws = setup.workspace
    winner = best_record(records)
    rows = from_profile(winner.table) if winner else from_profile(profile.baseline_table)
    result = FinalizeResult(winner, rows, "nothing: no variant beat the baseline")
    if winner is not None:
        comment = f"v{winner.version} ({winner.strategy}) on {profile.gpu}, {date.today()}"
        original = setup.table_path.read_text()
        proposed = rewrite_table_source(original, setup.arch, rows, comment)
        check_rewritten(proposed, setup.arch, rows)
        (ws / "proposed_table.py").write_text(proposed)
        if setup.placeholder or not setup.opts.write_library:
            why = "a dry run" if setup.placeholder else "library writes are off"
            result.applied = (
                f"not applied ({why}): the proposed table file is {ws / 'proposed_table.py'}"
            )
        else:
            result.library_written, result.gate = _apply(setup, rows, comment, progress)
            if result.gate.passed:
                result.applied = (
                    f"{setup.table_path} now holds the '{setup.arch}' entry of v{winner.version}; "
                    f"the op's tests pass (backup: {ws / 'table_backup.py'})"
                )
            else:
                result.applied = (
                    f"REVERTED: the op's tests failed with the new table, so {setup.table_path} "
                    f"was restored from {ws / 'table_backup.py'}. Gate output:\n\n"
                    f"```\n{result.gate.detail}\n```"
                )
    result.plots = plot(profile, winner, ws / "plots")
    report = ws / "report.md"
    report.write_text(
        notebook.report_md(
            profile,
            records,
            stop=stop,
            winner=winner,
            applied=result.applied,
            plots=result.plots,
            written=result.library_written,
        )
    )
    result.report = report
    return result


def _apply(
    setup: Setup, rows: ArchRows, comment: str, progress: Progress
) -> tuple[bool, GateResult]:
    backup = setup.workspace / "table_backup.py"
    shutil.copyfile(setup.table_path, backup)
    write_entry(setup.table_path, setup.arch, rows, comment)
    progress(f"[Stage 3] wrote {setup.table_path}; running the gate: {setup.test_file.name}")
    gate = (setup.opts.gate or (lambda: run_gate(setup)))()
    if gate.passed:
        install(setup.table, rows, [setup.arch])  # this process now matches the file
        return True, gate
    shutil.copyfile(backup, setup.table_path)
    progress("[Stage 3] the gate failed: the table file is restored")
    return False, gate
