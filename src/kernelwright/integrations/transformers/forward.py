"""One generic causal-LM forward whose training loss is our fused linear cross-entropy.

`plan_causal_lm(cls, profile)` reads the causal-LM class's own `forward` once (its source, by
AST) and writes down how it calls the base model; `causal_lm_forward(plan)` then returns the
forward the patcher binds to each instance:

- labels given, grad enabled, every logit wanted, a plain `nn.Linear` lm-head, the stock
  `ForCausalLMLoss`: call the base model with exactly the arguments the original passes, take
  the last hidden state and compute the loss from it and the lm-head weight without ever
  materialising the logits. The output is the profile's output class with `logits=None`.
- anything else (inference, `no_grad` evaluation, `logits_to_keep`, labels absent, an argument
  the original forward uses but does not pass to the base model, a LoRA-wrapped lm-head, a
  custom `loss_function`, router logits whose auxiliary loss cannot be reproduced exactly):
  the original forward, untouched, so generation and logits behave as before.

Nothing here names a model: the plan comes from the source of the class it is given and the
profile's output / logits / lm_head / moe decisions.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import operator
import re
import textwrap
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from transformers import modeling_outputs
from transformers.loss.loss_utils import ForCausalLMLoss

from kernelwright.ops.fused_linear_cross_entropy import fused_linear_cross_entropy
from kernelwright.profiles.model import ModelProfile

# `x = x if x is not None else self.config.key`: an argument defaulted from the config before
# the base-model call (Mixtral's output_router_logits; a VLM's from `self.config.text_config`);
# resolved the same way here.
_CONFIG_DEFAULT = re.compile(
    r"^(\w+) = \1 if \1 is not None else self\.config\.((?:text_config\.)?\w+)$"
)


class NotStandardForward(ValueError):
    """The causal-LM forward does something before the base-model call that the generic
    forward would not reproduce; the fused loss is not applied to it."""


@dataclasses.dataclass(frozen=True)
class CausalLMPlan:
    """How one causal-LM class calls its base model, read from its forward's source."""

    class_name: str
    signature: inspect.Signature  # the original forward's, `self` included
    positional: tuple[str, ...]  # parameter names that may be given positionally (no self)
    named: tuple[str, ...]  # every parameter but self, *args and **kwargs
    defaults: dict[str, Any]
    var_keyword: str | None  # the **kwargs parameter, forwarded to the base model as HF does
    base_attribute: str
    base_positional: tuple[str, ...]  # names passed positionally to the base model
    base_keywords: tuple[tuple[str, str], ...]  # (keyword, local name) pairs
    # (keyword, literal) pairs the original passes as constants (Gemma-3's `return_dict=True`)
    base_constants: tuple[tuple[str, Any], ...]
    config_defaults: dict[str, str]  # local name -> config key ("text_config.key" too)
    unforwarded: frozenset[str]  # parameters the original uses but never hands to the base
    output_class: type
    output_fields: tuple[str, ...]  # its dataclass fields (read once: torch.compile-friendly)
    hidden_state_field: str
    lm_head_attribute: str
    ignore_index: int
    softcap: float | None
    softcap_config_key: str | None
    scale_op: str | None
    scale: float | None
    scale_config_key: str | None
    aux_loss_function: Callable | None  # set only when the original's aux loss is reproduced


def _unwrap(fn: Callable) -> Callable:
    # HF stacks functools.wraps decorators (can_return_tuple, auto_docstring): the innermost
    # function is the one whose source and globals are the modeling file's.
    while hasattr(fn, "__wrapped__"):
        fn = fn.__wrapped__
    return fn


def _function_def(fn: Callable) -> ast.FunctionDef:
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError) as e:
        raise NotStandardForward(f"cannot read the source of {fn.__qualname__}: {e}") from e
    tree = ast.parse(textwrap.dedent(source))
    node = tree.body[0]
    if not isinstance(node, ast.FunctionDef):
        raise NotStandardForward(f"{fn.__qualname__} is not a plain function definition")
    return node


def _base_call(stmt: ast.stmt, base_attribute: str) -> tuple[str, ast.Call] | None:
    """(result name, call) when `stmt` is `<name>[: T] = self.<base_attribute>(...)`."""
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
        target, value = stmt.targets[0], stmt.value
    elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
        target, value = stmt.target, stmt.value
    else:
        return None
    if not (isinstance(target, ast.Name) and isinstance(value, ast.Call)):
        return None
    if ast.unparse(value.func) == f"self.{base_attribute}":
        return target.id, value
    return None


def _aux_loss_reproducible(body: list[ast.stmt], result: str, function: str) -> bool:
    """True when the forward adds the router loss exactly as the generic forward will:

    aux_loss = <function>(<result>.router_logits, self.num_experts,
                          self.num_experts_per_tok, attention_mask)
    loss += self.router_aux_loss_coef * aux_loss.to(loss.device)
    """
    want = {
        f"aux_loss = {function}({result}.router_logits, self.num_experts, "
        "self.num_experts_per_tok, attention_mask)",
        "loss += self.router_aux_loss_coef * aux_loss.to(loss.device)",
    }
    seen = set()
    for stmt in body:
        for node in ast.walk(stmt):
            if isinstance(node, (ast.Assign, ast.AugAssign)):
                seen.add(ast.unparse(node))
    return want <= seen


def _calls(node: ast.AST) -> list[ast.Call]:
    return [n for n in ast.walk(node) if isinstance(n, ast.Call)]


def _walk_outside_loss_call(node: ast.AST):
    """ast.walk, without the arguments of `self.loss_function(...)`: `_check_loss_call` checks
    those (its vocab_size argument, `self.config.text_config.vocab_size` say, is not used)."""
    todo = [node]
    while todo:
        n = todo.pop()
        yield n
        if isinstance(n, ast.Call) and ast.unparse(n.func) == "self.loss_function":
            continue
        todo.extend(ast.iter_child_nodes(n))


def _check_reads_after_base_call(cls: type, body: list[ast.stmt], profile: ModelProfile) -> None:
    """Raise NotStandardForward when the code after the base-model call reads an attribute of
    `self` (or of `self.config`) that the generic forward does not account for: a logit
    multiplier or an extra loss term the profile does not name would be silently dropped."""
    allowed = {
        "config",
        "config.vocab_size",
        # a multimodal config's text part, where the logits decision's keys are read
        "config.get_text_config",
        "config.text_config",
        "vocab_size",
        "loss_function",
        profile.output.lm_head_attribute,
        # the router loss: reproduced exactly or left to the original forward (see forward)
        "num_experts",
        "num_experts_per_tok",
        "router_aux_loss_coef",
    }
    if profile.logits.patched:
        for key in (profile.logits.softcap_config_key, profile.logits.scale_config_key):
            if key:
                # Cohere keeps config.logit_scale on the instance as self.logit_scale
                allowed |= {f"config.{key}", key}
    unknown = set()
    for stmt in body:
        for node in _walk_outside_loss_call(stmt):
            if not isinstance(node, ast.Attribute):
                continue
            chain = [node.attr]
            base = node.value
            if isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name):
                chain.insert(0, base.attr)
                base = base.value
            if isinstance(base, ast.Name) and base.id == "self":
                name = ".".join(chain)
                if name not in allowed and chain[0] not in allowed - {"config"}:
                    unknown.add(f"self.{name}")
    if unknown:
        raise NotStandardForward(
            f"{cls.__name__}.forward reads {sorted(unknown)} after the base-model call, which "
            "the profile's logits/lm_head decisions do not account for"
        )


def _check_loss_call(
    cls: type, body: list[ast.stmt], var_keyword: str | None, lm_head: str | None
) -> None:
    """Raise NotStandardForward unless the loss after the base-model call is exactly one
    `loss = self.loss_function(<logits>, labels, <vocab size>, **kwargs)` (positional or
    keyword, the forward's own **kwargs passed on), on the lm-head's output after the last
    change to it.

    That call is HF's ForCausalLMLoss (checked on the instance at every call): labels shifted
    left by one, `ignore_index=-100`, the mean over the trained tokens or the sum over
    `num_items_in_batch`. The fused forward reproduces exactly that and nothing else: a loss
    on unshifted labels, another ignore index or reduction, or a loss written by hand
    (`CrossEntropyLoss()(...)`) leaves the class to its original forward."""
    nodes = [node for stmt in body for node in ast.walk(stmt)]
    calls = [
        node
        for node in nodes
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "self.loss_function"
    ]
    if len(calls) != 1:
        raise NotStandardForward(
            f"{cls.__name__}.forward computes its loss "
            + ("without self.loss_function" if not calls else f"with {len(calls)} calls")
            + "; the fused loss reproduces one ForCausalLMLoss call only"
        )
    call = calls[0]
    stmt = next((n for n in nodes if isinstance(n, ast.Assign) and n.value is call), None)
    names = ("logits", "labels", "vocab_size")
    given: dict[str, ast.expr] = dict(zip(names, call.args, strict=False))
    problems = [ast.unparse(a) for a in call.args[len(names) :]]
    forwarded = False
    for kw in call.keywords:
        if kw.arg is None:
            forwarded = isinstance(kw.value, ast.Name) and kw.value.id == var_keyword
            if not forwarded:
                problems.append(f"**{ast.unparse(kw.value)}")
        elif kw.arg in names and kw.arg not in given:
            given[kw.arg] = kw.value
        else:
            problems.append(f"{kw.arg}={ast.unparse(kw.value)}")
    if var_keyword is not None and not forwarded:
        # the caller's num_items_in_batch / ignore_index / shift_labels reach the fused loss
        problems.append(f"**{var_keyword} not passed on (num_items_in_batch would be dropped)")
    labels, logits = given.get("labels"), given.get("logits")
    if not (isinstance(labels, ast.Name) and labels.id == "labels"):
        problems.append(f"labels={ast.unparse(labels) if labels is not None else None}")
    elif any(
        isinstance(t, ast.Name) and t.id == "labels"
        for node in nodes
        if isinstance(node, ast.Assign | ast.AugAssign)
        for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
    ):
        problems.append("labels re-assigned before the loss")
    head = f"self.{lm_head}"
    if not isinstance(logits, ast.Name):
        problems.append(f"logits={ast.unparse(logits) if logits is not None else None}")
    elif not any(
        isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == logits.id for t in node.targets)
        and any(ast.unparse(c.func) == head for c in _calls(node))
        for node in nodes
    ):
        problems.append(f"{logits.id} is not the output of {head}")
    elif any(
        isinstance(t, ast.Name) and t.id == logits.id and node.lineno > call.lineno
        for node in nodes
        if isinstance(node, ast.Assign | ast.AugAssign)
        for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
    ):
        problems.append(f"{logits.id} changed after the loss")
    if problems or stmt is None:
        raise NotStandardForward(
            f"{cls.__name__}.forward calls `{ast.unparse(call)[:100]}`: not the plain "
            f"self.loss_function(logits, labels, vocab_size, **kwargs) the fused loss "
            f"reproduces ({', '.join(problems) or 'its result is not assigned'})"
        )


def plan_causal_lm(cls: type, profile: ModelProfile) -> CausalLMPlan:
    """Read `cls.forward` and the profile into a CausalLMPlan.

    Raises NotStandardForward when the forward's shape is not the one the generic forward
    reproduces (statements before the base-model call other than config defaults, arguments
    built from expressions), and ValueError when the profile lacks a field it needs.
    """
    out, logits = profile.output, profile.logits
    missing = [
        f
        for f, v in (
            ("output.base_model_attribute", out.base_model_attribute),
            ("output.output_class", out.output_class),
            ("output.lm_head_attribute", out.lm_head_attribute),
        )
        if v is None
    ]
    if missing:
        raise ValueError(
            f"profile {profile.architecture}: the output decision is 'patch' but lacks "
            f"{missing}; re-run the analyser or mark the output decision unsupported"
        )
    # transformers.modeling_outputs, or the modeling file's own (MambaCausalLMOutput)
    output_class = getattr(modeling_outputs, out.output_class, None)
    if output_class is None:
        output_class = _unwrap(cls.forward).__globals__.get(out.output_class)
    if not (
        isinstance(output_class, type)
        and issubclass(output_class, modeling_outputs.ModelOutput)
        and dataclasses.is_dataclass(output_class)
    ):
        raise ValueError(
            f"profile {profile.architecture}: output class {out.output_class!r} is neither in "
            f"transformers.modeling_outputs nor a ModelOutput of {cls.__module__}; fix "
            "output.output_class in the profile"
        )

    fn = _unwrap(cls.forward)
    signature = inspect.signature(fn)
    params = list(signature.parameters.values())[1:]  # drop self
    positional = tuple(
        p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    )
    defaults = {p.name: p.default for p in params if p.default is not p.empty}
    var_keyword = next((p.name for p in params if p.kind == p.VAR_KEYWORD), None)
    named_order = tuple(p.name for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL))
    named = set(named_order)

    fdef = _function_def(fn)
    config_defaults: dict[str, str] = {}
    found = None
    for i, stmt in enumerate(fdef.body):
        if i == 0 and isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
            continue  # the docstring
        found = _base_call(stmt, out.base_model_attribute)
        if found is not None:
            _check_reads_after_base_call(cls, fdef.body[i + 1 :], profile)
            _check_loss_call(cls, fdef.body[i + 1 :], var_keyword, out.lm_head_attribute)
            break
        m = _CONFIG_DEFAULT.match(ast.unparse(stmt))
        if m is None or m.group(1) not in named:
            raise NotStandardForward(
                f"{cls.__name__}.forward runs `{ast.unparse(stmt)[:80]}` before calling "
                f"self.{out.base_model_attribute}(...); the generic forward would skip it"
            )
        config_defaults[m.group(1)] = m.group(2)
    if found is None:
        raise NotStandardForward(
            f"{cls.__name__}.forward never assigns the result of "
            f"self.{out.base_model_attribute}(...)"
        )
    result, call = found

    def local(node: ast.expr) -> str:
        if not (isinstance(node, ast.Name) and node.id in named):
            raise NotStandardForward(
                f"{cls.__name__}.forward passes `{ast.unparse(node)}` to the base model; the "
                "generic forward only forwards the forward's own arguments"
            )
        return node.id

    base_positional = tuple(local(a) for a in call.args)
    base_keywords, base_constants = [], []
    for kw in call.keywords:
        if kw.arg is None:
            if not (isinstance(kw.value, ast.Name) and kw.value.id == var_keyword):
                raise NotStandardForward(
                    f"{cls.__name__}.forward unpacks `{ast.unparse(kw.value)}` into the base "
                    "model call; only its own **kwargs is forwarded by the generic forward"
                )
            continue
        if isinstance(kw.value, ast.Constant) and isinstance(
            kw.value.value, bool | int | float | str | type(None)
        ):
            base_constants.append((kw.arg, kw.value.value))  # passed on as the same literal
            continue
        base_keywords.append((kw.arg, local(kw.value)))
    forwarded = set(base_positional) | {name for _, name in base_keywords}
    unforwarded = frozenset(named - forwarded - {"labels", "logits_to_keep"})

    aux = None
    # the router loss is the model's whether or not its experts are patched
    if profile.moe.is_moe and profile.moe.aux_loss_function:
        name = profile.moe.aux_loss_function.rsplit(".", 1)[-1]
        if _aux_loss_reproducible(fdef.body, result, name) and name in fn.__globals__:
            aux = fn.__globals__[name]

    return CausalLMPlan(
        class_name=cls.__name__,
        signature=inspect.signature(cls.forward),
        positional=positional,
        named=named_order,
        defaults=defaults,
        var_keyword=var_keyword,
        base_attribute=out.base_model_attribute,
        base_positional=base_positional,
        base_keywords=tuple(base_keywords),
        base_constants=tuple(base_constants),
        config_defaults=config_defaults,
        unforwarded=unforwarded,
        output_class=output_class,
        output_fields=tuple(f.name for f in dataclasses.fields(output_class)),
        hidden_state_field=out.hidden_state_field,
        lm_head_attribute=out.lm_head_attribute,
        ignore_index=out.ignore_index,
        softcap=logits.softcap if logits.patched else None,
        softcap_config_key=logits.softcap_config_key if logits.patched else None,
        scale_op=logits.scale_op if logits.patched else None,
        scale=logits.scale if logits.patched else None,
        scale_config_key=logits.scale_config_key if logits.patched else None,
        aux_loss_function=aux,
    )


def _config_value(config, key: str | None, fallback):
    # The instance's config is what the original forward reads at every call (a checkpoint may
    # differ from the config the profile was made from), or its text config (a multimodal
    # model's); the profile's number is the fallback.
    if key is None:
        return fallback
    for cfg in (config, config.get_text_config()):
        if hasattr(cfg, key):
            return getattr(cfg, key)
    return fallback


def _plain_linear(head) -> bool:
    # A LoRA/quantised wrapper computes more than x @ weight.T + bias: those keep the original.
    return isinstance(head, torch.nn.Linear) and type(head).forward is torch.nn.Linear.forward


def _is_default(value, default) -> bool:
    if value is default:
        return True
    scalar = (bool, int, float, str)
    return type(value) is type(default) and isinstance(value, scalar) and value == default


def causal_lm_forward(plan: CausalLMPlan) -> Callable:
    """forward(self, *args, **kwargs) for instances of the planned class.

    The original is the class's forward, looked up on `self` at each call (never a bound method
    kept in a closure, which a deepcopy of the model would still point at the old instance).
    """

    def forward(self, *args, **kwargs):
        def original(*a, **kw):
            return type(self).forward(self, *a, **kw)

        given = plan.positional[: len(args)]
        if len(args) > len(plan.positional) or any(n in kwargs for n in given):
            return original(*args, **kwargs)  # let the original raise its own TypeError
        call = dict(zip(given, args, strict=True))
        call.update(kwargs)
        labels = call.get("labels")
        logits_to_keep = call.get("logits_to_keep", 0)
        if (
            labels is None
            or not torch.is_grad_enabled()
            or not (isinstance(logits_to_keep, int) and logits_to_keep == 0)
            or self.loss_function is not ForCausalLMLoss
            or not _plain_linear(getattr(self, plan.lm_head_attribute))
            or any(
                name in call and not _is_default(call[name], plan.defaults.get(name))
                for name in plan.unforwarded
            )
        ):
            return original(*args, **kwargs)

        values = {name: call.get(name, plan.defaults.get(name)) for name in plan.named}
        for name, key in plan.config_defaults.items():
            if values.get(name) is None:
                values[name] = operator.attrgetter(key)(self.config)
        if values.get("output_router_logits") and plan.aux_loss_function is None:
            return original(*args, **kwargs)  # an aux loss we cannot reproduce exactly

        extra = {k: v for k, v in call.items() if k not in values}  # the **kwargs the original gets
        # can_return_tuple pops return_dict before the original's body runs; do the same
        return_dict = extra.pop("return_dict", None)
        if return_dict is None:
            return_dict = getattr(self.config, "return_dict", True)

        base = self.get_submodule(plan.base_attribute)  # "model", or "model.decoder"
        outputs = base(
            *(values[n] for n in plan.base_positional),
            **{kw: values[n] for kw, n in plan.base_keywords},
            **dict(plan.base_constants),
            **extra,
        )
        hidden = outputs[plan.hidden_state_field]  # [B, T, H]

        # ForCausalLMLoss: pad labels with ignore_index on the right, then shift left by one,
        # unless the caller already aligned them (`shift_labels`, sequence parallelism).
        ignore_index = extra.get("ignore_index", plan.ignore_index)
        shift_labels = extra.get("shift_labels")
        if shift_labels is None:
            padded = F.pad(labels, (0, 1), value=ignore_index)
            shift_labels = padded[..., 1:]
        target = shift_labels.reshape(-1).to(hidden.device)  # [B*T]
        hidden = hidden.reshape(-1, hidden.shape[-1])  # [B*T, H]

        head = getattr(self, plan.lm_head_attribute)
        weight, bias = head.weight, head.bias
        # logits = softcap * tanh(scale(h @ W.T + b) / softcap): the scale is linear, so it moves
        # onto the hidden state (and the bias) and the kernel applies the softcap.
        scale = _config_value(self.config, plan.scale_config_key, plan.scale)
        if plan.scale_op is not None and scale is not None and scale != 1:
            factor = 1.0 / scale if plan.scale_op == "divide" else float(scale)
            hidden = hidden * factor
            bias = bias * factor if bias is not None else None
        softcap = _config_value(self.config, plan.softcap_config_key, plan.softcap)

        num_items_in_batch = extra.get("num_items_in_batch")
        # "mean" over the non-ignored targets, or sum / num_items_in_batch when given, as
        # fixed_cross_entropy; the kernel takes the normaliser as the mean's denominator.
        loss = fused_linear_cross_entropy(
            hidden,
            weight,
            target,
            bias,
            ignore_index=ignore_index,
            reduction="mean",
            softcap=softcap,
            num_items_in_batch=num_items_in_batch,
        )

        fields = plan.output_fields
        result: dict[str, Any] = {"loss": loss, "logits": None}
        if plan.aux_loss_function is not None and values.get("output_router_logits"):
            aux_loss = plan.aux_loss_function(
                outputs.router_logits,
                self.num_experts,
                self.num_experts_per_tok,
                values.get("attention_mask"),
            )
            result["aux_loss"] = aux_loss
            result["loss"] = loss + self.router_aux_loss_coef * aux_loss.to(loss.device)
        for name in fields:
            if name not in result and name in outputs:
                result[name] = outputs[name]
        output = plan.output_class(**{k: v for k, v in result.items() if k in fields})
        if return_dict:
            return output
        # as `to_tuple()`, which leaves out None fields, but the logits keep their place (None),
        # so that positions in the tuple are the unpatched model's: `loss, logits = out[:2]`
        names = [f.name for f in dataclasses.fields(output)]
        return tuple(output.get(k) for k in names if k in output or k == "logits")

    forward.__name__ = "forward"
    forward.__qualname__ = f"{plan.class_name}.forward"
    forward.__doc__ = (
        f"kernelwright: {plan.class_name}.forward with the loss from fused linear "
        "cross-entropy when training with labels (logits=None then); otherwise the original."
    )
    # Trainer reads the forward's parameters to keep dataset columns and find label names
    forward.__signature__ = plan.signature
    return forward
