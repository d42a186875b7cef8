"""`kernelwright losses new FILE`: a post-training loss written the way a paper states it, on
the full [..., V] logits, becomes one on the fused log-prob primitive, without the logits.

Understand traces the loss (torch.fx) and finds each place the logits reach the loss:
log_softmax(logits / T, dim=-1) gathered at token ids, possibly after a cast to fp32 and a
constant temperature. The profile records the arguments and their roles, those sites and the
reductions after them, or why the loss cannot be expressed that way (the logits reach anything
else: softmax statistics, top-k, a second dim). Act rewrites the traced graph: the logits
argument becomes (hidden, weight), each site a call of `fused_linear_logprobs`, and writes the
function as Python, with tests that compare it with the original on random inputs (values and
gradients) and a memory benchmark. The same profile and source give the same files.
"""

from kernelwright.workflows.losses.lossgen import (
    LossGenError,
    generate,
    understand,
)

__all__ = ["LossGenError", "generate", "understand"]
