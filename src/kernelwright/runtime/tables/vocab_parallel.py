"""Launch configs for the vocabulary-parallel losses (distributed/_vp_kernels.py).

"stats": one program per row, the rank's slice walked once in `block_n` chunks (an online
max and rescaled sum). "grad": an elementwise pass, one program per `block_n` columns of a row
(the row's statistics are known by then); `reverse_pass` walks the programs from the last
row, so the first blocks read are the ones the stats pass read last (the likeliest still in L2).
"rescale": the per-row rescale of the local sums to the row max over ranks.

The "default" rows are starting points (the looped cross_entropy kernel's block for the
stats, a 4096-wide elementwise block for the gradient), not a sweep. The interpreter's
rows are one block for the tiny CPU tests' slices (the interpreter runs each program instance
in Python); tests/test_vocab_parallel.py passes small blocks to cover rows of several blocks.
"""

from kernelwright.runtime.launch import LaunchConfig as C

TABLE = {
    "stats": {
        "default": [(2**31 - 1, C(block_n=2048, num_warps=8))],
        "interpreter": [(2**31 - 1, C(block_n=64))],
    },
    "rescale": {  # [rows] scalars between the two all-reduces
        "default": [(2**31 - 1, C(block_n=1024, num_warps=4))],
        "interpreter": [(2**31 - 1, C(block_n=1024))],
    },
    "grad": {
        "default": [(2**31 - 1, C(block_n=4096, num_warps=8, reverse_pass=True))],
        "interpreter": [(2**31 - 1, C(block_n=64, reverse_pass=True))],
    },
}
