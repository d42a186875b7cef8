"""Every pattern of the graph pass, in the order they are tried at each node."""

from __future__ import annotations

from collections.abc import Callable

from torch.fx import Node

from kernelwright.compile.patterns import (
    Match,
    match_gated,
    match_layer_norm,
    match_relu_squared,
    match_rms_norm,
    match_softmax,
)
from kernelwright.compile.patterns_jagged import (
    match_index_add_mean,
    match_reduce_mean,
    match_segment_mean,
)
from kernelwright.compile.patterns_loss import match_cross_entropy
from kernelwright.compile.patterns_rope import match_rope

# Tried in this order at every node; RMSNorm first, since its `x32 * rsqrt` is also a `mul`.
MATCHERS: tuple[Callable[[Node], Match | None], ...] = (
    match_rms_norm,
    match_gated,
    match_relu_squared,
    match_softmax,
    match_layer_norm,
    match_cross_entropy,
    match_rope,
    match_segment_mean,
    match_index_add_mean,
    match_reduce_mean,
)
