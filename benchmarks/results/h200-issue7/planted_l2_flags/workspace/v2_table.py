# v2 (fewer_warps): TABLE[kernel]['hopper'] per kernel
# fwd
"hopper": [
    (256, C(block_n=256, rows=16, num_warps=4)),
    (1024, C(block_n=1024, rows=4, num_warps=4)),
    (4096, C(block_n=4096, num_warps=8)),
    (8192, C(block_n=8192, num_warps=16)),
    (16384, C(block_n=16384, num_warps=32)),
    (32768, C(block_n=32768, num_warps=16)),
    (65536, C(block_n=65536, num_warps=16)),
    (2**31 - 1, C(block_n=4096, num_warps=8, evict_hints=True, reverse_pass=True)),
],
# bwd
"hopper": [
    (256, C(block_n=256, rows=16, num_warps=4)),
    (1024, C(block_n=1024, rows=4, num_warps=4)),
    (4096, C(block_n=4096, num_warps=4)),
    (8192, C(block_n=8192, num_warps=16)),
    (16384, C(block_n=16384, num_warps=4)),
    (32768, C(block_n=32768, num_warps=16)),
    (2**31 - 1, C(block_n=16384, num_warps=16, evict_hints=True, reverse_pass=True)),
],
