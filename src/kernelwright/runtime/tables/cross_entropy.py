"""Launch configs for cross_entropy (and the chunks of fused_linear_cross_entropy).

"fwd": one program per row. A row that fits one block (`block_n >= V`) stays in registers
between the statistics and the gradient; longer rows are walked in `block_n` chunks twice (an
online max/sum pass, then the gradient pass, which re-reads the row, mostly from L2).
"scale": the backward's in-place multiply by the incoming gradient, one program per row,
skipped when that gradient is 1.
"""

from kernelwright.runtime.launch import LaunchConfig as C

TABLE = {
    "fwd": {
        "default": [
            (4096, C(block_n=4096, num_warps=8)),
            (16384, C(block_n=16384, num_warps=16)),
            (32768, C(block_n=32768, num_warps=32)),
            (2**31 - 1, C(block_n=8192, num_warps=16)),
        ],
        "interpreter": [(2**31 - 1, C(block_n=4096))],
    },
    "scale": {
        "default": [(2**31 - 1, C(block_n=8192, num_warps=16))],
        "interpreter": [(2**31 - 1, C(block_n=4096))],
    },
}
