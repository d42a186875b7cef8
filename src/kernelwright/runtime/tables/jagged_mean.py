"""Launch configs for jagged_mean. Rewritten by the optimize workflow; kernels read, never choose.

Both kernels ("fwd" and "bwd") run one program per (segment, column tile of `block_n`) and walk
the segment's rows `rows` at a time, so one launch covers segments of any length. Keyed by D,
the row length. `block_n` is a power of two; `rows` x `block_n` is the tile a loop step moves.
"""

from kernelwright.runtime.launch import LaunchConfig as C

_LAST = 2**31 - 1

TABLE = {
    # Swept with benchmarks/tune.py on an H200 (bf16, 4096 segments of 1..512 rows, 2026-11-22;
    # benchmarks/results/tune_softmax_jagged_mean_h200.csv). Forward: 65% of copy bandwidth at
    # D = 64 (128-byte rows: latency-bound), 95% at D = 256, 105% at D = 1024. num_stages: the
    # forward's row-chunk loop staged that deep (1: not staged; that sweep's num_stages was a
    # launch option the loop ignored, so it ran unstaged). Narrower column tiles than D give a
    # 4096-segment batch more programs to spread over 132 SMs.
    "fwd": {
        "default": [
            # The loop staged (tune.py jagged_mean_staged, H200, results/
            # tune_jagged_mean_staged_h200.csv, against the unstaged rows before in one run):
            # D = 64 0.0470 -> 0.0446 ms with 64-row chunks of 2 warps, 3 stages (before: 128-row
            # chunks of 4 warps; equal segment lengths were no faster, so not the long segments'
            # tail, tune_jagged_mean_balance_h200.csv); D = 256 0.1369 -> 0.1337; D = 1024
            # 0.4918 -> 0.4878. Stages are cut where fp32 chunks would not fit (`_stages`).
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
    # broadcast store: 85% of copy at D = 64, 98% at 256, 102% at 1024 (same sweep).
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
