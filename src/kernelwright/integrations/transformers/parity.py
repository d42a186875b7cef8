"""Model parity: a patched model against the same model unpatched, and the demotion of what differs.

The per-decision checks (`analysis/checks.py`) run one module or function in isolation. What
they cannot see is how the pieces are wired together in the model: the conventions of the
causal-LM loss the fused forward replaces (label shift, reduction, `ignore_index`, logit
scaling and soft-capping), a forward that behaves differently in `train()` than in `eval()`,
an aux loss the model adds on its own. `measure` runs the whole model on one batch, in training
and in evaluation mode, and `compare` holds the patched model to the unpatched one:

- the loss with labels (15 % of them `ignore_index`), in `train()` with `num_items_in_batch`
  (as the HF Trainer passes it, where the forward takes loss kwargs) and in `eval()` without;
- every parameter's gradient of that loss, in both modes;
- the log-probabilities of the unpatched model's top-k tokens without labels, in both modes.

`confirm(model, profile)` patches the model with the profile, compares, and when it fails
finds the decisions responsible: each patched decision alone, then the survivors together,
dropping them one at a time until the rest agree. Every decision that fails is demoted to
"unsupported" with the measured difference as its reason; every decision that stays gets the
measurement as evidence. The model is returned unpatched.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from kernelwright.profiles.model import Decision, Evidence, ModelProfile

IGNORE_INDEX = -100


class _Drop(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return False


@contextlib.contextmanager
def _muted():
    """No records from kernelwright's logger (`patch`'s one line) inside the block."""
    log, drop = logging.getLogger("kernelwright"), _Drop()
    log.addFilter(drop)
    try:
        yield
    finally:
        log.removeFilter(drop)


@dataclass(frozen=True)
class ParityTolerance:
    loss: float  # |loss_patched - loss_ref|, nats, in each mode
    grads: float  # ||g_patched - g_ref|| / ||g_ref|| over all parameters together, each mode
    logprobs: float  # max |log p_patched - log p_ref| at the reference's top-k tokens


# One forward and backward on identical weights and inputs: only the order of floating-point
# sums separates a correct patch from the module it replaces (fp32 rounding, a few ulps a sum).
# A wrong convention (an unshifted label, another reduction, a missing soft-cap) moves the loss
# and the gradients by orders of magnitude more. The model check of `patch(model)` runs in
# fp32. In bf16 (the sweep's `--dtype bf16`, both models in bf16) every activation is rounded
# to 8 bits of mantissa: loss and gradients get the convergence table's bf16 step-0 bounds (the
# same quantities after one forward and backward), log-probs about ten times what the tiny
# trained architectures show (a few 1e-3). A wrong label shift or logit scale still moves the
# loss by a nat; bf16 is the weaker check by nature, fp32 is where an equivalence is proven.
PARITY_TOLERANCES: dict[torch.dtype, ParityTolerance] = {
    torch.float32: ParityTolerance(loss=5e-5, grads=1e-4, logprobs=1e-4),
    torch.bfloat16: ParityTolerance(loss=2e-2, grads=1e-1, logprobs=5e-2),
}
TOPK = 5
DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16"}


def model_dtype(model: nn.Module) -> torch.dtype:
    """The dtype the model computes in: that of most of its floating-point parameters (a
    model loaded in bf16 may keep a few modules in fp32)."""
    counts: dict[torch.dtype, int] = {}
    for p in model.parameters():
        if p.is_floating_point():
            counts[p.dtype] = counts.get(p.dtype, 0) + p.numel()
    return max(counts, key=counts.get) if counts else torch.float32


def tolerance_for(dtype: torch.dtype) -> ParityTolerance:
    """The PARITY_TOLERANCES row of `dtype`; a dtype without one is an error, not fp32's."""
    if dtype not in PARITY_TOLERANCES:
        known = ", ".join(DTYPE_NAMES.get(d, str(d)) for d in PARITY_TOLERANCES)
        raise ValueError(f"no parity tolerance for {dtype} (known: {known})")
    return PARITY_TOLERANCES[dtype]


@dataclass
class Batch:
    input_ids: torch.Tensor  # [B, T]
    labels: torch.Tensor  # [B, T], IGNORE_INDEX where not trained on
    # further model inputs of every call (pixel_values, image_grid_thw, ...: `pixels.py`)
    inputs: dict[str, torch.Tensor] = field(default_factory=dict)
    note: str = ""  # what the batch holds beside text, or why it holds text only

    @property
    def has_images(self) -> bool:
        return "pixel_values" in self.inputs


def make_batch(vocab_size: int, *, batch: int = 2, seq: int = 16, seed: int = 0, avoid=()) -> Batch:
    """Random tokens below min(vocab, 512) (ids that every tiny embedding holds; the low ids
    too, so a loss that ignores another id than -100 shows), with 15 % of the labels ignored
    and the first label of each row ignored (a prompt token). `avoid`: ids never drawn (a
    multimodal model's image placeholder and other special tokens)."""
    g = torch.Generator().manual_seed(seed)
    high = max(4, min(vocab_size, 512))
    ids = torch.randint(0, high, (batch, seq), generator=g)
    ids[:, 1:3] = torch.arange(2)  # ids 0 and 1 (pad, bos in many configs) are trained on
    allowed = [i for i in range(high) if i not in set(avoid)] if avoid else None
    if allowed:
        # the draws above stay the same; an avoided id becomes the next allowed one
        pick = torch.tensor(allowed)
        ids = pick[torch.searchsorted(pick, ids).clamp(max=len(allowed) - 1)]
    labels = ids.clone()
    labels[torch.rand(batch, seq, generator=g) < 0.15] = IGNORE_INDEX
    labels[:, 0] = IGNORE_INDEX
    labels[:, 1:3] = ids[:, 1:3]
    return Batch(ids, labels)


@dataclass
class ModeRun:
    """One mode's numbers: the loss with labels, its gradients, log-probs without labels."""

    loss: float
    grads: dict[str, torch.Tensor]
    logprobs: torch.Tensor  # [B, T, V] fp32 (or [..., V]: whatever the logits' shape is)


@dataclass
class Measured:
    train: ModeRun
    eval: ModeRun
    loss_kwargs: dict = field(default_factory=dict)  # what the train-mode call passed
    ran: set[str] = field(default_factory=set)  # qualified names of the modules that ran


def _accepts_loss_kwargs(model: nn.Module) -> bool:
    # the HF Trainer's test: a forward with **kwargs receives num_items_in_batch
    params = inspect.signature(type(model).forward).parameters.values()
    return any(p.kind is p.VAR_KEYWORD for p in params)


def _loss(out) -> torch.Tensor:
    loss = out.loss if hasattr(out, "loss") else out[0]
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        raise ValueError(f"the forward with labels returned no scalar loss ({type(loss).__name__})")
    return loss


def _logits(out) -> torch.Tensor:
    logits = out.logits if hasattr(out, "logits") else out[0]
    if not isinstance(logits, torch.Tensor):
        raise ValueError(f"the forward without labels returned no logits ({type(logits).__name__})")
    return logits


def _run_mode(model: nn.Module, batch: Batch, *, train: bool, seed: int, loss_kwargs) -> ModeRun:
    device = next(model.parameters()).device
    ids, labels = batch.input_ids.to(device), batch.labels.to(device)
    inputs = {k: v.to(device) for k, v in batch.inputs.items()}
    model.train(train)
    model.zero_grad(set_to_none=True)
    # the same draws for both models: a forward that samples in training (router jitter)
    # samples the same numbers, so only the patch can separate the runs
    torch.manual_seed(seed)
    loss = _loss(model(input_ids=ids, labels=labels, **inputs, **loss_kwargs))
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    with torch.no_grad():
        logprobs = _logits(model(input_ids=ids, **inputs)).float().log_softmax(-1)
    return ModeRun(float(loss.detach().float()), grads, logprobs)


def measure(model: nn.Module, batch: Batch, *, seed: int = 0, loss_kwargs=None) -> Measured:
    """The model's loss, gradients and log-probs on `batch`, in train() and then eval() mode.

    loss_kwargs: what the train-mode call passes besides ids and labels; None passes
    num_items_in_batch where the forward takes **kwargs: twice the count of trained labels,
    as the Trainer does for the first of two accumulated micro-batches, so that a sum over
    num_items_in_batch and a mean over the batch give different losses.
    The model is left in eval mode with no gradients; torch's global RNG is restored.
    """
    if loss_kwargs is None:
        loss_kwargs = {}
        if _accepts_loss_kwargs(model):
            n = 2 * int((batch.labels[:, 1:] != IGNORE_INDEX).sum())
            device = next(model.parameters()).device
            loss_kwargs = {"num_items_in_batch": torch.tensor(n, device=device)}
    devices = [d.index for d in {p.device for p in model.parameters()} if d.type == "cuda"]
    ran: set[str] = set()
    hooks = [
        m.register_forward_pre_hook(lambda *_, name=name: ran.add(name))
        for name, m in model.named_modules()
    ]
    try:
        with torch.random.fork_rng(devices=devices):
            train = _run_mode(model, batch, train=True, seed=seed, loss_kwargs=loss_kwargs)
            evaluation = _run_mode(model, batch, train=False, seed=seed, loss_kwargs={})
    finally:
        for h in hooks:
            h.remove()
    return Measured(train, evaluation, dict(loss_kwargs), ran)


@dataclass
class ParityResult:
    passed: bool
    loss: float  # the largest |loss diff| over both modes
    grads: float  # the largest relative gradient error over both modes
    logprobs: float  # the largest top-k log-prob diff over both modes
    detail: str  # what was measured, in words; the first failure first

    def numbers(self) -> str:
        return (
            f"loss {self.loss:.2g}, grads {self.grads:.2g}, "
            f"top-{TOPK} log-probs {self.logprobs:.2g}"
        )


def _norm2(t: torch.Tensor) -> float:
    return float(t.double().square().sum())


def _grad_error(ref: dict, other: dict) -> tuple[float, str]:
    if set(ref) != set(other):
        only = sorted(set(ref) ^ set(other))
        return math.inf, f"gradient in one model only: {only[:3]}"
    num = den = 0.0
    worst, worst_name = -1.0, ""
    for name, g in ref.items():
        if g.shape != other[name].shape:
            return math.inf, f"gradient of {name} has shape {tuple(other[name].shape)}"
        d, r = _norm2(other[name].double() - g.double()), _norm2(g)
        num, den = num + d, den + r
        rel = math.sqrt(d / r) if r > 0 else math.sqrt(d)
        if not rel <= worst:
            worst, worst_name = rel, name
    err = math.sqrt(num / den) if den > 0 else math.sqrt(num)
    return (err if math.isfinite(err) else math.inf), f"worst {worst_name} {worst:.2g}"


def _logprob_diff(ref: torch.Tensor, other: torch.Tensor) -> float:
    if ref.shape != other.shape:
        return math.inf
    top = ref.topk(min(TOPK, ref.shape[-1]), dim=-1).indices
    diff = (other.gather(-1, top) - ref.gather(-1, top)).abs()
    diff = torch.where(torch.isnan(diff), torch.full_like(diff, math.inf), diff)
    return float(diff.max()) if diff.numel() else 0.0


def compare(
    ref: Measured, other: Measured, tolerance: ParityTolerance | None = None
) -> ParityResult:
    """`other` against `ref`, mode by mode, within `tolerance` (fp32's by default)."""
    tol = tolerance or PARITY_TOLERANCES[torch.float32]
    losses, grads, lps, problems = [], [], [], []
    for mode in ("train", "eval"):
        r, o = getattr(ref, mode), getattr(other, mode)
        dl = abs(o.loss - r.loss) if math.isfinite(o.loss) else math.inf
        dg, where = _grad_error(r.grads, o.grads)
        dp = _logprob_diff(r.logprobs, o.logprobs)
        losses.append(dl)
        grads.append(dg)
        lps.append(dp)
        if not dl <= tol.loss:
            problems.append(f"{mode} loss {o.loss:.6g} vs {r.loss:.6g} (|diff| {dl:.2g})")
        if not dg <= tol.grads:
            problems.append(f"{mode} gradients relative error {dg:.2g} ({where})")
        if not dp <= tol.logprobs:
            problems.append(f"{mode} top-{TOPK} log-probs |diff| {dp:.2g}")
    res = ParityResult(not problems, max(losses), max(grads), max(lps), "")
    if problems:
        res.detail = "; ".join(problems) + f" (tolerance {tol})"
    else:
        res.detail = f"train and eval: {res.numbers()}"
    return res


# --------------------------------------------------------------------------- demotion


@dataclass(frozen=True)
class Unit:
    """One patch decision the confirmation can keep or demote."""

    label: str  # "norm LlamaRMSNorm", "mlp LlamaMLP", "moe_experts", "rope", "fused loss"
    kind: str  # "norm", "mlp", "moe_experts", "rope", "causal_lm"
    class_name: str | None = None

    def decision(self, profile: ModelProfile) -> Decision:
        if self.kind == "norm":
            return next(n for n in profile.norms if n.class_name == self.class_name)
        if self.kind == "mlp":
            return next(m for m in profile.mlps if m.class_name == self.class_name)
        return {"moe_experts": profile.moe, "rope": profile.rope, "causal_lm": profile.output}[
            self.kind
        ]


def units(profile: ModelProfile) -> list[Unit]:
    """The profile's decisions that `patch` would apply, one Unit each."""
    out = [Unit(f"norm {n.class_name}", "norm", n.class_name) for n in profile.norms if n.patched]
    out += [Unit(f"mlp {m.class_name}", "mlp", m.class_name) for m in profile.mlps if m.patched]
    if profile.moe.patched and profile.moe.is_moe:
        out.append(Unit("moe_experts", "moe_experts"))
    if profile.rope.patched:
        out.append(Unit("rope", "rope"))
    if profile.output.patched:
        out.append(Unit("fused_linear_cross_entropy", "causal_lm"))
    return out


def _trial(profile: ModelProfile, keep: list[Unit]) -> tuple[ModelProfile, dict]:
    """A copy of `profile` and patch flags that apply exactly the units in `keep`."""
    p = profile.model_copy(deep=True)
    kinds = {u.kind for u in keep}
    # a flag is off only for a unit left out; decisions the profile itself leaves alone keep
    # their own reason in the record
    kinds |= {u.kind for u in units(profile)} ^ {"moe_experts", "rope", "causal_lm"}
    names = {u.class_name for u in keep}
    for d in p.norms:
        if d.patched and d.class_name not in names:
            d.status, d.reason = "unsupported", "left out of this trial"
    for d in p.mlps:
        if d.patched and d.class_name not in names:
            d.status, d.reason = "unsupported", "left out of this trial"
    flags = {
        "moe_experts": "moe_experts" in kinds,
        "rope": "rope" in kinds,
        "fused_linear_cross_entropy": "causal_lm" in kinds,
    }
    return p, flags


@dataclass
class Confirmation:
    """What `confirm` found: the final comparison and the decisions it demoted."""

    result: ParityResult | None  # None when nothing was left to patch
    kept: list[Unit]
    demoted: list[tuple[Unit, str]]  # (unit, reason)
    record: object = None  # the PatchRecord of the final (kept) patch
    trials: int = 0
    # decisions the patcher applied to no module of this model (its record says why)
    unapplied: list[tuple[Unit, str]] = field(default_factory=list)


def _patched_run(
    model: nn.Module,
    profile: ModelProfile,
    keep: list[Unit],
    ref: Measured,
    batch: Batch,
    seed: int,
    tolerance: ParityTolerance | None,
    patch_fn: Callable,
    unpatch_fn: Callable,
) -> tuple[ParityResult, object]:
    """The comparison with `keep` patched, and the patch record (None if patching raised)."""
    from kernelwright.integrations.transformers.patch import patch_record

    trial, flags = _trial(profile, keep)
    try:
        # the patcher warns when an instance refuses a decision; its record holds that already
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            patch_fn(model, trial, **flags)
    except Exception as e:  # a decision that cannot even be applied fails its check
        failed = f"patch raised {error_text(e)}"
        return ParityResult(False, math.inf, math.inf, math.inf, failed), None
    record = patch_record(model)
    try:
        other = measure(model, batch, seed=seed, loss_kwargs=ref.loss_kwargs)
    except Exception as e:
        failed = f"the patched model raised {error_text(e)}"
        return ParityResult(False, math.inf, math.inf, math.inf, failed), record
    finally:
        unpatch_fn(model)
    return compare(ref, other, tolerance), record


def error_text(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:300]}"


def confirm(
    model: nn.Module,
    profile: ModelProfile,
    *,
    batch: Batch | None = None,
    reference: Measured | None = None,
    seed: int = 0,
    tolerance: ParityTolerance | None = None,
    what: str = "model parity",
) -> Confirmation:
    """Patch `model` with `profile`, compare it with itself unpatched, demote what differs.

    Decisions that fail are set to "unsupported" in `profile` (in place) with the measured
    difference as their reason; those that pass get the measurement as evidence. `model` must
    be unpatched and is returned unpatched. `what` names the check in the evidence.
    tolerance: default the PARITY_TOLERANCES row of the model's dtype (`model_dtype`).
    """
    from kernelwright.integrations.transformers.patch import patch, unpatch

    dtype = model_dtype(model)
    tolerance = tolerance or tolerance_for(dtype)

    if batch is None:
        from kernelwright.integrations.transformers.pixels import check_batch

        batch = check_batch(model, seq=16, seed=seed)
    ref = reference if reference is not None else measure(model, batch, seed=seed)
    todo = units(profile)
    conf = Confirmation(None, [], [])

    def run(keep: list[Unit]) -> ParityResult:
        conf.trials += 1
        with _muted():  # the check's own patches of the tiny model are not the user's
            result, conf.record = _patched_run(
                model, profile, keep, ref, batch, seed, tolerance, patch, unpatch
            )
        return result

    for u in unexercised(model, profile, todo, ref, batch):
        todo.remove(u)
        why = f"no instance ran in its batch ({batch.note or 'text only'})"
        conf.demoted.append((u, why))
        d = u.decision(profile)
        d.status, d.reason = "unsupported", f"{what} could not confirm it: {why}"
    if not todo:
        return conf
    result = run(todo)
    if not result.passed:
        kept = []
        for u in todo:
            alone = run([u]) if len(todo) > 1 else result
            if alone.passed:
                kept.append(u)
            else:
                conf.demoted.append((u, f"with only this decision patched: {alone.detail}"))
        result = run(kept) if kept else None
        conf.record = conf.record if kept else None
        # the survivors may still differ together (one decision's error only shows through
        # another's): drop them one at a time, the last applied first, until the rest agree
        while result is not None and not result.passed:
            u = kept.pop()
            conf.demoted.append((u, f"together with {[k.label for k in kept]}: {result.detail}"))
            result = run(kept) if kept else None
            conf.record = conf.record if kept else None
        todo = kept
    conf.kept, conf.result = todo, result
    _demote(profile, conf, what)
    if conf.record is not None:
        # confirmed only what was applied: a decision the patcher refused on this model (a
        # causal-LM forward it cannot reproduce, an activation that differs) is left alone
        # with the patcher's reason instead of carrying a check it never took part in
        for u in list(conf.kept):
            if not _applied(u, conf.record):
                why = _skip_reason(u, conf.record)
                conf.kept.remove(u)
                conf.unapplied.append((u, why))
                d = u.decision(profile)
                d.status, d.reason = "unsupported", f"not applied by the patcher: {why}"
    if result is not None:
        ev = Evidence(source="check", detail=f"{what} on {_shape(batch, dtype)}: {result.detail}")
        for u in conf.kept:
            u.decision(profile).evidence.append(ev)
    return conf


def _demote(profile: ModelProfile, conf: Confirmation, what: str) -> None:
    for u, why in conf.demoted:
        d = u.decision(profile)
        if d.status == "patch":  # not those left alone before the comparison
            d.status = "unsupported"
            d.reason = f"{what} failed ({why})"


def unexercised(
    model: nn.Module, profile: ModelProfile, todo: list[Unit], ref: Measured, batch: Batch
) -> list[Unit]:
    """Norm/MLP units whose class lives in a non-text component (a vision tower) and of which
    no instance ran in the reference: a text-only batch never reaches the vision tower, so
    nothing would confirm them there. A class the text path also uses is checked there."""
    if not ref.ran:
        return []
    out = []
    for u in todo:
        if u.kind not in ("norm", "mlp") or not u.decision(profile).components:
            continue
        names = [n for n, m in model.named_modules() if type(m).__name__ == u.class_name]
        if names and not any(n in ref.ran for n in names):
            out.append(u)
    return out


_RECORD_KIND = {"causal_lm": "fused_linear_cross_entropy"}  # the record's word for a unit


def _applied(u: Unit, record) -> bool:
    return any(
        m.kind == u.kind and (u.class_name is None or m.class_name == u.class_name)
        for m in record.modules
    )


def _skip_reason(u: Unit, record) -> str:
    word = _RECORD_KIND.get(u.kind, u.kind)
    whys = [why for what, why in record.skipped if what.split(" ", 1)[0] == word]
    return "; ".join(dict.fromkeys(whys)) or "no module of the model took it"


def _shape(batch: Batch, dtype: torch.dtype) -> str:
    images = f" ({batch.note})" if batch.has_images else ""
    name = DTYPE_NAMES.get(dtype, str(dtype))
    return f"{list(batch.input_ids.shape)} tokens{images}, {name}, train() and eval()"


def vocab_size(model: nn.Module) -> int:
    """The token ids every part of the model takes: below the input embedding's rows and the
    lm-head's outputs (a model may embed more ids than it predicts, or fewer)."""
    sizes = []
    for get in ("get_input_embeddings", "get_output_embeddings"):
        module = getattr(model, get)() if hasattr(model, get) else None
        weight = getattr(module, "weight", None)
        if isinstance(weight, torch.Tensor) and weight.dim() == 2:
            sizes.append(int(weight.shape[0]))
    if sizes:
        return min(sizes)
    cfg = getattr(model, "config", None)
    text = cfg.get_text_config() if cfg is not None else None
    return int(getattr(text, "vocab_size", 128) or 128)


def spread_vectors(model: nn.Module, seed: int = 0) -> None:
    """Move every 1-D parameter off its initial value (norm weights of ones, zero biases, a
    `1 + w` scale of zeros): a patch that drops a weight or an offset would match them."""
    gen = torch.Generator().manual_seed(seed + 2)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1 and p.is_floating_point():
                noise = 0.1 * torch.randn(p.shape, generator=gen, dtype=torch.float32)
                p.add_(noise.to(p.device, p.dtype))
