"""Where a loss's logits go: Understand's walk of the traced graph for `kernelwright losses new`.

From the logits argument the walk follows what the fused log-prob primitive stands in for:
- casts to fp32 and a constant temperature (logits / T, logits * k): the logits z;
- log_softmax(z, -1) (or the log of softmax) and softmax(z, -1) (or the exp of log_softmax);
- log_softmax gathered at token ids: each token's log-prob (a LogprobSite);
- softmax times log_softmax of the same z (or torch.special.entr of softmax) summed over the
  vocabulary, negated or not: each token's entropy (an EntropySite); summed over every
  dimension at once, the entropy summed over the tokens too.
Anything else the logits reach stops the walk with the node and the reason.
"""

from __future__ import annotations

import operator

import torch
import torch.fx

from kernelwright.profiles.loss import EntropySite, LogprobSite

_CASTS = {"float"}
_LOG_SOFTMAX = {torch.log_softmax, torch.nn.functional.log_softmax, torch.special.log_softmax}
_SOFTMAX = {torch.softmax, torch.nn.functional.softmax, torch.special.softmax}
_EXP, _LOG = {torch.exp}, {torch.log}
_MUL, _NEG, _SUM = {operator.mul, torch.mul}, {operator.neg, torch.neg}, {torch.sum}
_ENTR = {torch.special.entr}

Z, LOGP, P = "the logits", "log_softmax of the logits", "softmax of the logits"
_ENTROPY = "the entropy -(softmax * log_softmax).sum(-1)"


def last_dim(dim, ndim: int) -> bool:
    if isinstance(dim, (tuple, list)) and len(dim) == 1:
        dim = dim[0]
    return dim in (-1, ndim - 1)


def arg(node: torch.fx.Node, index: int, key: str, default=None):
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(key, default)


def _is(node: torch.fx.Node, functions: set, *methods: str) -> bool:
    if node.op == "call_function":
        return node.target in functions
    return node.op == "call_method" and node.target in methods


def find_sites(gm: torch.fx.GraphModule, logits_arg: str, ndim: int):
    """(log-prob sites, entropy sites, stop): what the logits reach, or why they reach
    something the primitive cannot give."""
    placeholder = next(n for n in gm.graph.nodes if n.op == "placeholder" and n.name == logits_arg)
    kinds: dict[torch.fx.Node, tuple[str, float]] = {placeholder: (Z, 1.0)}
    queue, uses = [placeholder], {}
    while queue:  # the transforms: z, log_softmax(z), softmax(z) at each temperature
        node = queue.pop(0)
        for user in node.users:
            step = _transform(user, node, *kinds[node], kinds, ndim)
            if isinstance(step, str):
                return [], [], step
            if step is None:
                uses.setdefault(user, node)
            elif user not in kinds:
                kinds[user] = step
                queue.append(user)
            elif kinds[user] != step:
                return [], [], f"`{user.format_node()}` combines the logits with themselves"
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    sites, entropies = [], []
    for user in sorted(uses, key=order.get):  # what the transforms feed, in graph order
        node = uses[user]
        kind, temperature = kinds[node]
        where = user.format_node()
        if kind == LOGP and _is(user, {torch.gather}, "gather"):
            found = _gather_site(user, ndim, temperature)
        elif kind in (LOGP, P) and _is(user, _MUL, "mul"):
            found = _product(user, kinds, ndim)
        elif kind == P and _is(user, _ENTR):
            found = _entropy_sites(user, -1, temperature, ndim)
        elif kind == Z:
            found = (f"the logits reach `{where}`: only casts to fp32, a constant temperature, "
                     f"then log_softmax over the vocabulary gathered at token ids, or {_ENTROPY}, "
                     "can be computed without them")  # fmt: skip
        else:
            found = (f"{kind} reaches `{where}`: only a gather of token ids or {_ENTROPY} is "
                     "supported (not top-k, a max or other statistics)")  # fmt: skip
        if isinstance(found, str):
            return [], [], found
        if isinstance(found, LogprobSite):
            sites.append(found)
        else:
            entropies += [e for e in found if e not in entropies]
    if not sites and not entropies:
        return [], [], f"the loss never takes log_softmax of `{logits_arg}` at token ids"
    return sites, entropies, None


def _transform(user, node, kind, temperature, kinds, ndim):
    """(kind, temperature) of `user` when it is one of the walk's transforms of `node`, None
    when it is something else, or why the walk stops there."""
    where = user.format_node()
    if _is(user, set(), *_CASTS) or (
        _is(user, set(), "to") and torch.float32 in (*user.args[1:], *user.kwargs.values())
    ):
        return kind, temperature
    if kind == Z and user.op == "call_function" and user.target in (operator.truediv, operator.mul):
        other = user.args[1] if user.args[0] is node else user.args[0]
        if isinstance(other, (int, float)) and not (
            user.target is operator.truediv and user.args[1] is node
        ):
            k = float(other)
            return Z, temperature * k if user.target is operator.truediv else temperature / k
        if other in kinds:
            return (f"`{where}` multiplies the logits by {kinds[other][0]}: only "
                    f"{_ENTROPY} is supported")  # fmt: skip
        return (f"the logits are scaled by a tensor or a variable at `{where}`: only a constant "
                "temperature is supported")  # fmt: skip
    for functions, method, new in ((_LOG_SOFTMAX, "log_softmax", LOGP), (_SOFTMAX, "softmax", P)):
        if kind == Z and _is(user, functions, method):
            if not last_dim(arg(user, 1, "dim"), ndim):
                return f"{method} over another dim than the vocabulary at `{where}`"
            return new, temperature
    if kind == LOGP and _is(user, _EXP, "exp"):
        return P, temperature
    if kind == P and _is(user, _LOG, "log"):
        return LOGP, temperature
    return None


def _gather_site(gather: torch.fx.Node, ndim: int, temperature: float) -> LogprobSite | str:
    where = gather.format_node()
    if not last_dim(arg(gather, 1, "dim"), ndim):
        return f"a gather over another dim than the vocabulary at `{where}`"
    index = arg(gather, 2, "index")
    unsqueezed = isinstance(index, torch.fx.Node) and _is(index, {torch.unsqueeze}, "unsqueeze")
    if not unsqueezed or not last_dim(arg(index, 1, "dim"), ndim):
        return (f"the gather at `{where}` takes an index that is not `ids.unsqueeze(-1)`: one "
                "token id per position is supported")  # fmt: skip
    target = index.args[0]
    users = list(gather.users)
    squeeze = users[0] if len(users) == 1 and _is(users[0], set(), "squeeze") else None
    if squeeze is not None and last_dim(arg(squeeze, 1, "dim"), ndim):
        return LogprobSite(node=squeeze.name, target=target.name, temperature=temperature)
    return LogprobSite(node=gather.name, target=target.name, temperature=temperature, keepdim=True)


def _product(mul: torch.fx.Node, kinds, ndim: int) -> list[EntropySite] | str:
    """softmax * log_softmax of the same logits at the same temperature: p log p."""
    a, b = (kinds.get(x) if isinstance(x, torch.fx.Node) else None for x in mul.args[:2])
    if a is None or b is None or {a[0], b[0]} != {LOGP, P} or a[1] != b[1]:
        return (f"`{mul.format_node()}` multiplies the softmax or log_softmax of the logits by "
                f"something else than the other at the same temperature: only {_ENTROPY} is "
                "supported")  # fmt: skip
    return _entropy_sites(mul, 1, a[1], ndim)


def _entropy_sites(node: torch.fx.Node, sign: int, temperature: float, ndim: int):
    """Follow `node` = sign * p log p (elementwise) through negations to its sums over the
    vocabulary: each is sign' * entropy."""
    out = []
    for user in node.users:
        where = user.format_node()
        if _is(user, _NEG, "neg"):
            found = _entropy_sites(user, -sign, temperature, ndim)
            if isinstance(found, str):
                return found
            out += found
            continue
        if not _is(user, _SUM, "sum"):
            return (f"the terms p·log p of the entropy reach `{where}`: only their sum over the "
                    "vocabulary (negated or not) is supported")  # fmt: skip
        dim = arg(user, 1, "dim")
        if dim is not None and not last_dim(dim, ndim):
            return f"the entropy's terms are summed over another dim than the vocabulary: `{where}`"
        keepdim = bool(arg(user, 2, "keepdim", False)) and dim is not None
        coef, site = -sign, user  # sum of sign * p log p = -sign * entropy
        while len(site.users) == 1 and _is(next(iter(site.users)), _NEG, "neg"):
            site, coef = next(iter(site.users)), -coef
        over = "token" if dim is not None else "all"
        out.append(EntropySite(node=site.name, temperature=temperature, negated=coef < 0,
                               over=over, keepdim=keepdim))  # fmt: skip
    return out
