"""`kernelwright debug MODEL --compiled`: which site of `kernelwright.compile`'s rewrite makes a
model leave eager.

The model (a tiny config of a model type, a config.json or a directory holding one, or
`package.module:function` returning `(model, batch)`) runs once eagerly, the reference, and
through the compile pass: the same graph pass (`compile.passes.rewrite`) and the same source
rewrite of jagged loops as `kernelwright.compile`, then the backend (aot_eager by default, so
that it runs on a CPU). Dynamo captures the model once; each captured graph is kept as captured,
and every run rewrites a copy of it with a chosen set of sites (`rewrite(only=...)`), compiled
by the backend on first use. One forward and one backward per run; compared: every floating
output (the loss, the logits) to the forward tolerance and every parameter's gradient to the
backward one (relative-norm error, the dtype's defaults).

When the run with every site replaced diverges, the replaced sites are bisected in capture
order: with no site replaced it must agree (else the divergence is not the rewrite's), and a
binary search finds the shortest prefix of sites whose replacement diverges; its last site is
the first whose replacement makes the output diverge. That site is then run alone, to say
whether it diverges by itself. Loops rewritten in the source are one unit: they are in every
run, and judged (a capture without them) only when nothing else explains the divergence.

A bf16 run also runs the eager model in fp32: with `reference_dtype` "float32" (the default for
bf16) a quantity's bound is the tolerance plus the eager bf16 run's own error against fp32
(as `debug MODEL`; twice that under Triton's interpreter).
"""

from __future__ import annotations

import copy
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from kernelwright.profiles import reviewed
from kernelwright.profiles.debug import (
    CompiledDebugProfile,
    CompiledDivergence,
    CompiledRun,
    QuantityCheck,
    SiteCheck,
    TolSpec,
)
from kernelwright.runtime import default_device, device_info
from kernelwright.testing.tolerances import DEFAULT_TOLERANCES
from kernelwright.workflows.debug.model import (
    DTYPES,
    _first_tensor,
    _spread,
    base_factor,
    bound,
    build_config,
    is_model,
    reference_view,
)
from kernelwright.workflows.debug.numerics import _finite_error
from kernelwright.workflows.debug.run import claim

Progress = Callable[[str], None]


def is_compiled_target(target: str) -> bool:
    """A model `debug --compiled` takes: a model type, a config, or package.module:function."""
    return is_model(target) or (":" in target and "/" not in target.partition(":")[0])


# --------------------------------------------------------------------------- the model


def build(target: str, seed: int) -> tuple[torch.nn.Module, Any, str]:
    """(model in fp32, batch, its description): a tiny model of a type or config, with a batch
    of token ids and labels, or what `package.module:function()` returns."""
    torch.manual_seed(seed)
    if is_model(target):
        from transformers import AutoModelForCausalLM

        from kernelwright.testing.convergence import make_batches

        config = build_config(target)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        _spread(model, seed)
        vocab = config.get_text_config().vocab_size
        ids, labels = make_batches(vocab, count=1, batch=2, seq=16, seed=seed + 1)[0]
        return model, {"input_ids": ids, "labels": labels}, f"{type(model).__name__} " \
            f"({config.model_type})"  # fmt: skip
    from kernelwright.workflows.debug.target import TargetError, load, split_target

    split_target(target)
    got = load(target)()
    if not (isinstance(got, tuple) and len(got) == 2 and isinstance(got[0], torch.nn.Module)):
        raise TargetError(f"{target} must return (model, batch), got {type(got).__name__}")
    return got[0].float(), got[1], type(got[0]).__name__


def _cast(batch: Any, dtype: torch.dtype, device: torch.device) -> Any:
    """The batch on `device`, its floating tensors in `dtype`."""
    if isinstance(batch, torch.Tensor):
        batch = batch.to(device)
        return batch.to(dtype) if batch.is_floating_point() else batch
    if isinstance(batch, dict):
        return {k: _cast(v, dtype, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(_cast(v, dtype, device) for v in batch)
    return batch


def _call(model: Callable, batch: Any) -> Any:
    if isinstance(batch, dict):
        return model(**batch)
    if isinstance(batch, (list, tuple)):
        return model(*batch)
    return model(batch)


def _outputs(out: Any) -> dict[str, torch.Tensor]:
    """The floating tensors of a model's output, by name ("loss", "logits", "output[0]")."""
    if isinstance(out, torch.Tensor):
        items = [("output", out)]
    elif isinstance(out, dict):  # a transformers ModelOutput too
        items = list(out.items())
    elif isinstance(out, (list, tuple)):
        items = [(f"output[{i}]", v) for i, v in enumerate(out)]
    else:
        items = []
    return {k: v for k, v in items if isinstance(v, torch.Tensor) and v.is_floating_point()}


@dataclass
class _Outcome:
    values: dict[str, torch.Tensor]  # "output:<name>" and "grad:<parameter>", fp32 copies


def _run(model: torch.nn.Module, call: Callable, batch: Any, seed: int) -> _Outcome:
    """One forward and one backward: the loss, else the first output weighted at random."""
    model.zero_grad(set_to_none=True)
    out = _call(call, batch)
    loss = getattr(out, "loss", None)
    if not isinstance(loss, torch.Tensor):
        t = _first_tensor(out)
        if t is None:
            raise ValueError("the model returned no floating tensor")
        gen = torch.Generator().manual_seed(seed + 3)
        w = torch.randn(t.shape, generator=gen, dtype=torch.float32).to(t.device)
        loss = (t.float() * w).sum()
    loss.backward()
    values = {f"output:{k}": v.detach().float().clone() for k, v in _outputs(out).items()}
    for name, p in model.named_parameters():
        if p.grad is not None:
            values[f"grad:{name}"] = p.grad.detach().float().clone()
    return _Outcome(values)


# --------------------------------------------------------------------------- the capture


@dataclass
class _Switch:
    """A Dynamo backend that keeps every captured graph as captured and runs, per call, a copy
    rewritten with the sites of `only` (None: every site), compiled by `backend` on first use."""

    backend: str | Callable
    db: Any = None
    only: frozenset[str] | None = None
    graphs: list[torch.fx.GraphModule] = field(default_factory=list)
    compiled: dict = field(default_factory=dict)  # (graph, only) -> callable
    sites: dict = field(default_factory=dict)  # only -> [Site] of every graph rewritten

    def __call__(self, gm: torch.fx.GraphModule, example_inputs, **kwargs):
        index = len(self.graphs)
        self.graphs.append(torch.fx.GraphModule(gm, copy.deepcopy(gm.graph)))
        return lambda *args: self._variant(index, args)(*args)

    def _variant(self, index: int, args) -> Callable:
        key = (index, self.only)
        if key not in self.compiled:
            from kernelwright.compile.passes import rewrite

            original = self.graphs[index]
            gm = torch.fx.GraphModule(original, copy.deepcopy(original.graph))
            found = rewrite(gm, None, graph=index, db=self.db, only=self.only)
            self.sites.setdefault(self.only, []).extend(found)
            be = self.backend
            fn = torch._dynamo.lookup_backend(be) if isinstance(be, str) else be
            self.compiled[key] = fn(gm, list(args))
        return self.compiled[key]

    def module_of(self, graph: int, node: str) -> str:
        """The module a node of a captured graph was traced in ("model.layers.0.mlp")."""
        if not 0 <= graph < len(self.graphs):
            return ""
        for n in self.graphs[graph].graph.nodes:
            if n.name == node:
                stack = n.meta.get("nn_module_stack") or {}
                if not stack:
                    return ""
                path = list(stack.values())[-1][0]
                return re.sub(r"^L\['[^']*'\]\.?", "", str(path)) or "(model)"
        return ""


def _compile(model: torch.nn.Module, switch: _Switch, loops: bool) -> tuple[Callable, list]:
    from kernelwright.compile import loop_site
    from kernelwright.compile import loops as loop_pass

    captures = []
    if loops:
        model, captures = loop_pass.capture(model)
    return torch.compile(model, backend=switch), [loop_site(c) for c in captures]


# --------------------------------------------------------------------------- comparing


@dataclass
class _Judge:
    """Compares a run with the eager reference (and, a half-precision run, with fp32)."""

    tol: Any
    view: str
    ref: _Outcome
    ref32: _Outcome | None
    factor: float

    def checks(self, got: _Outcome) -> list[QuantityCheck]:
        out = []
        for name, want in self.ref.values.items():
            have = got.values.get(name)
            tol = self.tol.fwd if name.startswith("output:") else self.tol.bwd
            if have is None:
                out.append(QuantityCheck(name=name, error=float("inf"), bound=tol, ok=False))
                continue
            limit, against = tol, want
            if self.view == "float32" and self.ref32 is not None:
                against = self.ref32.values[name]
                limit = bound(tol, _error(want, against), self.factor)
            err = _error(have, against)
            err = float("inf") if err is None else err
            out.append(QuantityCheck(name=name, error=err, bound=limit, ok=err <= limit))
        return out


def _error(a: torch.Tensor, b: torch.Tensor) -> float | None:
    got = _finite_error(a, b)
    return None if got is None else got[0]


# --------------------------------------------------------------------------- the workflow


@dataclass
class CompiledResult:
    workspace: Path
    profile: CompiledDebugProfile
    report: Path

    @property
    def diverged(self) -> bool:
        return self.profile.verdict == "diverged"


def debug_compiled(
    target: str,
    *,
    workspace: Path,
    dtype: str = "float32",
    reference_dtype: str | None = None,
    seed: int = 0,
    backend: str | Callable = "aot_eager",
    db=None,
    name: str | None = None,
    progress: Progress = lambda _: None,
    force: bool = False,
) -> CompiledResult:
    # `force`: run in a workspace holding files debug did not write (else WorkspaceError)
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    view = reference_view(dtype, reference_dtype)
    claim(workspace, force)
    device = default_device()
    model32, batch, arch = build(target, seed)
    model32 = model32.to(device).train()
    model = copy.deepcopy(model32).to(DTYPES[dtype]) if dtype != "float32" else model32
    batch32 = _cast(batch, torch.float32, device)
    batch = _cast(batch, DTYPES[dtype], device)
    ref = _run(model, model, batch, seed)
    ref32 = _run(model32, model32, batch32, seed) if dtype != "float32" else None
    tol = DEFAULT_TOLERANCES[DTYPES[dtype]]
    judge = _Judge(tol, view, ref, ref32, base_factor())
    progress(f"[eager] {type(model).__name__}, {dtype}: {len(ref.values)} quantities")

    torch._dynamo.reset()  # a fresh capture, recompile limits included
    pristine = copy.deepcopy(model)  # before the source rewrite of loops, for a run without
    work = copy.deepcopy(model)
    switch = _Switch(backend, db=db)
    compiled, loop_sites = _compile(work, switch, loops=True)
    runs: list[CompiledRun] = []

    def run(only: frozenset[str] | None, label: str, on: tuple | None = None) -> Checks:
        """Runs with the sites of `only` replaced (None: every site); its checks."""
        module, fn, sw = on or (work, compiled, switch)
        sw.only = only
        start = time.perf_counter()
        checks = Checks(judge.checks(_run(module, fn, batch, seed)))
        failing = [c.name for c in checks if not c.ok]
        replaced = [s.key for s in sw.sites.get(only, []) if s.replaced]
        runs.append(CompiledRun(label=label, replaced=replaced, diverged=bool(failing),
                                failing=failing, seconds=time.perf_counter() - start))  # fmt: skip
        progress(f"[run] {label}: " + (f"diverged ({', '.join(failing[:3])})" if failing
                                       else "agrees"))  # fmt: skip
        return checks

    def without_loops() -> tuple:
        module, sw = copy.deepcopy(pristine), _Switch(backend, db=db)
        return module, _compile(module, sw, loops=False)[0], sw

    every = run(None, "every site")
    sites = loop_sites + switch.sites.get(None, [])
    checks = [
        SiteCheck(
            key=s.key,
            graph=s.graph,
            pattern=s.pattern,
            op=s.op,
            impl=s.impl,
            nodes=list(s.nodes),
            module=switch.module_of(s.graph, s.nodes[-1]),
            replaced=s.replaced,
            reason=s.reason,
        )
        for s in sites
    ]
    profile = CompiledDebugProfile(
        name=name or Path(target).name or target,
        target=target,
        architecture=arch,
        device=device_info(device).name,
        dtype=dtype,
        reference_dtype=view,
        seed=seed,
        backend=backend if isinstance(backend, str) else getattr(backend, "__name__", "backend"),
        tolerance_source="kernelwright.testing.tolerances: DEFAULT_TOLERANCES",
        tolerance=TolSpec(fwd=tol.fwd, bwd=tol.bwd),
        graphs=len(switch.graphs),
        sites=checks,
        checks=list(every),
    )
    if every.diverged:
        profile.divergence = _bisect(profile, run, every, without_loops)
    profile.verdict = "diverged" if profile.divergence else "no divergence"
    profile.runs = runs
    workspace.mkdir(parents=True, exist_ok=True)
    reviewed.write(profile, workspace / "profile.yaml")  # its digest: the workspace is debug's
    return CompiledResult(workspace, profile, write_compiled_report(profile, workspace))


class Checks(list):
    """The checks of one run (a list of `QuantityCheck`)."""

    @property
    def diverged(self) -> bool:
        return any(not c.ok for c in self)


def _bisect(profile, run, every: Checks, without_loops) -> CompiledDivergence:
    """The first replaced site (in capture order) whose replacement makes the run diverge."""
    graph_sites = [s for s in profile.sites if s.replaced and s.graph >= 0]
    loop_sites = [s for s in profile.sites if s.graph < 0]
    none = run(frozenset(), "no graph site")
    if none.diverged:
        site = None
        # the loops rewritten in the source are in every run: does it diverge without them?
        if loop_sites:
            plain = run(frozenset(), "no site, no loop rewritten", without_loops())
            site = None if plain.diverged else loop_sites[0]
        return _divergence(site, none, None, len(loop_sites))
    keys = [s.key for s in graph_sites]
    if not keys:  # every site diverged, none agrees, and there is no site: not repeatable
        return _divergence(None, every, None, 0)
    lo, hi = 0, len(keys)  # the first `lo` sites agree, the first `hi` diverge
    evidence = every
    while hi - lo > 1:
        mid = (lo + hi) // 2
        got = run(frozenset(keys[:mid]), f"first {mid} of {len(keys)} sites")
        if got.diverged:
            hi, evidence = mid, got
        else:
            lo = mid
    site = graph_sites[hi - 1]
    alone = True if hi == 1 else run(frozenset({site.key}), f"only {site.key}").diverged
    return _divergence(site, evidence, alone, 0)


def _divergence(site: SiteCheck | None, checks: list[QuantityCheck], alone: bool | None,
                loops: int) -> CompiledDivergence:  # fmt: skip
    bad = [c for c in checks if not c.ok]
    worst = max(bad, key=lambda c: c.error / c.bound if c.bound else float("inf"))
    forward = [c for c in bad if c.name.startswith("output:")]
    pass_name = "forward" if forward else "backward"
    shown = ", ".join(c.name for c in (forward or bad)[:4]) + (" ..." if len(bad) > 4 else "")
    if site is None:
        summary = ("the compiled model diverges with no site replaced"
                   + (" and no loop rewritten" if loops else "")
                   + f" ({shown}): not the rewrite; the capture or the backend")  # fmt: skip
    else:
        where = f" in {site.module}" if site.module else ""
        what = "the loops rewritten in the source" if site.graph < 0 else site.pattern
        summary = (
            f"{what} ({site.op} -> {site.impl or 'kernelwright'}) at {site.key}{where} is the "
            f"first replaced site whose replacement diverges ({pass_name}: {shown})"
            + ("" if alone is None else
               "; alone it diverges too" if alone else "; alone it agrees: with the sites "
               "before it only")
        )  # fmt: skip
    return CompiledDivergence(
        pass_name=pass_name,
        site=site,
        alone=alone,
        evidence=[c.name for c in bad],
        error=worst.error,
        tol=worst.bound,
        summary=summary,
    )


def write_compiled_report(profile: CompiledDebugProfile, ws: Path) -> Path:
    d = profile.divergence
    t = profile.tolerance
    lines = [
        f"# debug {profile.target} --compiled",
        "",
        f"{profile.architecture}, {profile.dtype}, seed {profile.seed}, on {profile.device}: "
        f"through kernelwright.compile (backend {profile.backend}, {profile.graphs} graph(s), "
        f"{sum(s.replaced for s in profile.sites)} of {len(profile.sites)} sites replaced) "
        f"against eager" + (" in fp32 (bound: tolerance + the eager run's own error there)"
                            if profile.reference_dtype == "float32" else "") + ".",
        "",
    ]  # fmt: skip
    if d is None:
        extra = ""
        if profile.reference_dtype == "float32":
            extra = " on top of the eager run's own error against fp32"
        lines += [
            f"**No divergence**: every output within {t.fwd:g} and every parameter gradient "
            f"within {t.bwd:g}{extra} (relative-norm error, {profile.tolerance_source}).",
            "",
        ]
    else:
        lines += [f"**Diverged ({d.pass_name}).** {d.summary}.", ""]
        if d.site is not None:
            lines += [
                f"Next: `kernelwright debug {d.site.op}` bisects the kernel itself; the site's "
                f"nodes: {', '.join(d.site.nodes)}.",
                "",
            ]
    lines += ["| site | pattern | op | module | replaced | impl |", "|---|---|---|---|---|---|"]
    for s in profile.sites:
        hit = d is not None and d.site is not None and d.site.key == s.key
        key = f"**{s.key}**" if hit else s.key
        lines.append(f"| {key} | {s.pattern} | {s.op} | {s.module or '-'} | "
                     f"{'yes' if s.replaced else 'no'} | {s.impl or '-'} |")  # fmt: skip
    lines += ["", "| run | sites replaced | verdict | failing |", "|---|---|---|---|"]
    for r in profile.runs:
        verdict = "diverged" if r.diverged else "agrees"
        lines.append(f"| {r.label} | {len(r.replaced)} | {verdict} | "
                     f"{', '.join(r.failing[:4]) or '-'} |")  # fmt: skip
    bad = [c for c in profile.checks if not c.ok]
    lines += ["", f"Every site replaced: {len(profile.checks) - len(bad)} of "
              f"{len(profile.checks)} quantities within their bound."]  # fmt: skip
    lines += [f"- {c.name}: {c.error:.3g} > {c.bound:.3g}" for c in bad]
    lines += [f"- note: {n}" for n in profile.notes]
    path = ws / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path
