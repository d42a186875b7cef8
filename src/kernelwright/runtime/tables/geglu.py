"""Launch configs for geglu. Rewritten by the optimize workflow; kernels read, never choose.

Both kernels ("fwd" and "bwd", the gated family's in ops/_gated.py) are elementwise over an
[M, N] view, laid out as swiglu's: one program per (row block of `rows`, column tile of
`block_n`), dense inputs re-viewed as [M*N / block_n, block_n] (full tiles). The fused form
(x = [gate | up]) looks up the table with N = half of x's last dimension. Both gelu forms
(tanh, erf) share the table.
"""

from kernelwright.runtime.launch import LaunchConfig as C

_LAST = 2**31 - 1

TABLE = {
    # swiglu's rows: the same memory traffic (3 tensors forward, 5 backward), and the extra
    # gelu arithmetic still leaves the kernels memory-bound.
    "fwd": {
        "default": [
            (256, C(block_n=256, rows=8, num_warps=4)),
            (1024, C(block_n=1024, rows=2, num_warps=4)),
            (2048, C(block_n=2048, rows=1, num_warps=4)),
            (_LAST, C(block_n=4096, rows=1, num_warps=8)),
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
