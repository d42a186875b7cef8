"""Launch configs for rope. Rewritten by the optimize workflow; kernels read, never choose.

One kernel serves both directions ("fwd" rotates q and k, "bwd" their gradients by the
inverse rotation). A program owns `rows` token positions and, at each, every head of q and of
k, walked in tiles of `block_n` elements: block_n // next_pow2(head_dim) heads per tile (at
least one, at most the head count rounded up to a power of two). Keyed by n = (heads +
kv_heads) * head_dim, the elements of q and k at one token position: the row a program moves.
"""

from kernelwright.runtime.launch import LaunchConfig as C

_LAST = 2**31 - 1

# "default" rows (bf16, q/k as HF's transposed views), keyed by the models' (heads + kv_heads) *
# head_dim: 2560 Llama-3.2-1B, 4096 Qwen2.5-7B, 5120 Llama-3-8B, 6144 Gemma-2-9B, 17408
# Llama-3.1-405B. Above 1024 elements one token position is a program's work; at 1024 and under
# (Qwen2.5-0.5B, SmolLM) a program takes two positions, so that its tile is not mostly empty.
# Tiles that hold all heads of q and all of k (block_n >= next_pow2(heads) * next_pow2(head_dim))
# let the kernel issue every load before its stores instead of one tile's latency at a time.
_ROWS = [
    (1024, C(block_n=1024, rows=2, num_warps=4)),
    (2560, C(block_n=8192, rows=1, num_warps=4)),
    (4096, C(block_n=4096, rows=1, num_warps=4)),
    (5120, C(block_n=4096, rows=1, num_warps=8)),
    (8192, C(block_n=4096, rows=1, num_warps=8)),
    (_LAST, C(block_n=16384, rows=1, num_warps=8)),
]

TABLE = {
    "fwd": {
        "default": _ROWS,
        # Under the interpreter every program instance costs milliseconds: few, wide programs.
        "interpreter": [
            (_LAST, C(block_n=2**16, rows=32)),
        ],
    },
    # The same kernel on the gradients (the inverse rotation), so the same tiles.
    "bwd": {
        "default": _ROWS,
        "interpreter": [
            (_LAST, C(block_n=2**16, rows=32)),
        ],
    },
}
