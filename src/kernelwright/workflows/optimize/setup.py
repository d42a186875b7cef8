"""Options, pre-flight checks and the run's shared state (`Setup`).

Pre-flight confirms, before anything is measured: the op's registry entry, its module with the
function and the fp32 reference the entry names, its launch-config table, its benchmark spec,
its test file (the Finalize gate), a results database its rows can be appended to and a CUDA
GPU (both unless `--dry-run`), that `--gpu` names the GPU actually present, and that the goal
can be measured. Any failure raises `PreflightError`
saying what is missing and what to do.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from kernelwright import registry
from kernelwright.bench.db import ResultsDB, ResultsDBError
from kernelwright.bench.harness import RunContext, Timer, default_timer, make_context
from kernelwright.bench.specs import BenchSpec, get_spec
from kernelwright.profiles.reviewed import Saved
from kernelwright.runtime import default_device, device_info, interpreter_mode
from kernelwright.runtime.fanout import Fanout, parse_workers
from kernelwright.runtime.launch import Table
from kernelwright.workflows.optimize.clock import FakeClock, is_backward_kernel
from kernelwright.workflows.optimize.measure import Bench, Point, points_of
from kernelwright.workflows.optimize.strategies import VARIABLE_FIELDS, field_varied
from kernelwright.workflows.optimize.tables import get_table, table_module
from kernelwright.workflows.optimize.target import Target, parse_target

GOALS = ("speed", "memory", "balanced")
SCOPES = ("forward", "backward", "all")
GPUS = ("auto", "ampere", "hopper", "blackwell")
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
REPO_ROOT = Path(__file__).resolve().parents[4]  # src/kernelwright/workflows/optimize -> repo


class PreflightError(RuntimeError):
    """A pre-flight check failed; the message says what and what to do."""


Progress = Callable[[str], None]


@dataclass
class GateResult:
    passed: bool
    detail: str  # the command and the tail of its output


@dataclass
class OptimizeOptions:
    op: str
    goal: str = "speed"
    scope: str = "all"
    gpu: str = "auto"
    max_variants: int = 8
    target: str | None = None
    yes: bool = False  # run on after Stage 1 instead of stopping for review
    dry_run: bool = False  # placeholder timings (FakeClock); never touches the library
    resume: bool = False  # continue from the reviewed profile.yaml in the workspace
    force: bool = False  # overwrite an edited profile.yaml (else the new one goes beside it)
    workspace: Path | None = None  # default kernelwright-runs/optimize/<op>
    write_library: bool = True  # Finalize rewrites the table file (never in a dry run)
    planted_regression: bool = False  # the caller de-tuned the arch entry (recorded only)
    shapes: list[dict[str, int]] | None = None  # benchmark points instead of the spec's sweeps
    quick: bool = False  # the spec's quick sweeps instead of the full ones
    dtype: str = "bfloat16"
    ncu: bool = True
    timer: Timer | None = None  # GPU timer (default: the harness's cuda_timer)
    # time GPU work alone (see bench.harness.cuda_timer): a launch config changes the kernel,
    # and at small shapes the host's launch overhead would hide the difference
    hide_host: bool = True
    deadline_s: float | None = None  # wall-clock budget of the variant loop
    execute: bool = True  # False: placeholder rows without running kernels (tests)
    gate: Callable[[], GateResult] | None = None  # Finalize's test gate (tests inject one)
    table_path: Path | None = None  # the table file Finalize rewrites (tests: a copy)
    # the launch sweep's candidates over this many GPUs at once ("auto": every visible one);
    # 1: in this process (runtime/fanout.py)
    workers: int | str = 1


@dataclass
class Setup:
    opts: OptimizeOptions
    spec: BenchSpec
    table: Table
    table_path: Path
    op_source: Path
    test_file: Path
    arch: str  # the table key tuned
    install_archs: list[str]  # keys a variant is installed under while measured
    kernels: list[str]
    varied: dict[str, set[str]]
    modes: list[str]
    points: list[Point]
    target: Target | None
    dtype: torch.dtype
    device: torch.device
    placeholder: bool
    ctx: RunContext
    bench: Bench  # the full benchmark of each variant
    sweep_bench: Bench  # the launch sweep's candidates (no execution in a dry run)
    clock: FakeClock | None
    workspace: Path
    started: float = field(default_factory=time.monotonic)
    saved: Saved | None = None  # where Stage 1 wrote the profile (profiles.reviewed)
    fanout: Fanout | None = None  # the sweep's workers (optimize() opens and closes it)

    def past_deadline(self) -> bool:
        d = self.opts.deadline_s
        return d is not None and time.monotonic() - self.started > d


def timing(
    device: torch.device,
    table: Table,
    arch: str,
    dtype: torch.dtype,
    *,
    dry_run: bool,
    timer: Timer | None = None,
    hide_host: bool = True,
) -> tuple[RunContext, Timer, FakeClock | None]:
    """The run's context, timer and (in a dry run) placeholder clock over `table` — the same
    in this process and in a fan-out worker measuring sweep candidates."""
    if dry_run:
        clock = FakeClock(table, arch, itemsize=dtype.itemsize)
        return make_context(device, timer=clock, copy_gbps=clock.gpu.gbps), clock, clock
    ctx = make_context(device, timer=timer, hide_host=hide_host)
    return ctx, timer or default_timer(device, hide_host=ctx.hide_host), None


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise PreflightError(message)


def _shape_from_label(spec: BenchSpec, label: str) -> dict[str, int]:
    parts = label.split("x")
    _check(
        len(parts) == len(spec.dims),
        f"target shape {label!r} must give {len(spec.dims)} dims ({'x'.join(spec.dims)})",
    )
    return {d: int(v) for d, v in zip(spec.dims, parts, strict=True)}


def scope_kernels(table: Table, scope: str) -> list[str]:
    if scope == "all":
        return list(table)
    return [k for k in table if is_backward_kernel(k) == (scope == "backward")]


def scope_modes(scope: str) -> list[str]:
    return {"forward": ["forward"], "backward": ["backward"], "all": ["forward", "backward"]}[scope]


def preflight(opts: OptimizeOptions) -> Setup:
    op = opts.op
    _check(opts.goal in GOALS, f"--goal must be one of {', '.join(GOALS)}, got {opts.goal!r}")
    _check(opts.scope in SCOPES, f"--scope must be one of {', '.join(SCOPES)}, got {opts.scope!r}")
    _check(opts.gpu in GPUS, f"--gpu must be one of {', '.join(GPUS)}, got {opts.gpu!r}")
    _check(opts.max_variants >= 1, "--max-variants must be at least 1")
    _check(opts.dtype in DTYPES, f"dtype must be one of {', '.join(DTYPES)}")
    _check(opts.execute or opts.dry_run, "execute=False (modelled rows) needs a dry run")
    try:
        workers = parse_workers(opts.workers)
    except ValueError as e:
        raise PreflightError(f"--workers: {e}") from None
    _check(
        workers == 1 or opts.timer is None or opts.dry_run,
        "a custom timer stays in this process: it cannot time the sweep in other workers "
        "(use workers=1)",
    )
    try:
        entry = registry.get(op)
    except registry.UnknownOpError as e:
        raise PreflightError(f"{e} (`kernelwright optimize --help` lists them)") from None
    ops = entry.load()
    for name in (entry.function, entry.reference):
        _check(
            callable(getattr(ops, name, None)),
            f"{entry.module} has no `{name}`: the workflow times `{entry.function}` and checks "
            f"it against `{entry.reference}`",
        )
    try:
        table = get_table(op)
        spec = get_spec(entry.bench or op)
    except (ValueError, KeyError) as e:
        raise PreflightError(str(e).strip("'\"")) from None
    table_path = opts.table_path or Path(table_module(op).__file__)
    test_file = REPO_ROOT / entry.tests
    writes = opts.write_library and not opts.dry_run
    _check(
        test_file.exists() or not writes,
        f"{op}: its test file {test_file} is missing; Finalize runs it as the gate before "
        f"keeping a new table (run from a source checkout, or use --dry-run)",
    )
    target = None
    if opts.target:
        try:
            target = parse_target(opts.target)
        except ValueError as e:
            raise PreflightError(str(e)) from None

    if not opts.dry_run:  # its rows go to the results database (a dry run's are not kept)
        try:
            ResultsDB.writable()
        except ResultsDBError as e:
            raise PreflightError(str(e)) from None
    on_gpu = torch.cuda.is_available() and not interpreter_mode()
    _check(
        on_gpu or opts.dry_run,
        "no CUDA GPU here (timings need one). Run it on a GPU machine, or "
        "add --dry-run to exercise the whole pipeline on the CPU with interpreter "
        "correctness and placeholder timings.",
    )
    device = default_device()
    device_arch = device_info(device).arch
    arch = device_arch if opts.gpu == "auto" else opts.gpu
    if not opts.dry_run:
        _check(
            arch == device_arch,
            f"--gpu {opts.gpu}: this machine's GPU is {device_info(device).name} "
            f"({device_arch}); a table is tuned on the GPU it is for. Use --gpu auto.",
        )
        _check(
            arch not in ("unknown", "interpreter"),
            f"this GPU's architecture ({device_info(device).name}) is not one the launch "
            f"tables are keyed by; pass --gpu",
        )
    install_archs = [arch] if arch == device_arch else [arch, device_arch]

    kernels = scope_kernels(table, opts.scope)
    _check(bool(kernels), f"{op}: its table has no {opts.scope} kernels")
    modes = scope_modes(opts.scope)
    if target and target.mode not in modes:
        modes.append(target.mode)
    varied = {
        k: {"block_n", "num_warps"} | {f for f in VARIABLE_FIELDS if field_varied(table[k], f)}
        for k in kernels
    }

    shapes = opts.shapes
    if shapes is None:
        interp = device.type != "cuda"
        sweeps = spec.sweeps_for(quick=opts.quick, interpreter=interp)
        shapes = [s for sw in sweeps for _, s in sw.shapes()]
    if target is not None:
        tshape = _shape_from_label(spec, target.shape)
        if spec.shape_label(tshape) not in {spec.shape_label(s) for s in shapes}:
            shapes = [*shapes, tshape]
    seen, unique = set(), []
    for s in shapes:
        if spec.shape_label(s) not in seen:
            seen.add(spec.shape_label(s))
            unique.append(s)
    points = points_of(spec, unique)

    dtype = DTYPES[opts.dtype]
    ctx, timer, clock = timing(
        device, table, arch, dtype, dry_run=opts.dry_run, timer=opts.timer, hide_host=opts.hide_host
    )
    if opts.goal != "speed" and not opts.dry_run:
        _check(device.type == "cuda", "--goal memory/balanced needs peak-memory statistics")
    bench = Bench(spec, ctx=ctx, timer=timer, dtype=dtype, clock=clock, execute=opts.execute)
    sweep_bench = bench
    if opts.dry_run:
        sweep_bench = Bench(spec, ctx=ctx, timer=timer, dtype=dtype, clock=clock, execute=False)
    workspace = opts.workspace or Path("kernelwright-runs") / "optimize" / op
    return Setup(
        opts=opts,
        spec=spec,
        table=table,
        table_path=table_path,
        op_source=Path(ops.__file__),
        test_file=test_file,
        arch=arch,
        install_archs=install_archs,
        kernels=kernels,
        varied=varied,
        modes=modes,
        points=points,
        target=target,
        dtype=dtype,
        device=device,
        placeholder=opts.dry_run,
        ctx=ctx,
        bench=bench,
        sweep_bench=sweep_bench,
        clock=clock,
        workspace=workspace,
    )
