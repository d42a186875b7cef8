"""Generated patterns: the ops `create --into-library` made, found where a graph computes them.

Each generated op whose module exports `<op>_pattern` (the reference as its author wrote it,
see workflows/create/pattern.py) contributes one pattern: that function traced by torch.fx,
matched against each captured graph with torch.fx's subgraph matcher (same calls, same
constants; its arguments match any node). A match is a site like any other (`Match`): the
op's public function called on the matched arguments, checked and selected by the pass. No
pattern is written by hand: adding an op to the library adds its pattern.

A created op that implements a library op (`create --implements OP`) has no sites of its own:
it competes at OP's sites, where the selection may choose it ("created"). It takes a site only
when the site makes the same call of OP as its reference does (`site_options`: the library
function, its constants, which input goes where), and is then called on the site's inputs in
its own argument order (`created_unfit`, `created_match`).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging

import torch
from torch.fx import GraphModule, Node

from kernelwright.compile.patterns import Match, value
from kernelwright.registry.entry import Impl

log = logging.getLogger("kernelwright.compile")


@functools.cache
def _pattern_graph(op: str, module: str) -> tuple[GraphModule, list[str]] | None:
    """The op's pattern traced by torch.fx, and its argument names; None without one."""
    import importlib

    mod = importlib.import_module(module)
    fn = getattr(mod, f"{op}_pattern", None)
    if fn is None:
        return None
    try:
        gm = torch.fx.symbolic_trace(fn)
    except Exception as e:  # a pattern fx cannot trace is skipped, and said once
        log.info("generated op %s: its pattern does not trace (%s); not matched", op, e)
        return None
    names = [n.target for n in gm.graph.nodes if n.op == "placeholder"]
    return gm, names


def _generated_entries():
    from kernelwright import registry

    return [e for e in registry.entries() if e.generated and e.implements is None]


def generated_matches(gm: GraphModule) -> dict[Node, Match]:
    """{output node: Match} for every generated op's pattern found in `gm`."""
    from torch.fx.passes.utils.matcher_utils import SubgraphMatcher

    found: dict[Node, Match] = {}
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    for entry in _generated_entries():
        traced = _pattern_graph(entry.name, entry.module)
        if traced is None:
            continue
        pattern, names = traced
        matcher = SubgraphMatcher(
            pattern.graph,
            match_output=False,
            match_placeholder=False,
            remove_overlapping_matches=True,
            ignore_literals=False,
        )
        for m in matcher.match(gm.graph):
            if len(m.returning_nodes) != 1 or len(m.placeholder_nodes) != len(names):
                continue
            inside = [g for p, g in m.nodes_map.items() if p.op in ("call_function", "call_method")]
            inside.sort(key=order.__getitem__)
            output = m.returning_nodes[0]
            if not inside or inside[-1] is not output or output in found:
                continue
            args = tuple(m.placeholder_nodes)
            tensors = dict(zip(names, args, strict=True))
            fn = entry.fn()
            # inputs the op reads in equal parts of their last dim (workflows/create/parts.py)
            cuts = {pos: k for pos, k, _ in getattr(inspect.getmodule(fn), "CUTS", [])}
            found[output] = Match(
                f"{entry.name} (generated pattern)", entry.name, fn, args, {}, inside,
                tensors, problem=_problem(tensors, output, cuts), scalars_ok=True,
            )  # fmt: skip
    return found


def _problem(
    tensors: dict[str, Node], output: Node, cuts: dict[int, int] | None = None
) -> str | None:
    """Why the generated kernel cannot take the site: its inputs broadcast to the first one's
    shape as [N] per-feature or scalar values only, and its output is the first one's dtype.
    `cuts`: the inputs read in k equal parts of their last dim, by position (the shape that
    counts is a part's)."""
    cuts = cuts or {}
    vals = {k: value(n) for k, n in tensors.items()}
    if any(not isinstance(v, torch.Tensor) for v in vals.values()):
        return "an argument is not a tensor"
    first = next(iter(vals.values()))
    if first.dim() == 0 or first.shape[-1] % cuts.get(0, 1):
        return "the first input is not cut in equal parts"
    full = (*first.shape[:-1], first.shape[-1] // cuts.get(0, 1))
    for i, (name, v) in enumerate(vals.items()):
        shapes = [(*full[:-1], full[-1] * cuts[i])] if i in cuts else [full, (full[-1],), ()]
        if tuple(v.shape) not in shapes:
            return f"{name} has shape {tuple(v.shape)}: the kernel broadcasts [N] and scalars only"
    out = value(output)
    if not isinstance(out, torch.Tensor) or out.dtype != first.dtype:
        return "the result's dtype is not the first input's (eager promotes)"
    if tuple(out.shape) != full:
        return "the result's shape is not the first input's" + (" part's" if cuts else "")
    return None


def site_options(m: Match) -> str:
    """The call a library site makes, as text: the function, its arguments with each input
    named by its role ("x", "weight") and every constant as written. Two sites with the same
    text compute the same thing on their inputs; a graph value that is not one of the site's
    inputs is named by its node, so it never equals another site's."""
    roles = {n: name for name, n in m.tensors.items()}

    def text(a) -> str:
        if isinstance(a, Node):
            return roles.get(a, f"<{a.name}>")
        if isinstance(a, (tuple, list)):
            return "(" + ", ".join(text(x) for x in a) + ")"
        return repr(a)

    args = [text(a) for a in m.args]
    args += [f"{k}={text(v)}" for k, v in sorted(m.kwargs.items())]
    return f"{getattr(m.fn, '__name__', repr(m.fn))}({', '.join(args)})"


def created_unfit(m: Match, impl: Impl) -> str | None:
    """Why the created implementation `impl` of a library op cannot take site `m` (it makes
    another call of the op), or None when it can."""
    here = site_options(m)
    if here != impl.computes:
        return f"the created kernel computes {impl.computes}, this site {here}"
    missing = [n for n in impl.inputs if n not in m.tensors]
    if missing:
        return f"the site has no {', '.join(missing)} for the created kernel"
    return None


def created_match(m: Match, impl: Impl) -> Match:
    """Site `m` of a library op, calling its created implementation `impl` instead: the site's
    inputs in the created kernel's argument order, its constants being the kernel's own."""
    args = tuple(m.tensors[n] for n in impl.inputs)
    return dataclasses.replace(m, fn=impl.load(), args=args, kwargs={})
