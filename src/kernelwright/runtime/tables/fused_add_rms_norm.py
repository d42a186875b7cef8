"""Launch configs for fused_add_rms_norm. Rewritten by the optimize workflow; kernels read only.

Same keys and meaning as rms_norm's table: "fwd" and "bwd"; a row fits one program when
`block_n >= n` (the row stays in registers), otherwise the looped kernels walk the row in
`block_n` chunks; `rows` rows per program step; the backward is persistent with
`programs_per_sm` programs per SM, each keeping its own fp32 partial sum of dW;
`num_stages=2`: the backward loads the next row block before this one's math (prefetch);
larger values act as 2 (one block ahead).
"""

from kernelwright.runtime.launch import LaunchConfig as C

# "default" rows for 2048..16384: swept with benchmarks/tune.py on an H200 (bf16, 2026-11-22;
# benchmarks/results/tune_fused_add_rms_norm_layer_norm_h200.csv). The rest are rms_norm's.
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
        # 2048..8192: num_stages=2 prefetches the next row block (+1-10% on the H200,
        # benchmarks/results/h200-issue3-normbwd/); at 16384 it spills registers (0.45-0.7x).
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
