"""`kernelwright debug MODEL`: the first module where a patched model leaves the unpatched one.

One small model (a tiny config of the model type, or a config.json / a directory holding one,
used as it is), its vectors spread around their init (a dropped norm weight or offset must show
at step 0), a deep copy patched (`kernelwright.patch`, or any `patch_fn`), one batch through
both in train mode and one backward of the loss. Hooks on every module record, per call, the
output (the first tensor of it), the gradient of that output and the gradient of the module's
input; every parameter's gradient is compared too.

- Forward: the first module call, in the order calls finish (a child before its parent),
  whose output leaves the reference beyond the dtype's forward tolerance.
- Backward (when the forward agrees): walking the calls backwards (the backward's order), the
  first module whose output gradient agrees but whose input gradient does not; of nested
  candidates, the innermost. Its own backward made the difference.
Tolerances are the project's per-dtype defaults (testing/tolerances.py); `error_growth.png`
plots every call's error in order, with the tolerances.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from kernelwright.profiles.debug import (
    ModelDebugProfile,
    ModelDivergence,
    ModuleCheck,
    ParamCheck,
    TolSpec,
)
from kernelwright.runtime import default_device, device_info
from kernelwright.testing.tolerances import DEFAULT_TOLERANCES
from kernelwright.workflows.debug.numerics import _finite_error

Progress = Callable[[str], None]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def is_model(target: str) -> bool:
    """A model type transformers registers, a config.json, or a directory holding one."""
    path = Path(target)
    if path.suffix == ".json" and path.is_file():
        return True
    if path.is_dir() and (path / "config.json").is_file():
        return True
    if "/" in target or ":" in target:
        return False
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    return target in CONFIG_MAPPING


def build_config(target: str):
    from transformers import AutoConfig

    from kernelwright.testing.model_configs import _training_ready, tiny_config

    path = Path(target)
    if path.is_dir() or path.suffix == ".json":
        source = path if path.is_dir() else path.parent
        return _training_ready(AutoConfig.from_pretrained(source), {})
    return tiny_config(target)


def _default_patch(model):
    from kernelwright.integrations.transformers.patch import patch

    return patch(model)


def _first_tensor(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value if value.is_floating_point() else None
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        for v in value:
            t = _first_tensor(v)
            if t is not None:
                return t
    return None


@dataclass
class _Call:
    key: str
    cls: str
    out: torch.Tensor | None = None
    grad: torch.Tensor | None = None
    input_grad: torch.Tensor | None = None


@dataclass
class _Recorder:
    """Per module call: output, its gradient, the gradient of the module's input."""

    calls: dict[str, _Call] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)
    handles: list = field(default_factory=list)

    def attach(self, model: torch.nn.Module) -> None:
        seen: dict[str, int] = {}
        for name, module in model.named_modules():
            label = name or "(model)"

            def hook(mod, args, kwargs, out, label=label):
                n = seen.get(label, 0)
                seen[label] = n + 1
                key = label if n == 0 else f"{label}#{n}"
                call = _Call(key, type(mod).__name__)
                self.calls[key] = call
                self.order.append(key)
                t = _first_tensor(out)
                if t is not None:
                    call.out = t.detach().float().clone()
                    if t.requires_grad:
                        t.register_hook(
                            lambda g, c=call: setattr(c, "grad", g.detach().float().clone())
                        )
                x = _first_tensor(list(args) + list(kwargs.values()))
                if x is not None and x.requires_grad:
                    x.register_hook(
                        lambda g, c=call: setattr(c, "input_grad", g.detach().float().clone())
                    )

            self.handles.append(module.register_forward_hook(hook, with_kwargs=True))

    def detach(self) -> None:
        for h in self.handles:
            h.remove()


def _error(a: torch.Tensor | None, b: torch.Tensor | None) -> float | None:
    if a is None or b is None:
        return None
    got = _finite_error(a, b)
    if got is None:
        return None
    err, max_abs = got
    return err


def _spread(model: torch.nn.Module, seed: int) -> None:
    # norm weights start as ones (or zeros under 1 + w) and biases as zeros: a patch that drops
    # the weight or the offset would agree at init; spread every 1-D parameter around it
    gen = torch.Generator().manual_seed(seed + 2)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.add_(0.1 * torch.randn(p.shape, generator=gen, dtype=p.dtype))


@dataclass
class ModelResult:
    workspace: Path
    profile: ModelDebugProfile
    report: Path
    plot: Path | None

    @property
    def diverged(self) -> bool:
        return self.profile.verdict == "diverged"


def debug_model(
    target: str,
    *,
    workspace: Path,
    dtype: str = "float32",
    seed: int = 0,
    batch: int = 2,
    seq: int = 16,
    patch_fn: Callable[[torch.nn.Module], Any] | None = None,
    name: str | None = None,
    progress: Progress = lambda _: None,
) -> ModelResult:
    from transformers import AutoModelForCausalLM

    from kernelwright.testing.convergence import make_batches

    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    config = build_config(target)
    device = default_device()
    torch.manual_seed(seed)
    ref = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _spread(ref, seed)
    ref = ref.to(device=device, dtype=DTYPES[dtype]).train()
    patched = copy.deepcopy(ref)
    (patch_fn or _default_patch)(patched)
    swapped = [n or "(model)" for n, m in patched.named_modules() if "forward" in m.__dict__]
    progress(f"[model] {type(ref).__name__} ({config.model_type}), {dtype}; patched: "
             f"{', '.join(swapped) or 'nothing'}")  # fmt: skip
    vocab = config.get_text_config().vocab_size
    ids, labels = make_batches(vocab, count=1, batch=batch, seq=seq, seed=seed + 1)[0]
    ids, labels = ids.to(device), labels.to(device)
    recorders = {}
    losses = {}
    for key, model in (("reference", ref), ("patched", patched)):
        rec = _Recorder()
        rec.attach(model)
        model.zero_grad(set_to_none=True)
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        rec.detach()
        recorders[key], losses[key] = rec, float(loss.detach().float())
        progress(f"[{key}] loss {losses[key]:.6f}")
    tol = DEFAULT_TOLERANCES[DTYPES[dtype]]
    r, p = recorders["reference"], recorders["patched"]
    modules = []
    for i, key in enumerate(r.order):
        a, b = r.calls[key], p.calls.get(key)
        modules.append(
            ModuleCheck(
                index=i,
                name=key,
                cls=a.cls,
                forward_error=_error(b.out, a.out) if b else None,
                grad_error=_error(b.grad, a.grad) if b else None,
                input_grad_error=_error(b.input_grad, a.input_grad) if b else None,
                patched=key.split("#")[0] in swapped,
            )
        )
    theirs = dict(patched.named_parameters())
    params = []
    for pname, param in ref.named_parameters():
        other = theirs.get(pname)
        if param.grad is None or other is None or other.grad is None:
            continue
        err = _error(other.grad.float(), param.grad.float())
        if err is not None:
            params.append(ParamCheck(name=pname, error=err, ok=err <= tol.bwd))
    profile = ModelDebugProfile(
        name=name or Path(target).name or target,
        target=target,
        model_type=config.model_type,
        architecture=type(ref).__name__,
        device=device_info(device).name,
        dtype=dtype,
        seed=seed,
        batch=batch,
        seq=seq,
        patched=swapped,
        tolerance_source="kernelwright.testing.tolerances: DEFAULT_TOLERANCES",
        tolerance=TolSpec(fwd=tol.fwd, bwd=tol.bwd),
        loss_reference=losses["reference"],
        loss_patched=losses["patched"],
        modules=modules,
        params=params,
    )
    profile.divergence = first_divergence(profile)
    profile.verdict = "diverged" if profile.divergence else "no divergence"
    if profile.divergence is None and abs(losses["patched"] - losses["reference"]) > tol.fwd * max(
        1.0, abs(losses["reference"])
    ):
        profile.notes.append(
            "the losses differ beyond the forward tolerance while no module's output does: "
            "the difference is in the loss itself (a fused loss replaced the lm_head)"
        )
        profile.verdict = "diverged"
        profile.divergence = ModelDivergence(
            pass_name="forward",
            module="(loss)",
            cls=type(ref).__name__,
            error=abs(losses["patched"] - losses["reference"])
            / max(abs(losses["reference"]), 1e-12),
            tol=tol.fwd,
            evidence="the loss",
            summary="the loss diverges with every module's output within the tolerance",
        )
    workspace.mkdir(parents=True, exist_ok=True)
    plot = plot_growth(profile, workspace / "error_growth.png")
    profile.plot = plot.name if plot else None
    profile.save(workspace / "profile.yaml")
    report = write_model_report(profile, workspace)
    return ModelResult(workspace, profile, report, plot)


def first_divergence(profile: ModelDebugProfile) -> ModelDivergence | None:
    tol = profile.tolerance
    for m in profile.modules:
        if m.forward_error is not None and not m.forward_error <= tol.fwd:
            return ModelDivergence(
                pass_name="forward",
                module=m.name,
                cls=m.cls,
                error=m.forward_error,
                tol=tol.fwd,
                evidence="its output",
                summary=(
                    f"{m.name} ({m.cls}{', patched' if m.patched else ''}) is the first module "
                    f"whose output leaves the reference: {m.forward_error:.3g} > tol {tol.fwd:g}"
                ),
            )

    def bad(e: float | None) -> bool:
        return e is not None and not e <= tol.bwd

    candidates = [m for m in reversed(profile.modules)
                  if bad(m.input_grad_error) and not bad(m.grad_error)]  # fmt: skip
    for m in candidates:
        base = m.name.split("#")[0]
        if any(c is not m and c.name.startswith(base + ".") for c in candidates):
            continue  # an inner module explains it
        return ModelDivergence(
            pass_name="backward",
            module=m.name,
            cls=m.cls,
            error=m.input_grad_error,
            tol=tol.bwd,
            evidence="the gradient of its input (its output's gradient agrees)",
            summary=(
                f"{m.name} ({m.cls}{', patched' if m.patched else ''}) is the first module, in "
                f"the backward's order, whose input gradient leaves the reference "
                f"({m.input_grad_error:.3g} > tol {tol.bwd:g}) while its output gradient agrees"
            ),
        )
    worst = [q for q in profile.params if not q.ok]
    if worst:
        q = worst[-1]  # parameters are listed in forward order: the backward meets the last first
        module = q.name.rsplit(".", 1)[0]
        return ModelDivergence(
            pass_name="backward",
            module=module,
            cls="",
            error=q.error,
            tol=tol.bwd,
            evidence=f"the gradient of its parameter {q.name}",
            summary=f"the gradient of {q.name} leaves the reference ({q.error:.3g} > {tol.bwd:g})",
        )
    return None


def plot_growth(profile: ModelDebugProfile, path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        profile.notes.append("matplotlib is not installed: no error_growth.png")
        return None
    floor = 1e-12
    fig, ax = plt.subplots(figsize=(11, 4.5))
    for attr, label in (("forward_error", "output"), ("grad_error", "gradient of the output")):
        xs = [m.index for m in profile.modules if getattr(m, attr) is not None]
        ys = [max(getattr(m, attr), floor) if math.isfinite(getattr(m, attr)) else 1e3
              for m in profile.modules if getattr(m, attr) is not None]  # fmt: skip
        ax.plot(xs, ys, marker=".", linewidth=1, label=label)
    ax.axhline(profile.tolerance.fwd, color="C0", linestyle=":", label="forward tolerance")
    ax.axhline(profile.tolerance.bwd, color="C1", linestyle=":", label="gradient tolerance")
    d = profile.divergence
    if d is not None:
        hit = next((m.index for m in profile.modules if m.name == d.module), None)
        if hit is not None:
            ax.axvline(hit, color="red", linewidth=1, label=f"first divergence: {d.module}")
    layers = [m for m in profile.modules if m.name.count(".") == 2 and ".layers." in m.name]
    ax.set_xticks([m.index for m in layers], [f"layer {m.name.split('.')[-1]}" for m in layers])
    ax.set_xlabel("module calls in the order they finish (ticks: where each decoder layer ends)")
    ax.set_yscale("log")
    ax.set_ylabel(f"relative-norm error vs unpatched (0 drawn at {floor:g})")
    ax.set_title(f"{profile.architecture} {profile.dtype}: patched vs unpatched, per module")
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_model_report(profile: ModelDebugProfile, ws: Path) -> Path:
    d = profile.divergence
    t = profile.tolerance
    lines = [
        f"# debug {profile.target}",
        "",
        f"{profile.architecture} ({profile.model_type}), {profile.dtype}, batch {profile.batch} "
        f"x {profile.seq} tokens, seed {profile.seed}, on {profile.device}: the patched model "
        "against the same model unpatched. Loss: reference "
        f"{profile.loss_reference:.6f}, patched {profile.loss_patched:.6f}.",
        "",
        f"Patched modules: {', '.join(profile.patched) or 'none'}.",
        "",
    ]
    if d is None:
        lines += [
            f"**No divergence**: every module's output within {t.fwd:g} and every gradient "
            f"within {t.bwd:g} (relative-norm error, {profile.tolerance_source}).",
            "",
        ]
    else:
        lines += [f"**Diverged ({d.pass_name}) at {d.module}.** {d.summary}.", ""]
        lines += [
            "Next: bisect the op behind it with `kernelwright debug OP` (forward vs each "
            "gradient, dtype, shapes, layouts, values, launch configs).",
            "",
        ]
    if profile.plot:
        lines += [f"![per-module error]({profile.plot})", ""]
    lines += ["| # | module | class | patched | output | output grad | input grad |",
              "|---|---|---|---|---|---|---|"]  # fmt: skip

    def fmt(e: float | None) -> str:
        return "-" if e is None else f"{e:.2e}"

    for m in profile.modules:
        lines.append(
            f"| {m.index} | {m.name} | {m.cls} | {'yes' if m.patched else ''} | "
            f"{fmt(m.forward_error)} | {fmt(m.grad_error)} | {fmt(m.input_grad_error)} |"
        )
    bad = [q for q in profile.params if not q.ok]
    lines += ["", f"Parameter gradients: {len(profile.params) - len(bad)} of "
              f"{len(profile.params)} within {t.bwd:g}."]  # fmt: skip
    lines += [f"- {q.name}: {q.error:.3g}" for q in bad]
    lines += [f"- note: {n}" for n in profile.notes]
    path = ws / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path
