"""TRL's trainers on kernelwright's log-prob primitive, without forking them.

TRL (1.x) computes every policy, reference and loss log-prob through one fused LM head:
`add_fused_lm_head` makes `model(..., labels=..., fused_lm_head=True)` run the backbone and
hand the hidden states of the scored tokens to a single autograd function, which returns the
target log-probs and the statistics a trainer asks for (entropy, log sum p^2, mean logit,
whether the target is the argmax). DPO, KTO, GRPO, RLOO and SFT all go through it, and their
loss formulas read only its outputs.

`enable()` puts `fused_linear_logprob_stats` in that function's place; everything around it
(masks, label shifting, PEFT and FSDP2 handling, the MoE auxiliary loss, the metrics) stays
TRL's. TRL's `DistillationTrainer` computes its loss from the student's and the teacher's
hidden states and lm_heads in one function (`_chunked_divergence_loss`: the generalized JSD
with beta and temperature over the completion tokens, and the student's entropy for its
metric); `enable()` puts `fused_linear_distill` there too. Each swap checks the function's
signature (and that the trainer still calls it) against the ones it was written for and
refuses, saying so and swapping nothing, when a TRL release changes them. Weights partitioned
by DeepSpeed ZeRO-3 (which TRL gathers inside its own functions) and soft-capped logits
(Gemma 2's `final_logit_softcapping`, in distillation) keep TRL's own functions.

    from kernelwright.integrations import trl as kw_trl

    kw_trl.enable()              # before or after building the trainer
    trainer = DPOTrainer(...)
    trainer.train()

or `with kw_trl.enabled(): trainer.train()`; `enable(distillation=False)` (or
`logprobs=False`) leaves one of the two to TRL. `enable(backward="stored")` keeps what spares
the backward a projection (see `fused_linear_logprob_stats`); `entropy_grad=False` treats the
entropy TRL asks for as the metric it is in DPO, KTO and GRPO without an entropy bonus (a
backward through it raises), so that a frozen head stores one gradient row per token rather
than the logits.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator

import torch

from kernelwright.losses.distill import fused_linear_distill
from kernelwright.losses.logprobs import BACKWARDS, STATS, fused_linear_logprob_stats

# The parameters of trl.kernels.ChunkedLogProbFunction.forward this adapter stands in for.
_CONTRACT = (
    "ctx", "hidden", "weight", "bias", "targets", "temperature", "chunk_size",
    "final_logit_softcapping", "logit_scale", "outputs",
)  # fmt: skip
_TRL_FUNCTION: object | None = None  # TRL's own function while ours is in its place
# The parameters of trl.trainer.distillation_trainer._chunked_divergence_loss.
_DISTILL_CONTRACT = (
    "student_hidden_states", "teacher_hidden_states", "student_lm_head_weight",
    "teacher_lm_head_weight", "completion_mask", "beta", "num_items_in_batch",
    "student_lm_head_bias", "teacher_lm_head_bias", "student_logit_scale", "teacher_logit_scale",
    "student_final_logit_softcapping", "teacher_final_logit_softcapping", "temperature",
)  # fmt: skip
_TRL_DIVERGENCE: object | None = None  # TRL's distillation loss while ours is in its place
_CONFIGURED: dict[tuple[str, bool], type] = {}  # KernelwrightLogProbs with non-default options


class KernelwrightLogProbs:
    """Stands in for trl.kernels.ChunkedLogProbFunction: `apply(hidden [N, H], weight [V, H],
    bias, targets [N], temperature, chunk_size, final_logit_softcapping, logit_scale,
    outputs)` -> (log_probs, entropy, log_sum_sq_probs, mean_logits, is_top1), each [N] or None.

    TRL's `chunk_size` is the width of its vocabulary tiles; here each chunk of tokens sees the
    whole vocabulary at once, so it is not used. Every target is scored (TRL passes only the
    scored tokens, or ignored ones clamped to 0).

    `backward` and `entropy_grad` are `fused_linear_logprob_stats`'s options; TRL calls
    `apply` on the class, so `configured(...)` returns a subclass that carries them."""

    backward: str = "recompute"
    entropy_grad: bool = True

    @classmethod
    def configured(
        cls, *, backward: str = "recompute", entropy_grad: bool = True
    ) -> type[KernelwrightLogProbs]:
        """This function with those options (the class itself for the defaults)."""
        if backward not in BACKWARDS:
            raise ValueError(f"KernelwrightLogProbs: backward must be one of {BACKWARDS}, "
                             f"got {backward!r}")  # fmt: skip
        base = KernelwrightLogProbs
        if (backward, bool(entropy_grad)) == (base.backward, base.entropy_grad):
            return base
        key = (backward, bool(entropy_grad))
        if key not in _CONFIGURED:  # one class per options: enable() stays idempotent
            options = dict(backward=backward, entropy_grad=bool(entropy_grad))
            _CONFIGURED[key] = type(base.__name__, (base,), {**options, "__module__": __name__})
        return _CONFIGURED[key]

    @classmethod
    def apply(
        cls,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        targets: torch.Tensor,
        temperature: float,
        chunk_size: int,
        final_logit_softcapping: float | None = None,
        logit_scale: float = 1.0,
        outputs: tuple[str, ...] = ("log_probs", *STATS),
    ):
        if hasattr(weight, "ds_id") and _TRL_FUNCTION is not None:  # DeepSpeed ZeRO-3
            return _TRL_FUNCTION.apply(  # type: ignore[attr-defined]
                hidden, weight, bias, targets, temperature, chunk_size,
                final_logit_softcapping, logit_scale, outputs,
            )  # fmt: skip
        st = fused_linear_logprob_stats(
            hidden,
            weight,
            targets,
            bias=bias,
            temperature=temperature,
            softcap=final_logit_softcapping,
            logit_scale=logit_scale,
            ignore_index=-(2**62),
            outputs=tuple(o for o in outputs if o in STATS),
            backward=cls.backward,
            entropy_grad=cls.entropy_grad,
        )
        return tuple(st)


def kernelwright_divergence_loss(
    student_hidden_states: torch.Tensor,
    teacher_hidden_states: torch.Tensor,
    student_lm_head_weight: torch.Tensor,
    teacher_lm_head_weight: torch.Tensor,
    completion_mask: torch.Tensor,
    beta: float,
    num_items_in_batch: torch.Tensor | int | None = None,
    student_lm_head_bias: torch.Tensor | None = None,
    teacher_lm_head_bias: torch.Tensor | None = None,
    student_logit_scale: float = 1.0,
    teacher_logit_scale: float = 1.0,
    student_final_logit_softcapping: float | None = None,
    teacher_final_logit_softcapping: float | None = None,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Stands in for trl.trainer.distillation_trainer._chunked_divergence_loss: hidden states
    [B, K, H_s] and [B, K, H_t] of the same tokens, each model's lm_head, completion_mask [B, K]
    (nonzero: in the loss) -> (the divergence summed over the masked tokens divided by
    num_items_in_batch, or by their count when it is None; the student's entropy summed over
    them, no gradient; their count). A logit scale folds into the hidden states and bias."""
    trl_args = (
        student_hidden_states, teacher_hidden_states, student_lm_head_weight,
        teacher_lm_head_weight, completion_mask, beta, num_items_in_batch, student_lm_head_bias,
        teacher_lm_head_bias, student_logit_scale, teacher_logit_scale,
        student_final_logit_softcapping, teacher_final_logit_softcapping, temperature,
    )  # fmt: skip
    softcapped = (student_final_logit_softcapping, teacher_final_logit_softcapping) != (None,) * 2
    zero3 = hasattr(student_lm_head_weight, "ds_id") or hasattr(teacher_lm_head_weight, "ds_id")
    if softcapped or zero3:
        return _trl_divergence()(*trl_args)
    hs, ws, bs = _scaled_head(
        student_hidden_states, student_lm_head_weight, student_lm_head_bias, student_logit_scale
    )
    ht, wt, bt = _scaled_head(
        teacher_hidden_states, teacher_lm_head_weight, teacher_lm_head_bias, teacher_logit_scale
    )
    if isinstance(num_items_in_batch, torch.Tensor):
        num_items_in_batch = float(num_items_in_batch)
    loss, entropy = fused_linear_distill(
        hs, ws, ht, wt, completion_mask, student_bias=bs, teacher_bias=bt, beta=float(beta),
        temperature=float(temperature), ignore_index=0, num_items_in_batch=num_items_in_batch,
        return_entropy=True,
    )  # fmt: skip
    return loss, entropy.sum(), (completion_mask != 0).sum()


def _scaled_head(hidden, weight, bias, logit_scale):
    """(hidden, weight, bias) whose logits are logit_scale times the head's; an FSDP2-sharded
    weight gathered whole in the hidden states' dtype, as TRL's own function does."""
    from torch.distributed.tensor import DTensor

    if isinstance(weight, DTensor):
        weight = weight.full_tensor().to(hidden.dtype)
        bias = bias.full_tensor() if isinstance(bias, DTensor) else bias
    if logit_scale != 1.0:
        hidden = hidden * logit_scale
        bias = None if bias is None else bias * logit_scale
    return hidden, weight, bias


def _trl_utils():
    try:
        import trl.trainer.utils as utils
    except ImportError as e:  # pragma: no cover - trl is a test dependency
        raise ImportError("kernelwright.integrations.trl needs TRL: pip install trl") from e
    return utils


def _distillation():
    """TRL's distillation trainer module, or None for a TRL without one."""
    try:
        import trl.trainer.distillation_trainer as module
    except ImportError:
        return None
    return module


def _trl_divergence():
    if _TRL_DIVERGENCE is not None:
        return _TRL_DIVERGENCE
    return _distillation()._chunked_divergence_loss


def _check_contract(fn: object) -> None:
    import trl

    forward = getattr(fn, "forward", None)
    params = tuple(inspect.signature(forward).parameters) if forward else ()
    if params != _CONTRACT:
        raise RuntimeError(
            f"kernelwright.integrations.trl: TRL {trl.__version__}'s fused LM head function "
            f"takes {params or 'nothing we recognise'}, not {_CONTRACT}; this TRL release is "
            "not supported, so its trainers keep TRL's own log-prob function"
        )


def _check_distill_contract(module) -> None:
    import trl

    fn = getattr(module, "_chunked_divergence_loss", None)
    params = tuple(inspect.signature(fn).parameters) if callable(fn) else ()
    compute = getattr(getattr(module, "DistillationTrainer", None), "_compute_loss", None)
    names = getattr(getattr(compute, "__code__", None), "co_names", ())
    if params != _DISTILL_CONTRACT or "_chunked_divergence_loss" not in names:
        raise RuntimeError(
            f"kernelwright.integrations.trl: TRL {trl.__version__}'s DistillationTrainer does "
            f"not compute its loss through _chunked_divergence_loss{_DISTILL_CONTRACT} as the "
            "release this was written for does, so nothing was swapped "
            "(enable(distillation=False) swaps the log-prob function alone)"
        )


def _ours(fn: object) -> bool:
    return isinstance(fn, type) and issubclass(fn, KernelwrightLogProbs)


def enable(
    *,
    logprobs: bool = True,
    distillation: bool = True,
    backward: str = "recompute",
    entropy_grad: bool = True,
) -> None:
    """Route TRL's fused LM head (logprobs) and its DistillationTrainer's loss (distillation)
    through kernelwright's functions (idempotent; called again, it replaces the log-prob
    function's `backward` and `entropy_grad`). Both are checked before either is swapped."""
    global _TRL_FUNCTION, _TRL_DIVERGENCE
    ours = KernelwrightLogProbs.configured(backward=backward, entropy_grad=entropy_grad)
    utils = _trl_utils() if logprobs else None
    module = _distillation() if distillation else None
    current = getattr(utils, "_ChunkedLogProbFunction", None)
    swap_lp = utils is not None and current is not ours
    swap_kd = module is not None and module.__dict__.get("_chunked_divergence_loss") is not (
        kernelwright_divergence_loss
    )
    if swap_lp and not _ours(current):
        _check_contract(current)
    if swap_kd:
        _check_distill_contract(module)
    if swap_lp:
        if not _ours(current):
            _TRL_FUNCTION = current
        utils._ChunkedLogProbFunction = ours
    if swap_kd:
        _TRL_DIVERGENCE = module._chunked_divergence_loss
        module._chunked_divergence_loss = kernelwright_divergence_loss


def disable(*, logprobs: bool = True, distillation: bool = True) -> None:
    """Give TRL its own functions back."""
    global _TRL_FUNCTION, _TRL_DIVERGENCE
    if logprobs and _TRL_FUNCTION is not None:
        _trl_utils()._ChunkedLogProbFunction = _TRL_FUNCTION
        _TRL_FUNCTION = None
    if distillation and _TRL_DIVERGENCE is not None:
        _distillation()._chunked_divergence_loss = _TRL_DIVERGENCE
        _TRL_DIVERGENCE = None


def _swapped() -> tuple[bool, bool]:
    """Whether (the log-prob function, the distillation loss) are ours."""
    module = _distillation()
    kd = module is not None and module.__dict__.get("_chunked_divergence_loss")
    return (
        _ours(getattr(_trl_utils(), "_ChunkedLogProbFunction", None)),
        kd is kernelwright_divergence_loss,
    )


def is_enabled() -> bool:
    """Whether any of TRL's functions has ours in its place."""
    return any(_swapped())


@contextlib.contextmanager
def enabled(
    *,
    logprobs: bool = True,
    distillation: bool = True,
    backward: str = "recompute",
    entropy_grad: bool = True,
) -> Iterator[None]:
    """`enable(...)` for the block, then back to whatever was in place before it (ours
    with its earlier options, or TRL's)."""
    had_lp, had_kd = _swapped()
    before = _trl_utils()._ChunkedLogProbFunction if had_lp else None
    enable(logprobs=logprobs, distillation=distillation, backward=backward,
           entropy_grad=entropy_grad)  # fmt: skip
    try:
        yield
    finally:
        disable(logprobs=not had_lp, distillation=not had_kd)
        if before is not None:
            _trl_utils()._ChunkedLogProbFunction = before
