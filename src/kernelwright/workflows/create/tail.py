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
    nodes = [n for n in forward.nodes if n.name in tail]
    rows = 1
    for d in by[starts[0].args[0]].shape or []:
        rows *= d
    for n in nodes:
        op = short_name(n.target)
        consts = [a for a in n.args if isinstance(a, (int, float)) and not isinstance(a, bool)]
        if rows > 1 and any(c == rows or (c and abs(c * rows - 1) < 1e-9) for c in consts):
            raise TailError(n.name, f"the traced row count {rows} is baked into {n.target}")
        if op in _TAIL_REDUCTIONS:
            dims = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim")
            rank = len(by[n.args[0]].shape or [])
            if dims not in (None, []) and sorted(d % rank for d in _flat([dims])) != list(
                range(rank)
            ):
                raise TailError(n.name, f"{n.target} over some dims of the rows' values")
        elif op not in elementwise and op not in _TAIL_VIEWS:
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


def _value(a: Any, env: dict[str, Any]) -> Any:
    if isinstance(a, (list, tuple)):
        return [_value(x, env) for x in a]
    if isinstance(a, str) and a in env:
        return env[a]
    if isinstance(a, str) and a in _CONSTS:
        return _CONSTS[a]
    return a


def _kw(k: str, v: Any) -> Any:
    if isinstance(v, str) and k in ("dtype", "layout") and v.startswith("torch."):
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

    def head(*tensors):
        env = dict(zip(placeholders, tensors, strict=True))
        for n in nodes:
            env[n.name] = call(n, env)
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
