"""Launch configs for softmax / log_softmax. Rewritten by the optimize workflow; kernels read.

"fwd" and "bwd": a row fits one program when `block_n >= n` (the row stays in registers; `rows`
rows per program; forward rows with `rows=1` and `num_stages > 1`: a persistent grid of
sm_count * `programs_per_sm` programs, one row per step, the next `num_stages - 1` rows' loads
in flight); otherwise the looped kernels walk the row in `block_n` chunks, one program per row
(forward: an online max/sum pass, then a write pass; backward: a reduction pass, then a write
pass).
"""

from kernelwright.runtime.launch import LaunchConfig as C

# "default" rows for 4096 and up: swept with benchmarks/tune.py on an H200 (bf16, 4096 rows,
# 2026-11-22; benchmarks/results/tune_softmax_1d_h200.csv, after the one-row kernels became 1-D
# with a reciprocal instead of a division per element: 32768 went from 63% to 75% of copy).
# The fused kernels hold up to 32768 fp32 values per row (16 warps: 64 per thread). Past that
# the looped kernels read each row twice, so their ceiling is 2/3 (forward) and 3/5 (backward)
# of copy bandwidth by the minimal byte count if the second read misses L2; they reached 61-63%.
# With the L2 flags (evict_last / evict_first hints, second pass from the row's end: benchmarks/
# tune.py l2_hints, H200, 2026-11-22, results/tune_l2_hints_h200.csv) part of the second read
# hits L2: forward 0.845 -> 0.778 ms at 4096 x 131072 (-8%), 1.669 -> 1.615 at 262144 (-3%);
# backward 1.234 -> 1.079 (-13%) and 2.468 -> 2.311 (-6%).
TABLE = {
    "fwd": {
        "default": [
            (256, C(block_n=256, rows=16, num_warps=4)),
            (1024, C(block_n=1024, rows=4, num_warps=4)),
            (4096, C(block_n=4096, rows=1, num_warps=8)),
            (8192, C(block_n=8192, rows=1, num_warps=16)),
            (16384, C(block_n=16384, rows=1, num_warps=32)),
            # 32768: one row fills an SM's registers; the persistent form keeps the next rows'
            # loads in flight meanwhile: 0.146 against 0.172 ms, 88% of copy (H200, 4096 rows,
            # benchmarks/softmax_pipe_probe.py). At <= 16384 and 65536 it lost (several
            # programs per SM already overlap there; 65536 spills).
            (32768, C(block_n=32768, rows=1, num_warps=16, num_stages=3, programs_per_sm=1)),
            # 65536 and up: the looped kernel with the L2 flags; at 65536 it now beats the fused
            # one, 0.369 against 0.388 ms (tune.py softmax_mid, results/tune_softmax_mid_h200.csv)
            (2**31 - 1, C(block_n=4096, rows=1, num_warps=16, evict_hints=True, reverse_pass=True)),
        ],
        # Under the interpreter every program instance costs milliseconds: few, wide programs
        # and large chunks (rows past 4096 take the looped kernel).
        "interpreter": [
            (1024, C(block_n=1024, rows=16)),
            (4096, C(block_n=4096, rows=4)),
            (2**31 - 1, C(block_n=4096, rows=1, evict_hints=True, reverse_pass=True)),
        ],
    },
    "bwd": {
        "default": [
            (256, C(block_n=256, rows=16, num_warps=4)),
            (1024, C(block_n=1024, rows=4, num_warps=4)),
            (4096, C(block_n=4096, rows=1, num_warps=4)),
            (8192, C(block_n=8192, rows=1, num_warps=16)),
            (16384, C(block_n=16384, rows=1, num_warps=4)),
            (32768, C(block_n=32768, rows=1, num_warps=16)),
            (
                2**31 - 1,
                C(block_n=16384, rows=1, num_warps=32, evict_hints=True, reverse_pass=True),
            ),
        ],
        "interpreter": [
            (1024, C(block_n=1024, rows=16)),
            (4096, C(block_n=4096, rows=4)),
            (2**31 - 1, C(block_n=4096, rows=1, evict_hints=True, reverse_pass=True)),
        ],
    },
}
