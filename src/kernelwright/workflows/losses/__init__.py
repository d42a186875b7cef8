"""`kernelwright losses new FILE`: a post-training loss written the way a paper states it, on
the full [..., V] logits, becomes one on the fused log-prob primitive, without the logits.

Understand traces the loss (torch.fx) and follows the logits (`sites.py`): casts to fp32 and a
constant temperature, then log_softmax(logits / T, dim=-1) gathered at token ids (a per-token
log-prob), or softmax times log_softmax summed over the vocabulary (each token's entropy). The
profile records the arguments and their roles, those sites and the reductions after them, or
why the loss cannot be expressed that way (the logits reach anything else: top-k, a max, a
second dim, another statistic of the distribution). Act rewrites the traced graph: the logits
argument becomes (hidden, weight), each site a call of `fused_linear_logprobs` (one call with
`return_entropy=True` gives a temperature's entropy and, when the loss has them, its log-probs),
and writes the function as Python, with tests that compare it with the original on random
inputs (values and gradients) and a memory benchmark. The same profile and source give the
same files.
"""

from kernelwright.workflows.losses.lossgen import (
    LossGenError,
    generate,
    understand,
)

__all__ = ["LossGenError", "generate", "understand"]
