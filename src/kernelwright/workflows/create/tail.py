"""A reduction over the rows' values after the row reduction: the head/tail split.

Cross-entropy written in PyTorch picks one log-probability per row, then takes the mean over
the rows; a cosine-similarity loss reduces each row, then averages. The row kernel computes
the per-row values (the head); what follows — a reduction over those values and the
element-wise work after it (the tail) — is O(rows) work that runs in PyTorch after the
kernel, in fp32, and autograd differentiates it. The head is traced again on its own, so the
generated backward kernel starts from the per-row values' gradient.

Only element-wise ops and reductions over every dim of a per-row value belong to a tail; a
tail needing anything else stops with that reason.
"""

from __future__ import annotations

import operator
from typing import Any

import torch

from kernelwright.profiles.kernel import Graph, GraphNode
from kernelwright.workflows.create.load import Reference
from kernelwright.workflows.create.lowering import _CONSTS
from kernelwright.workflows.create.trace import short_name

# ops a tail may hold besides element-wise ones: shape-only views and full reductions
_TAIL_VIEWS = {"view", "_unsafe_view", "reshape", "alias", "clone", "detach", "squeeze"}
_TAIL_REDUCTIONS = {"sum", "mean", "amax", "amin"}
_TAIL_SIZES = {"sym_numel", "sym_size"}  # a size of the rows' values, read at run time


class TailError(ValueError):
    """The ops after the row's values cannot run as a tail (node, reason)."""

    def __init__(self, node: str, reason: str):
        super().__init__(f"{node}: {reason}")
        self.node, self.reason = node, reason


def _users(graph: Graph) -> dict[str, list[GraphNode]]:
    names = {n.name for n in graph.nodes}
    users: dict[str, list[GraphNode]] = {}
    for n in graph.nodes:
        for a in _flat(list(n.args) + list(n.kwargs.values())):
            if isinstance(a, str) and a in names:
                users.setdefault(a, []).append(n)
    return users


def _flat(args: list) -> list:
    out = []
    for a in args:
        if isinstance(a, (list, tuple)):
            out.extend(_flat(list(a)))
        else:
            out.append(a)
    return out


def tail_start(forward: Graph, main_rank: int, reductions: frozenset[str]) -> list[GraphNode]:
    """The forward reductions of a value with fewer dims than the main input: a reduction over
    the rows' values. Empty when there is none."""
    shapes = {n.name: n.shape for n in forward.nodes}
    out = []
    for n in forward.nodes:
        if n.op != "call_function" or short_name(n.target) not in reductions:
            continue
        rank = len(shapes.get(n.args[0]) or [])
        if 0 < rank < main_rank:
            out.append(n)
    return out


# a reduction over the row's dims and more, split into the row's then the rows': the target
# of both halves, by the reduction's name (keepdim false only)
_WIDE = {"sum": "aten.sum.dim_IntList", "mean": "aten.mean.dim", "amax": "aten.amax.default",
         "amin": "aten.amin.default"}  # fmt: skip


def _dims(n: GraphNode, rank: int) -> list[int]:
    dims = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim")
    if dims is None or dims == []:
        return list(range(rank))
    return sorted({d % rank for d in _flat([dims])})


def split_wide(forward: Graph, main_rank: int, reductions: frozenset[str]) -> Graph:
    """Reductions of full-rank values over two sets of dims, one holding the other (KL's
    `batchmean`: a row's log-softmax over the last dim, then a sum over every dim): each wider
    one becomes the reduction over the row's dims, then one over the rows' values — which
    `tail_start` then finds. Unchanged when there is no such pair (the tier check names it)."""
    shapes = {n.name: n.shape for n in forward.nodes}
    sets: dict[str, tuple[int, ...]] = {}
    for n in forward.nodes:
        reduces = n.op == "call_function" and short_name(n.target) in reductions
        if reduces and len(shapes.get(n.args[0]) or []) == main_rank:
            sets[n.name] = tuple(_dims(n, main_rank))
    found = set(sets.values())
    if len(found) < 2:
        return forward
    row = min(found, key=len)
    by = {n.name: n for n in forward.nodes}
    wide = [by[name] for name, dims in sets.items() if dims != row]
    for n in wide:
        keep = n.args[2] if len(n.args) > 2 else n.kwargs.get("keepdim", False)
        if not set(row) < set(sets[n.name]) or short_name(n.target) not in _WIDE or keep:
            return forward
    kept = [d for d in range(main_rank) if d not in row]
    nodes = []
    for n in forward.nodes:
        if n not in wide:
            nodes.append(n)
            continue
        target = _WIDE[short_name(n.target)]
        rows = [s for d, s in enumerate(shapes[n.args[0]]) if d not in row]
        inner = GraphNode(
            name=f"{n.name}_row", op="call_function", target=target, dtype=n.dtype, shape=rows,
            args=[n.args[0], list(row), False],
        )  # fmt: skip
        outer = [kept.index(d) for d in sets[n.name] if d not in row]
        outer = [] if outer == list(range(len(kept))) else outer  # every dim, at any rank
        nodes += [inner, n.model_copy(update={"target": target, "kwargs": {},
                                              "args": [inner.name, outer, False]})]  # fmt: skip
    return Graph(nodes=nodes, readable=forward.readable)


def split(
    forward: Graph, starts: list[GraphNode], elementwise: frozenset[str], n_outputs: int
) -> tuple[list[str], Graph]:
    """(the head's outputs: the per-row values the tail reads, the tail graph over them)."""
    users = _users(forward)
    tail: set[str] = set()
    stack = [n.name for n in starts]
    while stack:
        name = stack.pop()
        if name in tail:
            continue
        tail.add(name)
        stack.extend(u.name for u in users.get(name, []) if u.op == "call_function")
    by = {n.name: n for n in forward.nodes}
    output = next(n for n in forward.nodes if n.op == "output")
    outs = _flat(list(output.args))[:n_outputs]
    if not all(isinstance(o, str) and o in tail for o in outs):
        raise TailError("output", "an output is not computed from the rows' reduction")
    nodes = _runtime_sizes([n for n in forward.nodes if n.name in tail], by[starts[0].args[0]])
    for n in nodes:
        op = short_name(n.target)
        if op in _TAIL_REDUCTIONS:
            dims = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim")
            rank = len(by[n.args[0]].shape or [])
            if dims not in (None, []) and sorted(d % rank for d in _flat([dims])) != list(
                range(rank)
            ):
                raise TailError(n.name, f"{n.target} over some dims of the rows' values")
        elif op not in elementwise and op not in _TAIL_VIEWS and op not in _TAIL_SIZES:
            raise TailError(n.name, f"{n.target} after the rows' reduction")
    # the boundary: values computed before the tail and read by it, in forward order
    head_outs: list[str] = []
    for n in nodes:
        for a in _flat(list(n.args) + list(n.kwargs.values())):
            if isinstance(a, str) and a in by and a not in tail and a not in head_outs:
                if by[a].op == "placeholder":
                    raise TailError(n.name, f"the tail reads the input {a} directly")
                head_outs.append(a)
    placeholders = [GraphNode(name=h, op="placeholder", target=h, shape=by[h].shape,
                              dtype=by[h].dtype) for h in head_outs]  # fmt: skip
    out_node = GraphNode(name="output", op="output", target="output", args=[outs])
    return head_outs, Graph(nodes=placeholders + nodes + [out_node])


def _runtime_sizes(nodes: list[GraphNode], rows: GraphNode) -> list[GraphNode]:
    """The tail with a constant that is a size of the rows' values (KL's batchmean divides by
    the batch, `mse` spelled as a sum divides by the row count) read from them at run time: a
    multiplication or division by the traced count of all their elements, or of their leading
    dim, becomes one by `sym_numel` / `sym_size(·, 0)`. Any other use of such a count, or one
    that both sizes match, would be wrong at other shapes: it stops."""
    shape = list(rows.shape or [])
    numel = 1
    for d in shape:
        numel *= d
    sizes = {"aten.sym_numel.default": numel}
    if len(shape) > 1:
        sizes["aten.sym_size.int"] = shape[0]

    def match(c: Any) -> tuple[list[str], bool]:  # (the size targets c is, whether as 1/size)
        if not isinstance(c, (int, float)) or isinstance(c, bool) or not c:
            return [], False
        hits = [t for t, v in sizes.items() if v > 1 and c == v]
        inv = [t for t, v in sizes.items() if v > 1 and abs(c * v - 1) < 1e-9]
        return (hits, False) if hits else (inv, True)

    out: list[GraphNode] = []
    for n in nodes:
        found = [(i, *match(c)) for i, c in enumerate(n.args)]
        found = [(i, t, inv) for i, t, inv in found if t]
        if not found:
            out.append(n)
            continue
        i, targets, inv = found[0]
        value = sizes[targets[0]]
        base = n.target.rsplit(".", 1)[0]
        if len(found) > 1 or len(targets) > 1 or i != 1 or base not in ("aten.mul", "aten.div"):
            raise TailError(n.name, f"the traced size {value} of the rows' values is baked into "
                            f"{n.target}")  # fmt: skip
        size = GraphNode(name=f"{n.name}_size", op="call_function", target=targets[0],
                         args=[rows.name] + ([0] if "sym_size" in targets[0] else []))  # fmt: skip
        # x * (1 / size) and x / size: a division by the size; x * size: a multiplication
        op = "aten.div.Tensor" if inv == (base == "aten.mul") else "aten.mul.Tensor"
        out += [size, n.model_copy(update={"target": op, "args": [n.args[0], size.name]})]
    return out


def _value(a: Any, env: dict[str, Any]) -> Any:
    if isinstance(a, (list, tuple)):
        return [_value(x, env) for x in a]
    if isinstance(a, str) and a in env:
        return env[a]
    if isinstance(a, str) and a in _CONSTS:
        return _CONSTS[a]
    return a


def _kw(k: str, v: Any) -> Any:
    if isinstance(v, str) and k in ("dtype", "layout", "memory_format") and v.startswith("torch."):
        return getattr(torch, v.split(".", 1)[1])
    if k == "device" and isinstance(v, str):
        return torch.device(v)
    return v


def call(node: GraphNode, env: dict[str, Any]) -> Any:
    """Run one aten node eagerly."""
    if node.target == "getitem":
        return operator.getitem(env[node.args[0]], node.args[1])
    fn = torch.ops
    for part in node.target.split("."):
        fn = getattr(fn, part)
    kwargs = {k: _kw(k, _value(v, env)) for k, v in node.kwargs.items()}
    return fn(*[_value(a, env) for a in node.args], **kwargs)


def head_reference(ref: Reference, forward: Graph, head_outs: list[str]) -> Reference:
    """A reference computing the head's outputs from the same inputs: the forward graph's
    nodes up to them, run eagerly (traced again by the caller)."""
    by = {n.name: n for n in forward.nodes}
    need: set[str] = set()
    stack = list(head_outs)
    while stack:
        name = stack.pop()
        if name in need or name not in by:
            continue
        need.add(name)
        stack.extend(a for a in _flat(list(by[name].args) + list(by[name].kwargs.values()))
                     if isinstance(a, str))  # fmt: skip
    placeholders = [n.name for n in forward.nodes if n.op == "placeholder"]
    nodes = [n for n in forward.nodes if n.op == "call_function" and n.name in need]
    shift = shifts(nodes)

    def head(*tensors):
        env = dict(zip(placeholders, tensors, strict=True))
        for n in nodes:
            env[n.name] = call(n, env)
            if n.name in shift:
                env[n.name] = env[n.name].detach()
        outs = tuple(env[h] for h in head_outs)
        return outs[0] if len(outs) == 1 else outs

    names = ref.input_names + ref.param_names
    return Reference(
        name=ref.name,
        source=ref.source,
        input_form="function",
        input_names=names,
        example_inputs=list(ref.example_inputs) + list(ref.params),
        function=head,
    )


def shifts(nodes: list[GraphNode]) -> set[str]:
    """The row maxima that only shift a softmax or log-softmax, as their decompositions write
    them: m = amax(x), s = x - m, e = exp(s), z = sum(e) over the same dims, read only as e / z
    or s - log(z). The result does not depend on m, so its gradient is zero; autograd through
    the decomposed ops would instead sum the row's rounding noise into the element at the
    maximum (on a long row, beyond any tolerance). The head runs them detached, and so does
    the generated reference of a profile with a tail."""
    # an alias (a traced detach) is its source: names resolve through them
    src = {n.name: n.args[0] for n in nodes if short_name(n.target) == "alias"}

    def res(a: Any) -> Any:
        while isinstance(a, str) and a in src:
            a = src[a]
        return a

    nodes = [n.model_copy(update={"args": [res(a) for a in n.args]}) for n in nodes
             if n.name not in src]  # fmt: skip
    users: dict[str, list[GraphNode]] = {}
    for n in nodes:
        for a in _flat(list(n.args)):
            if isinstance(a, str):
                users.setdefault(a, []).append(n)

    def op(n: GraphNode) -> str:
        return short_name(n.target)

    def row_sum(v: GraphNode, e: str, m: GraphNode) -> bool:  # z = sum(e, dims of m, keepdim)
        return op(v) == "sum" and v.args[:3] == [e, m.args[1], True]

    def shift_only(m: GraphNode) -> bool:
        for s in users.get(m.name, []):
            if op(s) != "sub" or s.args != [m.args[0], m.name]:
                return False
            logs = set()  # log(z) of this s's softmax denominators
            for e in users.get(s.name, []):
                if op(e) != "exp":
                    continue
                zs = [v.name for v in users.get(e.name, []) if row_sum(v, e.name, m)]
                for v in users.get(e.name, []):
                    if not (v.name in zs or op(v) == "div" and v.args[:2] in
                            ([e.name, z] for z in zs)):  # fmt: skip
                        return False
                for z in zs:
                    for w in users.get(z, []):
                        if op(w) == "log":
                            logs.add(w.name)
                        elif not (op(w) == "div" and w.args[:2] == [e.name, z]):
                            return False
            for u in users.get(s.name, []):
                if not (op(u) == "exp" or op(u) == "sub" and len(u.args) == 2 and
                        u.args[0] == s.name and u.args[1] in logs):  # fmt: skip
                    return False
            for w in logs:
                if any(op(q) != "sub" or q.args != [s.name, w] for q in users.get(w, [])):
                    return False
        return m.name in users and len(m.args) >= 3 and m.args[2] is True

    return {m.name for m in nodes if op(m) == "amax" and shift_only(m)}


def rename(graph: Graph, head_outs: list[str]) -> Graph:
    """The tail with its inputs named row0, row1, ... (the kernel's outputs, in order)."""
    names = {h: f"row{i}" for i, h in enumerate(head_outs)}

    def ren(a: Any) -> Any:
        if isinstance(a, list):
            return [ren(x) for x in a]
        return names.get(a, a) if isinstance(a, str) else a

    nodes = []
    for n in graph.nodes:
        nodes.append(n.model_copy(update={
            "name": names.get(n.name, n.name),
            "target": names.get(n.target, n.target) if n.op == "placeholder" else n.target,
            "args": ren(list(n.args)),
            "kwargs": {k: ren(v) for k, v in n.kwargs.items()},
        }))  # fmt: skip
    return Graph(nodes=nodes)
