"""Launch configs for layer_norm. Rewritten by the optimize workflow; kernels read, never choose.

"fwd" and "bwd": a row fits one program when `block_n >= n` (the row stays in registers);
otherwise the looped kernels walk the row in `block_n` chunks. `rows` is the number of rows a
program handles per step (short rows: more rows, fewer programs). The backward is persistent:
`programs_per_sm` programs per SM, each keeping its own fp32 partial sums of dW and dB.
`num_stages=2`: the backward loads the next row block before this one's math (prefetch);
larger values act as 2 (one block ahead). `evict_hints` / `reverse_pass`: the looped forward's
L2 flags (see LaunchConfig). `split_row` (backward): the row's `block_n` chunks go to a group of
programs that exchange their partial sums (ops/_split.py); where it cannot split (more than 32
chunks, too few SMs) the looped kernel runs at `block_n`.

Below TABLE: the thresholds the launchers read at call time (the forward's affine load
order, and how the backward sums dW and dB); the optimize workflow rewrites TABLE only.
"""

from kernelwright.runtime.launch import LaunchConfig as C

# "default" rows for 2048..16384: tuned on Hopper (bf16). The rest are rms_norm's.
TABLE = {
    "fwd": {
        "default": [
            (256, C(block_n=256, rows=16, num_warps=4)),
            (1024, C(block_n=1024, rows=4, num_warps=4)),
            (2048, C(block_n=2048, rows=2, num_warps=4)),
            (4096, C(block_n=4096, rows=2, num_warps=8)),
            # 8192: one row of 8 warps, w and b after the statistics (EARLY_AFFINE_MAX_N)
            (8192, C(block_n=8192, rows=1, num_warps=8)),
            # From 8193 the looped forward, two reads (Welford), the second from L2 with the
            # flags: faster than a row held in registers, which spills there.
            (16384, C(block_n=2048, num_warps=16, evict_hints=True, reverse_pass=True)),
            (32768, C(block_n=4096, num_warps=16, evict_hints=True)),
            (2**31 - 1, C(block_n=2048, num_warps=16, evict_hints=True, reverse_pass=True)),
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
            (2048, C(block_n=2048, rows=2, num_warps=8, programs_per_sm=2, num_stages=2)),
            (4096, C(block_n=4096, rows=2, num_warps=16, programs_per_sm=1, num_stages=2)),
            (8192, C(block_n=8192, rows=1, num_warps=16, programs_per_sm=1, num_stages=2)),
            # 16384 up: dx alone here, dW and dB in "bwd_dwdb" or co-running (SPLIT_DWDB_FROM).
            (16384, C(block_n=16384, rows=1, num_warps=16, programs_per_sm=1)),
            # Past 16384: rows split over programs in 4096-wide chunks that exchange their sums
            # (split_row): one read of x and dy. Not below: each row block waits on its group's
            # exchange, and little is in flight meanwhile.
            (131072, C(block_n=4096, rows=2, num_warps=4, programs_per_sm=2, split_row=True)),
            (2**31 - 1, C(block_n=4096, rows=1, num_warps=16, programs_per_sm=1)),
        ],
        "interpreter": [
            (1024, C(block_n=1024, rows=16, programs_per_sm=1)),
            (2**31 - 1, C(block_n=512, rows=1, programs_per_sm=1)),
        ],
    },
    # dW and dB alone, where the backward splits them off (SPLIT_DWDB_FROM, PARTIALS_SHARE;
    # named "bwd_..." so the optimize workflow counts it in the backward; ops/_norm_reduce.py):
    # one program per column block of block_n through every row, `rows` rows per step,
    # `num_stages` steps in flight. 32 columns at 4096: 128 programs, about one per SM.
    "bwd_dwdb": {
        "default": [
            (8192, C(block_n=32, rows=64, num_warps=4, num_stages=4)),
            (2**31 - 1, C(block_n=64, rows=64, num_warps=4, num_stages=3)),
        ],
        "interpreter": [(2**31 - 1, C(block_n=64, rows=4, num_stages=2))],
    },
}

# The one-row forward loads w and b before x for rows of up to this many columns (block_n), so
# that their latency overlaps x's; for longer rows after the statistics, so that their registers
# are not live across x's loads and the reductions (x, its centred copy, w and b at once spill).
EARLY_AFFINE_MAX_N = 4096

# Few rows: past this share of dx's bytes in fp32 partial dW and dB rows, dx runs alone and dW and
# dB come from "bwd_dwdb", which stores them itself (ops/_partials.few_rows).
PARTIALS_SHARE = 1 / 4

# From this row length up (where a row fits one program), the backward leaves dW and dB to the
# column kernel ("bwd_dwdb"): the fused one would hold w, dW and dB as three fp32 rows, most of
# the register file of one program per SM.
SPLIT_DWDB_FROM = 16384
# There, from CORUN_MIN_ROWS rows, dx and dW/dB run in one launch on different programs walking
# the rows at once (ops/_corun.py): the second read of each row comes from L2. CORUN: the column
# programs' count, rows per step and steps in flight. Only on GPUs of CORUN_MIN_SMS SMs or more:
# with fewer, the column programs would take too large a share of them from dx.
CORUN_MIN_ROWS = 4096
CORUN = {"col_programs": 32, "col_rows": 16, "col_stages": 4}
CORUN_MIN_SMS = 120
