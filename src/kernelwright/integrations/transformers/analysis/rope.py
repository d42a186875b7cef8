"""RoPE (8): the function the attention forward really calls with (q, k, cos, sin).

Resolved through the attention module's globals at analysis time, as Python resolves it at call
time; transformers 5 decorates it (`use_kernel_forward_from_hub`) and the attention class
(`use_kernelized_func`): both are recorded as evidence. Where the forward calls one of two
functions by a config flag (`if self.config.rope_interleave:`), the branch the config takes
is the one analysed. The variant comes from the function's AST (rotate_half: half split;
x[..., ::2] pairs: interleaved; x[..., ::2] pairs concatenated as (rotated evens, rotated
odds) with one angle a pair from cos's first half: deinterleave, DeepSeek-V3's
`apply_rotary_pos_emb_interleave`; torch.chunk halves rotated by tables as given, which then hold
one angle a pair: half_table, GPT-OSS's `_apply_rotary_emb`), the partial factor from the
config, and where the rotated dims are cut (in the function by cos.shape[-1], or by the caller).
Every attention class whose forward makes such a call is a site of its own (DeepSeek-V3.2's
indexer calls a half-split function beside MLA's interleaved one); the decision is patched only
where every site is.
M-RoPE (`mrope_section`: Qwen2-VL, Qwen2.5-VL, Qwen3-VL, GLM-4V) is the ordinary rotation by
tables the rotary-embedding module builds from three position streams; it is patched like any
half-split rope, and checked on tables from three different streams. A rotary function that
takes `mrope_section` itself (picks the streams inside) is left alone.
"""

from __future__ import annotations

import ast
import inspect
from dataclasses import dataclass

import torch

from kernelwright.integrations.transformers.analysis import source as S
from kernelwright.integrations.transformers.analysis.context import Context, text_config
from kernelwright.profiles.model import RopeDecision


def _config_branch(fwd: S.Method, node: ast.AST, ctx: Context) -> tuple[str, bool] | None:
    """(key, value) of the innermost `if self.config.K:` holding node, where the config takes
    the branch; None where node sits under no such test. A branch not taken raises LookupError."""
    child, p = node, fwd.file.parent(node)
    found = None
    while p is not None and p is not fwd.node:
        if isinstance(p, ast.If) and child is not p.test:
            key = S.config_key(p.test)
            if key is not None:
                value = bool(ctx.cfg(key))
                if value != any(child is stmt for stmt in p.body):
                    raise LookupError(key)
                found = found or (key, value)
        child, p = p, fwd.file.parent(p)
    return found


def _rope_call(cls: type, ctx: Context) -> tuple[str, object, ast.Call, S.Method] | None:
    """(global name, function, call node, forward) of the (q, k, cos, sin) call in a forward,
    on the branch the config takes where a config flag picks between two."""
    fwd = S.method(cls, "forward")
    if fwd is None:
        return None
    glb = S.module_globals(fwd.owner)
    for call in S.calls(fwd.node):
        if not isinstance(call.func, ast.Name):
            continue
        fn = glb.get(call.func.id)
        if not callable(fn) or inspect.isclass(fn):
            continue
        try:
            params = list(inspect.signature(fn).parameters)
        except (TypeError, ValueError):
            continue
        if len(params) >= 4 and params[2:4] == ["cos", "sin"]:
            try:
                _config_branch(fwd, call, ctx)
            except LookupError:
                continue  # on the branch the config does not take
            return call.func.id, fn, call, fwd
    return None


@dataclass
class RopeFn:
    """The rotary function the attention calls, and whether the caller cuts q to the rotated
    dims first (then the function sees cos.shape[-1] dims, not the head)."""

    fn: object
    caller_slices: bool = False


def analyze_rope(ctx: Context) -> tuple[RopeDecision, set[str], list[RopeFn]]:
    """(the decision, the attention classes, the function each site's check compares against:
    the decision's own first, then one per `other_sites` entry)."""
    found: dict[str, tuple] = {}
    for name, mods in ctx.classes().items():
        hit = _rope_call(type(mods[0][1]), ctx)
        if hit is not None:
            found[name] = hit
    attention = set(found)
    if not attention:
        # attention classes still matter for norm roles: those owning q/k/v projections
        attention = {
            n
            for n, mods in ctx.classes().items()
            if {"q_proj", "k_proj"} <= {c for c, _ in mods[0][1].named_children()}
        }
        has_rope = ctx.cfg("rope_parameters") is not None or any(
            "rotary" in n.lower() for n in ctx.classes()
        )
        if not has_rope:
            return RopeDecision(status="absent"), attention, []
        return (
            RopeDecision(
                status="unsupported",
                reason="no attention forward calls a global function taking (q, k, cos, sin)",
            ),
            attention,
            [],
        )
    # one site per attention class that calls a rotary function, each analysed and checked on
    # its own (DeepSeek-V3.2: MLA's interleaved function and the indexer's half-split one)
    names = sorted(found)
    d, rope_fn = _analyze_site(ctx, names[0], found[names[0]])
    fns = [rope_fn]
    for name in names[1:]:
        other, other_fn = _analyze_site(ctx, name, found[name])
        d.other_sites.append(other)
        fns.append(other_fn)
        if d.status == "patch" and other.status != "patch":
            d.status = "unsupported"
            d.reason = f"{name} calls {other.call_name}: {other.reason}"
    return d, attention, fns


def _analyze_site(ctx: Context, attn_name: str, hit: tuple) -> tuple[RopeDecision, RopeFn]:
    """The decision for one attention class's (q, k, cos, sin) call, and the function its check
    compares against."""
    call_name, fn, call, fwd = hit
    rope_fn = RopeFn(fn)
    d = RopeDecision(attention_class=attn_name, call_name=call_name)
    d.evidence.append(fwd.ev(call))
    branch = _config_branch(fwd, call, ctx)
    if branch is not None:
        d.evidence.append(S.config_evidence(ctx.text_prefix + branch[0], ctx.cfg(branch[0])))
    # transformers 5 marks the function and the attention for hub kernels; kernelwright
    # replaces the module global the forward resolves at call time
    found_cls = S.class_node(fwd.owner)
    if found_cls is not None:
        d.evidence += S.decorator_evidence(found_cls[0].decorator_list, found_cls[1])
    fdef = S.function(fn)
    if fdef is None:
        d.reason = f"no source for {call_name}"
        d.status = "unsupported"
        return d, rope_fn
    target = inspect.unwrap(fn)
    d.function = f"{target.__module__}.{target.__qualname__}"
    d.evidence.append(fdef.ev())
    d.evidence += S.decorator_evidence(fdef.node.decorator_list, fdef.file)
    if inspect.unwrap(fn) is not fn:
        ctx.notes.append(f"{call_name} is wrapped by a decorator at import time")
    sig = inspect.signature(fn)
    if "unsqueeze_dim" in sig.parameters:
        default = sig.parameters["unsqueeze_dim"].default
        d.unsqueeze_dim = int(default) if isinstance(default, int) else 1
    for kw in call.keywords:
        if kw.arg == "unsqueeze_dim" and S.const_number(kw.value) is not None:
            d.unsqueeze_dim = int(S.const_number(kw.value))
    if len(call.args) > 4 and S.const_number(call.args[4]) is not None:
        d.unsqueeze_dim = int(S.const_number(call.args[4]))
    rp = ctx.cfg("rope_parameters") or {}
    if "mrope_section" in sig.parameters:
        # the sections are picked inside the function from 3-stream tables: no kernel takes those
        d.reason = (
            f"{call_name} takes mrope_section and picks the position stream of each frequency "
            "itself; the rope kernel takes cos/sin tables that are already sectioned"
        )
        d.status = "unsupported"
        return d, rope_fn
    # M-RoPE (Qwen2-VL and kin): the rotary-embedding module builds cos/sin from three position
    # streams (temporal, height, width), a section of frequencies each, and the attention
    # applies the ordinary rotation to those tables; the check feeds three distinct streams,
    # so a function that did more than rotate by the tables would fail it
    d.evidence += _mrope_evidence(ctx, rp)
    relaid = _relays_tables(fdef)
    if relaid is not None:
        d.evidence.append(fdef.ev(relaid))
        d.reason = (
            f"{call_name} re-lays out cos/sin inside the function (GLM-style "
            "repeat_interleave); the kernel takes the tables as the rotary embedding gives them"
        )
        d.status = "unsupported"
        return d, rope_fn
    variant, lines = _rope_variant(fdef)
    d.evidence += [fdef.ev(n) for n in lines]
    if variant is None:
        d.reason = f"{call_name}: neither rotate_half (half split) nor an interleaved rotation"
        d.status = "unsupported"
        return d, rope_fn
    d.variant = variant
    factor, key = _partial_factor(ctx)
    d.partial_rotary_factor = factor
    if key:
        d.evidence.append(S.config_evidence(ctx.text_prefix + key, factor))
    slices = _slices_rot_dim(fdef) if variant != "deinterleave" else None
    if slices is not None:
        d.evidence.append(fdef.ev(slices))  # the function passes dims past cos.shape[-1] through
    elif factor < 1.0:
        caller = _caller_slices(fwd, call)
        if caller is not None:
            rope_fn.caller_slices = True  # Phi/StableLM hand it q[..., :rotary_dims] only
            d.evidence.append(fwd.ev(caller))
        else:
            d.reason = (
                f"partial_rotary_factor {factor} but neither {call_name} nor its caller "
                "slices the rotated dims"
            )
            d.status = "unsupported"
    if isinstance(rp, dict) and rp.get("rope_type", "default") != "default":
        key = ctx.text_prefix + "rope_parameters.rope_type"
        d.evidence.append(S.config_evidence(key, rp["rope_type"]))
    return d, rope_fn


def _mrope_evidence(ctx: Context, rp) -> list:
    """Where the sections come from: the config's `mrope_section`, or the rotary module's own
    (the modeling code's default, when the config has none)."""
    if isinstance(rp, dict) and "mrope_section" in rp:
        key = ctx.text_prefix + "rope_parameters.mrope_section"
        return [S.config_evidence(key, rp["mrope_section"])]
    rot = _rotary_module(ctx)
    sections = getattr(rot, "mrope_section", None) if rot is not None else None
    if sections is None:
        return []
    out = []
    for name, (value, m) in S.init_assignments(type(rot)).items():
        if name == "mrope_section":
            out.append(m.ev(value))
    out.append(
        S.check_evidence(
            f"{type(rot).__name__}.mrope_section = {sections} (the modeling code's default: "
            "the config has none): cos/sin from 3 position streams"
        )
    )
    return out


def _caller_slices(fwd: S.Method, call: ast.Call) -> ast.stmt | None:
    """The assignment that cuts the call's q argument to `q[..., :n]`, or takes it from a split
    of the last dim (`q_pass, q_rot = torch.split(q, [a, b], dim=-1)`, MLA), if the caller does."""
    if not call.args or not isinstance(call.args[0], ast.Name):
        return None
    name = call.args[0].id
    for stmt, _ in S.statements(fwd.node.body):
        if not isinstance(stmt, ast.Assign) or stmt.lineno > call.lineno:
            continue
        stored = {n.id for t in stmt.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        if name not in stored:
            continue
        if _splits_last_dim(stmt.value):
            return stmt
        for sub in ast.walk(stmt.value):
            if (
                isinstance(sub, ast.Subscript)
                and isinstance(sub.slice, ast.Tuple)
                and isinstance(sub.slice.elts[0], ast.Constant)
                and sub.slice.elts[0].value is Ellipsis
                and isinstance(sub.slice.elts[-1], ast.Slice)
                and sub.slice.elts[-1].upper is not None
                and sub.slice.elts[-1].lower is None
            ):
                return stmt
    return None


def _splits_last_dim(node: ast.expr) -> bool:
    """`torch.split(x, [a, b], dim=-1)` or `x.split([a, b], dim=-1)`."""
    if not isinstance(node, ast.Call) or not (
        S.dotted(node.func) == "torch.split"
        or (isinstance(node.func, ast.Attribute) and node.func.attr == "split")
    ):
        return False
    dims = [kw.value for kw in node.keywords if kw.arg == "dim"]
    dims += node.args[2:3] if S.dotted(node.func) == "torch.split" else node.args[1:2]
    return bool(dims) and S.const_number(dims[0]) == -1.0


def _relays_tables(fdef: S.Method) -> ast.stmt | None:
    """The statement that rebuilds cos or sin (`cos = cos[..., :d // 2].repeat_interleave(2)`)."""
    for stmt, _ in S.statements(fdef.node.body):
        if not isinstance(stmt, ast.Assign):
            continue
        names = {n.id for t in stmt.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        if names & {"cos", "sin"} and any(
            isinstance(c.func, ast.Attribute) and c.func.attr in ("repeat_interleave", "repeat")
            for c in S.calls(stmt.value)
        ):
            return stmt
    return None


def _rope_variant(fdef: S.Method) -> tuple[str | None, list[ast.AST]]:
    for call in S.calls(fdef.node):
        if isinstance(call.func, ast.Name) and "rotate" in call.func.id:
            helper = _global_function(fdef, call.func.id)
            if helper is not None and _is_rotate_half(helper):
                return "half_split", [call, helper.node]
            if helper is not None and _is_interleaved(helper):
                return "interleaved", [call, helper.node]
    for call in S.calls(fdef.node):
        # a helper that rotates one tensor by the tables (GPT-OSS's _apply_rotary_emb(q, cos, sin))
        args = {a.id for a in call.args if isinstance(a, ast.Name)}
        if isinstance(call.func, ast.Name) and {"cos", "sin"} <= args:
            helper = _global_function(fdef, call.func.id)
            nodes = _half_table_nodes(helper) if helper is not None else []
            if nodes:
                return "half_table", [call, *nodes]
    deinterleave = _deinterleave_nodes(fdef)
    if deinterleave:
        return "deinterleave", deinterleave
    half_table = _half_table_nodes(fdef)
    if half_table:
        return "half_table", half_table
    if _is_interleaved(fdef):
        return "interleaved", [fdef.node]
    return None, []


def _deinterleave_nodes(m: S.Method) -> list[ast.AST]:
    """[the table cut, the concatenation] of a function that rotates x[..., 0::2] / x[..., 1::2]
    pairs by one angle each, read from cos's first half (`cos[..., : cos.shape[-1] // 2]`), and
    writes them as cat((rotated evens, rotated odds)): half-split output from interleaved input.
    Empty where any part is missing."""
    if not _is_interleaved(m):
        return []
    cut = next(
        (
            stmt
            for stmt, _ in S.statements(m.node.body)
            if isinstance(stmt, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "cos" for t in stmt.targets)
            and "cos[..., :cos.shape[-1] // 2]" in ast.unparse(stmt.value)
        ),
        None,
    )
    cat = next(
        (
            c
            for c in S.calls(m.node)
            if S.dotted(c.func) in ("torch.cat", "torch.concat", "torch.concatenate")
            and c.args
            and isinstance(c.args[0], ast.Tuple | ast.List)
            and len(c.args[0].elts) == 2
            and all(isinstance(e, ast.BinOp) for e in c.args[0].elts)
        ),
        None,
    )
    return [cut, cat] if cut is not None and cat is not None else []


def _half_table_nodes(m: S.Method) -> list[ast.AST]:
    """[the split, the concatenation] of a function that splits x into halves (a, b) =
    torch.chunk(x, 2, dim=-1) and returns cat((a * cos - b * sin, b * cos + a * sin), dim=-1)
    with cos and sin as given: half-split pairs by tables that hold one angle a pair (GPT-OSS,
    whose rotary embedding returns the angles once, [.., D/2], not [f, f]). Empty where any part
    differs."""
    assigned: dict[str, ast.expr] = {}
    split = halves = None
    for stmt, _ in S.statements(m.node.body):
        if not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1:
            continue
        target = stmt.targets[0]
        if isinstance(target, ast.Name):
            assigned[target.id] = stmt.value
        elif (
            isinstance(target, ast.Tuple)
            and len(target.elts) == 2
            and all(isinstance(e, ast.Name) for e in target.elts)
            and _chunks_in_two(stmt.value)
        ):
            split, halves = stmt, tuple(e.id for e in target.elts)
    if split is None:
        return []
    tables = [n for n in ast.walk(m.node) if isinstance(n, ast.Name) and n.id in ("cos", "sin")]
    if any(isinstance(p, ast.Subscript | ast.Attribute) for p in _parents(m, tables)):
        return []  # the tables are cut or re-laid out, not used as given

    def product(node) -> frozenset | None:
        if (
            isinstance(node, ast.BinOp)
            and isinstance(node.op, ast.Mult)
            and isinstance(node.left, ast.Name)
            and isinstance(node.right, ast.Name)
        ):
            return frozenset((node.left.id, node.right.id))
        return None

    a, b = halves
    for call in S.calls(m.node):
        if S.dotted(call.func) not in ("torch.cat", "torch.concat", "torch.concatenate"):
            continue
        if not call.args or not isinstance(call.args[0], ast.Tuple | ast.List):
            continue
        parts = [assigned.get(e.id) if isinstance(e, ast.Name) else e for e in call.args[0].elts]
        if len(parts) != 2 or not all(isinstance(p, ast.BinOp) for p in parts):
            continue
        first, second = parts
        ok = (
            isinstance(first.op, ast.Sub)
            and product(first.left) == {a, "cos"}
            and product(first.right) == {b, "sin"}
            and isinstance(second.op, ast.Add)
            and {product(second.left), product(second.right)}
            == {
                frozenset((b, "cos")),
                frozenset((a, "sin")),
            }
        )
        if ok:
            return [split, call]
    return []


def _chunks_in_two(node: ast.expr) -> bool:
    """`torch.chunk(x, 2, dim=-1)` or `x.chunk(2, dim=-1)` (the dim as a keyword or positional)."""
    if not isinstance(node, ast.Call):
        return False
    if S.dotted(node.func) == "torch.chunk":
        rest = node.args[1:]
    elif isinstance(node.func, ast.Attribute) and node.func.attr == "chunk":
        rest = node.args
    else:
        return False
    dims = [kw.value for kw in node.keywords if kw.arg == "dim"] + rest[1:2]
    return (
        bool(rest)
        and S.const_number(rest[0]) == 2.0
        and bool(dims)
        and S.const_number(dims[0]) == -1.0
    )


def _parents(m: S.Method, nodes: list[ast.AST]) -> list[ast.AST]:
    return [p for n in nodes if (p := m.file.parent(n)) is not None]


def _global_function(fdef: S.Method, name: str) -> S.Method | None:
    for node in fdef.file.tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return S.Method(node, fdef.file, None)
    return None


def _is_rotate_half(m: S.Method) -> bool:
    # x1 = x[..., : d // 2]; x2 = x[..., d // 2 :]; cat((-x2, x1), -1)
    src = ast.unparse(m.node)
    halves = "// 2" in src
    cat = any(
        S.dotted(c.func) in ("torch.cat", "torch.concat", "torch.concatenate")
        and c.args
        and isinstance(c.args[0], ast.Tuple | ast.List)
        and len(c.args[0].elts) == 2
        and isinstance(c.args[0].elts[0], ast.UnaryOp)
        and isinstance(c.args[0].elts[0].op, ast.USub)
        for c in S.calls(m.node)
    )
    return halves and cat


def _is_interleaved(m: S.Method) -> bool:
    # x[..., ::2] and x[..., 1::2] stacked back: pairs (x0, x1) rotate together
    steps = [
        n
        for n in ast.walk(m.node)
        if isinstance(n, ast.Slice) and n.step is not None and S.const_number(n.step) == 2.0
    ]
    return len(steps) >= 2


def _slices_rot_dim(fdef: S.Method) -> ast.AST | None:
    for n in ast.walk(fdef.node):
        if isinstance(n, ast.Subscript) and ast.unparse(n) in ("cos.shape[-1]", "sin.shape[-1]"):
            return n
    return None


def _partial_factor(ctx: Context) -> tuple[float, str | None]:
    rp = ctx.cfg("rope_parameters")
    if isinstance(rp, dict) and rp.get("partial_rotary_factor") is not None:
        return float(rp["partial_rotary_factor"]), "rope_parameters.partial_rotary_factor"
    v = ctx.cfg("partial_rotary_factor")
    if v is not None:
        return float(v), "partial_rotary_factor"
    return 1.0, None


def _rotary_module(ctx: Context):
    """The text path's rotary-embedding module: the first holding an inv_freq buffer."""
    return next(
        (
            m
            for m in ctx.modules.values()
            if any("inv_freq" in n for n, _ in m.named_buffers(recurse=False))
        ),
        None,
    )


def rotary_tables(ctx: Context, batch: int = 2, seq: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin from the model's own rotary-embedding module at random positions."""
    rot = _rotary_module(ctx)
    if rot is None:
        raise ValueError("no rotary-embedding module (one holding an inv_freq buffer) found")
    hidden = text_config(ctx.tiny.config).hidden_size
    x = torch.zeros(batch, seq, hidden)
    gen = torch.Generator().manual_seed(3)
    rp = getattr(text_config(ctx.tiny.config), "rope_parameters", None)
    if getattr(rot, "mrope_section", None) is not None or (
        isinstance(rp, dict) and "mrope_section" in rp
    ):
        # M-RoPE: one position stream per section (temporal, height, width), all different
        pos = torch.randint(0, 512, (3, batch, seq), generator=gen)
    else:
        pos = torch.randint(0, 512, (batch, seq), generator=gen)
    kwargs = {}
    if "layer_type" in inspect.signature(rot.forward).parameters:
        kwargs["layer_type"] = sorted(getattr(rot, "layer_types", ["full_attention"]))[0]
    with torch.no_grad():
        cos, sin = rot(x, pos, **kwargs)
    return cos, sin
