"""The one-hot form of a per-row index: `F.one_hot(target, C)` folded back into one node.

one_hot traces to `eq(unsqueeze(target, -1), arange(C))` cast to int64. Where PyTorch's
Python decomposition runs (the CPU build here) a range check comes first: `any(target < 0)`
and `any(target >= C)` feeding `_assert_async`; PyTorch's C++ one_hot, which a trace on a GPU
has taken, gives fake tensors the comparison alone. Neither lowers as traced: `arange` is no
tile operation and `any` reduces the whole tensor. `fold` rewrites both forms into one
`aten.one_hot.default(target, C)` node (the int64 cast's node; trace.py renames it one_hot in
both graphs alike, so the forward's saved values and the backward's recomputed ones still
match) and drops the range check's nodes; the check itself is not lost:

- the kernel lowers the node as the mask `cols == target` of its row (emit.py, through
  `lower`), as the gather form of cross-entropy is lowered, and only where the one-hot's
  classes are the row (C equal to the last dim, the row); a row whose index lies outside
  [0, N) gets NaN everywhere, as the library's cross_entropy kernel gives such a row;
- on a GPU the forward kernel flags such an index as it reads it, and one program after the
  launch asserts on the flag (runtime.checks.index_flag / check_index_flag: a device-side
  assert naming the op and the input; rows long enough for the looped kernels are checked
  before them by check_index_range); on the CPU the generated function checks every such
  index input before the launch (check_index_range: a ValueError naming the first bad index);
- the eager reference calls `aten.one_hot` itself, which checks the range in PyTorch.
"""

from __future__ import annotations

import torch

from kernelwright.workflows.create.lowering import _IDENTITY, UnsupportedNode

ONE_HOT = "aten.one_hot.default"
_aten = torch.ops.aten
_ARANGE = (_aten.arange.default, _aten.arange.start, _aten.arange.start_step)
_CASTS = (_aten._to_copy.default, torch.ops.prims.convert_element_type.default)


def _classes(node: torch.fx.Node) -> int | None:
    """C when `node` is arange(0, C) (step 1) of an integer dtype, else None."""
    if node.op != "call_function" or node.target not in _ARANGE:
        return None
    args = list(node.args)
    start, end, step = (0, args[0], 1) if node.target is _aten.arange.default else (
        args[0], args[1], args[2] if len(args) > 2 else node.kwargs.get("step", 1))  # fmt: skip
    val = node.meta.get("val")
    ints = isinstance(val, torch.Tensor) and not val.is_floating_point()
    if start != 0 or step != 1 or not isinstance(end, int) or not ints:
        return None
    return end


def _index(node: torch.fx.Node) -> torch.fx.Node | None:
    """T when `node` is unsqueeze(T, -1) of an integer tensor T, else None."""
    if node.op != "call_function" or node.target is not _aten.unsqueeze.default:
        return None
    src, dim = node.args[0], node.args[1]
    val = src.meta.get("val") if isinstance(src, torch.fx.Node) else None
    if not isinstance(val, torch.Tensor) or val.is_floating_point() or val.dtype == torch.bool:
        return None
    return src if dim in (-1, val.dim()) else None


def _int64_cast(node: torch.fx.Node) -> torch.fx.Node | None:
    """The one user of `node` when it casts it to int64 (one_hot's `.to(torch.long)`)."""
    users = list(node.users)
    if len(users) != 1 or users[0].op != "call_function" or users[0].target not in _CASTS:
        return None
    cast = users[0]
    dtype = cast.kwargs.get("dtype") if cast.target in _CASTS[:1] else cast.args[1]
    return cast if dtype == torch.int64 else None


def _ancestors(node: torch.fx.Node) -> set[torch.fx.Node]:
    seen: set[torch.fx.Node] = set()
    stack = list(node.all_input_nodes)
    while stack:
        n = stack.pop()
        if n not in seen:
            seen.add(n)
            stack.extend(n.all_input_nodes)
    return seen


def fold(gm: torch.fx.GraphModule) -> list[str]:
    """Rewrite every one-hot form of `gm` into an `aten.one_hot.default` node in place and drop
    the range checks of the indices it folded; returns the folded nodes' names."""
    graph = gm.graph
    indices: set[torch.fx.Node] = set()
    folded: list[str] = []
    for eq in list(graph.nodes):
        if eq.op != "call_function" or eq.target is not _aten.eq.Tensor or len(eq.args) != 2:
            continue
        a, b = eq.args
        if not (isinstance(a, torch.fx.Node) and isinstance(b, torch.fx.Node)):
            continue
        if _classes(a) is not None:
            a, b = b, a
        classes, index, cast = _classes(b), _index(a), _int64_cast(eq)
        if classes is None or index is None or cast is None:
            continue
        # the cast's node becomes one_hot(T, C): its shape [..., C] and dtype int64 (its name
        # kept here; trace.py gives it a readable one in both graphs)
        cast.target, cast.args, cast.kwargs = _aten.one_hot.default, (index, classes), {}
        indices.add(index)
        folded.append(cast.name)
    if not indices:
        return []
    for node in list(graph.nodes):
        if (
            node.op == "call_function"
            and node.target is _aten._assert_async.msg
            and str(node.args[1]).startswith("one_hot:")
            and _ancestors(node) & indices
        ):
            graph.erase_node(node)
    graph.eliminate_dead_code()  # the comparisons, aranges and the checks' reductions
    gm.recompile()
    return folded


def names(folded: set[str], taken: set[str]) -> dict[str, str]:
    """A readable name per folded node (one_hot, one_hot_1...) that no other value has; the
    forward's and the backward's copies of a node share its name, and so its new one."""
    out: dict[str, str] = {}
    for old in sorted(folded):
        new, k = "one_hot", 0
        while new in taken:
            k += 1
            new = f"one_hot_{k}"
        taken.add(new)
        out[old] = new
    return out


def index_input(em, n) -> int | None:
    """The position among the inputs of the index a one_hot node reads (through shape ops),
    None when the index is computed."""
    index = n.args[0]
    by = {**em.fwd_by, **em.bwd_by}
    while isinstance(index, str) and index in by and by[index].target in _IDENTITY:
        index = by[index].args[0]
    if index not in em.f_ph:
        return None
    i = em.f_ph.index(index)
    return i if em.p.inputs[i].dtype == "int" else None


def lower(em, n, code: list[str]) -> str:
    """The one-hot tile: 1.0 at the row's index column, 0.0 elsewhere, NaN along a row whose
    index is outside [0, N). The classes must be the row: the last dim, of C columns."""
    classes = n.args[1]
    n_row = em.full[-1] if em.full else 0
    if not em.classic:
        raise UnsupportedNode(
            n.name,
            f"one_hot in a kernel whose row is dims {em.block} of {em.full}: the one-hot's "
            "classes are the last dim, so the row must be the last dim alone",
        )
    if classes != n_row:
        raise UnsupportedNode(
            n.name,
            f"one_hot with {classes} classes against rows of {n_row} columns: the classes "
            "must be the row (num_classes equal to the last dim)",
        )
    if index_input(em, n) is None:
        raise UnsupportedNode(
            n.name,
            "one_hot of a computed index: only an index input is range-checked (once, before "
            "the launch)",
        )
    t = code[0]
    return f'tl.where(({t} >= 0) & ({t} < N), tl.where(cols == {t}, 1.0, 0.0), float("nan"))'


def checks(em) -> list[tuple[int, str, str]]:
    """(position, name, the row length as code) per index input a one_hot reads: what the
    generated function checks before the launch. The row length is the full-size input's last
    dim, the traced one when no input is full size."""
    found = {index_input(em, n) for n in em.fwd + em.bwd if n.target == ONE_HOT}
    full = [s.name for s in em.p.inputs if s.broadcast == "full"]
    n = f"{full[0]}.shape[-1]" if full else repr(em.full[-1])
    return [(i, em.p.inputs[i].name, n) for i in sorted(i for i in found if i is not None)]
