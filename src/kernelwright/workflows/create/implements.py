"""`create --into-library --implements OP`: the created kernel as an implementation of a library
op, chosen per call site among OP's others (registry/generated.py, compile/select.py).

The created kernel computes its reference with the reference's constants baked in, so it can
stand in for OP only where a site makes the same call of OP. That call is found by the graph
pass's own patterns: the reference as written (`<name>_pattern`) is captured by Dynamo on its
example inputs and OP's patterns must match all of it — every call, and its result. The match
gives the call (`compile.generated.site_options`: the library function, its constants, which
input is which) and the created kernel's arguments as OP's inputs, in its order.

Checked before anything is written, each failure a `ImplementsError` that says what differs:
OP is a library op (an unknown name lists them) with a benchmark spec; the kernel takes as
many tensors as OP's benchmark inputs; the reference has a pattern, captured as one graph, that
is OP's call and nothing else; its inputs are OP's benchmark inputs (so `registry bench OP`
times it beside the others). The declaration (`IMPLEMENTS`) goes at the end of the op's
module: the op, its inputs, its call and its capability (the dtypes its generated tests check;
a row kernel without looped kernels takes rows up to the longest one program holds; a row
other than the last dim, the traced rank only).
"""

from __future__ import annotations

import ast
import inspect

import torch

from kernelwright import registry
from kernelwright.profiles.kernel import KernelProfile
from kernelwright.registry.entry import DTYPES, OpEntry
from kernelwright.workflows.create.dtypes import bool_inputs
from kernelwright.workflows.create.lowering import MAX_ROW
from kernelwright.workflows.create.parts import public_inputs


class ImplementsError(ValueError):
    """`--implements OP` cannot register the created kernel as an implementation of OP."""


def library_op(op: str, name: str | None = None) -> OpEntry:
    """The library op `op` a created kernel (op `name`) may implement; checked before the
    workflow runs. One created implementation per op: another created op that implements it
    already is an error naming it (checked once `name` is known)."""
    library = registry.names(generated=False)
    if op not in library:
        created = [n for n in registry.names() if n not in library]
        if op in created:
            raise ImplementsError(
                f"{op} is itself a created op; name the library op it "
                f"implements ({', '.join(library)})"
            )
        raise ImplementsError(str(registry.unknown_op(op, library)))
    entry = registry.get(op)
    if entry.bench is None:
        raise ImplementsError(
            f"{op} has no benchmark spec, so a created implementation could "
            "never be measured against its others"
        )
    other = next((g.name for g in registry.entries() if g.implements == op), None)
    if other is not None and name is not None and other != name:
        raise ImplementsError(
            f"the created op {other} implements {op} already; remove it from "
            "kernelwright/ops/generated first (an op has one created implementation)"
        )
    return entry


def declaration(profile: KernelProfile, op: str, module_text: str) -> dict:
    """`IMPLEMENTS` of the created op of `profile` (its module's source: `module_text`) as an
    implementation of library op `op`; raises `ImplementsError` saying what does not fit."""
    from kernelwright.bench.specs import get_spec
    from kernelwright.compile.generated import site_options
    from kernelwright.workflows.create.pattern import pattern_of

    entry = library_op(op, profile.name)
    spec = get_spec(entry.bench)
    shape = next(iter(spec.interpreter_sweeps[0].shapes()))[1]
    wanted = list(spec.make_inputs(shape, torch.float32, "cpu"))
    have = [i.name for i in public_inputs(profile)]
    if len(have) != len(wanted):
        raise ImplementsError(
            f"{op} takes {len(wanted)} tensor input(s) ({', '.join(wanted)}); "
            f"the created kernel {profile.name} takes {len(have)} ({', '.join(have)})"
        )
    source = pattern_of(profile)
    if source is None:
        raise ImplementsError(
            f"the reference of {profile.name} has no pattern (a forward "
            "reading submodules, buffers or helpers of its module), so nothing shows it "
            f"computes {op}"
        )
    gm, args = _capture(profile, source)
    m = _match(gm, op, profile.name)
    roles = {node: role for role, node in m.tensors.items()}
    inputs = []
    for name, node in zip(args, _placeholders(gm, args), strict=True):
        if node not in roles:
            raise ImplementsError(
                f"the reference's argument {name!r} is not an input of {op}'s "
                f"call ({', '.join(roles.values())})"
            )
        inputs.append(roles[node])
    if sorted(inputs) != sorted(wanted):
        raise ImplementsError(
            f"the reference's inputs are {op}'s {', '.join(inputs)}; its "
            f"benchmark takes {', '.join(wanted)}"
        )
    return {
        "op": op,
        "inputs": tuple(inputs),
        "computes": site_options(m),
        "capability": _capability(profile, module_text),
    }


def text(decl: dict) -> str:
    """The declaration as the module's last lines (read by registry/generated.py)."""
    return (
        '\n\n# `create --implements`: this kernel is also the "created" implementation of the '
        f"library op\n# {decl['op']}, at its sites that make the call below (compile/generated.py)"
        f"\nIMPLEMENTS = {decl!r}\n"
    )


def _capture(profile: KernelProfile, source: str) -> tuple[torch.fx.GraphModule, list[str]]:
    """The reference as written, captured by Dynamo on bf16 example inputs (as a model in
    training holds them), and its argument names in order."""
    namespace: dict = {}
    exec(compile(source, f"<{profile.name}_pattern>", "exec"), namespace)  # noqa: S102
    fn = namespace[f"{profile.name}_pattern"]
    args = list(inspect.signature(fn).parameters)
    specs = {i.name: i for i in public_inputs(profile)}
    main = profile.inputs[0].example_shape
    gen = torch.Generator().manual_seed(0)
    tensors = []
    masks = {profile.inputs[i].name for i in bool_inputs(profile)}
    for name in args:
        s = specs[name]
        if name in masks:
            tensors.append(torch.rand(s.example_shape, generator=gen) < 0.5)
            continue
        if s.dtype == "int":
            high = max(1, main[-1] if main else 1)
            tensors.append(torch.randint(0, high, s.example_shape, generator=gen))
            continue
        dtype = torch.float32 if s.dtype == "fp32" else torch.bfloat16
        tensors.append(torch.randn(s.example_shape, generator=gen).to(dtype))
    graphs: list[torch.fx.GraphModule] = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    try:
        torch.compile(fn, backend=keep, fullgraph=True, dynamic=False)(*tensors)
    except Exception as e:  # a graph break: fullgraph raises
        raise ImplementsError(
            f"the reference of {profile.name} does not capture as one graph ({type(e).__name__}: "
            f"{str(e).strip().splitlines()[0][:200]})"
        ) from None
    return graphs[0], args


def _placeholders(gm: torch.fx.GraphModule, args: list[str]) -> list:
    """The graph's input node of each argument (None where the graph has none). Dynamo names
    them after the argument (`L_x_`; the case differs between torch versions); failing that,
    the graph takes every argument, in order."""
    nodes = [n for n in gm.graph.nodes if n.op == "placeholder"]
    by_name = {str(n.target).lower(): n for n in nodes}
    got = [by_name.get(f"l_{a}_".lower()) for a in args]
    if None in got and len(nodes) == len(args):
        return nodes
    return got


def _match(gm: torch.fx.GraphModule, op: str, name: str):
    """The match of `op`'s patterns that is the whole captured reference."""
    from torch.fx import Node

    from kernelwright.compile.matchers import MATCHERS

    calls = {n for n in gm.graph.nodes if n.op in ("call_function", "call_method")}
    out = next(n for n in gm.graph.nodes if n.op == "output")
    returned = out.args[0]
    returned = [returned] if isinstance(returned, Node) else list(returned)
    seen = []
    for node in gm.graph.nodes:
        for matcher in MATCHERS:
            m = matcher(node)
            while m is not None:
                seen.append(f"{m.pattern} ({m.op})")
                whole = calls <= set(m.nodes) and returned == (list(m.outputs) or [m.output])
                if m.op == op and m.problem is None and whole:
                    return m
                m = m.fallback
    found = f"; its patterns found: {', '.join(dict.fromkeys(seen))}" if seen else ""
    raise ImplementsError(
        f"the reference of {name} is not {op}'s call as the graph pass "
        f"recognises it (every operation, and the result){found}"
    )


def _capability(profile: KernelProfile, module_text: str) -> dict:
    """What the generated kernel runs, from its module's `BENCH` layout."""
    bench = None
    for node in ast.parse(module_text).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "BENCH" for t in node.targets
        ):
            bench = ast.literal_eval(node.value)
    cap: dict = {"dtypes": DTYPES}
    if bench is None:
        return cap
    traced, block, _, long_rows = bench["layout"][:4]
    if tuple(block) != (len(traced) - 1,):  # the row is not the last dim: the traced rank
        cap["min_rank"] = cap["max_rank"] = len(traced)
    if profile.reduction_dims and not long_rows:  # rows held whole by one program only
        cap["max_row"] = MAX_ROW
    return cap
