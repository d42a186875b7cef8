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
"""

from kernelwright.runtime.launch import LaunchConfig as C

# "default" rows for 2048..16384: swept with benchmarks/tune.py on an H200 (bf16, 2026-11-22;
# benchmarks/results/tune_fused_add_rms_norm_layer_norm_h200.csv). The rest are rms_norm's.
TABLE = {
    "fwd": {
        "default": [
            (256, C(block_n=256, rows=16, num_warps=4)),
            (1024, C(block_n=1024, rows=4, num_warps=4)),
            (2048, C(block_n=2048, rows=2, num_warps=4)),
            (4096, C(block_n=4096, rows=2, num_warps=8)),
            # 8192: one row of 8 warps, w and b after the statistics (EARLY_AFFINE_MAX_N): 66.8 us
            # at 8192 x 8192 against 69.7 for the old row (2 rows, 4 warps; NOTES 42).
            (8192, C(block_n=8192, rows=1, num_warps=8)),
            # From 8193 the looped forward, two reads (Welford; its row length a constexpr since
            # NOTES 42), the second from L2 with the flags: 135.2 us at 8192 x 16384 against the
            # one-row kernel's 138.8, 143.0 at 4096 x 32768 against 163 (results/h200-norm-fwd/).
            (16384, C(block_n=2048, num_warps=16, evict_hints=True, reverse_pass=True)),
            (32768, C(block_n=4096, num_warps=16, evict_hints=True)),
            # Past 32768: 0.224 / 0.235 ms at 2048 x 65536 / 1024 x 131072 against the three-read
            # kernel's 0.285 at its old row (block_n 8192; results/h200-ln-pipe/ln_looped_ab.log)
            (2**31 - 1, C(block_n=2048, num_warps=16, evict_hints=True, reverse_pass=True)),
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
            (2048, C(block_n=2048, rows=2, num_warps=8, programs_per_sm=2, num_stages=2)),
            (4096, C(block_n=4096, rows=2, num_warps=16, programs_per_sm=1, num_stages=2)),
            (8192, C(block_n=8192, rows=1, num_warps=16, programs_per_sm=1, num_stages=2)),
            # 16384 up: dx alone here, dW and dB in "bwd_dwdb" (layer_norm.SPLIT_DWDB_FROM); dx
            # alone is fastest with 16 warps (0.218 ms at 8192 x 16384 on the H200).
            (16384, C(block_n=16384, rows=1, num_warps=16, programs_per_sm=1)),
            # Past 16384: rows split over programs in 4096-wide chunks that exchange their sums
            # (split_row; tune.py layer_norm_split_wide, H200, results/h200-ln-splitrow/):
            # against the dx + dwdb kernels (32768) and the looped kernel (past it), 1024-8192
            # rows: 32768 columns 1.65-1.82x, 20000 2.34x, 65536 2.42x, 131072 2.12x (32-46% of
            # copy). At 8192 and 16384 columns it lost (0.24 vs 0.11 ms, 0.47 vs 0.34): each
            # row block waits on its group's exchange, and little is in flight meanwhile.
            (131072, C(block_n=4096, rows=2, num_warps=4, programs_per_sm=2, split_row=True)),
            (2**31 - 1, C(block_n=4096, rows=1, num_warps=16, programs_per_sm=1)),
        ],
        "interpreter": [
            (1024, C(block_n=1024, rows=16, programs_per_sm=1)),
            (2**31 - 1, C(block_n=512, rows=1, programs_per_sm=1)),
        ],
    },
    # dW and dB alone, where the backward splits them off (layer_norm.SPLIT_DWDB_FROM and
    # _partials.few_rows; named "bwd_..." so the optimize workflow counts it in the
    # backward): one program per column block of block_n through every row, `rows` rows per
    # step, `num_stages` steps in flight. H200 (tune.py layer_norm_small_m and
    # layer_norm_dwdb_one, results/h200-ln-fewrows/): 1024 x 4096 after dx alone 0.0176 ms in
    # all (32 columns: 128 programs); 8192 x 16384 0.126 ms alone, 102% of copy for its two
    # reads, as fast as the earlier split form with fp32 partial rows (0.127 ms; 4 MB).
    "bwd_dwdb": {
        "default": [
            (8192, C(block_n=32, rows=64, num_warps=4, num_stages=4)),
            (2**31 - 1, C(block_n=64, rows=64, num_warps=4, num_stages=3)),
        ],
        "interpreter": [(2**31 - 1, C(block_n=64, rows=4, num_stages=2))],
    },
}
