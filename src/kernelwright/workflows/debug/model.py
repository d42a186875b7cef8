"""`kernelwright debug MODEL`: the first module where a patched model leaves the unpatched one.

One small model (a tiny config of the model type, or a config.json / a directory holding one,
used as it is), its vectors spread around their init (a dropped norm weight or offset must show
at step 0); or a checkpoint (a directory with weights beside its config.json: loaded as they
are, for a bug that only trained weights reach). A deep copy patched (`kernelwright.patch`, or
any `patch_fn`), one batch through both in train mode and one backward of the loss. Hooks on
every module record, per call, the output (the first tensor of it), the gradient of that output
and the gradient of the module's input; every parameter's gradient is compared too.

- Forward: the first module call, in the order calls finish (a child before its parent),
  whose output leaves the reference beyond the dtype's forward tolerance.
- Backward (when the forward agrees): walking the calls backwards (the backward's order), the
  first module whose output gradient agrees but whose input gradient does not; of nested
  candidates, the innermost, and not one that shares its input tensor with a module whose
  output gradient is out (a hook sees the input's gradient summed over its readers: up_proj
  beside a wrong gate branch). Its own backward made the difference. If an output gradient is
  out before that (the gradient a loss or head computed in the parent's own forward sends
  back, e.g. a fused linear cross-entropy), the parent is named. Else the last parameter
  whose gradient is out.
Tolerances are the project's per-dtype defaults (testing/tolerances.py); `error_growth.png`
plots every call's error in order, with the tolerances.

A bf16 run has two views. "same": against the unpatched model in bf16, to the bf16 tolerance.
"float32": against the unpatched model in fp32, where each error's bound is the bf16 tolerance
plus the unpatched bf16 model's own error there (what bf16 costs at that point already): a
kernel that keeps fp32 intermediates where eager rounds to bf16 differs from the bf16 model
but is no further from fp32, and only the second view tells the two apart. Both are reported;
`reference_dtype` picks the one that decides (default: "float32" for a bf16 run).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from kernelwright.profiles import reviewed
from kernelwright.profiles.debug import (
    ModelDebugProfile,
    ModelDivergence,
    ModuleCheck,
    ParamCheck,
    TolSpec,
    VsFp32,
)
from kernelwright.runtime import default_device, device_info
from kernelwright.testing.tolerances import DEFAULT_TOLERANCES
from kernelwright.workflows.debug.model_report import plot_growth, write_model_report
from kernelwright.workflows.debug.numerics import _finite_error
from kernelwright.workflows.debug.run import claim

Progress = Callable[[str], None]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
VIEWS = ("same", "float32")


def reference_view(dtype: str, reference_dtype: str | None) -> str:
    """The view that decides: "same" (the unpatched model in the run's dtype) or "float32"
    (the unpatched model in fp32; "fp32" reads the same). None: "float32" for a half-precision
    run. A float32 run has one view ("same")."""
    view = {"fp32": "float32", None: "float32"}.get(reference_dtype, reference_dtype)
    if view not in VIEWS:
        raise ValueError(f"reference dtype must be same or float32, got {reference_dtype!r}")
    return "same" if dtype == "float32" else view


def base_factor() -> float:
    """How many times the unpatched run's own error against fp32 the fp32 view allows: 1, and 2
    under Triton's interpreter, whose casts to bf16 truncate where the GPU (and torch) round to
    nearest: twice the rounding error in every kernel's output."""
    from kernelwright.runtime.device import interpreter_mode

    return 2.0 if interpreter_mode() else 1.0


def bound(tol: float, base: float | None, factor: float = 1.0) -> float:
    """A bound on an error: the tolerance, plus (fp32 view) `factor` times the unpatched run's
    own error there (`base`)."""
    return tol + (factor * base if base is not None and math.isfinite(base) else 0.0)


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


WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")  # fmt: skip


def weights_of(target: str) -> Path | None:
    """The folder `target` names when it holds weights beside its config.json (a checkpoint,
    as `save_pretrained` writes it); None for a model type, a config.json or a bare config."""
    path = Path(target)
    if path.is_dir() and any((path / f).is_file() for f in WEIGHT_FILES):
        return path
    return None


def build_config(target: str):
    from transformers import AutoConfig

    from kernelwright.testing.model_configs import _training_ready, tiny_config

    path = Path(target)
    if path.is_dir() or path.suffix == ".json":
        from kernelwright.integrations.transformers.analysis.load import _read_json

        # a .json is read as the file it is (`qwen.json` beside another model's config.json
        # is qwen's config); one that is not a JSON object is a ValueError naming the file
        _read_json(path / "config.json" if path.is_dir() else path)
        return _training_ready(AutoConfig.from_pretrained(path), {})
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
    input: int | None = None  # which tensor it took: calls given the same one share the number


@dataclass
class _Recorder:
    """Per module call: output, its gradient, the gradient of the module's input (of that
    tensor: the sum over every module and op that read it)."""

    calls: dict[str, _Call] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)
    handles: list = field(default_factory=list)
    inputs: dict[int, tuple[int, torch.Tensor]] = field(default_factory=dict)  # id -> (n, x)

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
                if x is not None:
                    # the tensor is kept while the recorder lives, so that its id stays its own
                    call.input = self.inputs.setdefault(id(x), (len(self.inputs), x))[0]
                if x is not None and x.requires_grad:
                    x.register_hook(
                        lambda g, c=call: setattr(c, "input_grad", g.detach().float().clone())
                    )

            self.handles.append(module.register_forward_hook(hook, with_kwargs=True))

    def detach(self) -> None:
        for h in self.handles:
            h.remove()
        self.inputs.clear()


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
    reference_dtype: str | None = None,
    seed: int = 0,
    batch: int = 2,
    seq: int = 16,
    patch_fn: Callable[[torch.nn.Module], Any] | None = None,
    name: str | None = None,
    progress: Progress = lambda _: None,
    inputs: tuple[torch.Tensor, torch.Tensor] | None = None,
    force: bool = False,
) -> ModelResult:
    # `inputs`: the (input_ids, labels) batch to run, e.g. one of the training run's; by
    # default `batch` x `seq` tokens of make_batches' bigram language. `force`: run in a
    # workspace holding files debug did not write (else WorkspaceError, before any work)
    from transformers import AutoModelForCausalLM

    from kernelwright.testing.convergence import make_batches

    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    view = reference_view(dtype, reference_dtype)
    two_views = dtype != "float32"
    config = build_config(target)
    claim(workspace, force)
    device = default_device()
    torch.manual_seed(seed)
    weights = weights_of(target)
    if weights is None:
        ref32 = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        _spread(ref32, seed)
    else:  # a checkpoint: its weights as trained (a bug that needs trained weights shows)
        ref32 = AutoModelForCausalLM.from_pretrained(weights, config=config, dtype=torch.float32)
    ref32 = ref32.to(device=device).train()
    ref = copy.deepcopy(ref32).to(dtype=DTYPES[dtype]) if two_views else ref32
    patched = copy.deepcopy(ref)
    (patch_fn or _default_patch)(patched)
    swapped = [n or "(model)" for n, m in patched.named_modules() if "forward" in m.__dict__]
    progress(f"[model] {type(ref).__name__} ({config.model_type}), {dtype}; patched: "
             f"{', '.join(swapped) or 'nothing'}")  # fmt: skip
    vocab = config.get_text_config().vocab_size
    if inputs is None:
        ids, labels = make_batches(vocab, count=1, batch=batch, seq=seq, seed=seed + 1)[0]
    else:
        ids, labels = inputs
        batch, seq = ids.shape
    ids, labels = ids.to(device), labels.to(device)
    recorders = {}
    losses = {}
    runs = [("reference", ref), ("patched", patched)] + [("fp32", ref32)] * two_views
    for key, model in runs:
        rec = _Recorder()
        rec.attach(model)
        model.zero_grad(set_to_none=True)
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        rec.detach()
        recorders[key], losses[key] = rec, float(loss.detach().float())
        progress(f"[{key}] loss {losses[key]:.6f}")
    tol = DEFAULT_TOLERANCES[DTYPES[dtype]]
    factor = base_factor()
    r, p, f = recorders["reference"], recorders["patched"], recorders.get("fp32")
    modules = []
    for i, key in enumerate(r.order):
        a, b = r.calls[key], p.calls.get(key)
        c = f.calls.get(key) if f is not None else None
        vs32 = None
        if c is not None and b is not None:
            vs32 = VsFp32(
                forward=_error(b.out, c.out),
                grad=_error(b.grad, c.grad),
                input_grad=_error(b.input_grad, c.input_grad),
                forward_unpatched=_error(a.out, c.out),
                grad_unpatched=_error(a.grad, c.grad),
                input_grad_unpatched=_error(a.input_grad, c.input_grad),
            )
        modules.append(
            ModuleCheck(
                index=i,
                name=key,
                cls=a.cls,
                forward_error=_error(b.out, a.out) if b else None,
                grad_error=_error(b.grad, a.grad) if b else None,
                input_grad_error=_error(b.input_grad, a.input_grad) if b else None,
                patched=key.split("#")[0] in swapped,
                input=a.input,
                fp32=vs32,
            )
        )
    theirs = dict(patched.named_parameters())
    fp32_params = dict(ref32.named_parameters()) if two_views else {}
    params = []
    for pname, param in ref.named_parameters():
        other = theirs.get(pname)
        if param.grad is None or other is None or other.grad is None:
            continue
        err = _error(other.grad.float(), param.grad.float())
        if err is None:
            continue
        q = ParamCheck(name=pname, error=err, ok=err <= tol.bwd)
        p32 = fp32_params.get(pname)
        if p32 is not None and p32.grad is not None:
            q.fp32_error = _error(other.grad.float(), p32.grad.float())
            q.fp32_unpatched_error = _error(param.grad.float(), p32.grad.float())
            if view == "float32" and q.fp32_error is not None:
                q.ok = q.fp32_error <= bound(tol.bwd, q.fp32_unpatched_error, factor)
        params.append(q)
    profile = ModelDebugProfile(
        name=name or Path(target).name or target,
        target=target,
        model_type=config.model_type,
        architecture=type(ref).__name__,
        device=device_info(device).name,
        dtype=dtype,
        reference_dtype=view,
        seed=seed,
        batch=batch,
        seq=seq,
        weights=str(weights) if weights is not None else None,
        patched=swapped,
        tolerance_source="kernelwright.testing.tolerances: DEFAULT_TOLERANCES",
        tolerance=TolSpec(fwd=tol.fwd, bwd=tol.bwd),
        loss_reference=losses["reference"],
        loss_patched=losses["patched"],
        loss_fp32=losses.get("fp32"),
        fp32_base_factor=factor,
        modules=modules,
        params=params,
    )
    for v in VIEWS[: 1 + two_views]:
        profile.divergences[v] = first_divergence(profile, v) or loss_divergence(profile, v)
    profile.divergence = profile.divergences[view]
    profile.verdict = "diverged" if profile.divergence else "no divergence"
    if profile.divergence is not None and profile.divergence.module == "(loss)":
        profile.notes.append(
            "the losses differ beyond the forward tolerance while no module's output does: "
            "the difference is in the loss itself (a fused loss replaced the lm_head)"
        )
    other = "float32" if view == "same" else "same"
    if two_views and (profile.divergences[other] is None) != (profile.divergence is None):
        profile.notes.append(view_note(profile, other))
    workspace.mkdir(parents=True, exist_ok=True)
    plot = plot_growth(profile, workspace / "error_growth.png")
    profile.plot = plot.name if plot else None
    reviewed.write(profile, workspace / "profile.yaml")  # its digest: the workspace is debug's
    report = write_model_report(profile, workspace)
    return ModelResult(workspace, profile, report, plot)


def view_note(profile: ModelDebugProfile, other: str) -> str:
    """Why the two views of a bf16 run disagree, in a sentence."""
    d = profile.divergences[other]
    if d is None:
        return (
            f"against the {'fp32' if other == 'float32' else profile.dtype} reference "
            "nothing diverges"
            + (
                ": the patched run is no further from fp32 than the unpatched bf16 model "
                "(a kernel that rounds less than eager), not a bug"
                if other == "float32"
                else ""
            )
        )
    where = "the fp32 reference" if other == "float32" else f"the unpatched {profile.dtype} model"
    return f"against {where} it diverges ({d.pass_name}) at {d.module}: {d.summary}"


def _errors(m: ModuleCheck, view: str) -> tuple[float | None, ...]:
    """(output, output grad, input grad) errors of `m` in `view`, then the unpatched run's own
    (None in the same view: no allowance)."""
    if view == "same" or m.fp32 is None:
        return m.forward_error, m.grad_error, m.input_grad_error, None, None, None
    v = m.fp32
    return v.forward, v.grad, v.input_grad, v.forward_unpatched, v.grad_unpatched, \
        v.input_grad_unpatched  # fmt: skip


def _against(profile: ModelDebugProfile, view: str) -> str:
    return "the fp32 reference" if view == "float32" else "the reference"


def _bound_text(err: float, limit: float, tol: float, view: str) -> str:
    if view == "same":
        return f"{err:.3g} > tol {tol:g}"
    return f"{err:.3g} > {limit:.3g} (tol {tol:g} + the unpatched model's own error there)"


def first_divergence(profile: ModelDebugProfile, view: str = "same") -> ModelDivergence | None:
    tol = profile.tolerance
    k = profile.fp32_base_factor
    against = _against(profile, view)
    for m in profile.modules:
        fwd, _, _, fwd0, _, _ = _errors(m, view)
        limit = bound(tol.fwd, fwd0, k)
        if fwd is not None and not fwd <= limit:
            return ModelDivergence(
                pass_name="forward",
                module=m.name,
                cls=m.cls,
                error=fwd,
                tol=limit,
                evidence="its output",
                view=view,
                summary=(
                    f"{m.name} ({m.cls}{', patched' if m.patched else ''}) is the first module "
                    f"whose output leaves {against}: {_bound_text(fwd, limit, tol.fwd, view)}"
                ),
            )

    def bad(e: float | None, base: float | None) -> bool:
        return e is not None and not e <= bound(tol.bwd, base, k)

    # In the backward's order (calls in reverse), the first of: a module whose output gradient
    # agrees and whose input gradient does not (its own backward), or an output gradient that is
    # already out (made by the parent's own code: a loss or head computed in its forward, which
    # no hooked module's backward runs). A module no gradient reached is no candidate.
    candidates, head = [], None
    for pos, m in enumerate(reversed(profile.modules)):
        _, g, ig, _, g0, ig0 = _errors(m, view)
        if g is None:
            continue
        if bad(g, g0):
            if head is None and m.name != "(model)":
                head = (pos, m, g, bound(tol.bwd, g0, k))
        elif bad(ig, ig0) and not _shared_input_explains(profile, m, view):
            candidates.append((pos, m, ig, bound(tol.bwd, ig0, k)))
    for pos, m, ig, limit in candidates:
        base = m.name.split("#")[0]
        if any(c is not m and c.name.startswith(base + ".") for _, c, _, _ in candidates):
            continue  # an inner module explains it
        if head is not None and head[0] < pos:
            break
        return ModelDivergence(
            pass_name="backward",
            module=m.name,
            cls=m.cls,
            error=ig,
            tol=limit,
            evidence="the gradient of its input (its output's gradient agrees)",
            view=view,
            summary=(
                f"{m.name} ({m.cls}{', patched' if m.patched else ''}) is the first module, in "
                f"the backward's order, whose input gradient leaves {against} "
                f"({_bound_text(ig, limit, tol.bwd, view)}) while its output gradient agrees"
            ),
        )
    if head is not None:
        _, child, g, limit = head
        name = child.name.split("#")[0]
        owner = name.rsplit(".", 1)[0] if "." in name else "(model)"
        m = next((c for c in profile.modules if c.name == owner), None)
        cls, patched = (m.cls, m.patched) if m is not None else ("", False)
        return ModelDivergence(
            pass_name="backward",
            module=owner,
            cls=cls,
            error=g,
            tol=limit,
            evidence=f"the gradient its own code passes to {child.name}'s output",
            view=view,
            summary=(
                f"{owner} ({cls}{', patched' if patched else ''}): the gradient its own code "
                f"(a loss or head in its forward) passes to {child.name}'s output leaves "
                f"{against} ({_bound_text(g, limit, tol.bwd, view)}) before any module's "
                "backward has run"
            ),
        )
    worst = []
    for q in profile.params:
        err, base = (q.error, None) if view == "same" else (q.fp32_error, q.fp32_unpatched_error)
        if err is not None and not err <= bound(tol.bwd, base, k):
            worst.append((q, err, bound(tol.bwd, base, k)))
    if worst:
        q, err, limit = worst[-1]  # listed in forward order: the backward meets the last first
        module = q.name.rsplit(".", 1)[0]
        return ModelDivergence(
            pass_name="backward",
            module=module,
            cls="",
            error=err,
            tol=limit,
            evidence=f"the gradient of its parameter {q.name}",
            view=view,
            summary=f"the gradient of {q.name} leaves {against} "
            f"({_bound_text(err, limit, tol.bwd, view)})",
        )
    return None


def _shared_input_explains(profile: ModelDebugProfile, m: ModuleCheck, view: str) -> bool:
    """Another module read the same input tensor as `m` (q/k/v projections, gate and up) and
    got a wrong output gradient: that one's backward may have put the error into the input's
    gradient, which hooks see only summed. Modules inside `m` do not count (their backward is
    part of its own)."""
    if m.input is None:
        return False
    inside = m.name.split("#")[0] + "."
    k = profile.fp32_base_factor
    for n in profile.modules:
        if n is m or n.input != m.input or n.name.startswith(inside):
            continue
        _, g, _, _, g0, _ = _errors(n, view)
        if g is not None and not g <= bound(profile.tolerance.bwd, g0, k):
            return True
    return False


def loss_divergence(profile: ModelDebugProfile, view: str = "same") -> ModelDivergence | None:
    """The loss beyond the forward tolerance while every module's output agrees."""
    tol = profile.tolerance.fwd
    if view == "same" or profile.loss_fp32 is None:
        ref, base = profile.loss_reference, 0.0
    else:
        ref = profile.loss_fp32
        base = abs(profile.loss_reference - ref) / max(abs(ref), 1.0)
    err = abs(profile.loss_patched - ref) / max(abs(ref), 1.0)
    limit = bound(tol, base, profile.fp32_base_factor)
    if err <= limit:
        return None
    return ModelDivergence(
        pass_name="forward",
        module="(loss)",
        cls=profile.architecture,
        error=err,
        tol=limit,
        evidence="the loss",
        view=view,
        summary=f"the loss diverges with every module's output within the bound "
        f"({_bound_text(err, limit, tol, view)})",
    )
