"""Inputs taken in equal parts of their last dim: a chunk, split or slice of an input.

`a, b = x.chunk(2, dim=-1)` (GLU, a fused gate/up projection's output) traces to slices of the
input `x`. A generated kernel reads whole [M, N] views with any strides, and each part is one:
a column slice of `x`, read in place. So such a reference is generated as the same reference
over the parts (`x_part0`, `x_part1`: one more input each), and the generated public function
takes `x`, hands the kernels its parts as views and writes their gradients into one `dx`.

Parts must be equal and cover whole parts (`chunk(k)`, `split(n // k)`, `x[..., : n // 2]`): the
generated code cuts `x` into k parts of its last dim at any size. The widths are checked to
scale with that dim on a symbolic trace, so a slice of a fixed width (`x[..., :64]`), which
would cut other sizes elsewhere, stops instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from kernelwright.profiles.kernel import Graph, GraphNode
from kernelwright.workflows.create.load import Reference
from kernelwright.workflows.create.trace import Traced, short_name

_CUTS = ("slice", "split_with_sizes", "split")


class PartsStop(Exception):
    """An input is cut in a way the parts form does not take: (node, reason)."""

    explained = True  # the reason says what to change

    def __init__(self, node: str, reason: str):
        super().__init__(reason)
        self.node, self.reason = node, reason


def _users(graph: Graph, name: str) -> list[GraphNode]:
    def reads(a: Any) -> bool:
        if isinstance(a, (list, tuple)):
            return any(reads(b) for b in a)
        return a == name

    return [n for n in graph.nodes if n.op == "call_function" and reads(list(n.args))]


def _bounds(node: GraphNode, n: int) -> list[tuple[int, int]]:
    """The [start, end) column ranges a last-dim slice or split of an n-column input takes."""
    op = short_name(node.target)
    if op == "slice":
        args = list(node.args) + [None] * (5 - len(node.args))
        start, end, step = args[2], args[3], args[4]
        start = 0 if start is None else start
        end = n if end is None else end
        start, end = (s + n if s < 0 else s for s in (start, end))
        if step not in (None, 1):
            raise PartsStop(_label(node), f"a slice with step {step}: parts are runs of columns")
        return [(max(0, min(start, n)), max(0, min(end, n)))]
    sizes = node.args[1]
    if op == "split":  # split(size): equal sizes, the last one shorter
        sizes = [min(sizes, n - s) for s in range(0, n, sizes)]
    out, at = [], 0
    for s in sizes:
        out.append((at, at + s))
        at += s
    return out


def _label(node: GraphNode) -> str:
    return f"{node.name} ({node.target})"


def _dim(node: GraphNode, rank: int) -> int:
    if short_name(node.target) == "slice":
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
    else:
        dim = node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", 0)
    return dim % rank


@dataclass
class Parts:
    """Per input cut into parts: its part count, and each cutting node's part (a slice: the
    part it takes; a split: its getitems' parts by node name)."""

    counts: dict[str, int]
    taken: dict[str, tuple[str, int]]  # node name -> (input, part index)

    def names(self, inp: str) -> list[str]:
        return [f"{inp}_part{j}" for j in range(self.counts[inp])]


def find_parts(ref: Reference, forward: Graph) -> Parts:
    """The inputs of `forward` read only through equal parts of their last dim."""
    shapes = {n.name: n.shape for n in forward.nodes}
    counts: dict[str, int] = {}
    taken: dict[str, tuple[str, int]] = {}
    for inp in ref.input_names:
        users = _users(forward, inp)
        cuts = [u for u in users if short_name(u.target) in _CUTS]
        if not cuts:
            continue
        shape = shapes.get(inp) or []
        dtype = next((n.dtype for n in forward.nodes if n.name == inp), None) or ""
        if "float" not in dtype:
            why = "the parts form cuts floating inputs; pass the parts as separate inputs"
            raise PartsStop(_label(cuts[0]), f"a part of {inp}, an index or mask input: {why}")
        if len(cuts) < len(users):
            whole = next(u for u in users if u not in cuts)
            raise PartsStop(_label(whole), f"{inp} is read whole and in parts: a generated kernel "
                            "reads an input either way, not both")  # fmt: skip
        if not shape or any(_dim(u, len(shape)) != len(shape) - 1 for u in cuts):
            raise PartsStop(_label(cuts[0]), f"a part of {inp} along another dim than the last: "
                            "the parts form cuts the last dim only")  # fmt: skip
        n = shape[-1]
        pieces: list[tuple[str, tuple[int, int]]] = []
        for u in cuts:
            bounds = _bounds(u, n)
            if short_name(u.target) == "slice":
                pieces.append((u.name, bounds[0]))
                continue
            for g in _users(forward, u.name):
                if short_name(g.target) != "getitem":
                    raise PartsStop(_label(g), f"the parts of {inp} are read as a list")
                pieces.append((g.name, bounds[g.args[1]]))
        widths = {e - s for _, (s, e) in pieces}
        w = widths.pop() if len(widths) == 1 else 0
        if not w or n % w or any(s % w for _, (s, _e) in pieces):
            got = ", ".join(f"[{s}, {e})" for _, (s, e) in sorted(pieces, key=lambda p: p[1]))
            raise PartsStop(_label(cuts[0]), f"{inp}'s parts (columns {got} of {n}) are not equal "
                            "parts of its last dim; pass the parts as separate inputs")  # fmt: skip
        counts[inp] = n // w
        for name, (s, _e) in pieces:
            taken[name] = (inp, s // w)
    parts = Parts(counts, taken)
    if counts:
        _check_scaling(ref, parts)
    return parts


def _check_scaling(ref: Reference, parts: Parts) -> None:
    """The parts' widths scale with the input's last dim (chunk, n // k), traced symbolically:
    a slice of a fixed width would cut another size somewhere else than k equal parts."""
    from torch.fx.experimental import _config as config
    from torch.fx.experimental.proxy_tensor import make_fx

    from kernelwright.workflows.create.trace import decompositions

    tensors = [t.clone() for t in ref.example_inputs] + [p.clone() for p in ref.params]
    try:
        # a symbol per dim, also for dims of equal size: a width taken from another dim of the
        # same size (x.shape[0] // 2) is then not mistaken for one that follows the last dim
        with config.patch(use_duck_shape=False):
            trace = make_fx(ref.call, decomposition_table=decompositions(), tracing_mode="symbolic")
            gm = trace(*tensors)
    except Exception as e:
        raise PartsStop("parts", f"the parts' widths could not be traced symbolically ({e}); "
                        "pass the parts as separate inputs") from e  # fmt: skip
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    by_input = dict(zip(placeholders, ref.input_names, strict=False))

    def expr(a: Any):
        val = a.meta.get("val") if isinstance(a, torch.fx.Node) else a
        val = val.node.expr if isinstance(val, torch.SymInt) else val
        return int(val) if getattr(val, "is_number", False) else val

    for node in gm.graph.nodes:
        src = node.args[0] if node.op == "call_function" and node.args else None
        name = by_input.get(src) if isinstance(src, torch.fx.Node) else None
        if name not in parts.counts:
            continue
        size = node.args[0].meta["val"].shape[-1]
        sym = size.node.expr if isinstance(size, torch.SymInt) else None
        op = str(node.target)
        if "slice" in op:
            bounds = [expr(a) for a in list(node.args)[2:4] if a is not None]
        elif "split" in op:
            sizes = node.args[1]
            bounds = [expr(a) for a in (sizes if isinstance(sizes, (list, tuple)) else [sizes])]
        else:
            continue
        for b in bounds:
            free = getattr(b, "free_symbols", set())
            ok = sym is not None and free == {sym}
            if ok:
                n = int(ref.example_inputs[ref.input_names.index(name)].shape[-1])
                ok = int(b.subs(sym, 2 * n)) == 2 * int(b.subs(sym, n))
            if not ok and not (isinstance(b, int) and b in (0, 2**63 - 1)):
                why = (
                    "the generated code cuts an input into equal parts of its last dim at "
                    "any size; pass the part as an input of its own"
                )
                raise PartsStop(
                    f"{node.name} ({node.target})",
                    f"a part of {name} whose bound does not scale with its last dim ({b}): {why}",
                )


class _PartsReference(Reference):
    """The reference over the parts: its traced forward graph run eagerly, each cut of an input
    read from the part that stands for it."""

    graph: Graph
    parts: Parts
    outs: list[str]

    def call(self, *tensors: torch.Tensor) -> Any:
        from kernelwright.workflows.create.tail import call, shifts

        env = dict(zip(self._names, tensors, strict=True))
        nodes = [n for n in self.graph.nodes if n.op == "call_function"]
        shift = shifts(nodes)
        for n in nodes:
            if n.name in self.parts.taken:
                inp, j = self.parts.taken[n.name]
                env[n.name] = env[f"{inp}_part{j}"]
            elif short_name(n.target) in _CUTS and n.args and n.args[0] in self.parts.counts:
                continue  # a split: its getitems read the parts
            else:
                env[n.name] = call(n, env)
                if n.name in shift:
                    env[n.name] = env[n.name].detach()
        outs = tuple(env[o] for o in self.outs)
        return outs[0] if len(outs) == 1 else outs


def parts_reference(ref: Reference, forward: Graph, outputs: int, parts: Parts) -> Reference:
    """`ref` over the parts of the inputs in `parts` (each input replaced by its parts, in
    place); `forward` is its traced graph, whose first `outputs` results are the real ones."""
    out_node = forward.nodes[-1]
    outs = list(out_node.args)[:outputs]
    for o in outs:
        if o in parts.counts:
            raise PartsStop(o, f"{o} is returned as it is and read in parts")
    names, examples = [], []
    for name, t in zip(ref.input_names, ref.example_inputs, strict=True):
        if name in parts.counts:
            k = parts.counts[name]
            names += parts.names(name)
            examples += [c.contiguous() for c in t.chunk(k, dim=-1)]
        else:
            names.append(name)
            examples.append(t)
    clash = set(names) & (set(ref.param_names) | set(ref.input_names))
    clash -= set(ref.input_names) - set(parts.counts)
    if clash:
        raise PartsStop(sorted(clash)[0], "an argument is named like a part of another input")
    pref = _PartsReference(
        name=ref.name,
        source=ref.source,
        input_form=ref.input_form,
        input_names=names,
        example_inputs=examples,
        param_names=list(ref.param_names),
        params=list(ref.params),
    )
    pref.graph, pref.parts, pref.outs = forward, parts, outs
    pref._names = names + list(ref.param_names)
    return pref


def over_parts(ref: Reference, traced: Traced) -> tuple[Reference, Traced, Parts]:
    """(reference, traced graphs, parts): `ref` and its graphs as they are when no input is cut,
    else the reference over the parts and its graphs. Raises PartsStop (node, reason)."""
    from kernelwright.workflows.create.trace import trace

    parts = find_parts(ref, traced.forward)
    if not parts.counts:
        return ref, traced, parts
    pref = parts_reference(ref, traced.forward, len(traced.output_names), parts)
    return pref, trace(pref), parts


def row_stop(parts: Parts, reduction_dims: list[int], has_tail: bool) -> tuple[str, str] | None:
    """(node, reason) unless the rows are of the last dim (or there are none): the parts form
    hands the kernels each part as an [M, N] view."""
    if parts.counts and (reduction_dims not in ([], [-1]) or has_tail):
        inp = next(iter(parts.counts))
        return inp, (
            f"{inp} is taken in parts and reduced over other dims than the last, or "
            "over the rows' values: the parts form runs rows of the last dim only"
        )
    return None


def context(profile) -> dict:
    """The templates' view of the parts: `cuts` (per cut input: its name, position among the
    public inputs, part count and the parts' positions among the kernel's inputs), `groups`
    (per public input, its positions among the kernel's inputs), `pub` (the
    public function's inputs: a cut input once, at full width) and `fname` (the function over
    the parts; the public function itself when nothing is cut)."""
    first = {ps[0]: name for name, ps in profile.input_parts.items()}
    rest = {p for ps in profile.input_parts.values() for p in ps[1:]}
    names = [s.name for s in profile.inputs]
    pub, cuts = [], []
    for s in profile.inputs:
        if s.name in rest:
            continue
        if s.name in first:
            whole = first[s.name]
            ps = profile.input_parts[whole]
            shape = [*s.example_shape[:-1], s.example_shape[-1] * len(ps)]
            cuts.append({"name": whole, "pos": len(pub), "k": len(ps),
                         "idx": [names.index(p) for p in ps]})  # fmt: skip
            s = s.model_copy(update={"name": whole, "example_shape": shape})
        pub.append(s)
    tail = "_parts" if cuts else ""
    cut = {c["pos"]: c["idx"] for c in cuts}
    at, groups = 0, []  # per public input: its positions among the kernel's inputs
    for i in range(len(pub)):
        groups.append(cut.get(i, [at]))
        at += len(groups[-1])
    return {
        "cuts": cuts,
        "groups": groups,
        "pub": pub,
        "pub_args": [s for s in pub if s.role != "parameter"],
        "fname": profile.function_name + tail,
        # the references over the kernel's inputs (`<op>_ref` takes the whole ones)
        "ref": f"{profile.name}_ref{tail}",
        "ref_grads": f"{profile.name}_ref_grads{tail}",
    }


def public_inputs(profile) -> list:
    """The generated public function's inputs: the profile's, a cut input once (whole)."""
    return context(profile)["pub"]
