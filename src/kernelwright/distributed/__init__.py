"""Losses for models split over several processes (torch.distributed).

`vocab_parallel_cross_entropy` and `vocab_parallel_fused_linear_cross_entropy`: the
cross-entropy of a tensor-parallel lm-head, with the vocabulary split over the ranks of a
process group (plain tensors and a group, or DTensors sharded along the vocabulary).
"""

from kernelwright.distributed._layout import chunk_sizes
from kernelwright.distributed.vocab_parallel import (
    vocab_parallel_cross_entropy,
    vocab_parallel_fused_linear_cross_entropy,
)

__all__ = [
    "chunk_sizes",
    "vocab_parallel_cross_entropy",
    "vocab_parallel_fused_linear_cross_entropy",
]
