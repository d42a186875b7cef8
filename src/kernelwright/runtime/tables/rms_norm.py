"""Launch configs for rms_norm. Rewritten by the optimize workflow; kernels read, never choose.

"fwd" and "bwd": a row fits one program when `block_n >= n` (the row stays in registers);
otherwise the looped kernels walk the row in `block_n` chunks. `rows` is the number of rows a
program handles per step (short rows: more rows, fewer programs). The backward is persistent:
`programs_per_sm` programs per SM, each keeping its own fp32 partial sum of dW.
`num_stages=2`: the backward loads the next row block before this one's math (prefetch);
larger values act as 2 (one block ahead).
"""

from kernelwright.runtime.launch import LaunchConfig as C

# "default" rows: swept with benchmarks/tune.py on an H200 (bf16, 2026-11-22; results in
# benchmarks/results/tune_rms_norm*_h200.csv, notes in benchmarks/NOTES.md). Other
# architectures use them until tuned.
TABLE = {
    "fwd": {
        "default": [
            (256, C(block_n=256, rows=16, num_warps=4)),
            (1024, C(block_n=1024, rows=4, num_warps=4)),
            (2048, C(block_n=2048, rows=1, num_warps=4)),
            (4096, C(block_n=4096, rows=1, num_warps=8)),
            # 8192: one row a program, 63.7-63.9 us at 8192 x 8192 against 65.1-65.5 for two
            # (two runs with the reading flush, results/h200-norm-fwd/, NOTES 42)
            (8192, C(block_n=8192, rows=1, num_warps=4)),
            (16384, C(block_n=16384, rows=1, num_warps=8)),
            (32768, C(block_n=32768, rows=1, num_warps=16)),
            (2**31 - 1, C(block_n=8192, rows=1, num_warps=16)),
        ],
        # Under the interpreter every program instance costs milliseconds: few, wide programs.
        "interpreter": [
            (1024, C(block_n=1024, rows=16)),
            (2**31 - 1, C(block_n=512, rows=1)),
        ],
    },
    "bwd": {
        # 2048..8192: num_stages=2 prefetches the next row block (+1-10% on the H200,
        # benchmarks/results/h200-issue3-normbwd/); at 16384 it spills registers (0.45-0.7x).
        "default": [
            (256, C(block_n=256, rows=16, num_warps=4, programs_per_sm=8)),
            (1024, C(block_n=1024, rows=4, num_warps=4, programs_per_sm=8)),
            (2048, C(block_n=2048, rows=8, num_warps=8, programs_per_sm=1, num_stages=2)),
            (4096, C(block_n=4096, rows=4, num_warps=8, programs_per_sm=1, num_stages=2)),
            (8192, C(block_n=8192, rows=1, num_warps=32, programs_per_sm=1, num_stages=2)),
            (16384, C(block_n=16384, rows=1, num_warps=16, programs_per_sm=1)),
            (32768, C(block_n=32768, rows=1, num_warps=32, programs_per_sm=1)),
            (2**31 - 1, C(block_n=4096, rows=1, num_warps=16, programs_per_sm=1)),
        ],
        "interpreter": [
            (1024, C(block_n=1024, rows=16, programs_per_sm=1)),
            (2**31 - 1, C(block_n=512, rows=1, programs_per_sm=1)),
        ],
    },
}

# Few rows (runtime.launch.FewRows): at most 1024 rows of 2049..4096 columns, two rows of 8 warps
# a program: 7.7-7.9 us at 1024 x 4096 against 8.5-8.6 for the table's row, swept at 8192+ rows
# (three runs, H200; results/h200-norm-fwd/, NOTES 42); at 2048 rows the table's row wins again.
# Not retuned by the optimize workflow, whose variants of the "fwd" row do not reach these calls.
FEW_ROWS = {
    "fwd": {
        "default": [(1024, 4096, C(block_n=4096, rows=2, num_warps=8))],
    },
}

# dW alone, where the backward leaves it to a column kernel (few rows, _partials.few_rows;
# fused_add_rms_norm's too): one program per column block of block_n through every row, `rows`
# rows per step, `num_stages` steps in flight; layer_norm's dwdb configs (H200,
# results/h200-ln-fewrows/), which read the same two tensors. Kept out of TABLE: the optimize
# workflow tunes and models every TABLE kernel of a mode as running at every shape, and this
# one runs at few rows only.
DW_TABLE = {
    "bwd_dw": {
        "default": [
            (8192, C(block_n=32, rows=64, num_warps=4, num_stages=4)),
            (2**31 - 1, C(block_n=64, rows=64, num_warps=4, num_stages=3)),
        ],
        "interpreter": [(2**31 - 1, C(block_n=64, rows=4, num_stages=2))],
    },
}
