"""Cross-entropy on logits, and with the lm-head matmul before it, fused linear cross-entropy."""

from __future__ import annotations

from typing import Any

import torch
from torch.fx import Node

from kernelwright.compile.patterns import Match, _float32_cast, arg, kind, value

# --------------------------------------------------------------------------- cross-entropy

_CE_REDUCTIONS = ("mean", "sum", "none")
_KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def match_cross_entropy(node: Node) -> Match | None:
    """`F.cross_entropy(logits, target, weight=, ignore_index=, reduction=, label_smoothing=)`
    with logits [M, V] and class indices [M] (`nn.CrossEntropyLoss` is recorded as this call).

    The logits may be written as Hugging Face's loss writes them: upcast, then flattened,
    `logits.float().view(-1, V)`. The kernel reads the logits as they are (bf16: no fp32 copy)
    and computes in fp32, as the upcast asks; both steps become part of the site. Low-precision
    logits without the upcast are reported (eager computes that loss in their dtype), as are
    class dimensions other than the last (logits [N, C, d...]) and class-probability targets
    (found by the checks).
    """
    if kind(node) != "cross_entropy":
        return None
    logits, target = arg(node, 0, "input"), arg(node, 1, "target")
    weight = arg(node, 2, "weight")
    ignore_index = arg(node, 4, "ignore_index", -100)
    reduction = arg(node, 6, "reduction", "mean")
    smoothing = arg(node, 7, "label_smoothing", 0.0)
    lv = value(logits)
    if not isinstance(lv, torch.Tensor) or not isinstance(target, Node):
        return None
    # upcast and flatten, in either order, as far back as they go
    x, absorbed = logits, []
    while len(absorbed) < 3:
        src = _float32_cast(x)
        if src is not None and getattr(value(src), "dtype", None) not in _KERNEL_DTYPES:
            src = None  # a float64 source is rounded by the cast: the cast stays
        if src is None and _flattens(x):
            src = x.args[0]
        if src is None:
            break
        absorbed.insert(0, x)
        x = src
    problem = None
    if arg(node, 3, "size_average") is not None or arg(node, 5, "reduce") is not None:
        problem = "size_average / reduce (deprecated) given"
    elif lv.dim() == 1:
        problem = "unbatched logits (1-D)"
    elif lv.dim() != 2:
        problem = f"logits are {lv.dim()}-D: classes along dimension 1, not the last"
    elif lv.dtype in (torch.float16, torch.bfloat16):
        dt = str(lv.dtype).replace("torch.", "")
        problem = f"{dt} logits without an upcast: eager computes that loss in {dt}"
    elif isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        problem = "ignore_index is not a constant integer"
    elif reduction not in _CE_REDUCTIONS:
        problem = f"reduction={reduction!r}"
    elif not _is_fraction(smoothing):
        problem = f"label_smoothing={smoothing!r} is not a constant in [0, 1]"
    tensors = {"logits": x, "target": target}
    if isinstance(weight, Node):
        tensors["weight"] = weight
    elif weight is not None:
        problem = problem or "weight is not a tensor"
    kwargs = {"ignore_index": ignore_index, "reduction": reduction}
    kwargs["label_smoothing"] = float(smoothing) if problem is None else smoothing
    ce = Match(
        pattern="cross_entropy(logits, target)",
        op="cross_entropy",
        fn=cross_entropy_rows,
        args=(x, target, weight),
        kwargs=kwargs,
        nodes=[*absorbed, node],
        tensors=tensors,
        problem=problem,
        shared_ok=tuple(absorbed),
    )
    return _linear_cross_entropy(ce, x, absorbed, node) or ce


def _linear_cross_entropy(ce: Match, logits: Node, absorbed: list, node: Node) -> Match | None:
    """The lm-head matmul and the loss as one site, `fused_linear_cross_entropy`, when the
    logits `F.linear(hidden, W, bias)` feed the loss alone (a model that also returns its
    logits keeps them, and the plain cross-entropy site: the report says so). The plain site
    is the fallback."""
    if kind(logits) != "linear":
        return None
    hidden, w = arg(logits, 0, "input"), arg(logits, 1, "weight")
    bias = arg(logits, 2, "bias")
    if not isinstance(hidden, Node) or not isinstance(w, Node):
        return None
    problem = ce.problem
    if problem is None and (
        len(logits.users) != 1 or (absorbed and any(len(n.users) != 1 for n in absorbed))
    ):
        # e.g. a Hugging Face causal LM, whose output holds the logits beside the loss
        problem = (
            "the logits are also read outside the loss (a graph output?): they must exist; "
            'kernelwright.compile(model, logits="drop_with_labels") drops a Hugging Face '
            "model's logits when it is trained with labels"
        )
    hv, wv = value(hidden), value(w)
    if problem is None and (hv is None or wv is None or hv.dtype != wv.dtype):
        problem = "hidden and the lm-head weight differ in dtype (eager promotes)"
    tensors = {"hidden": hidden, "weight": w, "target": ce.tensors["target"]}
    if isinstance(bias, Node):
        tensors["bias"] = bias
    kwargs = dict(ce.kwargs, class_weight=ce.args[2])
    return Match(
        pattern="cross_entropy(linear(hidden, W), target)",
        op="fused_linear_cross_entropy",
        fn=linear_cross_entropy_rows,
        args=(hidden, w, ce.tensors["target"], bias),
        kwargs=kwargs,
        nodes=[logits, *absorbed, node],
        tensors=tensors,
        problem=problem,
        fallback=ce,
    )


def linear_cross_entropy_rows(hidden, weight, target, bias=None, **kwargs):
    """`kernelwright.fused_linear_cross_entropy` of hidden [..., H] flattened to [M, H] against
    target [M]: what a matched `F.cross_entropy(F.linear(hidden, W).float().view(-1, V), t)`
    computes, without the [M, V] logits."""
    from kernelwright.ops.fused_linear_cross_entropy import fused_linear_cross_entropy

    return fused_linear_cross_entropy(
        hidden.reshape(-1, hidden.shape[-1]), weight, target.reshape(-1), bias, **kwargs
    )


def _flattens(node: Any) -> bool:
    """Whether `node` is `t.view(-1, V)` / `t.reshape(...)` to [M, V] keeping t's last dimension
    V: the flatten of t's leading dimensions (the only 2-D view that keeps the last one)."""
    if kind(node) not in ("view", "reshape") or not node.args:
        return False
    src, out = value(node.args[0]), value(node)
    if not isinstance(src, torch.Tensor) or not isinstance(out, torch.Tensor):
        return False
    return out.dim() == 2 and src.dim() >= 1 and out.shape[-1] == src.shape[-1]


def _is_fraction(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and 0.0 <= x <= 1.0


def cross_entropy_rows(logits, target, weight=None, **kwargs):
    """`kernelwright.cross_entropy` of `logits` flattened to [M, V], against target [M]: what
    a matched `F.cross_entropy(logits.float().view(-1, V), target)` computes."""
    from kernelwright.ops.cross_entropy import cross_entropy

    if logits.dim() != 2:
        logits = logits.reshape(-1, logits.shape[-1])
    return cross_entropy(logits, target, weight, **kwargs)
