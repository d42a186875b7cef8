"""Launch configs for softmax / log_softmax. Rewritten by the optimize workflow; kernels read.

"fwd" and "bwd": a row fits one program when `block_n >= n` (the row stays in registers; `rows`
rows per program); otherwise, with `split_row`, the row's `block_n` chunks go to programs that
share their statistics (ops/_split.py), and without it the looped kernels walk the row in
`block_n` chunks, one program per row (forward: an online max/sum pass, then a write pass;
backward: a reduction pass, then a write pass).
"""

from kernelwright.runtime.launch import LaunchConfig as C

# "default" rows for 4096 and up: swept with benchmarks/tune.py on an H200 (bf16, 4096 rows,
# 2026-11-22; benchmarks/results/tune_softmax_1d_h200.csv, after the one-row kernels became 1-D
# with a reciprocal instead of a division per element: 32768 went from 63% to 75% of copy).
# The one-row forward holds rows up to 32768 values, the backward up to 32768 values as fp32.
# Past that rows are split over programs (`split_row`) up to 32 chunks; past those the looped
# kernels read each row twice, so their ceiling is 2/3 (forward) and 3/5 (backward) of copy
# bandwidth by the minimal byte count if the second read misses L2; they reached 61-63%.
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
            # 16384-32768: the row held in its own dtype (bf16: half the registers of fp32;
            # benchmarks/softmax_hold_probe.py, H200, 4096 rows, NOTES 28): 16384 74.7 -> 70.8
            # us with 16 warps; 32768 0.146 (persistent, loads staged ahead) -> 0.139 ms.
            (16384, C(block_n=16384, rows=1, num_warps=16)),
            (32768, C(block_n=32768, rows=1, num_warps=32)),
            # Past 32768: the row split over programs in 16384-wide chunks that share their
            # statistics (ops/_split.py; tune.py softmax_split, H200, 4096 rows, NOTES 31):
            # one read of the row instead of two. At most 32 chunks (524288 columns).
            (524288, C(block_n=16384, rows=1, num_warps=16, split_row=True)),
            # Past that: the looped kernel with the L2 flags.
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
            # 4097-16384: the looped kernel compiled per row length, second read from L2
            # (benchmarks/softmax_bwd_probe.py, 4096 rows, bf16, NOTES 56): 8192 63.4 -> 62.1
            # us on an H100, 47.9 -> 46.2 on an H200; 16384 132.1 -> 127.9 and 95.3 -> 91.8.
            # fp32 values keep the one-row kernel at the 32768 row's warps (backward_config).
            (8192, C(block_n=4096, rows=1, num_warps=16, evict_hints=True)),
            (16384, C(block_n=8192, rows=1, num_warps=32, evict_hints=True)),
            # 32768: the one-row kernel. The looped one was 2% faster on an H100 (8192 x 32
            # warps) and 1% slower on an H200, where some configs of it (and torch.compile's
            # kernel of the same form at 24576) fell to 82% of copy: the rows in flight hold
            # 34 MB of dy and y, two-thirds of L2, so the second read misses more (NOTES 56).
            (32768, C(block_n=32768, rows=1, num_warps=16)),
            # Past 32768: split rows as in the forward, 8192-wide chunks (dy and y held as
            # fp32; NOTES 31), at most 32 of them; past that the looped kernel.
            (262144, C(block_n=8192, rows=1, num_warps=8, split_row=True)),
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
