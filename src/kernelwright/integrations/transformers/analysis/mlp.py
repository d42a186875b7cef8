"""MLP classes from their forward's AST: activation, layout and projection attribute names.

The forward is evaluated into a small expression tree over the input x:
`lin(attr, ...)` for a call of an nn.Linear child, `act(name, ...)`, `mul(a, b)`, `chunk(i, ...)`.
The returned tree must be one of the three layouts our kernels implement:
- separate:      lin(down, mul(act(lin(gate, x)), lin(up, x)))
- fused_gate_up: lin(down, mul(act(chunk(0, lin(gate_up, x))), chunk(1, lin(gate_up, x))))
- non_gated:     lin(down, act(lin(up, x)))          (relu_squared only)
The activation is what the forward calls (an activation module, resolved through the instance and
`ACT2CLS`, or an `F.silu`/`F.gelu` call), and the config key its `__init__` reads it from.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from torch import nn

from kernelwright import registry
from kernelwright.integrations.transformers.analysis import source as S
from kernelwright.profiles.model import Evidence, MLPDecision

# config value of the activation -> the gated kernel (or relu_squared for the non-gated layout),
# as the ops' registry entries declare them (HFPattern.config_values)
ACTIVATIONS = registry.hf_activations()
_FUNCS = {
    "F.silu": "silu",
    "nn.functional.silu": "silu",
    "torch.nn.functional.silu": "silu",
    "F.gelu": "gelu",
    "nn.functional.gelu": "gelu",
    "torch.nn.functional.gelu": "gelu",
}


@dataclass(frozen=True)
class _T:
    """A node of the expression tree: op in {"x", "lin", "act", "mul", "chunk", "tuple", "?"}."""

    op: str
    name: str | None = None  # the linear's attribute / the activation's key
    args: tuple = ()
    index: int | None = None  # chunk index
    line: int | None = None


_UNKNOWN = _T("?")


class _Eval:
    def __init__(self, module: nn.Module, m: S.Method):
        self.module, self.m = module, m
        self.act_lines: list[int] = []
        self.chunk_lines: list[int] = []  # where gate_up splits: which half is the gate

    def run(self) -> _T:
        env: dict[str, _T] = {}
        params = self.m.params[1:]
        if params:
            env[params[0]] = _T("x")
        for stmt in self.m.node.body:
            if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
                continue
            if isinstance(stmt, ast.Return) and stmt.value is not None:
                return self.expr(stmt.value, env)
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                value = self.expr(stmt.value, env)
                target = stmt.targets[0]
                if isinstance(target, ast.Name):
                    env[target.id] = value
                    continue
                unpack = isinstance(target, ast.Tuple) and value.op == "tuple"
                if unpack and len(target.elts) == len(value.args):
                    for t, v in zip(target.elts, value.args, strict=True):
                        if isinstance(t, ast.Name):
                            env[t.id] = v
                    continue
            return _UNKNOWN  # control flow or unpacking we do not follow
        return _UNKNOWN

    def expr(self, node: ast.expr, env: dict[str, _T]) -> _T:
        if isinstance(node, ast.Name):
            return env.get(node.id, _UNKNOWN)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            return _T("mul", args=(self.expr(node.left, env), self.expr(node.right, env)))
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            base = self.expr(node.value, env)
            if base.op == "tuple" and isinstance(node.slice.value, int):
                return base.args[node.slice.value]
            return _UNKNOWN
        if not isinstance(node, ast.Call):
            return _UNKNOWN
        attr = S.self_attr(node.func)
        args = [self.expr(a, env) for a in node.args]
        if attr is not None:
            sub = getattr(self.module, attr, None)
            if isinstance(sub, nn.Linear) and len(args) == 1:
                return _T("lin", attr, (args[0],), line=node.lineno)
            if isinstance(sub, nn.Module) and len(args) == 1 and not list(sub.children()):
                key = _activation_key(sub)
                self.act_lines.append(node.lineno)
                return _T("act", key or f"<{type(sub).__name__}>", (args[0],), line=node.lineno)
            return _UNKNOWN
        fname = S.dotted(node.func)
        if fname in _FUNCS and args:
            key = _FUNCS[fname]
            approx = {k.arg: k.value for k in node.keywords}.get("approximate")
            if key == "gelu" and isinstance(approx, ast.Constant) and approx.value == "tanh":
                key = "gelu_pytorch_tanh"
            self.act_lines.append(node.lineno)
            return _T("act", key, (args[0],), line=node.lineno)
        if isinstance(node.func, ast.Attribute) and node.func.attr == "chunk":
            recv = self.expr(node.func.value, env)
            n = node.args[0] if node.args else None
            dim = {k.arg: k.value for k in node.keywords}.get("dim")
            dim = dim if dim is not None else (node.args[1] if len(node.args) > 1 else None)
            if S.const_number(n) == 2.0 and dim is not None and S.const_number(dim) == -1.0:
                self.chunk_lines.append(node.lineno)
                halves = (_T("chunk", args=(recv,), index=0), _T("chunk", args=(recv,), index=1))
                return _T("tuple", args=halves)
        return _UNKNOWN


def _activation_key(module: nn.Module) -> str | None:
    """The ACT2CLS key of an activation module's class (plain entries: no constructor kwargs)."""
    from transformers.activations import ACT2CLS

    keys = [k for k, e in ACT2CLS.items() if not isinstance(e, tuple) and type(module) is e]
    return keys[0] if len(keys) == 1 else None


def _same_x(*trees: _T) -> bool:
    return all(t.op == "x" for t in trees)


def _match(tree: _T):
    """(layout, gate, up, gate_up, down, act, gate_half) or None."""
    if tree.op != "lin":
        return None
    down, inner = tree.name, tree.args[0]
    if inner.op == "act":
        src = inner.args[0]
        if src.op == "lin" and _same_x(src.args[0]):
            return ("non_gated", None, src.name, None, down, inner.name, None)
        return None
    if inner.op != "mul":
        return None
    for a, b in (inner.args, inner.args[::-1]):
        if a.op != "act":
            continue
        g = a.args[0]
        if g.op == "lin" and b.op == "lin" and _same_x(g.args[0], b.args[0]) and g.name != b.name:
            return ("separate", g.name, b.name, None, down, a.name, None)
        if g.op == "chunk" and b.op == "chunk" and g.index != b.index:
            src_g, src_b = g.args[0], b.args[0]
            if (
                src_g.op == src_b.op == "lin"
                and src_g.name == src_b.name
                and _same_x(src_g.args[0], src_b.args[0])
            ):
                return ("fused_gate_up", None, None, src_g.name, down, a.name, g.index)
    return None


def analyze_mlp_class(module: nn.Module, config) -> MLPDecision | None:
    """The MLPDecision of `module`'s class, or None when its forward is no gated/ReLU² MLP.

    A class named like an MLP ("MLP", "FeedForward", "FFN") whose forward does not match is
    returned as unsupported with the reason.
    """
    cls = type(module)
    named_mlp = any(s in cls.__name__.lower() for s in ("mlp", "feedforward", "ffn"))
    if sum(isinstance(c, nn.Linear) for c in module.children()) < 2:
        if named_mlp and not any(isinstance(p, nn.Parameter) for p in module.parameters()):
            return None
        return _unsupported(cls, "not two or more nn.Linear projections") if named_mlp else None
    fwd = S.method(cls, "forward")
    if fwd is None:
        return _unsupported(cls, "no Python source for its forward") if named_mlp else None
    ev = _Eval(module, fwd)
    tree = ev.run()
    found = _match(tree)
    if found is None:
        if named_mlp:
            return _unsupported(
                cls,
                "forward is not down(act(gate(x)) * up(x)), down(act(chunk(gate_up(x)))) or "
                "down(act(up(x)))",
                [fwd.ev()],
            )
        return None
    layout, gate, up, gate_up, down, act_key, gate_half = found
    evidence = [fwd.ev(tree.line)] if tree.line else [fwd.ev()]
    lines = sorted(set(ev.chunk_lines + ev.act_lines) - {tree.line})
    evidence += [fwd.ev(line) for line in lines]
    d = MLPDecision(
        class_name=cls.__name__,
        layout=layout,
        gate_attribute=gate,
        up_attribute=up,
        gate_up_attribute=gate_up,
        down_attribute=down,
        evidence=evidence,
    )
    # the config key __init__ reads the activation from: `self.act_fn = ACT2FN[config.K]`
    for attr, (value, m) in S.init_assignments(cls).items():
        if not isinstance(value, ast.Subscript) or S.dotted(value.value) != "ACT2FN":
            continue
        key = S.config_key(value.slice)
        sub = getattr(module, attr, None)
        if key is None or not isinstance(sub, nn.Module):
            continue
        configured = getattr(config, key, None)
        d.evidence += [m.ev(value), S.config_evidence(key, configured)]
        if configured_class_matches(configured, sub):
            act_key = configured
        elif configured != act_key:
            return _flip(
                d, f"config {key}={configured!r} but the module calls {type(sub).__name__}"
            )
    d.hidden_act = act_key
    activation = ACTIVATIONS.get(act_key)
    if activation is None:
        return _flip(d, f"activation {act_key!r} has no kernel (supported: {sorted(ACTIVATIONS)})")
    d.activation = activation
    if layout == "non_gated" and activation != "relu_squared":
        return _flip(d, f"non-gated MLP with {act_key!r}: only relu2 has a non-gated kernel")
    if layout != "non_gated" and activation == "relu_squared":
        return _flip(d, "gated MLP with relu2: no gated relu² kernel")
    if layout == "fused_gate_up" and gate_half != 0:
        return _flip(
            d,
            f"{gate_up} holds [up | gate] (the activation takes the second half); "
            "swiglu_fused/geglu_fused take [gate | up]",
        )
    return d


def configured_class_matches(key, module: nn.Module) -> bool:
    from transformers.activations import ACT2CLS

    entry = ACT2CLS.get(key)
    cls = entry[0] if isinstance(entry, tuple) else entry
    return cls is not None and type(module) is cls


def _unsupported(cls: type, why: str, evidence: list[Evidence] | None = None) -> MLPDecision:
    return MLPDecision(
        class_name=cls.__name__, status="unsupported", reason=why, evidence=evidence or []
    )


def _flip(d: MLPDecision, reason: str) -> MLPDecision:
    d.reason = reason
    d.status = "unsupported"
    return d
