"""Norm uses (4, roles): what each norm attribute's output flows into, from its owner's forward.

In-place safety is a dataflow question: the norm's backward may write dx over dy only if no
other branch still reads dy. It is safe when the output reaches exactly one call whose backward
returns a fresh gradient (a linear, a proven attention/MLP/MoE module, another norm, the RoPE
function), through view-like methods at most. A residual sum `residual + norm(h)` hands the same
gradient tensor to both branches, so it is unsafe, and so is anything the walk cannot follow.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from torch import nn

from kernelwright.integrations.transformers.analysis import source as S
from kernelwright.profiles.model import NormUse


@dataclass
class CallGraph:
    """What the analyser knows about the classes a norm's output can flow into."""

    attention_classes: set[str]
    mlp_classes: set[str]  # MLP classes and MoE blocks (for roles)
    norm_classes: set[str]
    rope_call: str | None  # the global name attention forwards call for RoPE
    # MLP classes whose forward matched a known layout (their input feeds linears first)
    proven_mlp_classes: set[str] = field(default_factory=set)

    @property
    def computing_classes(self) -> set[str]:
        # calls whose backward returns a fresh gradient for their input
        return self.attention_classes | self.proven_mlp_classes


def norm_use(owner: nn.Module, attr: str, owner_kind: str, graph: CallGraph) -> NormUse:
    """Role and in-place safety of `owner.<attr>`, from the owner's forward.

    owner_kind: "base" (the text model: its norm is the final one), "decoder", "attention" or
    "other".
    """
    cls = type(owner)
    use = NormUse(attribute=attr, owner_class=cls.__name__, role="other")
    fwd = S.method(cls, "forward")
    if fwd is None:
        return use  # no source: in-place safety stays unproven (False)
    sites = [c for a, c in S.self_calls(fwd.node) if a == attr]
    if not sites:
        use.evidence.append(fwd.ev())  # the forward never calls it: left unproven
        return use
    use.evidence += [fwd.ev(c) for c in sites]
    use.role = _role(owner, owner_kind, fwd, attr, sites[0], graph)
    safe = True
    for call in sites:
        ok, consumers = _feeds_only_computation(owner, fwd, call, graph)
        # the consumer lines show why: `self.mlp(h)` (safe) or `residual + h` (not)
        use.evidence += [fwd.ev(c) for c in consumers if hasattr(c, "lineno")]
        safe = safe and ok
    use.in_place_safe = safe
    return use


def _role(owner, owner_kind: str, fwd: S.Method, attr: str, call: ast.Call, graph: CallGraph):
    if owner_kind == "base":
        return "final"
    if owner_kind == "attention":
        low = attr.lower()
        if low.startswith(("q_", "q_norm", "query")):
            return "q_norm"
        if low.startswith(("k_", "k_norm", "key")):
            return "k_norm"
        return "other"
    if owner_kind != "decoder":
        return "other"
    # a decoder layer: what the norm's output feeds first, then its place between the calls
    lines: dict[str, list[int]] = {"attention": [], "mlp": []}
    norm_lines = []
    for a, c in S.self_calls(fwd.node):
        cname = type(getattr(owner, a, None)).__name__
        if cname in graph.attention_classes:
            lines["attention"].append(c.lineno)
        elif cname in graph.mlp_classes:
            lines["mlp"].append(c.lineno)
        elif cname in graph.norm_classes:
            norm_lines.append(c.lineno)
    far = 10**9
    attn, mlp = min(lines["attention"], default=far), min(lines["mlp"], default=far)
    cons = _consumers(fwd, call)
    target = ""
    if len(cons) == 1 and isinstance(cons[0], ast.Call) and S.self_attr(cons[0].func):
        target = type(getattr(owner, S.self_attr(cons[0].func), None)).__name__
    between = [n for n in norm_lines if attn < n < mlp]
    if target in graph.attention_classes:
        return "input"
    if target in graph.mlp_classes:
        # Gemma2's sandwich: another norm between attention and MLP is the post-attention one
        return "pre_feedforward" if len(between) > 1 else "post_attention"
    line = call.lineno
    if attn == far or mlp == far:
        return "other"
    if attn < line < mlp:
        return "post_attention"
    if line > attn and line > mlp:
        return "post_feedforward"
    return "other"


def _consumers(fwd: S.Method, node: ast.AST, seen: int = 0) -> list[ast.AST]:
    """The nodes that consume `node`'s value: calls, or the unsupported node that stops us."""
    pf = fwd.file
    parent = pf.parent(node)
    if parent is None or seen > 20:
        return [node]
    if (
        isinstance(parent, ast.Attribute)
        and parent.attr in S.VIEW_METHODS
        and isinstance(pf.parent(parent), ast.Call)
        and pf.parent(parent).func is parent
    ):
        return _consumers(fwd, pf.parent(parent), seen + 1)
    if isinstance(parent, ast.Subscript) and parent.value is node:
        return _consumers(fwd, parent, seen + 1)
    if isinstance(parent, ast.keyword):
        parent = pf.parent(parent)
        return [parent] if isinstance(parent, ast.Call) else [node]
    if isinstance(parent, ast.Call) and node is not parent.func:
        return [parent]
    if isinstance(parent, ast.Assign) and parent.value is node:
        if len(parent.targets) != 1 or not isinstance(parent.targets[0], ast.Name):
            return [parent]
        out: list[ast.AST] = []
        for load in _later_loads(fwd, parent, parent.targets[0].id):
            out += _consumers(fwd, load, seen + 1)
        return out or [parent]
    return [parent]


def _later_loads(fwd: S.Method, assign: ast.Assign, name: str) -> list[ast.Name]:
    """Loads of `name` after `assign`, until an unconditional reassignment in the same block."""
    stmts = list(S.statements(fwd.node.body))
    idx = next(i for i, (s, _) in enumerate(stmts) if s is assign)
    block = stmts[idx][1]
    loads: list[ast.Name] = []
    for stmt, blk in stmts[idx + 1 :]:
        heads = _own_expressions(stmt)
        for h in heads:
            for n in ast.walk(h):
                if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load):
                    loads.append(n)
        stores = [
            n
            for t in _targets(stmt)
            for n in ast.walk(t)
            if isinstance(n, ast.Name) and n.id == name
        ]
        if stores and blk == block:
            break
    return loads


def _own_expressions(stmt: ast.stmt) -> list[ast.AST]:
    """The expressions a statement evaluates itself (not those of its nested bodies)."""
    if isinstance(stmt, ast.If | ast.While):
        return [stmt.test]
    if isinstance(stmt, ast.For):
        return [stmt.iter]
    if isinstance(stmt, ast.With):
        return [i.context_expr for i in stmt.items]
    if isinstance(stmt, ast.Try):
        return []
    if isinstance(stmt, ast.Assign):
        return [stmt.value]
    if isinstance(stmt, ast.AugAssign | ast.AnnAssign):
        return [stmt.value] if stmt.value is not None else []
    return [stmt]


def _targets(stmt: ast.stmt) -> list[ast.AST]:
    if isinstance(stmt, ast.Assign):
        return list(stmt.targets)
    if isinstance(stmt, ast.AugAssign | ast.AnnAssign | ast.For):
        return [stmt.target]
    return []


def _feeds_only_computation(owner, fwd: S.Method, call: ast.Call, graph: CallGraph):
    """(safe, consumer nodes): the norm's output reaches only calls whose backward returns a
    fresh gradient (a linear, an attention/MLP/norm module, the RoPE function).

    Anything else is unsafe: a residual sum (the sum's gradient tensor is also the residual
    branch's), a return (consumers not visible), several uses, a call in a loop.
    """
    cons = _consumers(fwd, call)
    if S.in_loop(fwd.node, call, fwd.file) or len(cons) != 1:
        return False, cons
    c = cons[0]
    if not isinstance(c, ast.Call):
        return False, cons
    attr = S.self_attr(c.func)
    if attr is not None:
        sub = getattr(owner, attr, None)
        cname = type(sub).__name__
        ok = S.is_linear(sub) or cname in graph.computing_classes | graph.norm_classes
        return ok, cons
    return S.dotted(c.func) is not None and S.dotted(c.func) == graph.rope_call, cons
