"""Convergence: a patched model trains like the unpatched one (autopatch's Verify stage).

`run_convergence` builds one small model and trains three copies side by side with AdamW on
identical token batches (labels with ignored positions):

- the reference, unpatched;
- the patched copy (`kernelwright.patch`, or any `patch_fn`);
- a control: unpatched, on every forward its embedding outputs moved by one rounding step per
  element and every norm's output rows scaled by one rounding step per row, at random. It
  differs from the reference only by rounding and by the chaos training makes of it (a router
  flipping a token's expert, Adam normalising a gradient that is pure rounding noise): the
  noise floor of this model, dtype and run length, measured, not guessed.

It compares with the reference the loss of every step, the gradients of the first step (same
weights, so a gradient difference is the patch's alone), the log-probabilities of the
reference's top-k tokens on a held-out batch in eval mode (the logits path, no labels) and all
parameters after training. A quantity passes when it is within max(table tolerance,
CONTROL_FACTOR x the control's divergence): the table bounds the dense, short runs where the
floor is tiny; the control stretches the bound where the model itself is chaotic (MoE routing,
long bf16 runs). A wrong patch diverges from the first step, where the control has not yet.

`tiny_config` and `config_for_profile` (in `model_configs.py`) give the small configs it trains.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from kernelwright.runtime.device import default_device
from kernelwright.testing.model_configs import (
    ARCHITECTURES,
    config_for_profile,
    tiny_config,
)

__all__ = [
    "ARCHITECTURES",
    "CONTROL_FACTOR",
    "RUNS",
    "TOLERANCES",
    "ConvergenceResult",
    "ConvergenceTolerance",
    "Divergence",
    "config_for_profile",
    "make_batches",
    "run_convergence",
    "tiny_config",
]


@dataclass(frozen=True)
class ConvergenceTolerance:
    loss: float  # |loss_patched - loss_ref| at any step, in nats
    grads: float  # step 0: ||g_patched - g_ref|| / ||g_ref||, all parameters together
    logprobs: float  # max |log p_patched - log p_ref| at the reference's top-k tokens (eval)
    params: float  # after training: ||p_patched - p_ref|| / ||p_ref - p_init||, all together


# Table tolerances: the floor under every bound, a few times above the largest divergence from
# the reference that the dense models show, at both sizes, in (a) the control and (b) the
# unpatched model with every norm's output re-rounded by one ulp (a second, equivalent norm);
# the MoE models are chaotic and left to the control. A wrong norm offset or RoPE layout
# exceeds the fp32 bounds by orders of magnitude from step 0; bf16 is the weaker check by
# nature (one bf16 ulp of a logit near 16 is 0.125), fp32 is where an equivalence is proven.
TOLERANCES: dict[torch.dtype, ConvergenceTolerance] = {
    torch.float32: ConvergenceTolerance(loss=5e-5, grads=1e-5, logprobs=5e-3, params=2e-3),
    torch.bfloat16: ConvergenceTolerance(loss=2e-2, grads=1e-1, logprobs=5e-1, params=2.5e-1),
}
# The control's divergence is one sample of the noise: the bound allows a few times it.
CONTROL_FACTOR = 4.0

# Run settings of the two suites (and of the emitted per-model tests): "tiny" through the
# interpreter on the CPU, where every kernel launch costs milliseconds, "gpu" on a CUDA device.
RUNS: dict[str, dict[str, Any]] = {
    "tiny": dict(steps=4, batch=2, seq=16, lr=1e-3),
    "gpu": dict(steps=32, batch=4, seq=256, lr=3e-4),
}


def make_batches(
    vocab_size: int, *, count: int, batch: int, seq: int, seed: int, ignored: float = 0.15
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`count` (input_ids, labels) pairs on the CPU, from one seeded bigram language.

    Tokens come from the first eighth of the vocabulary; each has four likely successors (90%
    of the time), so the loss falls steadily and generalises to a held-out batch instead of a
    few batches being memorised (a memorising model is chaotic: tiny differences decide which
    sample it fits first). A fraction `ignored` of the labels is -100.
    """
    gen = torch.Generator().manual_seed(seed)
    alphabet = min(vocab_size, max(8, vocab_size // 8))
    successors = torch.randint(0, alphabet, (alphabet, 4), generator=gen)
    out = []
    for _ in range(count):
        ids = torch.empty(batch, seq, dtype=torch.long)
        ids[:, 0] = torch.randint(0, alphabet, (batch,), generator=gen)
        for t in range(1, seq):
            pick = successors[ids[:, t - 1], torch.randint(0, 4, (batch,), generator=gen)]
            noise = torch.randint(0, alphabet, (batch,), generator=gen)
            ids[:, t] = torch.where(torch.rand(batch, generator=gen) < 0.9, pick, noise)
        labels = ids.clone()
        labels[torch.rand(batch, seq, generator=gen) < ignored] = -100
        out.append((ids, labels))
    return out


@dataclass
class Divergence:
    """How far one run ended from the reference run."""

    losses: list[float]  # this run's loss at every step
    loss_diffs: list[float]  # |loss - loss_ref| per step
    grad_error: float  # step 0, relative error of all gradients together
    grad_errors: dict[str, float]  # the same per parameter
    logprob_diff: float  # max |Δ log p| at the reference's top-k tokens, held-out batch
    logprob_where: str  # "batch 1, position 7, token 42" of that maximum
    param_error: float  # after training, ||Δp|| / ||p_ref - p_init||, all parameters together
    param_errors: dict[str, float]  # the same per parameter
    param_max_abs: dict[str, float]  # max |Δp| per parameter


@dataclass
class ConvergenceResult:
    """The three runs' numbers; `check` lists what is out of bounds, `assert_close` raises.

    Gradients and parameters are checked over the whole model at once: one tensor's error can be
    noise made large (a key-projection bias has no true gradient; Adam turns its rounding noise
    into whole steps), a wrong patch moves them all. Messages name the worst tensor.
    """

    model_type: str
    dtype: torch.dtype
    device: str
    steps: int
    lr: float
    losses_ref: list[float]
    heldout_loss_ref: tuple[float, float]  # the reference's held-out loss before and after
    patched: Divergence
    control: Divergence | None  # None when run without the control
    profile: Any = None  # what the patch function returned (a ModelProfile)

    @property
    def losses_patched(self) -> list[float]:
        return self.patched.losses

    def control_divergence(self, what: str, step: int = 0) -> float | None:
        """The control's divergence in `what` ("loss", "grads", "logprobs", "params")."""
        c = self.control
        if c is None:
            return None
        if what == "loss":
            # Step 0 runs identical weights: only rounding separates the runs there. Later steps
            # carry the chaos of training, which sets in at no fixed step (a router flips a
            # token when it flips), so they get the control's largest divergence of the run.
            return c.loss_diffs[0] if step == 0 else max(c.loss_diffs)
        return {"grads": c.grad_error, "logprobs": c.logprob_diff, "params": c.param_error}[what]

    def bound(self, what: str, tolerance: ConvergenceTolerance, step: int = 0) -> float:
        """max(table tolerance, CONTROL_FACTOR x the control's divergence)."""
        control = self.control_divergence(what, step)
        table = getattr(tolerance, what)
        return table if control is None else max(table, CONTROL_FACTOR * control)

    def _why(self, what: str, tolerance: ConvergenceTolerance, step: int = 0) -> str:
        control = self.control_divergence(what, step)
        table = getattr(tolerance, what)
        if control is None or CONTROL_FACTOR * control <= table:
            return f"tol {table:g}"
        return f"{CONTROL_FACTOR:g} x control {control:.3g}"

    def check(self, tolerance: ConvergenceTolerance | None = None) -> list[str]:
        """One readable line per quantity out of bounds; empty when the runs agree."""
        tol = tolerance or _tolerance_for(self.dtype)
        p = self.patched
        label = f"{self.model_type} {_dtype_name(self.dtype)} on {self.device}"
        if not all(math.isfinite(v) for v in self.losses_ref + p.losses):
            return [f"{label}: non-finite loss (ref {self.losses_ref}, patched {p.losses})"]
        out = []
        for step, d in enumerate(p.loss_diffs):
            if d > self.bound("loss", tol, step):
                out.append(
                    f"{label}: loss differs at step {step}: patched {p.losses[step]:.6f} vs ref "
                    f"{self.losses_ref[step]:.6f} (|diff| {d:.3g} > {self._why('loss', tol, step)})"
                )
                break  # the first diverging step says the most; later ones follow from it
        if not p.grad_error <= self.bound("grads", tol):
            name, err = _worst(p.grad_errors)
            out.append(
                f"{label}: step-0 gradients differ: relative error {p.grad_error:.3g} > "
                f"{self._why('grads', tol)} (worst tensor {name}: {err:.3g})"
            )
        if not p.logprob_diff <= self.bound("logprobs", tol):
            out.append(
                f"{label}: eval log-probs differ at {p.logprob_where}: |diff| "
                f"{p.logprob_diff:.3g} > {self._why('logprobs', tol)}"
            )
        if not p.param_error <= self.bound("params", tol):
            name, err = _worst(p.param_errors)
            out.append(
                f"{label}: parameters after {self.steps} steps differ: ||diff|| / ||update|| "
                f"{p.param_error:.3g} > {self._why('params', tol)} (worst tensor {name}: "
                f"{err:.3g}, max |diff| {p.param_max_abs[name]:.3g})"
            )
        before, after = self.heldout_loss_ref
        if not after < before:
            out.append(
                f"{label}: the reference's held-out loss did not fall over {self.steps} steps "
                f"({before:.4f} -> {after:.4f}), so agreement says nothing about training; "
                "raise steps or lr"
            )
        return out

    def assert_close(self, tolerance: ConvergenceTolerance | None = None) -> None:
        """Raise AssertionError listing every quantity out of bounds, with the summary."""
        problems = self.check(tolerance)
        if problems:
            raise AssertionError(
                "the patched model does not train like the unpatched one:\n  "
                + "\n  ".join(problems)
                + "\n"
                + self.summary()
            )

    def summary(self) -> str:
        p, c = self.patched, self.control
        lines = [
            f"{self.model_type} {_dtype_name(self.dtype)} on {self.device}, {self.steps} steps, "
            f"lr {self.lr:g}; reference held-out loss {self.heldout_loss_ref[0]:.4f} -> "
            f"{self.heldout_loss_ref[1]:.4f}",
            "  step  loss_ref    loss_patched  |diff|     control |diff|",
        ]
        for i, (r, d) in enumerate(zip(self.losses_ref, p.loss_diffs, strict=True)):
            ctrl = "" if c is None else f"{c.loss_diffs[i]:.3g}"
            lines.append(f"  {i:4d}  {r:10.6f}  {p.losses[i]:12.6f}  {d:<9.3g}  {ctrl}")

        def row(label: str, value: float, what: str, detail: str) -> str:
            control = self.control_divergence(what)
            ctrl = "" if control is None else f" (control {control:.3g})"
            return f"  {label}: {value:.3g}{ctrl}; {detail}"

        g_name, g_err = _worst(p.grad_errors)
        p_name, p_err = _worst(p.param_errors)
        lines += [
            row(
                "step-0 gradient error",
                p.grad_error,
                "grads",
                f"worst {g_name} {g_err:.3g}",
            ),
            row(
                "eval top-k log-prob max |diff|",
                p.logprob_diff,
                "logprobs",
                p.logprob_where,
            ),
            row("parameter error", p.param_error, "params", f"worst {p_name} {p_err:.3g}"),
        ]
        return "\n".join(lines)


def _worst(errors: Mapping[str, float]) -> tuple[str, float]:
    name = max(errors, key=lambda k: math.inf if math.isnan(errors[k]) else errors[k])
    return name, errors[name]


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _tolerance_for(dtype: torch.dtype) -> ConvergenceTolerance:
    if dtype not in TOLERANCES:
        raise ValueError(
            f"no convergence tolerance for {dtype}; known: {[_dtype_name(d) for d in TOLERANCES]}."
            " Pass a ConvergenceTolerance to check()/assert_close()"
        )
    return TOLERANCES[dtype]


def _default_patch(model, *, profile=None, **kwargs):
    try:
        from kernelwright.integrations.transformers.patch import patch
    except ImportError as e:
        raise ImportError(
            f"kernelwright.integrations.transformers.patch is not importable ({e}); "
            "pass patch_fn= to run_convergence"
        ) from e
    return patch(model, profile=profile, **kwargs)


def run_convergence(
    model_type_or_config,
    *,
    steps: int = RUNS["tiny"]["steps"],
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
    seed: int = 0,
    batch: int = RUNS["tiny"]["batch"],
    seq: int = RUNS["tiny"]["seq"],
    lr: float = RUNS["tiny"]["lr"],
    size: str = "tiny",
    patch_kwargs: Mapping[str, Any] | None = None,
    profile=None,
    patch_fn: Callable[..., Any] | None = None,
    control: bool = True,
    topk: int = 5,
) -> ConvergenceResult:
    """Train a reference, a patched copy and a control side by side; see the module doc.

    `model_type_or_config` is a model_type (built with `tiny_config(size=size)`) or a config.
    `patch_fn(model, profile=profile, **patch_kwargs)` patches a copy in place and returns the
    profile it applied; it defaults to `kernelwright.patch`. Parameters train in `dtype`
    (initialised in fp32, then cast: the bf16 and fp32 runs start from the same weights).
    `control=False` skips the control run; the table tolerances alone then bound the check.
    """
    from transformers import AutoModelForCausalLM, PretrainedConfig

    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    config = (
        model_type_or_config
        if isinstance(model_type_or_config, PretrainedConfig)
        else tiny_config(model_type_or_config, size=size)
    )
    device = torch.device(device) if device is not None else default_device()
    torch.manual_seed(seed)
    ref = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _spread_vectors(ref, seed)
    ref = ref.to(device=device, dtype=dtype).train()
    init = {n: p.detach().clone() for n, p in ref.named_parameters()}
    # deep copies are bit-identical and keep tied weights tied
    patched = copy.deepcopy(ref)
    applied = (patch_fn or _default_patch)(patched, profile=profile, **dict(patch_kwargs or {}))
    patched.train()
    runs = {"ref": ref, "patched": patched}
    if control:
        runs["control"] = copy.deepcopy(ref)
        _jitter(runs["control"], seed)

    vocab = config.get_text_config().vocab_size
    *data, (heldout, _) = make_batches(vocab, count=steps + 1, batch=batch, seq=seq, seed=seed + 1)
    heldout = heldout.to(device)
    heldout_before = _heldout_loss(ref, heldout)
    opts = {k: torch.optim.AdamW(m.parameters(), lr=lr) for k, m in runs.items()}
    losses: dict[str, list[float]] = {k: [] for k in runs}
    grads: dict[str, tuple[float, dict[str, float]]] = {}
    for step in range(steps):
        ids, labels = (t.to(device) for t in data[step])
        for k, model in runs.items():
            opts[k].zero_grad(set_to_none=True)
            loss = model(input_ids=ids, labels=labels).loss
            loss.backward()
            losses[k].append(float(loss.detach().float()))
        if step == 0:
            grads = {k: _grad_errors(ref, runs[k]) for k in runs if k != "ref"}
        for opt in opts.values():
            opt.step()

    heldout_after = _heldout_loss(ref, heldout)
    lp_ref, top = _eval_logprobs(ref, heldout, topk)
    result = {}
    for k in grads:
        diff, where = _logprob_diff(_eval_logprobs(runs[k], heldout, topk)[0], lp_ref, top)
        param_error, param_errors, param_max_abs = _param_errors(ref, runs[k], init)
        result[k] = Divergence(
            losses=losses[k],
            loss_diffs=[abs(a - b) for a, b in zip(losses[k], losses["ref"], strict=True)],
            grad_error=grads[k][0],
            grad_errors=grads[k][1],
            logprob_diff=diff,
            logprob_where=where,
            param_error=param_error,
            param_errors=param_errors,
            param_max_abs=param_max_abs,
        )
    return ConvergenceResult(
        model_type=config.model_type,
        dtype=dtype,
        device=str(device),
        steps=steps,
        lr=lr,
        losses_ref=losses["ref"],
        heldout_loss_ref=(heldout_before, heldout_after),
        patched=result["patched"],
        control=result.get("control"),
        profile=applied,
    )


def _spread_vectors(model: torch.nn.Module, seed: int) -> None:
    # Norm weights start as all ones (or zeros under a 1 + w scale) and biases as zeros: a patch
    # that drops the weight or mis-casts the multiply would match at step 0. Spread every 1-D
    # parameter around its init (the same in every copy, so the comparison stays exact).
    gen = torch.Generator().manual_seed(seed + 2)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.add_(0.1 * torch.randn(p.shape, generator=gen, dtype=p.dtype))


def _jitter(model: torch.nn.Module, seed: int) -> None:
    # The control computes the same math rounded differently, without changing a weight (the
    # parameter comparison then sees only what training did), in two ways on each forward:
    # - every embedding output element is moved by one rounding step (x * (1 + eps), x *
    #   (1 - eps) or kept, at random);
    # - every norm's output row is scaled as a whole by 1 + eps, 1 - eps or 1, at random per row.
    #   A norm that sums its row in another order (every norm kernel does) rounds the row's
    #   statistic differently, and that moves the whole row one way, which element-wise noise
    #   does not do: in an MoE model a correct norm patch flips routing decisions as early as
    #   row scaling does, and earlier than element-wise noise alone.
    gen = torch.Generator().manual_seed(seed + 3)

    def elements(module, args, out):
        step = torch.randint(-1, 2, out.shape, generator=gen).to(out.device, out.dtype)
        return out * (1 + step * torch.finfo(out.dtype).eps)

    def rows(module, args, out):
        if not isinstance(out, torch.Tensor) or not out.is_floating_point() or out.dim() < 1:
            return out
        shape = (*out.shape[:-1], 1)
        step = torch.randint(-1, 2, shape, generator=gen).to(out.device, out.dtype)
        return out * (1 + step * torch.finfo(out.dtype).eps)

    model.get_input_embeddings().register_forward_hook(elements)
    for module in model.modules():
        if "Norm" in type(module).__name__:
            module.register_forward_hook(rows)


def _pairs(ref: torch.nn.Module, other: torch.nn.Module):
    theirs = dict(other.named_parameters())
    for name, p in ref.named_parameters():
        if name not in theirs:
            raise AssertionError(
                f"the patched model has no parameter {name!r}: the patch must keep parameters "
                "(names, storage) as they are"
            )
        yield name, p, theirs[name]


def _norm2(t: torch.Tensor) -> float:
    return float(t.double().square().sum())


def _ratio(num_sq: float, den_sq: float) -> float:
    if not math.isfinite(num_sq):
        return math.inf
    return math.sqrt(num_sq / den_sq) if den_sq > 0 else math.sqrt(num_sq)


def _grad_errors(ref, other) -> tuple[float, dict[str, float]]:
    per, num, den = {}, 0.0, 0.0
    for name, p_ref, p in _pairs(ref, other):
        if p_ref.grad is None and p.grad is None:
            continue
        if p_ref.grad is None or p.grad is None:
            which = "reference" if p_ref.grad is None else "other run"
            raise AssertionError(f"{name} has a gradient in one model only (none in the {which})")
        d, r = _norm2(p.grad.double() - p_ref.grad.double()), _norm2(p_ref.grad)
        per[name] = _ratio(d, r)
        num, den = num + d, den + r
    return _ratio(num, den), per


def _param_errors(ref, other, init) -> tuple[float, dict[str, float], dict[str, float]]:
    # Relative to how far training moved the weights: a rounding-level difference is small next
    # to the update, a wrong patch is of the update's size.
    per, max_abs, num, den = {}, {}, 0.0, 0.0
    with torch.no_grad():
        for name, p_ref, p in _pairs(ref, other):
            diff = p.double() - p_ref.double()
            d, u = _norm2(diff), _norm2(p_ref.double() - init[name].double())
            if u == 0.0:
                # bf16 can swallow every update of a weight near 1 (its ulp there is 2^-7 > lr):
                # for the per-tensor number, measure against one ulp of the weight instead
                ulp = torch.finfo(p_ref.dtype).eps * p_ref.double().abs().clamp_min(1e-3)
                per[name] = _ratio(d, _norm2(ulp))
            else:
                per[name] = _ratio(d, u)
            max_abs[name] = float(diff.abs().max())
            num, den = num + d, den + u
    return _ratio(num, den), per, max_abs


def _heldout_loss(model, ids: torch.Tensor) -> float:
    model.eval()
    with torch.no_grad():
        loss = model(input_ids=ids, labels=ids).loss
    model.train()
    return float(loss.float())


def _eval_logprobs(model, ids: torch.Tensor, topk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 log-probs [B, T, V] in eval mode without labels, and their top-k indices."""
    model.eval()
    with torch.no_grad():
        lp = model(input_ids=ids).logits.float().log_softmax(-1)
    return lp, lp.topk(topk, dim=-1).indices


def _logprob_diff(lp: torch.Tensor, lp_ref: torch.Tensor, top: torch.Tensor) -> tuple[float, str]:
    if lp.shape != lp_ref.shape:
        raise AssertionError(
            f"logits have shape {tuple(lp.shape)}, reference {tuple(lp_ref.shape)}"
        )
    # compared at the reference's top-k: near-ties may swap order without any real difference
    diff = (lp.gather(-1, top) - lp_ref.gather(-1, top)).abs()  # [B, T, k]
    diff = torch.where(torch.isnan(diff), torch.full_like(diff, math.inf), diff)
    b, t, k = (int(i) for i in torch.unravel_index(diff.argmax().cpu(), diff.shape))
    return float(diff.max()), f"batch {b}, position {t}, token {int(top[b, t, k])}"
