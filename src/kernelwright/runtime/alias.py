"""Aliasing tests for in-place backward passes: may a kernel write through these views?"""

from __future__ import annotations

import torch


def storage_ptr(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def writes_through(t: torch.Tensor, t2: torch.Tensor) -> bool:
    # Writing the [M, N] view t2 writes each element of t exactly once: rows_view made no copy
    # (a copy lives elsewhere) and rows do not overlap (no stride-0 / expanded rows).
    return t2.data_ptr() == t.data_ptr() and (t2.shape[0] <= 1 or t2.stride(0) >= t2.shape[1])


def disjoint(a: torch.Tensor, b: torch.Tensor) -> bool:
    # Whether two [M, N] row-strided views share no element (conservative: False if unsure).
    if storage_ptr(a) != storage_ptr(b):
        return True
    size = a.element_size()
    span_a = ((a.shape[0] - 1) * a.stride(0) + a.shape[1]) * size
    span_b = ((b.shape[0] - 1) * b.stride(0) + b.shape[1]) * size
    if a.data_ptr() + span_a <= b.data_ptr() or b.data_ptr() + span_b <= a.data_ptr():
        return True
    # Interleaved rows of one buffer, as `gate, up = x.chunk(2, -1)`: same row stride s, and
    # b's column offset within a row leaves room for both N-wide rows.
    s, n = a.stride(0), a.shape[1]
    if b.stride(0) != s or s == 0:
        return False
    offset = (abs(b.data_ptr() - a.data_ptr()) // size) % s
    return n <= offset <= s - n
