# v2 (fewer_warps): TABLE[kernel]['hopper'] per kernel
# bwd
"hopper": [
    (256, C(block_n=256, rows=16, num_warps=4, programs_per_sm=8)),
    (1024, C(block_n=1024, rows=4, num_warps=4, programs_per_sm=8)),
    (2048, C(block_n=2048, rows=2, num_warps=4, num_stages=2, programs_per_sm=2)),
    (4096, C(block_n=4096, rows=2, num_warps=8, num_stages=2)),
    (8192, C(block_n=8192, num_warps=8, num_stages=2)),
    (16384, C(block_n=16384, num_warps=8)),
    (32768, C(block_n=32768, num_warps=32)),
    (2**31 - 1, C(block_n=4096, num_warps=16)),
],
