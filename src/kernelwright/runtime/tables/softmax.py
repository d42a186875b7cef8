"""Launch configs for softmax / log_softmax. Rewritten by the optimize workflow; kernels read.

"fwd" and "bwd": a row fits one program when `block_n >= n` (the row stays in registers; `rows`
rows per program); otherwise, with `split_row`, the row's `block_n` chunks go to programs that
share their statistics (ops/_split.py), and without it the looped kernels walk the row in
`block_n` chunks, one program per row (forward: an online max/sum pass, then a write pass;
backward: a reduction pass, then a write pass).

"default" rows from 4096 up were swept on an H200 (bf16, 4096 rows). The one-row forward holds
rows up to 32768 values, the backward up to 32768 values as fp32. Past that rows are split over
programs up to 32 chunks; past those the looped kernels read each row twice, so their ceiling is
2/3 (forward) and 3/5 (backward) of copy bandwidth by the minimal byte count if the second read
misses L2. The L2 flags (evict_last / evict_first hints, the second pass from the row's end)
serve part of that second read from L2.
"""

from kernelwright.runtime.launch import LaunchConfig as C

TABLE = {
    "fwd": {
        "default": [
            (256, C(block_n=256, rows=16, num_warps=4)),
            (1024, C(block_n=1024, rows=4, num_warps=4)),
            (4096, C(block_n=4096, rows=1, num_warps=8)),
            (8192, C(block_n=8192, rows=1, num_warps=16)),
            # 16384-32768: the row held in its own dtype (ops/_held.py: half the registers).
            (16384, C(block_n=16384, rows=1, num_warps=16)),
            (32768, C(block_n=32768, rows=1, num_warps=32)),
            # Past 32768: the row split over programs in 16384-wide chunks that share their
            # statistics (one read of the row instead of two), at most 32 chunks (524288).
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
            # 4097-16384: the looped kernel compiled per row length, its second read from L2
            # (faster there than holding dy and y). fp32 values keep the one-row kernel at the
            # 32768 row's warps (softmax.backward_config).
            (8192, C(block_n=4096, rows=1, num_warps=16, evict_hints=True)),
            (16384, C(block_n=8192, rows=1, num_warps=32, evict_hints=True)),
            # 32768: the one-row kernel. The looped one's rows in flight would hold two-thirds
            # of an H200's L2 in dy and y, so its second read would miss more.
            (32768, C(block_n=32768, rows=1, num_warps=16)),
            # Past 32768: split rows as in the forward, 8192-wide chunks (dy and y held as
            # fp32), at most 32 of them, each program prefetching its row's counter line
            # (`split_prefetch`: it pays in the backward, not in the forward); past that the
            # looped kernel.
            (262144, C(block_n=8192, rows=1, num_warps=8, split_row=True, split_prefetch=True)),
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

# Warps of the small kernels that write the values over a split row's exchange words (one
# program per row): their merge reduces at most 32 slots within one warp, as the split
# kernels' merge does at any warp count, so both give the same result; more warps only cost.
WORDS_WARPS = 4
