"""Launch configs for cross_entropy (and the chunks of fused_linear_cross_entropy).

"fwd": one program per row. A row that fits one block (`block_n >= V`) stays in registers
between the statistics and the gradient (from 16384 columns in the logits' own dtype; fp32
logits past 32768 classes take the looped row instead); longer rows are walked in `block_n`
chunks twice (an online max/sum pass, then the gradient pass, which re-reads the row, mostly
from L2).
"bwd_scale": the backward's in-place multiply by the incoming gradient, one program per row,
skipped when that gradient is 1.

"default" rows were swept on an H200 (bf16, 8192 rows, forward with the gradient). Small
looped blocks (2048 columns x 8 warps) keep more rows in flight per SM, and part of the second
read of each row hits L2 — more with the L2 flags (evict_last / evict_first hints, the gradient
pass from the row's end).
"""

from kernelwright.runtime.launch import LaunchConfig as C

TABLE = {
    "fwd": {
        "default": [
            (2048, C(block_n=2048, num_warps=8)),
            (15360, C(block_n=2048, num_warps=8, evict_hints=True, reverse_pass=True)),
            # One block, the row held in its own dtype (ops/_held.py), only where the vocabulary
            # fills most of the block: its time goes with the block, not V. From 65536 classes
            # the looped form is ahead, so there it is the only one.
            (16384, C(block_n=16384, num_warps=16)),
            (30720, C(block_n=2048, num_warps=8, evict_hints=True, reverse_pass=True)),
            (32768, C(block_n=32768, num_warps=32)),
            (2**31 - 1, C(block_n=2048, num_warps=8, evict_hints=True, reverse_pass=True)),
        ],
        "interpreter": [(2**31 - 1, C(block_n=4096, evict_hints=True, reverse_pass=True))],
    },
    "bwd_scale": {
        "default": [(2**31 - 1, C(block_n=4096, num_warps=8))],
        "interpreter": [(2**31 - 1, C(block_n=4096))],
    },
}

# fused_linear_cross_entropy's chunks of tokens (`choose_chunk_rows`): the [C, V] logits buffer
# within CHUNK_BYTES, but never fewer than MIN_CHUNK_TOKENS tokens (below ~400 the grad_weight
# update, a read and write of all of [V, H] per chunk, is memory-bound) nor fewer than
# 1/CHUNK_SHARE of the tokens (at most about CHUNK_SHARE such updates).
CHUNK_BYTES = 128 * 2**20
MIN_CHUNK_TOKENS = 512
CHUNK_SHARE = 16
