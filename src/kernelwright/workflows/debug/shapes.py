"""Shape regimes in each inputs maker's own convention, and how a failing shape shrinks.

A maker reads its shape one of three ways (its "family"):
- rows: [..., N], the leading dims' product the row count (x, x_weight, gate_up, logits_target,
  jagged, a created op's [rows, cols]);
- hidden: [..., H, V] (hidden_weight_target: tokens, hidden size, vocabulary);
- rope: (B, S, Hq, Hk, D, R) (batch, sequence, q heads, k heads, head dim, rotary dims).

Regimes: pow2 (every size a power of two: the base point), tail (odd sizes, a row that is no
multiple of any block), tiny (rows far shorter than any block; enough of them that a
relative-norm error averages over more than a few roundings), many_rows (long reductions over
rows: dW, dB), long_row (past the launch table's last bounded row and its block: the looped
kernels), huge (the largest input past 2^31 elements, where an offset computed in int32 wraps;
see workflows/debug/huge.py for where it runs and how it is compared). Launch-table rows are
reached at a row length `n` of their regime (`with_n`).
"""

from __future__ import annotations

import math

from kernelwright.runtime.launch import Table, table_rows

MAKER_FAMILIES = {"rope": "rope", "hidden_weight_target": "hidden"}
OPEN = 2**31 - 1
# a long row when there is no table: past the interpreter tables' one-block rows
DEFAULT_LONG_ROW = 1500
TAIL = 37  # added to a bound: an odd length inside the next regime
HUGE = 2**31  # elements: past this, an offset computed in int32 wraps
HUGE_ROW = 4096  # the huge regime's row: one block of the GPU tables, a model's hidden size
# rows of HUGE_ROW whose last 1/16 lie past 2^31 elements: a bug that spoils only those rows
# still moves the relative-norm error past every dtype's tolerance (a few rows would not)
HUGE_ROWS = HUGE // HUGE_ROW + HUGE // HUGE_ROW // 16


def family_of(maker_name: str) -> str:
    return MAKER_FAMILIES.get(maker_name, "rows")


def long_row(table: Table | None, arch_of, fallback: int = DEFAULT_LONG_ROW) -> int:
    """A row length past the table's last bounded row and past its last row's block (so the
    row is walked in chunks); `arch_of(kernel)` is the table key in force for a kernel."""
    if not table:
        return fallback
    longest = 0
    for kernel in table:
        rows = table_rows(table, kernel, arch_of(kernel))
        bounds = [m for m, _ in rows if m < OPEN]
        longest = max(longest, *bounds, rows[-1][1].block_n)
    return longest + TAIL


def regime_shapes(family: str, long_n: int) -> dict[str, list[int]]:
    if family == "hidden":
        shapes = {
            "pow2": (4, 8, 32, 64),  # 32 tokens: a mean loss over fewer is one rounding
            "tail": (3, 5, 33, 37),
            "tiny": (16, 3, 5),
            "many_rows": (256, 8, 16),
            "long_row": (2, 32, long_n),
            # hidden [T, H] and its gradient past 2^31 elements: the op walks the [T, V]
            # logits in chunks of bounded size (they never exist whole), so the offsets that
            # grow are those of hidden; a small V keeps the fp32 reference's logits small
            "huge": (HUGE_ROWS, HUGE_ROW, 256),
        }
    elif family == "rope":
        shapes = {
            "pow2": (1, 8, 4, 2, 32, 32),
            "tail": (1, 7, 6, 2, 38, 22),
            "tiny": (1, 4, 2, 1, 2, 2),
            "many_rows": (2, 16, 2, 1, 16, 16),
            "long_row": (1, 3, 8, 2, 256, 256),
            # q [B, Hq, S, D] past 2^31 elements through its batch dim (offsets b * stride)
            "huge": (HUGE_ROWS // 64, 64, 32, 8, 128, 128),
        }
    else:
        shapes = {
            "pow2": (2, 4, 64),
            "tail": (3, 5, 37),
            "tiny": (16, 3),
            "many_rows": (256, 16),
            "long_row": (2, long_n),
            "huge": (HUGE_ROWS, HUGE_ROW),
        }
    return {k: list(v) for k, v in shapes.items()}


def row_len(family: str, shape) -> int:
    """The length the launch tables are keyed by."""
    if family == "rope":
        _, _, hq, hk, d, _ = shape
        return (hq + hk) * d
    return int(shape[-1])


def with_n(family: str, n: int) -> tuple[int, ...] | None:
    """A small shape whose row length is `n` (None: the family's tables are not keyed so)."""
    if family == "rows":
        return (3, n)
    if family == "hidden":
        return (3, 32, n)
    return None


def config_shape(family: str, shapes: dict[str, list[int]]) -> tuple[int, ...]:
    """Where every forced launch config runs: a few rows (fewer than a multi-row program
    holds) of an odd length that one config holds in a block and another walks in chunks."""
    if family == "rows":
        return (3, 300)
    if family == "hidden":
        return (3, 32, 300)
    return tuple(shapes["pow2"])


def valid(family: str, shape) -> tuple[int, ...] | None:
    """`shape` made valid for the family (rope: even head and rotary dims, R <= D, Hq a
    multiple of Hk), or None."""
    shape = tuple(max(1, int(s)) for s in shape)
    if family != "rope":
        return shape
    b, s, hq, hk, d, r = shape
    d = max(2, d - d % 2)
    r = max(2, min(r - r % 2, d))
    hk = math.gcd(hq, hk)
    return (b, s, hq, hk, d, r)


def halvings(family: str, shape) -> list[tuple[int, ...]]:
    """The shapes one halving away from `shape`: each dim in turn, the row length first."""
    shape = tuple(shape)
    order = list(range(len(shape)))[::-1]
    if family == "rope":  # head dim first, then rotary dims, heads, sequence, batch
        order = [4, 5, 2, 3, 1, 0]
    out = []
    for i in order:
        if shape[i] <= 1:
            continue
        smaller = valid(family, shape[:i] + (shape[i] // 2,) + shape[i + 1 :])
        if smaller is not None and smaller != shape and smaller not in out:
            out.append(smaller)
    return out
