"""The pick form of a row kernel's forward: a gather of one value per row by a per-row target
index, when nothing else in the forward needs the row, reads that one element only.

The row kernel lowers a gather as a masked sum over the row (emit.py), which reads all N
columns to produce one value. When the gather is the forward's only work along the row (no
other reduction or scan, every output one value per row, nothing stored) and its index is an
input (through shape ops), the forward instead loads each row's index, then every input at
that column (pointer arithmetic with the [M, N] views' row and column strides), and evaluates
the element-wise work there: [ROWS, 1] tiles, whatever N (templates/pick.py.j2). An index
outside [0, N) reads nothing and picks 0, as the masked row sum does. The backward (a scatter
into a zero row, written at full size) keeps the row kernel.
"""

from __future__ import annotations

from kernelwright.workflows.create.lowering import _IDENTITY, _output_args

_GATHER = "aten.gather.default"


def plan(em, out_kinds: list[str], keeps: bool) -> tuple[int, list[str]] | None:
    """(the position of the gather's index among the inputs, the forward's lines on [ROWS, 1]
    tiles of the picked elements) when the forward takes the pick form, else None (the row
    kernel as usual). `keeps`: the forward's looped launch keeps row values for the backward's."""
    p = em.p
    if not em.row or not em.trailing or p.stored or keeps or "full" in out_kinds:
        return None
    nodes = [n for n in em.fwd_needed(_output_args(em.fwd)[: len(p.outputs)])
             if n.op == "call_function"]  # fmt: skip
    # the work along the row: reductions and scans (a gather is one), scatters, flips
    along = [n for n in nodes if em.reduce_kind(n) is not None
             or n.target.startswith(("aten.scatter", "aten.flip"))]  # fmt: skip
    if len(along) != 1 or along[0].target != _GATHER:
        return None
    g = along[0]
    if not em.row_dims(g.args[1]) or list(g.shape or []) != em.row_shape(True):
        return None
    index = g.args[2]  # through shape ops (the unsqueeze of a [...] index) to an input
    while isinstance(index, str) and index in em.fwd_by and em.fwd_by[index].target in _IDENTITY:
        index = em.fwd_by[index].args[0]
    if index not in em.f_ph:
        return None
    i = em.f_ph.index(index)
    spec = p.inputs[i]
    if spec.dtype != "int" or spec.broadcast != "row":
        return None
    em.picked = True  # the gather: the value at the picked column
    try:
        body, _ = em.forward_body()
    finally:
        em.picked = False
    # element-wise work only: nothing may refer to the row's columns
    return None if "cmask" in "\n".join(body) else (i, body)
