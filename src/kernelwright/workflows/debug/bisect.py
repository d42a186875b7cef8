"""Stage 2 (Bisect): probe the op one axis at a time, find the first divergence, confine it to
a regime and shrink its input.

The base point is (case 0, pow2 shape, contiguous, normal values, the launch table as it is),
run at every dtype. Every other value of every axis changes that one coordinate; they run as
one pass per dtype: at the base's first failing dtype, else at float32, then bfloat16, then
float16 until a pass finds a failure (a divergence that shows in one dtype only, or in one
dtype and one regime, is found without a full product of the axes). When the base passed, the
failing probes are then run at the dtypes not yet tried, which confines the divergence in
dtype. The first failing probe is the divergence; the failing values per axis are its regime;
its shape is then halved, dim by dim, while the same pass still fails.

The huge shape regime (past 2^31 elements) runs only on a CUDA device with the memory it needs
free (huge.py); elsewhere its probe is "not tried", with the reason, and counts as no probe
of its axis. The config axis forces rows of the plan's launch table; an op that read no row
of it in the probes before (a plain PyTorch function given a library op's --ref) launches
nothing that table configures, so the axis is "not applicable" instead of run and blamed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from kernelwright.profiles.debug import AXES, DebugProfile, Divergence, PassResult, Probe
from kernelwright.runtime import default_device, device_info
from kernelwright.runtime.alloc import poisoned
from kernelwright.runtime.launch import LaunchConfig, next_pow2, table_rows
from kernelwright.workflows.debug import huge
from kernelwright.workflows.debug import shapes as S
from kernelwright.workflows.debug.numerics import compare, with_layout, with_values
from kernelwright.workflows.debug.target import add_paths, decode, load, maker_of

Progress = Callable[[str], None]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
BASE = {"shape": "pow2", "layout": "contiguous", "values": "normal", "config": "table"}


@dataclass(frozen=True)
class Point:
    case: int
    dtype: str
    regime: str  # the shape regime's name, or "n=<len>" for a launch-table row's length
    shape: tuple[int, ...]
    layout: str = "contiguous"
    values: str = "normal"
    config: str = "table"
    forced: tuple[tuple[str, LaunchConfig], ...] = ()  # (kernel, config) served for every n


class _Watched(dict):
    """One kernel's rows per arch, noting every read (`lookup` and `table_rows` read them):
    whether the op under test consults the launch table at all."""

    def __init__(self, rows: dict, note: Callable[[], None]):
        super().__init__(rows)
        self.note = note

    def __getitem__(self, key):
        self.note()
        return super().__getitem__(key)

    def __contains__(self, key):
        self.note()
        return super().__contains__(key)

    def get(self, key, default=None):
        self.note()
        return super().get(key, default)

    def values(self):
        self.note()
        return super().values()

    def items(self):
        self.note()
        return super().items()


def describe(cfg: LaunchConfig) -> str:
    """A config's fields that differ from the defaults, plus block_n: "block_n=256 rows=16"."""
    default = LaunchConfig(block_n=cfg.block_n)
    parts = [f"block_n={cfg.block_n}"]
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if f.name != "block_n" and value != getattr(default, f.name):
            parts.append(f"{f.name}={value}")
    return " ".join(parts)


class Runner:
    """Runs probes of one plan: loads its cases, owns the launch table swaps."""

    def __init__(self, profile: DebugProfile, progress: Progress):
        add_paths(profile.sys_path)
        self.profile = profile
        self.progress = progress
        self.device = default_device()
        self.cases = [
            (spec, load(spec.function), load(spec.reference), maker_of(spec), decode(spec.kwargs))
            for spec in profile.cases
        ]
        module = load(profile.launch_table) if profile.launch_table else None
        table = getattr(module, "TABLE", None)
        self.table = table if isinstance(table, dict) else None
        arch = device_info(self.device).arch
        self.arch_of = lambda k: arch if self.table and arch in self.table[k] else "default"
        self.interpreter = arch == "interpreter"
        self._huge: dict[tuple, huge.Plan] = {}
        self.reads_table = False  # whether a probe's op read a row of `self.table`
        self.compared = 0  # probes whose op ran

    def config_not_applicable(self) -> str:
        """Why the config axis does not apply to this op ("" when it does): no probe so far
        read its launch table, so forcing the table's configs would change nothing."""
        if self.table is None or self.reads_table or not self.compared:
            return ""
        return (
            f"not applicable: {self.profile.cases[0].function} read no row of "
            f"{self.profile.launch_table}.TABLE in the {self.compared} probes before (it "
            "launches no kernel that table configures; forcing its configs changes nothing)"
        )

    @contextlib.contextmanager
    def _watching(self) -> Iterator[None]:
        """While the op runs, each kernel's rows note a read into `reads_table`."""
        if self.table is None or self.reads_table:
            yield
            return
        saved = {k: v for k, v in self.table.items() if isinstance(v, dict)}

        def note() -> None:
            self.reads_table = True

        try:
            for kernel, rows in saved.items():
                self.table[kernel] = _Watched(rows, note)
            yield
        finally:
            for kernel, rows in saved.items():
                watched = self.table[kernel]
                self.table[kernel] = rows
                if watched is not rows:  # keep what the op wrote into its table meanwhile
                    rows.clear()
                    rows.update(dict.items(watched))

    # ------------------------------------------------------------------- one probe

    @contextlib.contextmanager
    def _forced(self, forced) -> Iterator[None]:
        saved = []
        try:
            for kernel, cfg in forced:
                key = self.arch_of(kernel)
                saved.append((kernel, key, self.table[kernel].get(key)))
                self.table[kernel][key] = [(S.OPEN, cfg)]
            yield
        finally:
            for kernel, key, rows in reversed(saved):
                if rows is None:
                    self.table[kernel].pop(key, None)
                else:
                    self.table[kernel][key] = rows

    def huge_plan(self, point: Point) -> huge.Plan:
        """What a huge probe at `point` costs and how it compares (cached per case, dtype,
        shape)."""
        key = (point.case, point.dtype, point.shape)
        if key not in self._huge:
            spec, _, ref, maker, kwargs = self.cases[point.case]
            dtype, seed = DTYPES[point.dtype], self.profile.seed
            self._huge[key] = huge.plan(
                maker, ref, kwargs, spec.inputs, spec.grad_inputs, point.shape, dtype, seed
            )
        return self._huge[key]

    def run(self, point: Point, axis: str, value: str, quiet: bool = False) -> Probe:
        start = time.perf_counter()
        plan = self.huge_plan(point) if point.regime == "huge" else None
        if plan is not None:
            reason = huge.not_tried(plan, self.device, self.interpreter)
            if reason:
                return self._not_tried(point, axis, value, reason, start, quiet)
        try:
            passes, skipped = self._compare(point, plan)
        except torch.cuda.OutOfMemoryError as e:
            if plan is None:
                raise
            reason = huge.out_of_memory(plan, e)
            return self._not_tried(point, axis, value, reason, start, quiet)
        finally:
            if plan is not None and self.device.type == "cuda":
                huge.free_device_memory(self.device)
        failing = []
        for p in passes:
            if not p.ok and p.name not in failing:
                failing.append(p.name)
        status = "skipped" if skipped or not passes else ("fail" if failing else "pass")
        worst = max(passes, key=lambda p: p.error / p.tol if p.tol else p.error, default=None)
        message = skipped or ("no finite reference value" if not passes else "")
        message = message or "; ".join(f"{p.name}: {p.detail}" for p in passes
                                       if not p.ok and "raised" in p.detail)  # fmt: skip
        if plan is not None:
            message = "; ".join(m for m in (message, huge.describe(plan)) if m)
        probe = self._probe(point, axis, value, status, start, message)
        probe.failing, probe.passes = failing, passes
        probe.max_error = worst.error if worst is not None else 0.0
        if not quiet:
            self.progress(progress_line(probe))
        return probe

    def _compare(self, point: Point, plan: huge.Plan | None) -> tuple[list[PassResult], str]:
        spec, fn, ref, maker, kwargs = self.cases[point.case]
        tol = self.profile.tolerances[point.dtype]
        seed = self.profile.seed
        inputs = maker(point.shape, DTYPES[point.dtype], self.device, seed)
        inputs = with_layout(with_values(inputs, point.values, seed), point.layout)
        rows = list(plan.rows) if plan is not None and plan.chunked else None
        # NaN, inf and overflow are what some regimes are about: numpy's warnings say nothing
        with self._forced(point.forced), self._watching(), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            got, skipped = compare(fn, ref, inputs, kwargs, spec.grad_inputs, tol.model_dump(),
                                   seed, poisoned, rows=rows)  # fmt: skip
        self.compared += 1
        return [PassResult(**r) for r in got], skipped

    def _probe(self, point: Point, axis: str, value: str, status: str, start: float,
               message: str) -> Probe:  # fmt: skip
        return Probe(
            axis=axis,
            value=value,
            case=self.cases[point.case][0].label,
            dtype=point.dtype,
            shape=list(point.shape),
            shape_regime=point.regime,
            layout=point.layout,
            values=point.values,
            config=point.config,
            status=status,
            message=message,
            seconds=round(time.perf_counter() - start, 4),
        )

    def not_applicable(self, point: Point, axis: str) -> Probe:
        why = self.config_not_applicable()
        probe = self._probe(point, axis, "every config", "not applicable", time.perf_counter(),
                            why)  # fmt: skip
        self.progress(progress_line(probe))
        return probe

    def _not_tried(self, point, axis, value, reason, start, quiet) -> Probe:
        probe = self._probe(point, axis, value, "not tried", start, reason)
        if not quiet:
            self.progress(progress_line(probe))
        return probe

    # ------------------------------------------------------------------- the plan's points

    def base(self, dtype: str, case: int = 0) -> Point:
        shape = tuple(self.profile.cases[case].shapes["pow2"])
        return Point(case, dtype, "pow2", shape)

    def axis_points(self) -> list[tuple[str, str, Point]]:
        """(axis, value, point at float32) for every probe after the dtype axis, in order."""
        p = self.profile
        base = self.base("float32")
        out: list[tuple[str, str, Point]] = []
        for i, spec in enumerate(p.cases[1:], 1):
            out.append(("case", spec.label, self.base("float32", i)))
        shapes = p.cases[0].shapes
        for regime in p.shapes:
            if regime != "pow2" and regime in shapes:
                point = dataclasses.replace(base, regime=regime, shape=tuple(shapes[regime]))
                out.append(("shape", regime, point))
        out += [("layout", v, dataclasses.replace(base, layout=v)) for v in p.layouts
                if v != "contiguous"]  # fmt: skip
        out += [("values", v, dataclasses.replace(base, values=v)) for v in p.values
                if v != "normal"]  # fmt: skip
        if self.table is not None:
            out += self.config_points()
        return out

    def config_points(self) -> list[tuple[str, str, Point]]:
        family = self.profile.cases[0].family
        base = self.base("float32")
        out: list[tuple[str, str, Point]] = []
        if "regime" in self.profile.configs:
            by_n: dict[int, list[str]] = {}
            for kernel in self.table:
                rows = table_rows(self.table, kernel, self.arch_of(kernel))
                if len(rows) < 2:
                    continue  # one row serves every length: the other probes reach it
                low = 0
                for i, (max_n, cfg) in enumerate(rows):
                    n = max_n - 1 if max_n - 1 > low and max_n < S.OPEN else max_n
                    n = low + S.TAIL if max_n >= S.OPEN else n
                    label = f"{kernel} row {i} (n <= {max_n}: {describe(cfg)})"
                    by_n.setdefault(n, []).append(label)
                    low = max_n
            for n, labels in sorted(by_n.items()):
                shape = S.with_n(family, n)
                if shape is None:
                    continue
                value = "table " + "; ".join(labels)
                point = dataclasses.replace(base, regime=f"n={n}", shape=shape, config=value)
                out.append(("config", value, point))
        if "forced" in self.profile.configs:
            shape = S.config_shape(family, self.profile.cases[0].shapes)
            width = next_pow2(S.row_len(family, shape))
            for kernel in self.table:
                # configs that run alike at this shape: the same fields once the block is
                # capped at the row (a block past the row holds it all the same) and, under
                # the interpreter, whatever their warps; the smallest block stands for them
                classes: dict[LaunchConfig, list[LaunchConfig]] = {}
                for rows in self.table[kernel].values():
                    for _, cfg in rows:
                        key = dataclasses.replace(cfg, block_n=min(cfg.block_n, width))
                        if self.interpreter:
                            key = dataclasses.replace(key, num_warps=4)
                        classes.setdefault(key, []).append(cfg)
                for alike in classes.values():
                    cfg = min(alike, key=lambda c: c.block_n)
                    others = len({c for c in alike}) - 1
                    value = f"forced {kernel}: {describe(cfg)}"
                    value += f" (+{others} alike at this shape)" if others else ""
                    point = dataclasses.replace(
                        base, regime="config", shape=shape, config=value, forced=((kernel, cfg),)
                    )
                    out.append(("config", value, point))
        return out


def progress_line(p: Probe) -> str:
    where = f"[{p.axis}] {p.value} | {p.dtype} {tuple(p.shape)} {p.layout} {p.values}"
    if p.status == "skipped":
        return f"  skip {where}: {p.message}"
    if p.status == "not tried":
        return f"  --   {where}: {p.message}"
    if p.status == "not applicable":
        return f"  n/a  [{p.axis}]: {p.message}"
    if p.status == "pass":
        return f"  ok   {where}: max err {p.max_error:.2e}"
    bad = next(x for x in p.passes if not x.ok)
    detail = f" ({bad.detail})" if bad.detail else ""
    return f"  FAIL {where}: {bad.name} err {bad.error:.2e} > tol {bad.tol:.1e}{detail}"


# --------------------------------------------------------------------------- the bisection


def bisect(profile: DebugProfile, progress: Progress) -> DebugProfile:
    """Run the plan's probes, then localise and shrink the first divergence (if any)."""
    runner = Runner(profile, progress)
    probes: list[Probe] = []
    dtypes = list(profile.dtypes)
    progress(f"[base] {profile.cases[0].label} at every dtype")
    for d in dtypes:
        probes.append(runner.run(runner.base(d), "dtype", d))
    axis_points = runner.axis_points()
    # One pass over the axes per dtype: at the base's first failing dtype, else in the plan's
    # order until a pass finds a failure (a divergence in one dtype only needs that dtype).
    failed_base = [p.dtype for p in probes if p.status == "fail"]
    order = failed_base[:1] or dtypes
    failing: list[tuple[str, str, Point]] = []
    done: list[str] = []
    for d in order:
        done.append(d)
        progress(f"[axes at {d}]")
        for axis, value, point in axis_points:
            if axis == "config" and runner.config_not_applicable():
                if not any(p.status == "not applicable" for p in probes):
                    probes.append(runner.not_applicable(point, axis))
                continue
            probe = runner.run(dataclasses.replace(point, dtype=d), axis, value)
            probes.append(probe)
            if probe.status == "fail":
                failing.append((axis, value, dataclasses.replace(point, dtype=d)))
        if failing or failed_base:
            break
    # a base that passed: the failing points at the other dtypes say which dtypes the
    # divergence is confined to (a base that failed has said so already)
    others = [d for d in dtypes if d not in done]
    if failing and others and not failed_base:
        progress(f"[dtypes of the failing probes: {', '.join(others)}]")
        for axis, value, point in failing:
            for d in others:
                probes.append(runner.run(dataclasses.replace(point, dtype=d), axis, value))
    profile.probes = probes
    failed = [p for p in probes if p.status == "fail"]
    if not failed:
        profile.verdict = "no divergence"
        profile.divergence = None
        return profile
    first = failed[0]
    points = {(a, v): pt for a, v, pt in axis_points}
    point = points.get((first.axis, first.value)) or runner.base(first.dtype)
    point = dataclasses.replace(point, dtype=first.dtype)
    pass_name = first.failing[0]
    minimal, steps = tuple(first.shape), []
    if profile.shrink:
        progress(f"[shrink] {pass_name} at {first.dtype} {minimal}")
        minimal, steps = shrink(runner, point, pass_name)
    rows = None  # a huge input: the inputs the repro compares chunk by chunk of rows
    if first.shape_regime == "huge":
        rows = list(runner.huge_plan(dataclasses.replace(point, shape=tuple(minimal))).rows) or None
    row = next(p for p in first.passes if p.name == pass_name)
    regime = regime_of(profile, probes)
    profile.divergence = Divergence(
        pass_name=pass_name,
        passes=first.failing,
        case=first.case,
        dtype=first.dtype,
        shape=first.shape,
        shape_regime=first.shape_regime,
        layout=first.layout,
        values=first.values,
        config=first.config,
        error=row.error,
        tol=row.tol,
        message=first.message,
        minimal_shape=list(minimal),
        shrink_steps=[list(s) for s in steps],
        rows=rows,
        regime=regime,
        summary=summary(profile, first, pass_name, row, regime),
    )
    profile.verdict = "diverged"
    return profile


def shrink(runner: Runner, point: Point, pass_name: str):
    """Halve the failing shape one dim at a time while `pass_name` still fails; returns the
    smallest failing shape and the failing shapes on the way."""
    family = runner.profile.cases[point.case].family
    shape, steps = point.shape, []
    progressed = True
    while progressed:
        progressed = False
        for smaller in S.halvings(family, shape):
            probe = runner.run(dataclasses.replace(point, shape=smaller), "shrink", "", quiet=True)
            if pass_name in probe.failing:
                runner.progress(f"  still fails at {smaller}")
                shape, progressed = smaller, True
                steps.append(smaller)
                break
    return shape, steps


def regime_of(profile: DebugProfile, probes: list[Probe]) -> dict[str, list[str]]:
    """Per axis, the values whose own probe failed (the base point's value when the base
    failed); for dtype, every dtype a probe failed at."""
    base_failed = any(p.axis == "dtype" and p.status == "fail" for p in probes)
    base_values = {"case": profile.cases[0].label, **BASE}
    out: dict[str, list[str]] = {}
    for axis in AXES:
        if axis == "dtype":
            failed = {p.dtype for p in probes if p.status == "fail"}
            out[axis] = [d for d in profile.dtypes if d in failed]
            continue
        values = [base_values[axis]] if base_failed else []
        values += [p.value for p in probes if p.axis == axis and p.status == "fail"]
        out[axis] = list(dict.fromkeys(values))
    return out


def probed_values(profile: DebugProfile, probes: list[Probe]) -> dict[str, list[str]]:
    """Per axis, every value probed (the base's included; not one that was not tried)."""
    base_values = {"case": profile.cases[0].label, **BASE}
    out = {}
    for axis in AXES:
        if axis == "dtype":
            out[axis] = list(profile.dtypes)
            continue
        values = [base_values[axis]]
        values += [
            p.value for p in probes if p.axis == axis and p.status in ("pass", "fail", "skipped")
        ]
        out[axis] = list(dict.fromkeys(values))
    return out


def summary(profile: DebugProfile, first: Probe, pass_name: str, row, regime) -> str:
    what = "the forward" if pass_name == "forward" else (
        "the backward (it raised)" if pass_name == "backward"
        else f"the gradient of {pass_name.split(':', 1)[1]}"
    )  # fmt: skip
    applies = not any(p.status == "not applicable" for p in profile.probes if p.axis == "config")
    where = (
        f"{first.case}, {first.dtype}, shape {tuple(first.shape)} ({first.shape_regime}), "
        f"{first.layout}, {first.values} values"
        + (f", launch config {first.config}" if applies else "")
    )
    probed = probed_values(profile, profile.probes)
    loose = looser_dtypes(profile, pass_name, row.error, regime.get("dtype", []))
    confined = []
    for axis in AXES:
        failed, every = regime.get(axis, []), probed.get(axis, [])
        if failed and len(failed) < len(every) and not (axis == "dtype" and loose):
            confined.append(f"{axis} {', '.join(failed)}")
    scope = (
        "; only at " + "; ".join(confined)
        if confined
        else "; at every probed value of every axis" if not loose else ""
    )  # fmt: skip
    if loose:
        # the error is within those dtypes' tolerances: their pass says nothing about dtype
        kind = "fwd" if pass_name == "forward" else "bwd"
        tols = ", ".join(f"{d} {getattr(profile.tolerances[d], kind):.2g}" for d in loose)
        scope += (
            f"; fails at dtype {', '.join(regime['dtype'])}, and {', '.join(loose)} pass only "
            f"within their looser tolerances ({tols}, above this error {row.error:.3g}): "
            "not confined in dtype"
        )
    return f"{what} diverges ({row.error:.3g} > tol {row.tol:.3g}) at {where}{scope}"


def looser_dtypes(profile: DebugProfile, pass_name: str, error: float, failed: list[str]):
    """The dtypes whose probes passed although their tolerance for `pass_name` is at least
    `error`, the divergence's error: a bug that size passes there too, so passing there does
    not confine it to the failing dtypes."""
    kind = "fwd" if pass_name == "forward" else "bwd"
    return [d for d in profile.dtypes if d not in failed and d in profile.tolerances
            and getattr(profile.tolerances[d], kind) >= error]  # fmt: skip
