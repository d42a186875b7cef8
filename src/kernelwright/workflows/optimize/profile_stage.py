"""Stage 1 — Profile: snapshot, baseline (v0), resources, roofline, bottleneck, strategies."""

from __future__ import annotations

import math
import shutil
from collections import Counter
from collections.abc import Sequence

import torch

from kernelwright.bench.harness import BenchRow
from kernelwright.bench.report import write_csv
from kernelwright.profiles import reviewed
from kernelwright.profiles.optimization import (
    Bottleneck,
    KernelResources,
    OptimizationProfile,
    RooflinePoint,
)
from kernelwright.workflows.optimize import notebook
from kernelwright.workflows.optimize.loop import run_smoke
from kernelwright.workflows.optimize.measure import OURS, row_problem, timing_of
from kernelwright.workflows.optimize.resources import compiled_kernels, ncu_metrics
from kernelwright.workflows.optimize.setup import PreflightError, Progress, Setup
from kernelwright.workflows.optimize.strategies import ordered
from kernelwright.workflows.optimize.tables import arch_rows, to_profile

MEMORY_BOUND_PCT = 60.0  # achieved bandwidth over copy bandwidth at which the op is memory-bound
# FLOP per byte above which an op with a FLOP model counts as compute-bound when no matmul rate
# was measured (a dry run): H100 ~990 TFLOP/s bf16 over ~3.3 TB/s is ~300; half of it leaves
# room for the real, lower rate. On a GPU the ridge is the measured matmul rate over the
# measured copy bandwidth.
RIDGE_FLOP_PER_BYTE = 150.0
MATMUL_N = 8192  # the bf16 square matmul timed for the matmul rate (1.1 TFLOP)
PEER = "torch"
PLACEHOLDER_TIMING = "placeholder (model of the launch configs)"


def measure_matmul_tflops(setup: Setup) -> float | None:
    """The bf16 matmul rate of this GPU (TFLOP/s, cuBLAS, same timer), or None off a GPU."""
    if setup.placeholder or setup.device.type != "cuda":
        return None
    gen = torch.Generator(device=setup.device).manual_seed(0)
    a, b = (
        torch.randn(MATMUL_N, MATMUL_N, device=setup.device, dtype=torch.bfloat16, generator=gen)
        for _ in range(2)
    )
    _, ms, _ = setup.bench.timer(lambda: torch.mm(a, b), lambda: None)
    return 2 * MATMUL_N**3 / (ms * 1e-3) / 1e12


def classify(
    rows: Sequence[BenchRow],
    resources: Sequence[KernelResources],
    matmul_tflops: float | None = None,
) -> tuple[Bottleneck, list[RooflinePoint]]:
    """Bottleneck class per (shape, mode) from the roofline position, and overall.

    The ridge between memory- and compute-bound is the measured matmul rate over the measured
    copy bandwidth (FLOP per byte) when both are known, else RIDGE_FLOP_PER_BYTE."""
    per_shape: dict[str, str] = {}
    evidence: list[str] = []
    roofline = []
    for r in rows:
        if r.provider != OURS or not r.ok:
            continue
        roofline.append(
            RooflinePoint(
                shape=r.shape,
                mode=r.mode,
                bytes=r.bytes,
                flops=r.flops,
                ms=r.ms_p50,
                gbps=round(r.gbps, 1),
                pct_copy_bw=round(r.pct_copy_bw, 1),
                tflops=r.tflops,
                pct_matmul=round(r.tflops / matmul_tflops * 100, 1)
                if matmul_tflops and r.flops
                else float("nan"),
            )
        )
        key = f"{r.shape} {r.mode}"
        measured = bool(matmul_tflops) and r.copy_gbps > 0
        ridge = matmul_tflops * 1e3 / r.copy_gbps if measured else RIDGE_FLOP_PER_BYTE
        if r.flops and r.flops / max(r.bytes, 1) > ridge:
            per_shape[key] = "compute-bound"
            rate = f" = {r.tflops / matmul_tflops:.0%} of the matmul rate" if measured else ""
            evidence.append(
                f"{key}: {r.flops / r.bytes:.0f} FLOP/byte, above the ridge ({ridge:.0f}"
                f"{' = matmul rate / copy bandwidth' if measured else ', assumed'}); "
                f"{r.tflops:.1f} TFLOP/s{rate}"
            )
        elif r.pct_copy_bw >= MEMORY_BOUND_PCT:
            per_shape[key] = "memory-bound"
            evidence.append(
                f"{key}: {r.gbps:.0f} GB/s = {r.pct_copy_bw:.0f}% of the copy bandwidth "
                f"({r.copy_gbps:.0f} GB/s)"
            )
        else:
            per_shape[key] = "latency-occupancy-bound"
            evidence.append(
                f"{key}: only {r.pct_copy_bw:.0f}% of the copy bandwidth ({r.gbps:.0f} of "
                f"{r.copy_gbps:.0f} GB/s) with a byte-bound op: latency or occupancy limits it"
            )
    for k in resources:
        if k.spills:
            evidence.append(
                f"{k.kernel} {k.constants}: {k.spills} spilled registers (register pressure)"
            )
        if k.occupancy < 0.25:
            evidence.append(
                f"{k.kernel} {k.constants}: occupancy {k.occupancy:.0%}, limited by {k.limited_by}"
            )
    if not per_shape:
        return Bottleneck(cls="latency-occupancy-bound", evidence=["no successful rows"]), []
    counts = Counter(per_shape.values())
    # ties: memory-bound first (the usual case for these ops), then latency, then compute
    rank = ["memory-bound", "latency-occupancy-bound", "compute-bound"]
    cls = max(rank, key=lambda c: (counts.get(c, 0), -rank.index(c)))
    summary = ", ".join(f"{n} {c}" for c, n in counts.most_common())
    evidence = [f"points: {summary}", *evidence]
    return Bottleneck(cls=cls, evidence=evidence, per_shape=per_shape), roofline


def run_profile(setup: Setup, progress: Progress) -> OptimizationProfile:
    ws, opts = setup.workspace, setup.opts
    snap = ws / "snapshot"
    snap.mkdir(parents=True, exist_ok=True)
    table_snap = snap / f"{opts.op}_table.py"
    source_snap = snap / f"{opts.op}.py"
    shutil.copyfile(setup.table_path, table_snap)
    shutil.copyfile(setup.op_source, source_snap)
    base_rows = arch_rows(setup.table, setup.kernels, setup.arch)

    # the smoke test must pass on the table as it is, or it cannot judge a variant (one shape:
    # this checks the op's provider and reference, the variants check every regime)
    passed, detail = run_smoke(setup, base_rows, first_only=True)
    if not passed:
        raise PreflightError(
            f"{opts.op}: the smoke test fails on the unchanged table, so it cannot judge "
            f"variants; fix the op (or its bench provider / reference) first.\n{detail}"
        )
    progress(f"[Stage 1] baseline v0: {len(setup.points)} shape(s) x {', '.join(setup.modes)}")
    on_row = _row_progress(progress, setup.placeholder)
    rows = setup.bench.run(setup.points, setup.modes, on_row=on_row)
    write_csv(rows, ws / "v0_bench.csv")
    peers: list[BenchRow] = []
    if PEER in setup.spec.provider_names:
        progress(f"[Stage 1] PyTorch eager ({PEER}) at the same points, for the report")
        peers = setup.bench.run(setup.points, setup.modes, provider=PEER)
        write_csv(peers, ws / "peers_bench.csv")

    resources, resources_note = [], ""
    if setup.device.type == "cuda":
        resources = compiled_kernels(opts.op, setup.arch)
        if not resources:
            resources_note = "no compiled kernel of the op was found in this process"
    else:
        resources_note = "not available: the interpreter compiles nothing (no GPU)"
    ncu: dict[str, float] = {}
    ncu_note = "not run: no GPU" if setup.device.type != "cuda" else "not run (ncu=False)"
    if setup.device.type == "cuda" and opts.ncu:
        largest = max(setup.points, key=lambda p: math.prod(row_problem(setup.spec, p.shape)))
        progress(f"[Stage 1] Nsight Compute at {largest.label} (if ncu is installed)")
        ncu, ncu_note = ncu_metrics(opts.op, largest.shape)

    matmul_tflops = measure_matmul_tflops(setup)
    if matmul_tflops is not None:
        progress(f"[Stage 1] matmul rate: {matmul_tflops:.0f} TFLOP/s (bf16 {MATMUL_N}^3, cuBLAS)")
    bottleneck, roofline = classify(rows, resources, matmul_tflops)
    notes = []
    if setup.placeholder:
        notes.append(
            "PLACEHOLDER: a dry run; timings come from a model of the launch configs "
            "(workflows/optimize/clock.py), correctness from the interpreter. Not speeds."
        )
    if opts.planted_regression:
        notes.append(f"planted regression: the '{setup.arch}' entry was de-tuned in-process")
    notes.append(
        "regimes measured (table rows a benchmark shape falls in) are the only ones a variant "
        "changes; the others keep their configs"
    )
    profile = OptimizationProfile(
        op=opts.op,
        placeholder=setup.placeholder,
        timing=PLACEHOLDER_TIMING if setup.placeholder else setup.ctx.timing,
        gpu=setup.ctx.gpu,
        device_arch=setup.install_archs[-1],
        arch=setup.arch,
        goal=opts.goal,
        scope=opts.scope,
        max_variants=opts.max_variants,
        target=str(setup.target) if setup.target else None,
        dtype=opts.dtype,
        planted_regression=opts.planted_regression,
        kernels=setup.kernels,
        modes=setup.modes,
        shapes=[p.shape for p in setup.points],
        table_module=f"kernelwright.runtime.tables.{opts.op}",
        table_snapshot=str(table_snap),
        source_snapshot=str(source_snap),
        baseline_table=to_profile(base_rows),
        copy_gbps=round(setup.ctx.copy_gbps, 1),
        matmul_tflops=round(matmul_tflops, 1) if matmul_tflops is not None else None,
        baseline=[timing_of(r) for r in rows],
        peers=[timing_of(r) for r in peers],
        resources=resources,
        resources_note=resources_note,
        ncu=ncu,
        ncu_note=ncu_note,
        roofline=roofline,
        bottleneck=bottleneck,
        strategies=ordered(bottleneck.cls),
        notes=notes,
    )
    # an edited profile.yaml stays; this run's goes beside it (profile.new.yaml) and the run stops
    setup.saved = reviewed.save_profile(profile, ws / "profile.yaml", force=opts.force)
    setup.saved.path.with_suffix(".md").write_text(notebook.profile_md(profile))
    return profile


def _row_progress(progress: Progress, placeholder: bool = False):
    unit = "ms (placeholder)" if placeholder else "ms"

    def on_row(r: BenchRow) -> None:
        status = f"{r.ms_p50:.4f} {unit}" if r.ok else f"error: {r.error}"
        progress(f"  {r.provider} {r.shape} {r.mode}: {status}")

    return on_row
