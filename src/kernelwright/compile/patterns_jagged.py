"""Jagged mean in the graph, as users spell it:

    torch.segment_reduce(data, "mean", lengths= | offsets=)
    torch.zeros(B, D).index_add_(0, ids, x) / counts[:, None]          (index_add of ones,
    torch.zeros(B, D).scatter_add_(0, ids[:, None].expand(-1, D), x) / counts    bincount, ...)
    torch.zeros(B, D).scatter_reduce_(0, ids[:, None].expand(-1, D), x, "mean",
                                      include_self=False)                  (and index_reduce_)

(A Python loop over segments never reaches a graph whole: compile/loops.py rewrites it first.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.fx import Node
from torch.fx.experimental.symbolic_shapes import statically_known_true

from kernelwright.compile.patterns import Match, arg, kind, value

# --------------------------------------------------------------------------- jagged mean


def segment_mean(data: torch.Tensor, lengths=None, offsets=None) -> torch.Tensor:
    """`torch.segment_reduce(data, "mean", lengths= | offsets=, axis=0)` through jagged_mean:
    NaN for an empty segment, as eager gives; lengths that do not sum to the rows of `data` are
    a device-side assert, as eager's error."""
    from kernelwright.ops.jagged_mean import jagged_mean

    if offsets is None:
        zero = torch.zeros(1, dtype=torch.int64, device=lengths.device)
        offsets = torch.cat([zero, torch.cumsum(lengths, 0)])
    offsets = offsets.to(torch.int64)
    total = data.shape[0]
    torch._assert_async(
        (offsets[0] == 0) & (offsets[-1] == total),
        "segment_reduce: lengths must sum to the rows of data",
    )
    out = jagged_mean(data.reshape(total, -1), offsets, validate=False)
    empty = (offsets[1:] == offsets[:-1]).unsqueeze(-1)
    out = torch.where(empty, torch.full_like(out, float("nan")), out)
    return out.view(offsets.shape[0] - 1, *data.shape[1:])


def match_segment_mean(node: Node) -> Match | None:
    """`torch.segment_reduce(data, "mean", lengths=L)` (or `offsets=O`) along axis 0."""
    if kind(node) != "segment_reduce":
        return None
    data, reduce = arg(node, 0, "data"), arg(node, 1, "reduce")
    lengths, offsets = arg(node, 2, "lengths"), node.kwargs.get("offsets")
    bounds = lengths if lengths is not None else offsets
    if reduce != "mean" or not isinstance(data, Node) or not isinstance(bounds, Node):
        return None
    problem = None
    extra = set(node.kwargs) - {"lengths", "offsets", "axis", "unsafe"}
    if len(node.args) > 2 or extra or node.kwargs.get("initial") is not None:
        problem = "indices=, initial= or arguments past lengths/offsets"
    elif node.kwargs.get("axis", 0) != 0:
        problem = "axis is not 0"
    elif lengths is not None and offsets is not None:
        problem = "both lengths and offsets"
    bv = value(bounds)
    if problem is None and (
        bv is None or bv.dim() != 1 or bv.dtype not in (torch.int64, torch.int32)
    ):
        problem = "lengths/offsets are not a 1-D integer tensor (a batched segment_reduce)"
    kwargs = {"lengths": lengths} if lengths is not None else {"offsets": offsets}
    return Match(
        "segment_reduce(data, 'mean')", "jagged_mean", segment_mean, (data,), kwargs, [node],
        {"data": data}, problem,
    )  # fmt: skip


# --------------------------------------------------------------------------- index_add / scatter
# Rows x [N, ...] with one segment id per row, ids [N], B segments:
#     torch.zeros(B, D).index_add_(0, ids, x) / counts[:, None]
#     torch.zeros(B, D).scatter_add_(0, ids[:, None].expand(-1, D), x) / counts
#     torch.zeros(B, D).scatter_reduce_(0, ids[:, None].expand(-1, D), x, "mean",
#                                       include_self=False)             (and index_reduce_)
# The ids need not be sorted: the replacement sorts the rows by id (`index_mean`).


class _PermuteRows(torch.autograd.Function):
    """x[order] for a permutation `order`; the backward puts each gradient row back where its
    row came from (a gather and a scatter, neither accumulating)."""

    @staticmethod
    def forward(ctx, x, order):
        ctx.save_for_backward(order)
        return x.index_select(0, order)

    @staticmethod
    def backward(ctx, grad):
        (order,) = ctx.saved_tensors
        return torch.empty_like(grad).index_copy_(0, order, grad), None


def index_mean(values, ids, segments, divisor=None, empty: float = 0.0) -> torch.Tensor:
    """`torch.zeros(segments, ...).index_add_(0, ids, values)` divided by `divisor`, through
    jagged_mean: the rows sorted by id (a stable sort: each segment's rows keep their order),
    the offsets read from the sorted ids, one launch.

    divisor: a tensor of one number per segment, divided as eager divides (its dtype, its
    zeros); the sums are the segment means times the segment sizes. None: the ids' own counts
    (the pattern counted them), so the result is the mean itself, `empty` (0, or NaN for an
    unclamped 0 / 0) for an id no row has. An id outside [0, segments) is a device-side
    assert, where eager raises an index error."""
    from kernelwright.ops.jagged_mean import jagged_mean

    total, features = values.shape[0], values.shape[1:]
    keys, order = torch.sort(ids.to(torch.int64), stable=True)
    bounds = torch.searchsorted(keys, torch.arange(segments + 1, device=keys.device))
    inside = (bounds[0] == 0) & (bounds[-1] == total)
    torch._assert_async(inside, "index_add / scatter_add: an index is out of range")
    rows = _PermuteRows.apply(values.reshape(total, math.prod(features)), order)
    mean = jagged_mean(rows, bounds, validate=False)
    sizes = (bounds[1:] - bounds[:-1]).unsqueeze(1)
    if divisor is not None:
        sums = (mean.float() * sizes).to(mean.dtype)
        return sums.view(segments, *features) / divisor
    if empty != 0:
        mean = torch.where(sizes == 0, torch.full_like(mean, empty), mean)
    return mean.view(segments, *features)


def index_mean_in_place(values, ids, segments) -> tuple[torch.Tensor]:
    """`index_mean` as the one result of a site whose output is a mutated tensor."""
    return (index_mean(values, ids, segments),)


_ACCUMULATE = ("index_add", "scatter_add", "scatter_reduce", "index_reduce")  # + "_": in place
_ZEROS = ("zeros", "new_zeros", "zeros_like")
_COLUMN = ("unsqueeze", "view", "reshape", "getitem")
_BROADCAST = ("expand", "expand_as", "broadcast_to", "repeat")
_CASTS = ("to", "float", "double", "type_as")
# dtypes that hold a count exactly (below 2**24 rows for float32)
_EXACT = (torch.int32, torch.int64, torch.float32, torch.float64)


def _same(a, b) -> bool:
    """Sizes (or shapes) equal for every value of their symbols."""
    if isinstance(a, (tuple, list)) or isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(statically_known_true(a == b))


def _shape(node) -> tuple | None:
    v = value(node)
    return tuple(v.shape) if isinstance(v, torch.Tensor) else None


def _column_of(node) -> Node | None:
    """v when `node` is a 1-D v [n] as a column [n, 1] (`v[:, None]`, `v.unsqueeze(1)`,
    `v.view(-1, 1)`, ...) or the other way round."""
    if kind(node) not in _COLUMN or not node.args or not isinstance(node.args[0], Node):
        return None
    v = node.args[0]
    vs, ns = _shape(v) or (), _shape(node) or ()
    column, flat = (ns, vs) if len(ns) == 2 else (vs, ns)
    if len(column) != 2 or len(flat) != 1 or not _same(column, (flat[0], 1)):
        return None
    if kind(node) == "getitem":
        index = node.args[1] if isinstance(node.args[1], tuple) else (node.args[1],)
        if not all(i is None or i is Ellipsis or i == slice(None) for i in index):
            return None
    return v


def _ids_of(index, rows: tuple) -> tuple[Node | None, list[Node]]:
    """(ids [N], the nodes between) when a scatter's `index` gives row i the id ids[i] in every
    column: `ids[:, None].expand(-1, D)`, `ids.view(-1, 1).expand_as(x)`, ... (ids itself for
    1-D rows); (None, []) otherwise. `rows` is the shape of the scattered rows."""
    shape = _shape(index)
    if shape is None or not _same(shape, rows) or len(rows) > 2:
        return None, []
    if len(rows) == 1:
        return index, []
    nodes = []
    if kind(index) in _BROADCAST and isinstance(index.args[0], Node):
        nodes.append(index)
        index = index.args[0]
        if not _same(_shape(index) or (), (rows[0], 1)):
            return None, []
    ids = _column_of(index)
    return (ids, [*nodes, index]) if ids is not None else (None, [])


@dataclass
class _Accumulation:
    """`zeros.<op>(dim, index, source, ...)`, in place or not: the sums (or means) of the
    source rows by id."""

    op: str  # "index_add", "scatter_add", "scatter_reduce" or "index_reduce"
    zeros: Node
    mut: Node  # the call
    ids: Node | None  # one id per row [N]; None: the index is something else
    source: Node
    prep: list[Node]  # the nodes making the index from ids
    in_place: bool
    problem: str | None


def _accumulation(node, reader: Node | None = None, reading_rows=True) -> _Accumulation | None:
    """The accumulation whose result `node` is, read by `reader`: the call itself, or (for
    `s = zeros(...); s.index_add_(...); ... s ...`) the zeros it mutated before `reader`.
    `reading_rows`: the source is rows for the kernel (False: ones, counted)."""
    if kind(node) in _ZEROS and reader is not None:
        muts = [u for u in node.users if kind(u) in [f"{op}_" for op in _ACCUMULATE]]
        if len(muts) != 1 or muts[0].args[0] is not node or not _before(muts[0], reader):
            return None
        node = muts[0]
    k = kind(node) or ""
    op = k.removesuffix("_")
    if op not in _ACCUMULATE or len(node.args) < 2 or kind(node.args[0]) not in _ZEROS:
        return None
    zeros, dim = node.args[0], arg(node, 1, "dim")
    index, source = arg(node, 2, "index"), arg(node, 3, "source", node.kwargs.get("src"))
    zs, xs = _shape(zeros), _shape(source)
    if xs is None or zs is None or not isinstance(index, Node) or len(zs) != len(xs):
        return None
    if value(zeros).dtype != value(source).dtype or not _same(zs[1:], xs[1:]):
        return None
    if op.startswith("index"):
        ids, prep = (index if _same(_shape(index) or (), xs[:1]) else None), []
    else:
        ids, prep = _ids_of(index, xs)
    problem = None
    if reading_rows and len(xs) != 2:
        problem = f"x is {len(xs)}-D: the kernel pools the rows of a [N, D] tensor"
    elif dim not in (0, -len(xs)):
        problem = f"dim={dim!r} is not 0"
    elif ids is None:
        problem = "the index is not one id per row, repeated along the columns"
    elif value(ids).dtype not in (torch.int64, torch.int32):
        problem = "the index is not an integer tensor"
    elif op == "index_add" and node.kwargs.get("alpha", 1) != 1:
        problem = "alpha= scales the sums"
    return _Accumulation(op, zeros, node, ids, source, prep, k.endswith("_"), problem)


def _before(a: Node, b: Node) -> bool:
    """`a` comes before `b` in their graph."""
    n = a.next
    while n.op != "root":
        if n is b:
            return True
        n = n.next
    return False


def _segments(zeros: Node):
    """The number of rows of `zeros` as the graph has it: an int, or the node of its symbol;
    None when neither."""
    b = value(zeros).shape[0]
    if isinstance(b, int):
        return b
    k = kind(zeros)
    size = zeros.args[1:] if k == "new_zeros" else zeros.args if k == "zeros" else ()
    size = size or zeros.kwargs.get("size") or ()
    if len(size) == 1 and isinstance(size[0], (tuple, list)):
        size = size[0]
    return size[0] if size and isinstance(size[0], Node) else None


def _is_ones(node, shape: tuple) -> bool:
    k = kind(node)
    if k not in ("ones", "ones_like", "new_ones") or not _same(_shape(node) or (), shape):
        return False
    return value(node).dtype in _EXACT


def _counts(div: Node, acc: _Accumulation, segments) -> tuple[float, list[Node]] | None:
    """(what an empty segment gives, the nodes from the count to the divisor) when `div`
    divides by the number of rows of each id of `acc`, counted in the graph: an index_add /
    scatter_add of ones, or `bincount(ids, minlength=B)`, then casts to exact dtypes,
    `clamp(min=m)` with 0 < m <= 1 (an empty segment then gives 0, else 0 / 0) and a column
    view. None otherwise."""
    nodes: list[Node] = []
    empty, node, reader = float("nan"), div.args[1], div
    while isinstance(node, Node):
        k = kind(node)
        view = k in _COLUMN and _column_of(node) is not None
        if view or k in _CASTS and value(node).dtype in _EXACT:
            pass
        elif k in ("clamp", "clamp_min"):
            low = arg(node, 1, "min")
            high = arg(node, 2, "max") if k == "clamp" else None
            if not isinstance(low, (int, float)) or not 0 < low <= 1 or high is not None:
                return None
            empty = 0.0
        else:
            break
        nodes.append(node)
        node, reader = node.args[0], node
    if kind(node) == "bincount":
        length = arg(node, 2, "minlength")
        weights = arg(node, 1, "weights")
        if node.args[0] is not acc.ids or weights is not None or length != segments:
            return None  # (an int compares by value, a symbol's node by identity)
        return empty, [node, *nodes]
    count = _accumulation(node, reader, reading_rows=False)
    if count is None or count.problem or count.ids is not acc.ids:
        return None
    ones = _shape(acc.source)[:1] + _shape(count.zeros)[1:]
    if count.op not in ("index_add", "scatter_add") or not _is_ones(count.source, ones):
        return None
    if value(count.zeros).dtype not in _EXACT or _segments(count.zeros) != segments:
        return None
    return empty, [count.zeros, *count.prep, count.source, count.mut, *nodes]


def _in_order(nodes: list[Node]) -> list[Node]:
    order = {n: i for i, n in enumerate(nodes[-1].graph.nodes)}
    return sorted(set(nodes), key=order.__getitem__)


def match_index_add_mean(div: Node) -> Match | None:
    """`zeros.index_add_(0, ids, x) / d` and `zeros.scatter_add_(0, ids column, x) / d` (in
    place or not, or `s.index_add_(...)` as a statement then `s / d`), d one number per
    segment. d counted from the same ids in the graph (index_add / scatter_add of ones,
    bincount; clamped or not): the mean itself. Any other d (a bincount before a graph break
    arrives as an input): the sums, as means times sizes, divided by it as eager divides."""
    if kind(div) != "div" or len(div.args) != 2 or div.kwargs.get("rounding_mode") is not None:
        return None
    sums, divisor = div.args
    acc = _accumulation(sums, div)
    if acc is None or acc.op not in ("index_add", "scatter_add") or not isinstance(divisor, Node):
        return None
    xs, ds, outs = _shape(acc.source), _shape(divisor), _shape(div)
    segments = _segments(acc.zeros)
    if ds is None or outs is None or not _same(outs, _shape(acc.zeros)):
        return None
    # one number per segment (a [B] divisor of [B, D] sums would divide the columns)
    if len(ds) != len(xs) or not _same(ds, (outs[0],) + (1,) * (len(ds) - 1)):
        return None
    counted = _counts(div, acc, segments) if acc.problem is None else None
    problem = acc.problem
    if problem is None and segments is None:
        problem = "the number of segments is symbolic and not in the graph as a size"
    nodes = [acc.zeros, *acc.prep, acc.mut, div]
    shared = tuple(acc.prep) + ((acc.zeros,) if not acc.in_place else ())
    if counted is not None and value(div).dtype == torch.float32 == value(acc.source).dtype:
        empty, count_nodes = counted
        inside = set(nodes) | set(count_nodes)
        if all(set(n.users) <= inside for n in count_nodes):  # else the count stays as it is
            nodes += count_nodes
        args, kwargs, how = (acc.source, acc.ids, segments), {"empty": empty}, "counts"
    else:
        args, kwargs, how = (acc.source, acc.ids, segments, divisor), {}, "a per-segment divisor"
    index = "ids" if acc.op == "index_add" else "ids column"
    return Match(
        f"{acc.op}(zeros, 0, {index}, x) / {how}", "jagged_mean", index_mean, args, kwargs,
        _in_order(nodes), {"x": acc.source}, problem, shared_ok=shared,
    )  # fmt: skip


def match_reduce_mean(node: Node) -> Match | None:
    """`zeros.scatter_reduce_(0, ids column, x, "mean", include_self=False)` and
    `index_reduce_(0, ids, x, "mean", include_self=False)` (in place or not): each id's mean,
    0 where an id has no row (the zero stays)."""
    acc = _accumulation(node)
    if acc is None or acc.op not in ("scatter_reduce", "index_reduce"):
        return None
    if arg(node, 4, "reduce") != "mean":
        return None
    segments = _segments(acc.zeros)
    include_self = node.kwargs.get("include_self", True)
    problem = acc.problem
    if problem is None and include_self is not False:
        problem = "include_self=True averages the zero already there into each mean"
    elif problem is None and segments is None:
        problem = "the number of segments is symbolic and not in the graph as a size"
    index = "ids" if acc.op == "index_reduce" else "ids column"
    pattern = f"{acc.op}(zeros, 0, {index}, x, 'mean', include_self={include_self})"
    nodes = _in_order([acc.zeros, *acc.prep, acc.mut])
    args = (acc.source, acc.ids, segments)
    if acc.in_place and not node.users:  # `s.scatter_reduce_(...)` as a statement: s is read
        readers = [u for u in acc.zeros.users if u is not node]
        if not all(_before(node, u) for u in readers):
            return None
        return Match(
            pattern, "jagged_mean", index_mean_in_place, args, {}, nodes, {"x": acc.source},
            problem, shared_ok=tuple(acc.prep), outputs=(acc.zeros,),
        )  # fmt: skip
    shared = tuple(acc.prep) + ((acc.zeros,) if not acc.in_place else ())
    return Match(
        pattern, "jagged_mean", index_mean, args, {}, nodes, {"x": acc.source}, problem,
        shared_ok=shared,
    )  # fmt: skip
