"""The pick form of a row kernel's forward: a gather of one value per row by a per-row target
index, when nothing else in the forward needs the row, reads that one element only.

The row kernel lowers a gather as a masked sum over the row (emit.py), which reads all N
columns to produce one value. When the gather is the forward's only work along the row (no
other reduction or scan, every output one value per row, nothing stored) and its index is an
input (through shape ops), or element-wise work on that input alone (take_along_dim's wrap of a
negative index, a remainder by the row length), the forward instead loads each row's index,
computes the column from it, then loads every input at that column (pointer arithmetic with the
[M, N] views' row and column strides), and evaluates the element-wise work there: [ROWS, 1]
tiles, whatever N (templates/pick.py.j2). An index outside [0, N) reads nothing and picks 0, as
the masked row sum does. The backward (a scatter into a zero row, written at full size) keeps
the row kernel.
"""

from __future__ import annotations

from kernelwright.workflows.create.lowering import _IDENTITY, UnsupportedNode, _output_args, _refs

_GATHER = "aten.gather.default"


def plan(em, out_kinds: list[str], keeps: bool) -> tuple[int, list[str], list[str], str] | None:
    """(the position of the gather's index among the inputs, the forward's lines on [ROWS, 1]
    tiles of the picked elements, the lines computing the column from the index input's tile,
    the column's variable) when the forward takes the pick form, else None (the row kernel as
    usual). `keeps`: the forward's looped launch keeps row values for the backward's."""
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
    found = index_input(em, g.args[2])
    if found is None:
        return None
    i, chain, column = found
    em.picked = True  # the gather: the value at the picked column
    try:
        body, _ = em.forward_body()
    finally:
        em.picked = False
    # element-wise work only: nothing may refer to the row's columns
    if "cmask" in "\n".join(body + chain):
        return None
    return i, body, chain, column


def index_input(em, column: str) -> tuple[int, list[str], str] | None:
    """(the index input's position, the lines computing the column from it, the column's var or
    "" for the input itself) for a gather's index `column` that is a per-row int input, through
    shape ops (the unsqueeze of a [...] index) or element-wise work on that input alone; else
    None."""
    index = column
    while isinstance(index, str) and index in em.fwd_by and em.fwd_by[index].target in _IDENTITY:
        index = em.fwd_by[index].args[0]
    chain: list[str] = []
    if index not in em.f_ph:  # element-wise work on one per-row index input: the column's code
        index, chain = _index_chain(em, column)
        if index is None:
            return None
    i = em.f_ph.index(index)
    spec = em.p.inputs[i]
    if spec.dtype != "int" or spec.broadcast != "row":
        return None
    return i, chain, ("f_" + column) if chain else ""


def _index_chain(em, column: str) -> tuple[str | None, list[str]]:
    """(the one input `column` is computed from, the lines computing it as f_<node>) when it is
    element-wise work on that input and constants alone (no reduction along the row, no other
    input), else (None, [])."""
    nodes = [n for n in em.fwd_needed([column]) if n.op == "call_function"]
    if not nodes or any(em.reduce_kind(n) is not None or n.target.startswith(
            ("aten.scatter", "aten.flip", "aten.gather")) for n in nodes):  # fmt: skip
        return None, []
    names = {n.name for n in nodes}
    known = set(em.fwd_by)  # the forward's nodes, its placeholders (the inputs) among them
    leaves = {a for n in nodes for a in _refs(list(n.args) + list(n.kwargs.values()), known)
              if a not in names}  # fmt: skip
    if len(leaves) != 1 or next(iter(leaves)) not in em.f_ph:  # one input, nothing else
        return None, []
    index = next(iter(leaves))
    try:
        lines = em.emit(nodes, "f_", {index: "f_" + index})
    except UnsupportedNode:  # a node with no tile lowering: the row kernel as usual
        return None, []
    if any("cols" in line or "cmask" in line for line in lines):  # it varies along the row
        return None, []
    return index, lines
