"""Post-training losses on one fused log-prob primitive (issue 35, in progress).

    from kernelwright.losses import fused_linear_logprobs, sequence_logprobs, dpo_loss, grpo_loss

`fused_linear_logprobs` gives each token's log-probability of its target under
softmax((hidden @ weight.T + bias) / temperature) without the [tokens, vocab] logits (chunked,
on the fused linear cross-entropy kernels). Each loss is a short function of log-probs kept in
this package, once: preference losses in `preference.py`, policy-gradient losses in `rl.py`,
distillation (forward/reverse KL, generalized JSD on two lm_heads) in `distill.py`.
"""

from kernelwright.losses.distill import fused_linear_distill
from kernelwright.losses.logprobs import (
    LogprobStats,
    fused_linear_logprob_stats,
    fused_linear_logprobs,
    fused_linear_logprobs_ref,
    head_weight,
    sequence_logprobs,
)
from kernelwright.losses.preference import (
    CPO_LOSS_TYPES,
    DPO_LOSS_TYPES,
    KTO_LOSS_TYPES,
    cpo_loss,
    dpo_loss,
    kto_loss,
    orpo_loss,
    simpo_loss,
)
from kernelwright.losses.rl import GRPO_LOSS_TYPES, grpo_loss

__all__ = [
    "CPO_LOSS_TYPES",
    "DPO_LOSS_TYPES",
    "GRPO_LOSS_TYPES",
    "KTO_LOSS_TYPES",
    "LogprobStats",
    "cpo_loss",
    "dpo_loss",
    "fused_linear_distill",
    "fused_linear_logprob_stats",
    "fused_linear_logprobs",
    "fused_linear_logprobs_ref",
    "grpo_loss",
    "head_weight",
    "kto_loss",
    "orpo_loss",
    "sequence_logprobs",
    "simpo_loss",
]
