"""Rows held in registers in their own dtype (softmax's and cross_entropy's one-row kernels).

A one-row kernel that converts the loaded row to fp32 at once keeps 4 bytes per value in
registers: a bf16 row of 32768 fills half an SM's register file (one program per SM, nothing
else loading while it reduces) and 65536 spills. Held as bf16/fp16 the row costs half that;
each pass over it converts it to fp32 afresh. `again` makes those conversions depend on the
previous reduction's result, so the compiler cannot merge them into one fp32 copy that stays
live across the reduction (which would undo the saving).
"""

from __future__ import annotations

import triton
import triton.language as tl

# Rows of at least this many columns are held in their own dtype; narrower ones as fp32, which
# leaves room for enough programs per SM and skips the extra conversions.
HOLD_FROM = tl.constexpr(16384)

# The most bytes of one row a one-row kernel holds: 65536 bf16/fp16 values, or 32768 fp32 ones
# (half of an SM's 256 KB register file). Wider rows of a wider dtype take the looped kernel.
MAX_HELD_ROW_BYTES = 128 * 1024


@triton.jit
def again(x, s, HOLD: tl.constexpr):
    """x, for another pass over a row held in registers. With HOLD: x + |0 * s|, the same
    values (a NaN where s is NaN, when what follows is NaN anyway) but computable only once s
    is known. The add stays in the row's dtype, on packed pairs; |0 * s| is +0, whose bits the
    interpreter's 16-bit arithmetic also leaves alone (adding -0 there flips the sign bit); an
    integer add on the bits would unpack the pairs. Without HOLD: x itself (its conversions
    merge into one fp32 copy)."""
    if HOLD:
        return x + tl.abs(s * 0.0).to(x.dtype)
    else:
        return x


def held_row_fits(n: int, element_size: int) -> bool:
    """Whether a one-row kernel may hold a row of `n` values of `element_size` bytes."""
    return n * element_size <= MAX_HELD_ROW_BYTES
