"""Launch configs for jagged_mean. Rewritten by the optimize workflow; kernels read, never choose.

Both kernels ("fwd" and "bwd") run one program per (segment, column tile of `block_n`) and walk
the segment's rows `rows` at a time, so one launch covers segments of any length. Keyed by D,
the row length. `block_n` is a power of two; `rows` x `block_n` is the tile a loop step moves.
"""

from kernelwright.runtime.launch import LaunchConfig as C

_LAST = 2**31 - 1

TABLE = {
    # For batches of thousands of short segments: narrower column tiles than D give such a
    # batch more programs to spread over the SMs. num_stages: the forward's
    # row-chunk loop staged that deep (1: not staged), cut where fp32 chunks would not fit
    # STAGED_BYTES (jagged_mean._stages). Short rows (D = 64, 128 bytes) are latency-bound:
    # small chunks, several staged, keep loads in flight.
    "fwd": {
        "default": [
            (64, C(block_n=64, rows=64, num_warps=2, num_stages=3)),
            (256, C(block_n=128, rows=32, num_warps=2, num_stages=3)),
            (1024, C(block_n=512, rows=16, num_warps=4, num_stages=4)),
            (_LAST, C(block_n=512, rows=16, num_warps=4, num_stages=4)),
        ],
        # Under the interpreter every program instance costs milliseconds: few, wide programs.
        "interpreter": [
            (_LAST, C(block_n=512, rows=32)),
        ],
    },
    # Backward reads one gradient row per (segment, tile) and writes every row of the segment, a
    # broadcast store.
    "bwd": {
        "default": [
            (64, C(block_n=64, rows=32, num_warps=8)),
            (256, C(block_n=128, rows=16, num_warps=8)),
            (1024, C(block_n=128, rows=16, num_warps=8)),
            (_LAST, C(block_n=128, rows=16, num_warps=8)),
        ],
        "interpreter": [
            (_LAST, C(block_n=512, rows=32)),
        ],
    },
}

# The forward's staged row chunks take at most this much shared memory (jagged_mean._stages):
# well under any CUDA GPU's per-block limit (99 KB on sm_86/89, 227 KB on sm_90).
STAGED_BYTES = 48 * 1024
