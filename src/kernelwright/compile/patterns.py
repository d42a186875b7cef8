"""The patterns the graph pass replaces, matched in a Dynamo graph as users write them.

A Dynamo graph holds torch-level calls in the spellings of the source: `x * y` is
`operator.mul`, `x.pow(2)` a `call_method` "pow", `F.silu(x)` `torch.nn.functional.silu`.
`kind()` maps every spelling of one computation to one name ("mul", "pow", "silu"), so each
pattern is written once, as a walk from an anchor node to its inputs, and matches
`torch.rsqrt(v)` and `v.rsqrt()` alike.

A matcher returns a `Match` (the kernelwright function to call, its arguments, the nodes it
replaces) or None; a match the kernel cannot compute as written (softmax over a dimension
other than the last) carries the reason in `problem` and is reported, not replaced.

Here: the shared vocabulary (`kind`, `Match`, ...) and the norm, activation and softmax
patterns: RMSNorm (HF-style; fused add + RMSNorm where its input is a residual sum, the sum
being the call's second result), `silu(gate) * up` / `gelu(gate) * up`, `relu(x) ** 2`,
softmax / log_softmax, LayerNorm. Beside it: cross-entropy and fused linear cross-entropy
(patterns_loss.py), HF's rotate_half RoPE (patterns_rope.py), jagged mean pooling as
segment_reduce, index_add / scatter_add over counts, or scatter_reduce (patterns_jagged.py);
`matchers.py` lists them all in the order they are tried.
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
    operator.truediv: "div",
    torch.div: "div",
    torch.true_divide: "div",
    torch.zeros: "zeros",
    torch.zeros_like: "zeros_like",
    torch.ones: "ones",
    torch.ones_like: "ones_like",
    torch.index_add: "index_add",
    torch.scatter_add: "scatter_add",
    torch.scatter_reduce: "scatter_reduce",
    torch.index_reduce: "index_reduce",
    torch.bincount: "bincount",
    torch.clamp: "clamp",
    torch.clip: "clamp",
    torch.clamp_min: "clamp_min",
    torch.broadcast_to: "broadcast_to",
}
# Tensor methods (call_method targets) the patterns read; an in-place one ("index_add_") has its
# own name, so that a pattern reading "mul" never matches "mul_".
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
    "div",
    "double",
    "type_as",
    "new_zeros",
    "new_ones",
    "index_add",
    "index_add_",
    "scatter_add",
    "scatter_add_",
    "scatter_reduce",
    "scatter_reduce_",
    "index_reduce",
    "index_reduce_",
    "bincount",
    "clamp",
    "clamp_min",
    "expand",
    "expand_as",
    "broadcast_to",
    "repeat",
}
_METHOD_ALIASES = {"true_divide": "div", "clip": "clamp"}


def kind(node: Any) -> str | None:
    """What `node` computes ("mul", "rsqrt", ...), whatever the spelling; None otherwise."""
    if not isinstance(node, Node):
        return None
    if node.op == "call_method" and node.target in _METHODS:
        return node.target
    if node.op == "call_method" and node.target in _METHOD_ALIASES:
        return _METHOD_ALIASES[node.target]
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


def _fn(name: str) -> Callable[..., torch.Tensor]:
    """The kernelwright function a replaced site calls, from the op registry (log_softmax is a
    second function of softmax's module)."""
    from kernelwright import registry

    if name == "log_softmax":
        return registry.get("softmax").attr("log_softmax")
    return registry.get(name).fn()
