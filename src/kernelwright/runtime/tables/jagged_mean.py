"""Launch configs for jagged_mean. Rewritten by the optimize workflow; kernels read, never choose.

Both kernels ("fwd" and "bwd") run one program per (segment, column tile of `block_n`) and walk
the segment's rows `rows` at a time, so one launch covers segments of any length. Keyed by D,
the row length. `block_n` is a power of two; `rows` x `block_n` is the tile a loop step moves.
"""

from kernelwright.runtime.launch import LaunchConfig as C

_LAST = 2**31 - 1

TABLE = {
    # UNTUNED guesses (no GPU measurement yet). Forward reads each row once, writes one row per
    # segment: a streaming reduction, so a step should move ~4-8 KB per program (2048-4096
    # elements) and num_stages=2 lets the compiler prefetch the next row chunk during the sum.
    # Narrow rows take more rows per step; wide rows split D over several programs, which also
    # gives a 4096-segment batch enough programs (4096 x 2 at D = 1024) to fill 132 SMs.
    "fwd": {
        "default": [
            (64, C(block_n=64, rows=32, num_warps=4, num_stages=2)),
            (256, C(block_n=256, rows=16, num_warps=4, num_stages=2)),
            (1024, C(block_n=512, rows=8, num_warps=4, num_stages=2)),
            (_LAST, C(block_n=1024, rows=4, num_warps=8, num_stages=2)),
        ],
        # Under the interpreter every program instance costs milliseconds: few, wide programs.
        "interpreter": [
            (_LAST, C(block_n=512, rows=32)),
        ],
    },
    # UNTUNED. Backward reads one gradient row per (segment, tile) and writes every row of the
    # segment: a broadcast store, the same tiles as the forward.
    "bwd": {
        "default": [
            (64, C(block_n=64, rows=32, num_warps=4)),
            (256, C(block_n=256, rows=16, num_warps=4)),
            (1024, C(block_n=512, rows=8, num_warps=4)),
            (_LAST, C(block_n=1024, rows=4, num_warps=8)),
        ],
        "interpreter": [
            (_LAST, C(block_n=512, rows=32)),
        ],
    },
}
