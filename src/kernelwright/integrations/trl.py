"""TRL's trainers on kernelwright's log-prob primitive, without forking them.

TRL (1.x) computes every policy, reference and loss log-prob through one fused LM head:
`add_fused_lm_head` makes `model(..., labels=..., fused_lm_head=True)` run the backbone and
hand the hidden states of the scored tokens to a single autograd function, which returns the
target log-probs and the statistics a trainer asks for (entropy, log sum p^2, mean logit,
whether the target is the argmax). DPO, KTO, GRPO, RLOO and SFT all go through it, and their
loss formulas read only its outputs.

`enable()` puts `fused_linear_logprob_stats` in that function's place; everything around it
(masks, label shifting, PEFT and FSDP2 handling, the MoE auxiliary loss, the metrics) stays
TRL's. The swap checks the function's signature against the one it was written for and
refuses, saying so, when a TRL release changes it. Weights partitioned by DeepSpeed ZeRO-3
(which TRL gathers inside its backward) keep TRL's own function.

    from kernelwright.integrations import trl as kw_trl

    kw_trl.enable()              # before or after building the trainer
    trainer = DPOTrainer(...)
    trainer.train()

or `with kw_trl.enabled(): trainer.train()`.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator

import torch

from kernelwright.losses.logprobs import STATS, fused_linear_logprob_stats

# The parameters of trl.kernels.ChunkedLogProbFunction.forward this adapter stands in for.
_CONTRACT = (
    "ctx", "hidden", "weight", "bias", "targets", "temperature", "chunk_size",
    "final_logit_softcapping", "logit_scale", "outputs",
)  # fmt: skip
_TRL_FUNCTION: object | None = None  # TRL's own function while ours is in its place


class KernelwrightLogProbs:
    """Stands in for trl.kernels.ChunkedLogProbFunction: `apply(hidden [N, H], weight [V, H],
    bias, targets [N], temperature, chunk_size, final_logit_softcapping, logit_scale,
    outputs)` -> (log_probs, entropy, log_sum_sq_probs, mean_logits, is_top1), each [N] or None.

    TRL's `chunk_size` is the width of its vocabulary tiles; here each chunk of tokens sees the
    whole vocabulary at once, so it is not used. Every target is scored (TRL passes only the
    scored tokens, or ignored ones clamped to 0)."""

    @staticmethod
    def apply(
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
        )
        return tuple(st)


def _trl_utils():
    try:
        import trl.trainer.utils as utils
    except ImportError as e:  # pragma: no cover - trl is a test dependency
        raise ImportError("kernelwright.integrations.trl needs TRL: pip install trl") from e
    return utils


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


def enable() -> None:
    """Route TRL's fused LM head through kernelwright's primitive (idempotent)."""
    global _TRL_FUNCTION
    utils = _trl_utils()
    current = getattr(utils, "_ChunkedLogProbFunction", None)
    if current is KernelwrightLogProbs:
        return
    _check_contract(current)
    _TRL_FUNCTION = current
    utils._ChunkedLogProbFunction = KernelwrightLogProbs


def disable() -> None:
    """Give TRL its own function back."""
    global _TRL_FUNCTION
    if _TRL_FUNCTION is not None:
        _trl_utils()._ChunkedLogProbFunction = _TRL_FUNCTION
        _TRL_FUNCTION = None


def is_enabled() -> bool:
    return getattr(_trl_utils(), "_ChunkedLogProbFunction", None) is KernelwrightLogProbs


@contextlib.contextmanager
def enabled() -> Iterator[None]:
    """`enable()` for the block, then back to whatever was in place before it."""
    was = is_enabled()
    enable()
    try:
        yield
    finally:
        if not was:
            disable()
