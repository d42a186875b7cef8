"""Launch configs for fused_add_rms_norm. Rewritten by the optimize workflow; kernels read only.

Same keys and meaning as rms_norm's table: "fwd" and "bwd"; a row fits one program when
`block_n >= n` (the row stays in registers), otherwise the looped kernels walk the row in
`block_n` chunks; `rows` rows per program step; the backward is persistent with
`programs_per_sm` programs per SM, each keeping its own fp32 partial sum of dW;
`num_stages=2`: the backward loads the next row block before this one's math (prefetch);
larger values act as 2 (one block ahead).

Below TABLE: the thresholds that choose how the backward sums dW (partial rows, parked in ds,
rms_norm's column kernel, or co-running column programs). The launcher reads them at call
time; the optimize workflow rewrites TABLE only.
"""

from kernelwright.runtime.launch import LaunchConfig as C

# "default" rows for 2048..16384: tuned on Hopper (bf16). The rest are rms_norm's.
TABLE = {
    "fwd": {
        "default": [
            (256, C(block_n=256, rows=16, num_warps=4)),
            (1024, C(block_n=1024, rows=4, num_warps=4)),
            (2048, C(block_n=2048, rows=1, num_warps=4)),
            (4096, C(block_n=4096, rows=1, num_warps=4)),
            (8192, C(block_n=8192, rows=1, num_warps=16)),
            (16384, C(block_n=16384, rows=1, num_warps=32)),
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
            (2048, C(block_n=2048, rows=2, num_warps=8, programs_per_sm=2, num_stages=2)),
            (4096, C(block_n=4096, rows=2, num_warps=16, programs_per_sm=1, num_stages=2)),
            (8192, C(block_n=8192, rows=1, num_warps=16, programs_per_sm=1, num_stages=2)),
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

# Few rows: past this share of ds's bytes in fp32 partial dW rows, dW comes from rms_norm's
# column kernel (its DW_TABLE) instead (ops/_partials.few_rows).
PARTIALS_SHARE = 1 / 4

# Where the partial rows would pass this share of ds's bytes (and stay under PARTIALS_SHARE), the
# backward parks dW in ds instead (ops/_park.py): no partial-row memory, at the cost of a
# cooperative launch.
PARK_SHARE = 1 / 20
# The parking backward runs P programs, P dividing N into slices of whole 128-byte lines
# (PARK_SLICE_WORDS fp32 words), but not fewer than this share of the SMs: fewer programs read
# less of the memory bandwidth.
PARK_MIN_SHARE = 0.9
PARK_SLICE_WORDS = 32

# From CORUN_FROM columns (where a row still fits one program) and CORUN_MIN_ROWS rows, ds and
# dW run in one launch on different programs walking the rows at once (ops/_corun.py): the
# second read of each row comes from L2. CORUN: the column programs' count, rows per step and
# steps in flight. Only on GPUs of CORUN_MIN_SMS SMs or more: with fewer, ds would lose too
# many SMs to dW.
CORUN_FROM = 16384
CORUN_MIN_ROWS = 4096
CORUN = {"col_programs": 64, "col_rows": 16, "col_stages": 3}
CORUN_MIN_SMS = 120
