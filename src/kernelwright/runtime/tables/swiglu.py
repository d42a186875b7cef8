"""Launch configs for swiglu. Rewritten by the optimize workflow; kernels read, never choose.

Both kernels ("fwd" and "bwd", the gated family's in ops/_gated.py) are elementwise over an
[M, N] view: one program per (row block of `rows`, column tile of `block_n`), so any row length
is covered and a row never has to fit in registers. Dense inputs are re-viewed as
[M*N / block_n, block_n] (full tiles). `max_n` picks the tile for a row-length regime: short
rows take several rows per program so each program still moves enough bytes to hide memory
latency. The fused form (x = [gate | up]) looks up the table with N = half of x's last dimension.
"""

from kernelwright.runtime.launch import LaunchConfig as C

_LAST = 2**31 - 1

TABLE = {
    # Forward reads gate and up, writes c: 3 tensors. At least 16 bytes per thread per row for
    # bf16 (block_n / (32 * num_warps) >= 8 elements) gives full-width vector loads.
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
    # Backward reads gate, up and dc, writes da and db: 5 tensors.
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
