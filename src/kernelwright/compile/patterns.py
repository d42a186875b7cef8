"""The patterns the graph pass replaces, matched in a Dynamo graph as users write them.

A Dynamo graph holds torch-level calls in the spellings of the source: `x * y` is
`operator.mul`, `x.pow(2)` a `call_method` "pow", `F.silu(x)` `torch.nn.functional.silu`.
`kind()` maps every spelling of one computation to one name ("mul", "pow", "silu"), so each
pattern is written once, as a walk from an anchor node to its inputs, and matches
`torch.rsqrt(v)` and `v.rsqrt()` alike.

A matcher returns a `Match` (the kernelwright function to call, its arguments, the nodes it
replaces) or None; a match the kernel cannot compute as written (softmax over a dimension
other than the last) carries the reason in `problem` and is reported, not replaced.

The patterns, in `MATCHERS` order: RMSNorm (HF-style; fused add + RMSNorm where its input is a
residual sum, the sum being the call's second result), `silu(gate) * up` / `gelu(gate) * up`,
`relu(x) ** 2`, softmax / log_softmax, LayerNorm, cross-entropy on logits (with the lm-head
matmul before it: fused linear cross-entropy), HF's rotate_half RoPE (`q * cos +
rotate_half(q) * sin`, once for q and once for k).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch.fx import Node

# Functions (call_function targets) -> the name of what they compute.
_FUNCTIONS: dict[Any, str] = {
    operator.mul: "mul",
    torch.mul: "mul",
    operator.add: "add",
    torch.add: "add",
    operator.pow: "pow",
    torch.pow: "pow",
    torch.square: "square",
    torch.rsqrt: "rsqrt",
    torch.mean: "mean",
    torch.relu: "relu",
    F.relu: "relu",
    F.silu: "silu",
    F.gelu: "gelu",
    torch._C._nn.gelu: "gelu",
    torch.softmax: "softmax",
    F.softmax: "softmax",
    torch.log_softmax: "log_softmax",
    F.log_softmax: "log_softmax",
    F.layer_norm: "layer_norm",
    torch.layer_norm: "layer_norm",
    F.cross_entropy: "cross_entropy",
    F.linear: "linear",
    torch.segment_reduce: "segment_reduce",
    torch._C._nn.linear: "linear",
    torch.reshape: "reshape",
    operator.neg: "neg",
    torch.neg: "neg",
    torch.cat: "cat",
    torch.unsqueeze: "unsqueeze",
    operator.getitem: "getitem",
}
# Tensor methods (call_method targets) the patterns read; in-place ones ("mul_") never match.
_METHODS = {
    "mul",
    "add",
    "pow",
    "square",
    "rsqrt",
    "mean",
    "relu",
    "softmax",
    "log_softmax",
    "to",
    "float",
    "view",
    "reshape",
    "neg",
    "unsqueeze",
}


def kind(node: Any) -> str | None:
    """What `node` computes ("mul", "rsqrt", ...), whatever the spelling; None otherwise."""
    if not isinstance(node, Node):
        return None
    if node.op == "call_method" and node.target in _METHODS:
        return node.target
    if node.op == "call_function":
        try:
            return _FUNCTIONS.get(node.target)
        except TypeError:  # an unhashable target
            return None
    return None


def arg(node: Node, i: int, name: str, default: Any = None) -> Any:
    """Argument `i` of the call, passed by position or as `name`."""
    if len(node.args) > i:
        return node.args[i]
    return node.kwargs.get(name, default)


def value(node: Any) -> Any:
    """The example (fake) tensor Dynamo recorded for `node`, or None."""
    if not isinstance(node, Node):
        return None
    return node.meta.get("example_value", node.meta.get("val"))


def _only_user(node: Node) -> Node | None:
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def _other(node: Node, one: Any) -> Any:
    """The operand of binary `node` that is not `one` (None when neither or both are)."""
    if len(node.args) != 2 or node.kwargs:
        return None
    a, b = node.args
    if a is one and b is not one:
        return b
    if b is one and a is not one:
        return a
    return None


def _is_number(x: Any, *values: float) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x in values


def _float32_cast(node: Any) -> Node | None:
    """The input of `node` when it is `x.to(torch.float32)` / `x.float()`, else None."""
    k = kind(node)
    if k == "float" and len(node.args) == 1 and not node.kwargs:
        return node.args[0]
    if k == "to" and _cast_dtype(node) is torch.float32:
        return node.args[0]
    return None


def _cast_dtype(node: Node) -> torch.dtype | None:
    """The dtype of `x.to(dtype)` (positional or `dtype=`), None for any other `to` call."""
    if kind(node) != "to":
        return None
    extra = set(node.kwargs) - {"dtype"}
    if extra or len(node.args) > 2:
        return None
    dtype = node.args[1] if len(node.args) == 2 else node.kwargs.get("dtype")
    return dtype if isinstance(dtype, torch.dtype) else None


def _squared(node: Any) -> Any:
    """v when `node` is `v ** 2`, `v.pow(2)`, `torch.square(v)` or `v * v`; else None."""
    k = kind(node)
    if k == "pow" and len(node.args) == 2 and _is_number(arg(node, 1, "exponent"), 2):
        return node.args[0]
    if k == "square" and len(node.args) == 1:
        return node.args[0]
    if k == "mul" and len(node.args) == 2 and node.args[0] is node.args[1]:
        return node.args[0]
    return None


def _last_dim(dim: Any, ndim: int) -> bool:
    if isinstance(dim, (list, tuple)) and len(dim) == 1:
        dim = dim[0]
    return isinstance(dim, int) and not isinstance(dim, bool) and dim in (-1, ndim - 1)


@dataclass
class Match:
    """One matched site: calling `fn(*args, **kwargs)` computes what `nodes` compute."""

    pattern: str  # what was matched, as the report names it
    op: str  # the registry op whose kernel replaces it
    fn: Callable[..., torch.Tensor]
    args: tuple
    kwargs: dict = field(default_factory=dict)
    nodes: list[Node] = field(default_factory=list)  # in graph order; the last is the output
    tensors: dict[str, Node] = field(default_factory=dict)  # the inputs the checks look at
    problem: str | None = None  # matched, but the kernel cannot compute it as written
    shared_ok: tuple[Node, ...] = ()  # matched nodes others may read too (an input's cast)
    # When `fn` returns a tuple: the nodes its items replace, in order (the first is `output`);
    # each may be read outside the match. Empty: `fn` returns one value, replacing `output`.
    outputs: tuple[Node, ...] = ()
    fallback: Match | None = None  # the site to try instead when this one cannot be taken
    scalars_ok: bool = False  # 0-d tensor inputs are taken (a created op's scalar parameter)

    @property
    def output(self) -> Node:
        return self.nodes[-1]


# --------------------------------------------------------------------------- RMSNorm


def match_rms_norm(rsqrt: Node) -> Match | None:
    """`x * rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)`, then `* weight`, as LlamaRMSNorm:

        x32 = x.to(torch.float32)
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
        return weight * y.to(x.dtype)

    Also without the casts (casting "none") and without the weight. A fp32 normalisation
    multiplied by the weight without the cast back rounds differently: left alone.
    """
    if kind(rsqrt) != "rsqrt" or len(rsqrt.args) != 1:
        return None
    add = rsqrt.args[0]
    if kind(add) != "add" or len(add.args) != 2 or add.kwargs:
        return None
    a, b = add.args
    mean, eps = (a, b) if isinstance(b, (int, float)) else (b, a)
    if kind(mean) != "mean" or not isinstance(eps, (int, float)) or isinstance(eps, bool):
        return None
    if arg(mean, 2, "keepdim", False) is not True or arg(mean, 3, "dtype") is not None:
        return None
    sq = mean.args[0]
    x32 = _squared(sq)
    if x32 is None:
        return None
    xv = value(x32)
    if xv is None or not _last_dim(arg(mean, 1, "dim"), xv.dim()):
        return None
    # x32 * rsqrt; a site whose rsqrt is read elsewhere too is reported, not replaced
    normed = next((u for u in rsqrt.users if kind(u) == "mul" and _other(u, rsqrt) is x32), None)
    if normed is None or len(normed.args) != 2:
        return None
    nodes = [sq, mean, add, rsqrt, normed]
    x = _float32_cast(x32)
    shared: tuple[Node, ...] = ()
    if x is None:  # no upcast: computed in the input's dtype
        x, casting = x32, "none"
    else:
        casting = "llama"
        nodes.insert(0, x32)
        shared = (x32,)
    out = normed
    nxt = _only_user(out)
    if casting == "llama":
        if _cast_dtype(nxt) is not None and _cast_dtype(nxt) == value(x).dtype:
            out = nxt
            nodes.append(out)
            nxt = _only_user(out)
        elif value(x).dtype != torch.float32:
            return None  # fp32 result, not cast back: not a casting mode of the kernel
    weight = None
    if kind(nxt) == "mul" and len(nxt.args) == 2 and not nxt.kwargs:
        w = _other(nxt, out)
        wv = value(w)
        if isinstance(wv, torch.Tensor) and wv.dim() == 1:
            weight = w
            out = nxt
            nodes.append(out)
    tensors = {"x": x} if weight is None else {"x": x, "weight": weight}
    norm = Match(
        pattern="rms_norm" if weight is not None else "rms_norm (no weight)",
        op="rms_norm",
        fn=_fn("rms_norm"),
        args=(x, weight, float(eps)),
        kwargs={"casting_mode": casting},
        nodes=nodes,
        tensors=tensors,
        shared_ok=shared,
    )
    summands = _residual_add(x)
    if summands is None:
        return norm
    # x is itself a sum: add and norm in one kernel, the sum its second result
    a, b = summands
    return Match(
        pattern="rms_norm(x + residual)",
        op="fused_add_rms_norm",
        fn=_fn("fused_add_rms_norm"),
        args=(a, b, weight, float(eps)),
        kwargs={"casting_mode": casting},
        nodes=[x, *nodes],
        tensors={"x": a, "residual": b} | ({} if weight is None else {"weight": weight}),
        shared_ok=shared,
        outputs=(out, x),
        fallback=norm,
    )


def _residual_add(s: Node) -> tuple[Node, Node] | None:
    """(a, b) when `s` is `a + b` of two tensors of s's shape and dtype (no broadcasting, no
    promotion): the residual add of a pre-norm block, `hidden = residual + hidden`."""
    if kind(s) != "add" or len(s.args) != 2 or s.kwargs:
        return None
    a, b = s.args
    vs, va, vb = value(s), value(a), value(b)
    if not all(isinstance(v, torch.Tensor) for v in (vs, va, vb)):
        return None
    same = all(v.shape == vs.shape and v.dtype == vs.dtype for v in (va, vb))
    return (a, b) if same else None


# --------------------------------------------------------------------------- LayerNorm


def match_layer_norm(node: Node) -> Match | None:
    """`F.layer_norm(x, (N,), weight, bias, eps)` (and `torch.layer_norm`, and `nn.LayerNorm`,
    which Dynamo records as that call) with weight and bias each a tensor or None. Normalising
    over more than the last dimension is reported, not replaced."""
    if kind(node) != "layer_norm" or node.op != "call_function":
        return None
    x = arg(node, 0, "input")
    shape = arg(node, 1, "normalized_shape")
    weight, bias = arg(node, 2, "weight"), arg(node, 3, "bias")
    eps = arg(node, 4, "eps", 1e-5)
    xv = value(x)
    if not isinstance(xv, torch.Tensor):
        return None
    problem = None
    if not isinstance(shape, (tuple, list, torch.Size)) or not all(
        isinstance(d, int) for d in shape
    ):
        problem = f"normalized_shape {shape!r} is not a constant"
    elif len(shape) != 1:
        problem = f"normalized_shape {tuple(shape)} spans more than the last dimension"
    elif not isinstance(eps, (int, float)) or isinstance(eps, bool):
        problem = "eps is not a constant"
    tensors = {"x": x}
    for name, t in (("weight", weight), ("bias", bias)):
        if isinstance(t, Node):
            tensors[name] = t
        elif t is not None:
            problem = problem or f"{name} is not a tensor"
    affine = "weight" in tensors or "bias" in tensors
    return Match(
        pattern="layer_norm" if affine else "layer_norm (no affine)",
        op="layer_norm",
        fn=_fn("layer_norm"),
        args=(x, weight, bias, float(eps) if problem is None else eps),
        nodes=[node],
        tensors=tensors,
        problem=problem,
    )


# --------------------------------------------------------------------------- gated MLP


def match_gated(mul: Node) -> Match | None:
    """`F.silu(gate) * up` (swiglu) and `F.gelu(gate, approximate=...) * up` (geglu)."""
    if kind(mul) != "mul" or len(mul.args) != 2 or mul.kwargs:
        return None
    for act in mul.args:
        k = kind(act)
        if k not in ("silu", "gelu") or _only_user(act) is not mul:
            continue
        up = _other(mul, act)
        if not isinstance(up, Node):
            continue
        gate = act.args[0] if act.args else act.kwargs.get("input")
        if k == "silu" and arg(act, 1, "inplace", False):
            continue
        if k == "silu":
            return Match(
                "silu(gate) * up", "swiglu", _fn("swiglu"), (gate, up), {}, [act, mul],
                {"gate": gate, "up": up},
            )  # fmt: skip
        approximate = arg(act, 1, "approximate", "none")
        return Match(
            f"gelu(gate, approximate={approximate!r}) * up", "geglu", _fn("geglu"),
            (gate, up), {"approximate": approximate}, [act, mul], {"gate": gate, "up": up},
            problem=None if approximate in ("tanh", "none") else "unknown gelu approximation",
        )  # fmt: skip
    return None


# --------------------------------------------------------------------------- relu^2


def match_relu_squared(node: Node) -> Match | None:
    """`F.relu(x) ** 2`, `torch.square(F.relu(x))`, `r * r` with `r = relu(x)`."""
    relu = _squared(node)
    if kind(relu) != "relu" or len(relu.users) != 1 or arg(relu, 1, "inplace", False):
        return None
    x = relu.args[0] if relu.args else relu.kwargs.get("input")
    return Match("relu(x) ** 2", "relu_squared", _fn("relu_squared"), (x,), {}, [relu, node],
                 {"x": x})  # fmt: skip


# --------------------------------------------------------------------------- softmax


def match_softmax(node: Node) -> Match | None:
    """`torch.softmax(x, -1)`, `F.softmax(x, dim=-1)`, `x.softmax(-1)`; the same for log."""
    k = kind(node)
    if k not in ("softmax", "log_softmax"):
        return None
    x = node.args[0] if node.args else node.kwargs.get("input")
    xv = value(x)
    if xv is None:
        return None
    dim = arg(node, 1, "dim")
    # F.softmax(x, dim, _stacklevel, dtype); torch.softmax / Tensor.softmax(x, dim, dtype)
    functional = node.op == "call_function" and node.target in (F.softmax, F.log_softmax)
    dtype = arg(node, 3 if functional else 2, "dtype")
    problem = None
    if not _last_dim(dim, xv.dim()):
        problem = f"dim={dim!r} is not the last dimension"
    elif dtype is not None and dtype != xv.dtype:
        problem = f"dtype={dtype} converts the result"
    return Match(f"{k}(x, dim=-1)", "softmax", _fn(k), (x,), {}, [node], {"x": x}, problem)


# --------------------------------------------------------------------------- jagged mean


def segment_mean(data: torch.Tensor, lengths=None, offsets=None) -> torch.Tensor:
    """`torch.segment_reduce(data, "mean", lengths= | offsets=, axis=0)` through jagged_mean:
    NaN for an empty segment, as eager gives; lengths that do not sum to the rows of `data` are
    a device-side assert, as eager's error."""
    from kernelwright.ops.jagged_mean import jagged_mean

    if offsets is None:
        zero = torch.zeros(1, dtype=torch.int64, device=lengths.device)
        offsets = torch.cat([zero, torch.cumsum(lengths, 0)])
    offsets = offsets.to(torch.int64)
    total = data.shape[0]
    torch._assert_async(
        (offsets[0] == 0) & (offsets[-1] == total),
        "segment_reduce: lengths must sum to the rows of data",
    )
    out = jagged_mean(data.reshape(total, -1), offsets, validate=False)
    empty = (offsets[1:] == offsets[:-1]).unsqueeze(-1)
    out = torch.where(empty, torch.full_like(out, float("nan")), out)
    return out.view(offsets.shape[0] - 1, *data.shape[1:])


def match_segment_mean(node: Node) -> Match | None:
    """`torch.segment_reduce(data, "mean", lengths=L)` (or `offsets=O`) along axis 0."""
    if kind(node) != "segment_reduce":
        return None
    data, reduce = arg(node, 0, "data"), arg(node, 1, "reduce")
    lengths, offsets = arg(node, 2, "lengths"), node.kwargs.get("offsets")
    bounds = lengths if lengths is not None else offsets
    if reduce != "mean" or not isinstance(data, Node) or not isinstance(bounds, Node):
        return None
    problem = None
    extra = set(node.kwargs) - {"lengths", "offsets", "axis", "unsafe"}
    if len(node.args) > 2 or extra or node.kwargs.get("initial") is not None:
        problem = "indices=, initial= or arguments past lengths/offsets"
    elif node.kwargs.get("axis", 0) != 0:
        problem = "axis is not 0"
    elif lengths is not None and offsets is not None:
        problem = "both lengths and offsets"
    bv = value(bounds)
    if problem is None and (
        bv is None or bv.dim() != 1 or bv.dtype not in (torch.int64, torch.int32)
    ):
        problem = "lengths/offsets are not a 1-D integer tensor (a batched segment_reduce)"
    kwargs = {"lengths": lengths} if lengths is not None else {"offsets": offsets}
    return Match(
        "segment_reduce(data, 'mean')", "jagged_mean", segment_mean, (data,), kwargs, [node],
        {"data": data}, problem,
    )  # fmt: skip


# --------------------------------------------------------------------------- RoPE


def _half_slice(node: Any, x: Node, half: int, first: bool) -> bool:
    """Whether `node` is `x[..., :half]` (first) or `x[..., half:]` (not first)."""
    if kind(node) != "getitem" or len(node.args) != 2 or node.args[0] is not x:
        return False
    index = node.args[1]
    if not (isinstance(index, tuple) and len(index) == 2 and index[0] is Ellipsis):
        return False
    sl = index[1]
    if not isinstance(sl, slice) or sl.step is not None:
        return False
    return (sl.start, sl.stop) == ((None, half) if first else (half, None))


def _rotate_half(cat: Any) -> Node | None:
    """x for HF's `rotate_half(x)`: `torch.cat((-x[..., h:], x[..., :h]), dim=-1)`, h = D/2."""
    if kind(cat) != "cat" or len(cat.args) < 1:
        return None
    parts = cat.args[0]
    dim = arg(cat, 1, "dim", 0)
    if not (isinstance(parts, (tuple, list)) and len(parts) == 2) or dim != -1:
        return None
    neg, x1 = parts
    if kind(neg) != "neg" or len(neg.args) != 1:
        return None
    x2 = neg.args[0]
    if not isinstance(x1, Node) or kind(x1) != "getitem" or not isinstance(x1.args[0], Node):
        return None
    x = x1.args[0]
    xv = value(x)
    if xv is None or not isinstance(xv.shape[-1], int) or xv.shape[-1] % 2:
        return None
    half = xv.shape[-1] // 2
    if _half_slice(x1, x, half, True) and _half_slice(x2, x, half, False):
        return x
    return None


def _unsqueezed(node: Any) -> tuple[Node, int] | None:
    """(t, dim) for `t.unsqueeze(dim)` / `torch.unsqueeze(t, dim)`."""
    if kind(node) != "unsqueeze" or len(node.args) + len(node.kwargs) != 2:
        return None
    dim = arg(node, 1, "dim")
    return (node.args[0], dim) if isinstance(dim, int) else None


def rope_rotate_half(x: torch.Tensor, cos, sin, unsqueeze_dim: int) -> torch.Tensor:
    """`x * cos.unsqueeze(d) + rotate_half(x) * sin.unsqueeze(d)` for one of q, k: kernelwright's
    rope with no heads on the other side."""
    from kernelwright.ops.rope import rope

    return rope(x, x.narrow(unsqueeze_dim, 0, 0), cos, sin, unsqueeze_dim=unsqueeze_dim)[0]


def match_rope(add: Node) -> Match | None:
    """HF's `q * cos + rotate_half(q) * sin` (cos, sin unsqueezed at dim 1 or 2), for q or k."""
    if kind(add) != "add" or len(add.args) != 2 or add.kwargs:
        return None
    for rot_mul in add.args:
        if kind(rot_mul) != "mul" or len(rot_mul.args) != 2 or rot_mul.kwargs:
            continue
        cat = next((a for a in rot_mul.args if kind(a) == "cat"), None)
        x = _rotate_half(cat)
        if x is None:
            continue
        plain = _other(add, rot_mul)
        if kind(plain) != "mul" or len(plain.args) != 2 or plain.kwargs:
            continue
        cos_u, sin_u = _other(plain, x), _other(rot_mul, cat)
        cos, sin = _unsqueezed(cos_u), _unsqueezed(sin_u)
        if cos is None or sin is None or cos[1] != sin[1]:
            continue
        dim = cos[1]
        x1, x2 = cat.args[0][1], cat.args[0][0].args[0]
        neg = cat.args[0][0]
        nodes = [plain, x1, x2, neg, cat, rot_mul, add]
        order = {n: i for i, n in enumerate(add.graph.nodes)}
        nodes.sort(key=order.__getitem__)
        return Match(
            "q * cos + rotate_half(q) * sin", "rope", rope_rotate_half,
            (x, cos[0], sin[0], dim), {}, nodes, {"x": x, "cos": cos[0], "sin": sin[0]},
            problem=_rope_problem(x, cos[0], sin[0], dim, add),
        )  # fmt: skip
    return None


def _rope_problem(x: Node, cos: Node, sin: Node, dim: int, add: Node) -> str | None:
    xv, cv, sv, out = value(x), value(cos), value(sin), value(add)
    if any(v is None for v in (xv, cv, sv, out)):
        return "no traced value for q, cos or sin"
    if xv.dim() != 4 or dim not in (1, 2):
        return "not [batch, heads, seq, head_dim] with cos/sin unsqueezed at dim 1 or 2"
    if cv.dim() != 3 or tuple(cv.shape) != tuple(sv.shape) or cv.shape[-1] != xv.shape[-1]:
        return "cos/sin are not [batch or 1, seq, head_dim] (partial rotary is not matched)"
    seq = xv.shape[3 - dim]
    if cv.shape[1] != seq or cv.shape[0] not in (1, xv.shape[0]):
        return "cos/sin do not match q's batch and sequence"
    if out.dtype != xv.dtype or tuple(out.shape) != tuple(xv.shape):
        return "the result's dtype or shape differs from q's (eager promotes or broadcasts)"
    if cv.requires_grad or sv.requires_grad:
        return "cos/sin require grad (the kernel gives q and k theirs only)"
    return None


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
    logits keeps them, and the plain cross-entropy site). The plain site is the fallback."""
    if kind(logits) != "linear" or len(logits.users) != 1:
        return None
    hidden, w = arg(logits, 0, "input"), arg(logits, 1, "weight")
    bias = arg(logits, 2, "bias")
    if not isinstance(hidden, Node) or not isinstance(w, Node):
        return None
    if absorbed and any(len(n.users) != 1 for n in absorbed):
        return None  # the upcast or flattened logits are read elsewhere
    hv, wv = value(hidden), value(w)
    problem = ce.problem
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


def _fn(name: str) -> Callable[..., torch.Tensor]:
    """The kernelwright function a replaced site calls, from the op registry (log_softmax is a
    second function of softmax's module)."""
    from kernelwright import registry

    if name == "log_softmax":
        return registry.get("softmax").attr("log_softmax")
    return registry.get(name).fn()


# Tried in this order at every node; RMSNorm first, since its `x32 * rsqrt` is also a `mul`.
MATCHERS: tuple[Callable[[Node], Match | None], ...] = (
    match_rms_norm,
    match_gated,
    match_relu_squared,
    match_softmax,
    match_layer_norm,
    match_cross_entropy,
    match_rope,
    match_segment_mean,
)
