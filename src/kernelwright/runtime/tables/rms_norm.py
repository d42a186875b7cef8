"""Launch configs for rms_norm. Rewritten by the optimize workflow; kernels read, never choose.

"fwd" and "bwd": a row fits one program when `block_n >= n` (the row stays in registers);
otherwise the looped kernels walk the row in `block_n` chunks. `rows` is the number of rows a
program handles per step (short rows: more rows, fewer programs). The backward is persistent:
`programs_per_sm` programs per SM, each keeping its own fp32 partial sum of dW.
`num_stages=2`: the backward loads the next row block before this one's math (prefetch);
larger values act as 2 (one block ahead).

Below TABLE: FEW_ROWS and DW_TABLE (configs for calls TABLE does not model), and the
threshold that sends few rows to the column kernel. The launchers read them at call time; the
optimize workflow rewrites TABLE only.
"""

from kernelwright.runtime.launch import LaunchConfig as C

# "default" rows: tuned on Hopper (bf16); other architectures use them until tuned.
TABLE = {
    "fwd": {
        "default": [
            (256, C(block_n=256, rows=16, num_warps=4)),
            (1024, C(block_n=1024, rows=4, num_warps=4)),
            (2048, C(block_n=2048, rows=1, num_warps=4)),
            (4096, C(block_n=4096, rows=1, num_warps=8)),
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
        # 2048..8192: num_stages=2 prefetches the next row block; at 16384 it spills registers.
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
# a program (two rows' loads in flight per program, where the table's row, sized for many rows,
# has one). Not retuned by the optimize workflow, whose "fwd" variants do not reach these calls.
FEW_ROWS = {
    "fwd": {
        "default": [(1024, 4096, C(block_n=4096, rows=2, num_warps=8))],
    },
}

# dW alone, where the backward leaves it to the column kernel (few rows, PARTIALS_SHARE;
# fused_add_rms_norm's too; ops/_norm_reduce.py): one program per column block of block_n
# through every row, `rows` rows per step, `num_stages` steps in flight; layer_norm's bwd_dwdb
# configs, which read the same two tensors. Kept out of TABLE: the optimize workflow tunes and
# models every TABLE kernel of a mode as running at every shape, and this one runs at few rows
# only.
DW_TABLE = {
    "bwd_dw": {
        "default": [
            (8192, C(block_n=32, rows=64, num_warps=4, num_stages=4)),
            (2**31 - 1, C(block_n=64, rows=64, num_warps=4, num_stages=3)),
        ],
        "interpreter": [(2**31 - 1, C(block_n=64, rows=4, num_stages=2))],
    },
}

# Few rows: where the backward's fp32 partial dW rows (one per program) would pass this share of
# the row gradient's bytes, dx runs alone and dW comes from the column kernel (DW_TABLE), which
# stores dW itself (ops/_partials.few_rows).
PARTIALS_SHARE = 1 / 4
