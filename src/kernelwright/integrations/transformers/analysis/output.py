"""Output (9), logits (10) and lm-head (11) from the causal-LM forward and the instance."""

from __future__ import annotations

import ast

from torch import nn

from kernelwright.integrations.transformers.analysis import source as S
from kernelwright.integrations.transformers.analysis.context import Context
from kernelwright.profiles.model import LMHeadDecision, LogitsDecision, OutputDecision


def analyze_output(ctx: Context) -> OutputDecision:
    """Which `self.X(...)` call gives the hidden states, which field of its output is read,
    which attribute is the lm-head, and the output class the forward returns."""
    cls = ctx.target.model_cls
    d = OutputDecision(causal_lm_class=cls.__name__, vocab_size=ctx.cfg("vocab_size"))
    d.evidence.append(ctx.cfg_ev("vocab_size"))
    fwd = S.method(cls, "forward")
    if fwd is None:
        d.reason = f"no source for {cls.__name__}.forward"
        d.status = "unsupported"
        return d
    # the causal LM calls the module on the path to the text decoder (`self.model`)
    first = ctx.text_model_path.split(".")[0] if ctx.text_model_path else None
    base = ctx.tiny.get_submodule(first) if first else ctx.tiny.base_model
    head = ctx.tiny.get_output_embeddings()
    # or the text decoder itself through a path (OPT, BART: `self.model.decoder(...)`)
    decoder = ctx.tiny.get_submodule(ctx.text_model_path) if ctx.text_model_path else None
    base_var, head_found = None, False
    for attr, call in _self_path_calls(fwd.node):
        try:
            sub = ctx.tiny.get_submodule(attr)
        except AttributeError:
            continue
        if (sub is base or sub is decoder) and d.base_model_attribute is None:
            d.base_model_attribute = attr
            d.evidence.append(fwd.ev(call))
            stmt = S.enclosing_statement(call, fwd.file)
            target = _assign_target(stmt)
            if target is not None:
                base_var = target
        elif sub is head and head is not None and "." not in attr:
            d.lm_head_attribute, head_found = attr, True
            d.evidence.append(fwd.ev(call))
    if base_var is not None:
        # `hidden_states = outputs.last_hidden_state` (or `outputs[0]`, the same first field)
        for stmt, _ in S.statements(fwd.node.body):
            v = getattr(stmt, "value", None)
            if not isinstance(stmt, ast.Assign) or not isinstance(v, ast.Attribute | ast.Subscript):
                continue
            if not (isinstance(v.value, ast.Name) and v.value.id == base_var):
                continue
            if isinstance(v, ast.Attribute):
                d.hidden_state_field = v.attr
            elif S.const_number(v.slice) == 0.0:
                d.hidden_state_field = "last_hidden_state"
            else:
                continue
            d.evidence.append(fwd.ev(stmt))
            break
    for n in ast.walk(fwd.node):
        if isinstance(n, ast.Return) and isinstance(n.value, ast.Call):
            name = S.dotted(n.value.func)
            if name:
                d.output_class = name.rsplit(".", 1)[-1]
                d.evidence.append(fwd.ev(n))
                break
    if d.base_model_attribute is None or not head_found:
        missing = "base-model call" if d.base_model_attribute is None else "lm_head call"
        d.reason = f"{cls.__name__}.forward: {missing} not found"
        d.status = "unsupported"
    return d


def _self_path_calls(fn: ast.FunctionDef) -> list[tuple[str, ast.Call]]:
    """('model.decoder', call) for every `self.model.decoder(...)` (any depth), in source order."""
    found = []
    for call in S.calls(fn):
        path = S.dotted(call.func)
        if path and path.startswith("self.") and path.count(".") <= 3:
            found.append((path[len("self.") :], call))
    return sorted(found, key=lambda ac: (ac[1].lineno, ac[1].col_offset))


def _assign_target(stmt) -> str | None:
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
        t = stmt.targets[0]
    elif isinstance(stmt, ast.AnnAssign):
        t = stmt.target
    else:
        return None
    return t.id if isinstance(t, ast.Name) else None


def analyze_logits(ctx: Context, output: OutputDecision) -> LogitsDecision:
    """Soft-capping and scaling applied to the lm-head's output, constants from the config.

    Every later assignment to the logits variable must be `z / K`, `z * K` or `tanh(z)`
    (casts are ignored); anything else makes the decision unsupported, since the fused loss
    would compute something else. A guard `if self.config.K is not None:` whose key is None in
    this config leaves its statements out.
    """
    d = LogitsDecision(status="absent")
    fwd = S.method(ctx.target.model_cls, "forward")
    if fwd is None or output.lm_head_attribute is None:
        return d
    init = S.init_assignments(ctx.target.model_cls)
    stmts = list(S.statements(fwd.node.body))
    start, var = None, None
    for i, (stmt, _) in enumerate(stmts):
        call = getattr(stmt, "value", None)
        if isinstance(call, ast.Call) and S.self_attr(call.func) == output.lm_head_attribute:
            start, var = i, _assign_target(stmt)
            break
    if start is None or var is None:
        return d
    key_of = _config_keys(fwd.node, init)
    ops: list[tuple[str, str | None, float | None, ast.AST]] = []
    for stmt, _ in stmts[start + 1 :]:
        if not (
            isinstance(stmt, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == var for t in stmt.targets)
        ):
            continue
        # `if config.<key> is not None:` with the key None in this config: the transform is
        # inactive here, but the key is still recorded (the patched forward reads its value at
        # every call, as the original does, so a config that sets it gets it)
        guard = _inactive_guard(ctx, fwd, stmt, key_of)
        if guard is not None:
            d.evidence.append(fwd.ev(guard))
        v = stmt.value
        capped = _one_line_softcap(v, var)
        if isinstance(v, ast.BinOp) and isinstance(v.left, ast.Name) and v.left.id == var:
            op = {ast.Div: "divide", ast.Mult: "multiply"}.get(type(v.op))
            key = key_of(v.right)
            const = S.const_number(v.right)
            value = getattr(ctx.text_config, key, None) if key else const
            if op is None or (value is None and (guard is None or key is None)):
                d.reason = f"unrecognised logits transform: {ast.unparse(stmt)}"
                d.status = "unsupported"
                return d
            ops.append((op, key, None if value is None else float(value), stmt))
        elif isinstance(v, ast.Call) and S.dotted(v.func) in (*_TANH, f"{var}.tanh"):
            ops.append(("tanh", None, None, stmt))
        elif capped is not None:
            # `tanh(z / K) * K` in one statement (RecurrentGemma): the three steps, one line
            key = key_of(capped)
            value = getattr(ctx.text_config, key, None) if key else S.const_number(capped)
            if value is None and (guard is None or key is None):
                d.reason = f"unrecognised logits transform: {ast.unparse(stmt)}"
                d.status = "unsupported"
                return d
            value = None if value is None else float(value)
            ops += [("divide", key, value, stmt), ("tanh", None, None, stmt)]
            ops.append(("multiply", key, value, stmt))
        elif (
            isinstance(v, ast.Call)
            and isinstance(v.func, ast.Attribute)
            and v.func.attr in ("float", "to", "contiguous")
        ):
            continue
        else:
            d.reason = f"unrecognised logits transform: {ast.unparse(stmt)}"
            d.status = "unsupported"
            return d
    d.evidence += [fwd.ev(s) for *_, s in ops]
    kinds = [o[0] for o in ops]
    if "tanh" in kinds:
        i = kinds.index("tanh")
        pre, post = ops[i - 1] if i else None, ops[i + 1] if i + 1 < len(ops) else None
        # softcap * tanh(z / softcap): the same constant divides before and multiplies after
        capped = pre and post and (pre[0], post[0]) == ("divide", "multiply")
        if not (capped and pre[2] == post[2]):
            d.reason = f"tanh on the logits not as softcap * tanh(z / softcap): {kinds}"
            d.status = "unsupported"
            return d
        d.softcap, d.softcap_config_key = pre[2], pre[1]
        if pre[1]:
            d.evidence.append(ctx.cfg_ev(pre[1]))
        ops = ops[: i - 1] + ops[i + 2 :]
        if ops and ops[0][3].lineno > post[3].lineno:
            d.reason = "logits scaled after soft-capping; the fused loss scales before"
            d.status = "unsupported"
            return d
    if len(ops) > 1:
        d.reason = f"more than one logits scaling: {[o[0] for o in ops]}"
        d.status = "unsupported"
        return d
    if ops:
        d.scale_op, d.scale_config_key, d.scale = ops[0][0], ops[0][1], ops[0][2]
        if ops[0][1]:
            d.evidence.append(ctx.cfg_ev(ops[0][1]))
    if d.softcap is not None or d.softcap_config_key or d.scale_op is not None:
        d.status = "patch"
    return d


_TANH = ("torch.tanh", "nn.functional.tanh", "F.tanh", "torch.nn.functional.tanh")


def _one_line_softcap(v: ast.expr, var: str) -> ast.expr | None:
    """K when `v` is `tanh(var / K) * K` (the same K twice), else None."""
    if not (isinstance(v, ast.BinOp) and isinstance(v.op, ast.Mult)):
        return None
    call, k = v.left, v.right
    if not (isinstance(call, ast.Call) and S.dotted(call.func) in _TANH and len(call.args) == 1):
        return None
    inner = call.args[0]
    if (
        isinstance(inner, ast.BinOp)
        and isinstance(inner.op, ast.Div)
        and isinstance(inner.left, ast.Name)
        and inner.left.id == var
        and ast.unparse(inner.right) == ast.unparse(k)
    ):
        return k
    return None


def _config_keys(fn: ast.FunctionDef, init):
    """key_of(node): the config key an expression of the forward reads, if any: through
    `self.config.K`, `self.X` set from one in __init__, `self.config.get_text_config().K`, or a
    local name bound to one (`cap = self.config.K`, `(cap := ...) is not None`)."""

    def direct(node: ast.AST) -> str | None:
        key = S.config_key(node, init)
        if (
            key is None
            and isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Call)
            and S.dotted(node.value.func) == "self.config.get_text_config"
        ):
            key = node.attr
        return key

    local: dict[str, str] = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.NamedExpr) and direct(node.value):
            local[node.target.id] = direct(node.value)
        elif (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and direct(node.value)
        ):
            local[node.targets[0].id] = direct(node.value)

    def key_of(node: ast.AST) -> str | None:
        if isinstance(node, ast.NamedExpr):
            node = node.value
        if isinstance(node, ast.Name):
            return local.get(node.id)
        return direct(node)

    return key_of


def _inactive_guard(ctx: Context, fwd: S.Method, stmt: ast.stmt, key_of) -> ast.If | None:
    """The `if <config key> is not None:` around `stmt` when the config value is None."""
    p = fwd.file.parent(stmt)
    while p is not None and p is not fwd.node:
        if isinstance(p, ast.If):
            t = p.test
            if (
                isinstance(t, ast.Compare)
                and len(t.ops) == 1
                and isinstance(t.ops[0], ast.IsNot)
                and isinstance(t.comparators[0], ast.Constant)
                and t.comparators[0].value is None
            ):
                key = key_of(t.left)
                if key and getattr(ctx.text_config, key, None) is None:
                    return p
        p = fwd.file.parent(p)
    return None


def analyze_lm_head(ctx: Context) -> LMHeadDecision:
    """Tied or separate lm-head and its bias, as the weights (not only the config) say."""
    model = ctx.target.instance or ctx.tiny
    head, emb = model.get_output_embeddings(), model.get_input_embeddings()
    d = LMHeadDecision()
    d.evidence.append(ctx.cfg_ev("tie_word_embeddings"))
    if not isinstance(head, nn.Linear):
        d.reason = f"lm_head is {type(head).__name__}, not nn.Linear"
        d.status = "unsupported"
        return d
    d.tied = head.weight is getattr(emb, "weight", None)
    d.bias = head.bias is not None
    which = "the given model" if ctx.target.instance is not None else "the tiny instance"
    d.evidence.append(
        S.check_evidence(
            f"{which}: lm_head.weight is the input embedding's weight: {d.tied}; "
            f"lm_head.bias: {'present' if d.bias else 'None'}"
        )
    )
    configured = ctx.cfg("tie_word_embeddings")
    if configured is not None and bool(configured) != d.tied:
        ctx.notes.append(
            f"tie_word_embeddings={configured} but the weights are "
            f"{'shared' if d.tied else 'separate'} in {which}; the profile follows the weights"
        )
    return d
