"""Launch configs for relu_squared. Rewritten by the optimize workflow; kernels read, never choose.

Both kernels ("fwd" and "bwd", the gated family's in ops/_gated.py with no up operand) are
elementwise over an [M, N] view, laid out as swiglu's: one program per (row block of `rows`,
column tile of `block_n`), dense inputs re-viewed as [M*N / block_n, block_n] (full tiles,
which is every contiguous input whose size allows it).
"""

from kernelwright.runtime.launch import LaunchConfig as C

_LAST = 2**31 - 1

TABLE = {
    "fwd": {
        "default": [
            (256, C(block_n=256, rows=8, num_warps=4)),
            (1024, C(block_n=1024, rows=2, num_warps=4)),
            (2048, C(block_n=2048, rows=1, num_warps=4)),
            # the forward moves 2 tensors, not swiglu's 3: 1024-wide tiles of 4 warps suffice
            (_LAST, C(block_n=1024, rows=1, num_warps=4)),
        ],
        # Under the interpreter every program instance costs milliseconds: few, wide programs.
        "interpreter": [
            (_LAST, C(block_n=512, rows=16)),
        ],
    },
    "bwd": {
        "default": [
            (256, C(block_n=256, rows=8, num_warps=4)),
            (1024, C(block_n=1024, rows=2, num_warps=4)),
            (2048, C(block_n=2048, rows=2, num_warps=8)),
            (_LAST, C(block_n=4096, rows=1, num_warps=8)),
        ],
        "interpreter": [
            (_LAST, C(block_n=512, rows=16)),
        ],
    },
}
