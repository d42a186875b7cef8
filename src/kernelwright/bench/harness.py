"""Timing, peak memory and achieved bandwidth of every provider of a `BenchSpec`.

Modes, all with grad-enabled inputs as in training:
- forward: the provider's forward (the autograd graph and saved tensors included).
- backward: the forward runs once, untimed; `backward(dy, retain_graph=True)` is timed.
- full: forward + `backward(dy)`.

Before every rep, outside the timed region, a setup step resets the gradients to None (no
rep pays for accumulation) and, for providers that write into their inputs or into dy
(in-place backward, Liger), copies the original values back: without that restore the values
drift rep after rep towards inf/NaN/denormals, and the time drifts with them.

The timers (bench/timers.py) measure as `triton.testing.do_bench` does, with that setup kept
out of the timed region; under the interpreter a perf_counter fallback runs a few reps and
the rows say so (`timing`): those numbers are not speeds. The run's context (device, arch,
versions, commit, copy bandwidth) is in bench/context.py.

Losses (`BenchSpec.backward_once`) allow one backward per graph: in "backward" mode every rep
gets a fresh forward in its untimed setup instead of re-walking one retained graph.

Every measurement turns into one `BenchRow`, the schema of the CSV (bench/report.py) and of
the results database (bench/db.py). A provider that fails (OOM, a peer not installed, an
exception) gives a row with NaN numbers and the error, and the run goes on.
"""

from __future__ import annotations

import gc
import json
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np
import torch

from kernelwright.bench.context import RunContext, arch_of, git_commit, make_context
from kernelwright.bench.specs import MODES, BenchSpec, Provider, importable
from kernelwright.bench.timers import (
    QUANTILES,
    Timer,
    _quantiles,  # noqa: F401  (importable from here as before the split)
    _sleep_cycles_per_ms,  # noqa: F401
    cuda_timer,
    default_flush,
    default_timer,
    interpreter_timer,
    measure_copy_bandwidth,
)
from kernelwright.runtime import default_device, interpreter_mode

NAN = float("nan")

__all__ = [
    "COLUMNS",
    "NAN",
    "QUANTILES",
    "BenchRow",
    "Plan",
    "RunContext",
    "Timer",
    "arch_of",
    "cuda_timer",
    "default_flush",
    "default_timer",
    "git_commit",
    "interpreter_timer",
    "make_context",
    "measure",
    "measure_copy_bandwidth",
    "plan",
    "run_plan",
    "run_spec",
    "select_providers",
    "shape_dims",
    "with_bandwidth",
]


@dataclass
class BenchRow:
    """One measurement; the field order is the CSV's column order (see bench.report)."""

    op: str
    mode: str
    provider: str
    x_name: str
    x_value: int
    shape: str  # e.g. "8192x4096", dims in the spec's order
    dtype: str
    ms_p20: float = NAN
    ms_p50: float = NAN
    ms_p80: float = NAN
    peak_mem_mb: float = NAN  # peak allocated above what existed before the run (see _peak_mb)
    host_ms: float = NAN  # CPU time to issue one call; near ms_p50 means launch-bound
    bytes: int = 0  # the spec's byte model for this shape and mode
    gbps: float = NAN  # bytes / ms_p50
    pct_copy_bw: float = NAN  # gbps as % of the measured device-to-device copy bandwidth
    copy_gbps: float = NAN
    # "cuda_events[_gpu_only]_<flush>_flush" | "interpreter" | "placeholder" (optimize's dry
    # run); only the cuda_events ones are speeds (see RunContext.timing)
    timing: str = ""
    gpu: str = ""
    torch: str = ""
    triton: str = ""
    commit: str = ""
    timestamp: str = ""
    error: str = ""
    # Compute-bound ops (specs with a FLOP model): the spec's FLOP count for this shape and mode,
    # and flops / ms_p50; 0 and NaN for the others. Last, so older CSVs keep their prefix.
    flops: int = 0
    tflops: float = NAN
    # The shape's named dims as JSON ({"tokens": 8192, "hidden": 4096}) and the device's
    # architecture ("sm_90", "cpu-interpreter"); after the FLOP columns for the same reason.
    dims: str = ""
    arch: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and math.isfinite(self.ms_p50)

    @property
    def host_bound(self) -> bool:
        """The CPU takes about as long to issue the call as the GPU to run it: the time
        measures Python/launch overhead as much as the kernels (small shapes)."""
        return self.ok and math.isfinite(self.host_ms) and self.host_ms >= 0.8 * self.ms_p50

    @property
    def is_speed(self) -> bool:
        """Timed on a GPU with CUDA events (interpreter and placeholder times are not speeds)."""
        return self.timing.startswith("cuda_events")

    @property
    def host_inclusive(self) -> bool:
        """The time includes the host's launch cost, as a user's eager loop sees it (the
        default timer; `hide_host` rows time GPU work alone)."""
        return self.is_speed and not self.timing.startswith("cuda_events_gpu_only")


COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(BenchRow))


def shape_dims(spec: BenchSpec, shape) -> str:
    """The `dims` column: the shape's named dims in the spec's order, as JSON."""
    return json.dumps({d: int(shape[d]) for d in spec.dims})


# --------------------------------------------------------------------------- measurement


def _free(device: torch.device, *, collect: bool = True) -> None:
    # gc only when something may sit in a reference cycle (an exception's traceback holds
    # the frames, and their tensors) and only on a GPU, whose memory the next row records (a
    # full collection walks every object a process holds).
    if device.type == "cuda":
        if collect:
            gc.collect()
        torch.cuda.empty_cache()


def _peak_mb(fn: Callable[[], Any], device: torch.device) -> float:
    """Peak bytes allocated while `fn` runs, above what was allocated before it, in MB.

    Taken after the mode's setup: for "backward" the forward's output and saved tensors
    already exist, so this is what the backward itself adds (grads and temporaries).
    """
    if device.type != "cuda":
        return NAN  # the CPU allocator keeps no peak statistics
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    fn()
    torch.cuda.synchronize(device)
    return (torch.cuda.max_memory_allocated(device) - base) / 2**20


def _host_ms(fn: Callable[[], Any], setup: Callable[[], None], device: torch.device) -> float:
    """Median CPU time to issue one call of `fn` onto an idle GPU (NaN off CUDA).

    Kernels run asynchronously, so this is Python, autograd and launch overhead. When it is
    close to the GPU time, the GPU waits on the CPU and the timing measures the overhead.
    """
    if device.type != "cuda":
        return NAN
    times = []
    for _ in range(5):
        setup()
        torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize(device)
    return float(np.median(times))


class _Alias(torch.autograd.Function):
    """A leaf's storage as a non-leaf, with no copy and no kernel: in-place writers refuse a
    leaf that requires grad, as PyTorch's in-place ops do."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.detach()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad


def _as_tuple(out: Any) -> tuple[torch.Tensor, ...]:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _error_text(e: BaseException) -> str:
    if isinstance(e, torch.cuda.OutOfMemoryError):
        return "OOM: " + str(e).splitlines()[0][:200]
    first = (str(e).splitlines() or [""])[0]
    return f"{type(e).__name__}: {first}"[:300]


def measure(
    spec: BenchSpec,
    provider: Provider,
    mode: str,
    base_inputs: dict[str, torch.Tensor],
    row: BenchRow,
    *,
    ctx: RunContext,
    timer: Timer,
    seed: int = 0,
) -> BenchRow:
    """Time one provider in one mode on copies of `base_inputs`; fill in and return `row`."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    device = ctx.device
    try:
        if provider.requires and not importable(provider.requires):
            raise ModuleNotFoundError(f"{provider.requires} is not installed")
        # Fresh copies per provider and mode: some providers write into their inputs or into
        # dy (Liger's SwiGLU backward, in-place backward), and must not hand that to the next.
        inputs = {
            k: v.detach().clone().requires_grad_(k in spec.grad_inputs)
            for k, v in base_inputs.items()
        }
        leaves = [inputs[k] for k in spec.grad_inputs]
        if spec.grad_through_views:  # the leaves stay in `inputs` for restore and grad reset
            fwd = provider.build(
                {k: v.view_as(v) if k in spec.grad_inputs else v for k, v in inputs.items()}
            )
        elif provider.mutates:  # writes its inputs: hand it non-leaves, as a model's layers do
            fwd = provider.build(
                {k: _Alias.apply(v) if k in spec.grad_inputs else v for k, v in inputs.items()}
            )
        else:
            fwd = provider.build(inputs)

        def through(out: Any) -> tuple[torch.Tensor, ...]:
            outs = _as_tuple(out)
            return tuple(outs[i] for i in spec.backward_through)

        restore: list[tuple[torch.Tensor, torch.Tensor]] = []  # (buffer, original values)
        graph: list[tuple[torch.Tensor, ...]] = []  # backward_once: the next rep's outputs
        if provider.mutates:
            # `.data`: a write autograd does not version-count, as the provider's own kernel
            # writes are not — the graph kept by "backward" mode stays valid.
            restore += [(inputs[k].data, base_inputs[k]) for k in inputs]
        if mode == "forward":
            fn = fwd
        else:
            outs = through(fwd())
            # dy drawn on the device: a CPU draw (testing.rand) of a GB-sized output would take
            # seconds for every provider and mode.
            gen = torch.Generator(device=device).manual_seed(seed + 1000)
            if spec.unit_grad:
                dys = [torch.ones_like(o) for o in outs]
            else:
                dys = [
                    torch.randn(o.shape, dtype=o.dtype, device=device, generator=gen) for o in outs
                ]
            if provider.mutates:
                restore += [(d, d.clone()) for d in dys]
            if mode == "backward" and spec.backward_once:
                # One backward per graph: setup runs a fresh forward (untimed) before each rep.
                del outs

                def fn():
                    torch.autograd.backward(graph.pop(), dys)

            elif mode == "backward":
                # retain_graph: the same graph is walked every rep; the forward is not timed.
                def fn():
                    torch.autograd.backward(outs, dys, retain_graph=True)
            else:
                del outs

                def fn():
                    torch.autograd.backward(through(fwd()), dys)

        def setup() -> None:
            for t in leaves:
                t.grad = None
            for buf, original in restore:
                buf.copy_(original)
            if mode == "backward" and spec.backward_once:
                graph[:] = [through(fwd())]

        # Untimed first run: torch.compile builds its graphs, Triton compiles, the caching
        # allocator warms up — none of which should land in the memory or time figures.
        setup()
        fn()
        setup()
        row.peak_mem_mb = _peak_mb(fn, device)
        row.ms_p20, row.ms_p50, row.ms_p80 = timer(fn, setup)
        row.host_ms = _host_ms(fn, setup, device)
    except Exception as e:  # a failing provider is a result (an error row), not the end of a run
        row.error = _error_text(e)
        row.ms_p20 = row.ms_p50 = row.ms_p80 = row.peak_mem_mb = row.host_ms = NAN
    finally:
        inputs = leaves = fwd = fn = outs = dys = restore = setup = graph = None  # noqa: F841
        _free(device, collect=bool(row.error))
    return with_bandwidth(row)


def with_bandwidth(row: BenchRow) -> BenchRow:
    """Fill in GB/s, % of copy bandwidth and TFLOP/s from p50 (a row timed elsewhere too)."""
    if math.isfinite(row.ms_p50) and row.ms_p50 > 0:
        row.gbps = row.bytes / (row.ms_p50 * 1e-3) / 1e9
        if math.isfinite(row.copy_gbps) and row.copy_gbps > 0:
            row.pct_copy_bw = row.gbps / row.copy_gbps * 100.0
        if row.flops:
            row.tflops = row.flops / (row.ms_p50 * 1e-3) / 1e12
    return row


# --------------------------------------------------------------------------- planning and runs


def select_providers(
    spec: BenchSpec,
    names: Iterable[str] | None = None,
    *,
    device: torch.device | None = None,
    quick: bool = False,
) -> list[Provider]:
    """The providers to run: `names` as given (unknown names raise), or the defaults.

    Defaults: every provider whose required package imports; on the CPU, without the
    torch.compile ones (inductor takes ~15 s per shape there, for numbers that mean nothing);
    in a quick run on a GPU, without the slow ones (`Provider.slow`: seconds a call there).
    A provider named explicitly always runs, and fails into an error row if it cannot.
    """
    if names is not None:
        return [spec.provider(n) for n in names]
    device = device or default_device()
    on_gpu = device.type == "cuda" and not interpreter_mode()
    chosen = []
    for p in spec.providers:
        if p.requires and not importable(p.requires):
            continue
        if p.compiled and device.type != "cuda":
            continue
        if p.slow and quick and on_gpu:
            continue
        chosen.append(p)
    return chosen


def _dynamo_limits(limit: int = 256) -> dict[str, Any]:
    """Config changes that let every benchmarked shape compile its own graph.

    Each shape is a new static graph (dynamic=False); past dynamo's recompile limit (8 by
    default) it would silently run the function eagerly. Raise the limit, and should it still
    be hit, fail into an error row rather than time eager code under the torch_compile name.
    """
    import torch._dynamo

    cfg = torch._dynamo.config
    changes: dict[str, Any] = {}
    for name in (
        "recompile_limit",
        "cache_size_limit",
        "accumulated_recompile_limit",
        "accumulated_cache_size_limit",
    ):
        if hasattr(cfg, name):
            changes[name] = max(int(getattr(cfg, name)), limit)
    if hasattr(cfg, "fail_on_recompile_limit_hit"):
        changes["fail_on_recompile_limit_hit"] = True
    return changes


@dataclass
class Plan:
    """The points one `run_spec` call measures: (sweep, x value, shape) x provider x mode."""

    spec: BenchSpec
    points: list[tuple[str, int, dict[str, int]]]
    providers: list[Provider]
    modes: list[str]

    @property
    def size(self) -> int:
        return len(self.points) * len(self.providers) * len(self.modes)


def plan(
    spec: BenchSpec,
    *,
    modes: Sequence[str] = MODES,
    sweep: str | None = None,
    providers: Sequence[str] | None = None,
    quick: bool = False,
    device: torch.device | None = None,
) -> Plan:
    device = device or default_device()
    interp = device.type != "cuda" or interpreter_mode()
    for m in modes:
        if m not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {m!r}")
    sweeps = spec.sweeps_for(quick=quick, interpreter=interp)
    if sweep is not None:
        sweeps = (spec.sweep(sweep, quick=quick, interpreter=interp),)
    points = [(s.name, x, shape) for s in sweeps for x, shape in s.shapes()]
    chosen = select_providers(spec, providers, device=device, quick=quick)
    return Plan(spec, points, chosen, list(modes))


def run_spec(
    spec: BenchSpec,
    *,
    modes: Sequence[str] = MODES,
    sweep: str | None = None,
    providers: Sequence[str] | None = None,
    dtype: torch.dtype = torch.bfloat16,
    quick: bool = False,
    ctx: RunContext | None = None,
    timer: Timer | None = None,
    on_row: Callable[[BenchRow], None] | None = None,
) -> list[BenchRow]:
    """Measure `spec` over its sweeps: every shape x provider x mode, one `BenchRow` each.

    `ctx` carries the device and the copy bandwidth (measured once by `make_context`; pass the
    same one to every spec of a run). `timer` replaces the device timer (tests inject one).
    `on_row` is called after every row, for progress display.
    """
    ctx = ctx or make_context(timer=timer)
    p = plan(spec, modes=modes, sweep=sweep, providers=providers, quick=quick, device=ctx.device)
    return run_plan(p, dtype=dtype, ctx=ctx, timer=timer, on_row=on_row)


def run_plan(
    p: Plan,
    *,
    dtype: torch.dtype,
    ctx: RunContext,
    timer: Timer | None = None,
    on_row: Callable[[BenchRow], None] | None = None,
) -> list[BenchRow]:
    """Measure the points of `p` (see `run_spec`)."""
    timer = timer or default_timer(ctx.device, hide_host=ctx.hide_host, flush=ctx.flush)
    if not any(pr.compiled for pr in p.providers):
        return _run_points(p, dtype, ctx, timer, on_row)
    import torch._dynamo

    # Graphs of an earlier spec would count against the limits; the limits are restored after.
    torch._dynamo.reset()
    with torch._dynamo.config.patch(_dynamo_limits()):
        try:
            return _run_points(p, dtype, ctx, timer, on_row)
        finally:
            torch._dynamo.reset()


def _run_points(p: Plan, dtype, ctx: RunContext, timer: Timer, on_row) -> list[BenchRow]:
    spec = p.spec
    rows: list[BenchRow] = []
    done: dict[tuple[str, str, str], BenchRow] = {}  # (shape, provider, mode) -> first row
    for x_name, x_value, shape in p.points:
        label = spec.shape_label(shape)
        skip = spec.too_large(shape, dtype)
        base: dict[str, torch.Tensor] | Exception | None = None
        for pr in p.providers:
            for mode in p.modes:
                key = (label, pr.name, mode)
                if key in done:
                    # The same shape met again in another sweep (e.g. 8192x4096 is on both the
                    # hidden and the tokens sweep): reuse the measurement, relabel its x.
                    row = replace(done[key], x_name=x_name, x_value=x_value)
                else:
                    row = _new_row(spec, ctx, pr.name, mode, x_name, x_value, shape, dtype)
                    if skip:
                        row.error = skip
                    else:
                        if base is None:
                            base = _make_base(spec, shape, dtype, ctx.device)
                        if isinstance(base, Exception):
                            row.error = "make_inputs failed: " + _error_text(base)
                        else:
                            row = measure(spec, pr, mode, base, row, ctx=ctx, timer=timer)
                    done[key] = row
                rows.append(row)
                if on_row is not None:
                    on_row(row)
        base = None
        _free(ctx.device)
    return rows


def _new_row(spec, ctx, provider, mode, x_name, x_value, shape, dtype) -> BenchRow:
    return BenchRow(
        op=spec.op,
        mode=mode,
        provider=provider,
        x_name=x_name,
        x_value=x_value,
        shape=spec.shape_label(shape),
        dims=shape_dims(spec, shape),
        dtype=str(dtype).replace("torch.", ""),
        bytes=spec.bytes(shape, dtype, mode),
        flops=spec.flops(shape, dtype, mode) if spec.flops is not None else 0,
        copy_gbps=ctx.copy_gbps,
        timing=ctx.timing,
        gpu=ctx.gpu,
        torch=ctx.torch,
        triton=ctx.triton,
        commit=ctx.commit,
        timestamp=ctx.timestamp,
        arch=ctx.arch,
    )


def _make_base(spec: BenchSpec, shape, dtype, device) -> dict[str, torch.Tensor] | Exception:
    # Drawn once per shape (CPU draws of GB-sized tensors take seconds); every provider gets
    # clones of the same values, so all of them see the same inputs.
    try:
        with torch.no_grad():
            return spec.make_inputs(shape, dtype, device)
    except Exception as e:  # e.g. OOM at a large shape: every provider gets the error row
        return e
