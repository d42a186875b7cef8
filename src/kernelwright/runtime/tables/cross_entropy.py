"""Launch configs for cross_entropy (and the chunks of fused_linear_cross_entropy).

"fwd": one program per row. A row that fits one block (`block_n >= V`) stays in registers
between the statistics and the gradient (from 16384 columns in the logits' own dtype; fp32
logits past 32768 classes take the looped row instead); longer rows are walked in `block_n`
chunks twice (an online max/sum pass, then the gradient pass, which re-reads the row, mostly
from L2).
"scale": the backward's in-place multiply by the incoming gradient, one program per row,
skipped when that gradient is 1.
"""

from kernelwright.runtime.launch import LaunchConfig as C

# "default": swept on an H200 (bf16, 8192 rows, forward with the gradient, 2026-11-22,
# benchmarks/loss_probe.py): 2048 columns x 8 warps was fastest at V = 32000, 128256 and 262144
# (1.57 ms at 128256 vs 1.8+ for 8192-16384 columns; the one-block form, holding the row as
# fp32 then, was 5% slower at 32000).
# Small blocks keep more rows in flight per SM, and part of the second read of each row hits
# L2 - more with the L2 flags (evict_last / evict_first hints, the gradient pass from the row's
# end; benchmarks/tune.py l2_hints, H200, results/tune_l2_hints_h200.csv): 0.421 -> 0.377 ms at
# V = 32000 (-11%), 1.595 -> 1.480 at 128256 (-7%), 3.235 -> 3.062 at 262144 (-5%).
TABLE = {
    "fwd": {
        "default": [
            (2048, C(block_n=2048, num_warps=8)),
            (15360, C(block_n=2048, num_warps=8, evict_hints=True, reverse_pass=True)),
            # One block, the row held in its own dtype (ops/_held.py), only where the vocabulary
            # fills most of the block: its time goes with the block, not V (tune.py
            # cross_entropy_hold, H200, 8192 rows, results/tune_cross_entropy_hold_h200.csv):
            # 16384 0.198 -> 0.167 ms; 32000 0.376 -> 0.334, 32768 0.377 -> 0.335. At 65536 the
            # looped form stayed ahead (0.741 against 0.798), so from there it is the only one.
            (16384, C(block_n=16384, num_warps=16)),
            (30720, C(block_n=2048, num_warps=8, evict_hints=True, reverse_pass=True)),
            (32768, C(block_n=32768, num_warps=32)),
            (2**31 - 1, C(block_n=2048, num_warps=8, evict_hints=True, reverse_pass=True)),
        ],
        "interpreter": [(2**31 - 1, C(block_n=4096, evict_hints=True, reverse_pass=True))],
    },
    "scale": {
        "default": [(2**31 - 1, C(block_n=4096, num_warps=8))],
        "interpreter": [(2**31 - 1, C(block_n=4096))],
    },
}
