"""Liger Kernel's implementation of an op, called at a graph site where Liger is installed.

The registry lists Liger beside kernelwright's kernel for the ops Liger has, and the selection
(select.py) times it like the others. Where Liger measured fastest and the adapter here takes
the site, the pass (passes.py) calls Liger's function with the site's arguments, the
positional arguments the benchmark providers time (bench/specs/):

    rms_norm            LigerRMSNormFunction(x, w, eps, 0.0, casting, False): HF's RMSNorm is
                        casting "llama" (fp32 rstd, the weight applied in x's dtype) or "none"
    fused_add_rms_norm  LigerFusedAddRMSNormFunction(x, residual, w, eps, 0.0, casting, False)
                        -> (norm, sum)
    layer_norm          LigerLayerNormFunction(x, w, b, eps)
    swiglu, geglu       LigerSiLUMulFunction(gate, up), LigerGELUMulFunction(gate, up) (tanh)
    relu_squared        LigerReLUSquaredFunction(x)
    softmax             LigerSoftmaxFunction(x) over the last dim
    rope                LigerRopeFunction(q, k, cos, sin) on q [B, H, S, D] and cos/sin
                        [1 or B, S, D]; a [B, S, H, D] site (cos unsqueezed at 2) is transposed
    cross_entropy       LigerCrossEntropyFunction(logits, target, weight, ignore_index, 0.0,
                        label_smoothing, reduction, None, False, False, False)
    fused_linear_cross_entropy  LigerFusedLinearCrossEntropyFunction(hidden, W, target, bias,
                        class_weight, ignore_index, 0.0, label_smoothing, reduction, None,
                        False, None)

How it is called. AOT autograd traces the rewritten graph with fake tensors, and Liger's
Functions launch Triton kernels from Python, which fake tensors cannot run; so each call goes
through two opaque custom ops, `kernelwright::liger_fwd` and `kernelwright::liger_bwd`, whose
output shapes are given here. An opaque op cannot carry Liger's autograd context from the
forward to the backward, so the losses take their gradient in the forward for a unit upstream
gradient (as Liger's losses do) and the backward scales it, and every other op's backward
runs Liger's forward again on the saved inputs, then Liger's backward: one more forward pass
than the benchmark times. Where Liger writes over its inputs (rope rotates q and k in place,
and the upstream gradients in its backward; cross-entropy writes the gradient over the
logits; the gated activations' backward writes over gate and up) it gets copies, so the
graph's tensors keep their values. Cross-entropy gets the logits as an fp32 copy, the upcast
eager makes, because Liger sums its loss in the logits' dtype.

`unsupported(match)` says why Liger cannot take a site (None when it can): not installed, or
what its function does not compute (no weight, a class weight that needs a gradient, the erf
GELU, log_softmax, reduction="none" with the lm-head fused, cos/sin that are not HF's tables).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.autograd.function import once_differentiable
from torch.fx import Node

from kernelwright.compile.patterns import Match, arg, kind, value
from kernelwright.registry.entry import resolve

Tensors = list[torch.Tensor | None]


@contextlib.contextmanager
def _autograd():
    """Autograd recording inside a custom op's kernel, which the dispatcher runs with autograd
    excluded: Liger's backward is reached through autograd, here, on real tensors."""
    include = torch._C._dispatch_tls_local_include_set()
    exclude = torch._C._dispatch_tls_local_exclude_set()
    exclude = exclude.remove(torch._C.DispatchKey.AutogradFunctionality)
    with torch._C._ForceDispatchKeyGuard(include, exclude), torch.enable_grad():
        yield


@dataclass(frozen=True)
class Adapter:
    """How the pass calls Liger for one op.

    inputs: the site's tensors (nodes or None) and the constants Liger takes, from its match.
    run: (Liger's callable, tensors, constants, needs-grad flags) -> the outputs; for a loss,
        the loss then the gradients of the flagged inputs for a unit upstream gradient.
    fake: the same outputs as empty tensors (shapes, dtypes, strides) for tracing.
    check: why Liger cannot compute this site (None when it can).
    """

    inputs: Callable[[Match], tuple[tuple[Any, ...], dict]]
    run: Callable[[Any, Tensors, dict, list[bool]], list[torch.Tensor]]
    fake: Callable[[Tensors, dict, list[bool]], list[torch.Tensor]]
    check: Callable[[Match], str | None] = lambda m: None
    outputs: int = 1  # what the site returns (fused add + RMSNorm: the norm and the sum)
    loss: bool = False  # its gradient comes from the forward
    note: str = "its backward runs Liger's forward again (an opaque op keeps no autograd state)"


def _vals(m: Match) -> dict[str, Any]:
    return {k: value(n) for k, n in m.tensors.items()}


def _like(t: torch.Tensor, shape=None, dtype=None) -> torch.Tensor:
    return t.new_empty(t.shape if shape is None else shape, dtype=dtype or t.dtype)


def _same(ts: Tensors, *_) -> list[torch.Tensor]:
    return [_like(ts[0])]


def _dtype_check(m: Match, *names: str) -> str | None:
    """Liger computes and writes in x's dtype: a parameter of another dtype (which eager
    promotes, or computes in) is not taken."""
    v = _vals(m)
    x = v["x"]
    for name in names:
        p = v.get(name)
        if p is not None and p.dtype != x.dtype:
            a, b = str(p.dtype).removeprefix("torch."), str(x.dtype).removeprefix("torch.")
            return f"{name} is {a} and x {b}: Liger computes in x's dtype"
    return None


# --------------------------------------------------------------------------- norms


def _rms_inputs(m: Match):
    x, weight, eps = m.args
    return (x, weight), {"eps": eps, "casting": m.kwargs["casting_mode"]}


def _rms_run(fn, ts, p, need):
    x, w = ts
    return [fn(x, w, p["eps"], 0.0, p["casting"], False)]


def _rms_check(m: Match) -> str | None:
    return _dtype_check(m, "weight")


def _fused_add_inputs(m: Match):
    a, b, weight, eps = m.args
    return (a, b, weight), {"eps": eps, "casting": m.kwargs["casting_mode"]}


def _fused_add_run(fn, ts, p, need):
    x, r, w = ts
    y, s = fn(x, r, w, p["eps"], 0.0, p["casting"], False)
    return [y, s]


def _fused_add_check(m: Match) -> str | None:
    if "weight" not in m.tensors:
        return "no weight: Liger's fused add + RMSNorm takes one"
    return _rms_check(m)


def _layer_norm_inputs(m: Match):
    x, weight, bias, eps = m.args
    return (x, weight, bias), {"eps": eps}


def _layer_norm_run(fn, ts, p, need):
    x, w, b = ts
    return [fn(x, w, b, p["eps"])]


def _layer_norm_check(m: Match) -> str | None:
    if "weight" not in m.tensors or "bias" not in m.tensors:
        return "not affine (weight and bias): Liger's LayerNorm takes both"
    return _dtype_check(m, "weight", "bias")


# --------------------------------------------------------------------------- activations


def _tensor_args(m: Match):
    return tuple(m.args), {}


def _call_all(fn, ts, p, need):
    return [fn(*ts)]


def _geglu_check(m: Match) -> str | None:
    if m.kwargs.get("approximate") != "tanh":
        return "gelu(approximate='none') is the erf form: Liger's GELU-mul is the tanh form only"
    return None


def _softmax_check(m: Match) -> str | None:
    return "log_softmax: Liger has softmax only" if m.pattern.startswith("log_softmax") else None


# --------------------------------------------------------------------------- rope


def _rope_inputs(m: Match):
    x, cos, sin, dim = m.args
    return (x, cos, sin), {"dim": dim}


def _bshd_empty(x: torch.Tensor, dim: int) -> torch.Tensor:
    """x's shape laid out as [B, S, H, D] in memory (HF's q: a projection viewed per head),
    the layout Liger rotates in place."""
    if dim == 2:  # x is [B, S, H, D]
        return x.new_empty(x.shape)
    b, h, s, d = x.shape
    return x.new_empty((b, s, h, d)).transpose(1, 2)


def _rope_run(fn, ts, p, need):
    x, cos, sin = ts
    dim = p["dim"]
    q = _bshd_empty(x, dim)
    q.copy_(x)  # Liger rotates q in place: a copy, never the graph's tensor
    q4 = q if dim == 1 else q.transpose(1, 2)  # [B, H, S, D]
    b, _, s, d = q4.shape
    k4 = q.new_zeros((b, s, 1, d)).transpose(1, 2)  # one head of k: Liger rotates both
    out, _ = fn(q4, k4, cos, sin)
    out = out if dim == 1 else out.transpose(1, 2)
    if out.stride() != q.stride():  # a Liger that allocates its result: the traced layout
        q.copy_(out)
        out = q
    return [out]


def _rope_fake(ts, p, need):
    return [_bshd_empty(ts[0], p["dim"])]


_ELEMENTWISE = {"cos", "sin", "to", "float", "type_as", "contiguous", "clone", "detach"}
_SCALE = {"mul", "div"}


def _repeats_halves(node: Any, depth: int = 0) -> bool:
    """Whether the table `node` provably repeats its first half in its second along the last
    dim, as HF's rotary embedding builds it: `emb = cat((freqs, freqs), -1)`, then cos/sin,
    a scale, a cast, or an index into the leading dims."""
    if not isinstance(node, Node) or depth > 16:
        return False
    k = kind(node)
    target = node.target
    if k == "cat":
        parts, dim = arg(node, 0, "tensors"), arg(node, 1, "dim", 0)
        ndim = getattr(value(node), "ndim", None)
        return (
            isinstance(parts, (list, tuple))
            and len(parts) == 2
            and parts[0] is parts[1]
            and (dim == -1 or dim == (ndim or 0) - 1)
        )
    unary = target in (torch.cos, torch.sin) or (
        node.op == "call_method" and target in _ELEMENTWISE
    )
    if unary and node.args:
        return _repeats_halves(node.args[0], depth + 1)
    if k in _SCALE and len(node.args) == 2 and not node.kwargs:
        a, b = node.args
        if isinstance(b, (int, float)):
            return _repeats_halves(a, depth + 1)
        if isinstance(a, (int, float)) and k == "mul":
            return _repeats_halves(b, depth + 1)
        return False
    # cos[position_ids]: rows picked along the leading dim, the last dim untouched
    if k == "getitem" and target is operator.getitem and isinstance(node.args[1], Node):
        return _repeats_halves(node.args[0], depth + 1)
    return False


def _rope_check(m: Match) -> str | None:
    cos, sin = m.tensors["cos"], m.tensors["sin"]
    if (why := _dtype_check(m, "cos", "sin")) is not None:
        return why
    if not (_repeats_halves(cos) and _repeats_halves(sin)):
        return (
            "cos/sin are not shown to repeat their first half (HF's cat((freqs, freqs))): "
            "Liger's RoPE reads only the first half"
        )
    return None


# --------------------------------------------------------------------------- losses


def _ce_inputs(m: Match):
    x, target, weight = m.args
    keys = ("ignore_index", "reduction", "label_smoothing")
    return (x, target, weight), {k: m.kwargs[k] for k in keys}


def _first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


def _ce_run(fn, ts, p, need):
    x, target, weight = ts
    v = x.shape[-1]
    # an fp32 copy: Liger writes the gradient over its input and sums the loss in its dtype
    logits = x.reshape(-1, v).to(torch.float32, memory_format=torch.contiguous_format, copy=True)
    with _autograd():
        logits.requires_grad_(need[0])
        args = (p["ignore_index"], 0.0, p["label_smoothing"], p["reduction"], None)
        loss = _first(fn(logits, target.reshape(-1), weight, *args, False, False, False))
        outs = [loss.detach().float()]
        if need[0]:
            (g,) = torch.autograd.grad(loss, logits, torch.ones_like(loss))
            outs.append(g.detach().to(x.dtype).reshape(x.shape))
    return outs


def _ce_fake(ts, p, need):
    x = ts[0]
    rows = x.numel() // x.shape[-1]
    loss = x.new_empty((rows,) if p["reduction"] == "none" else (), dtype=torch.float32)
    return [loss] + ([_like(x)] if need[0] else [])


def _class_weight_check(v: Any) -> str | None:
    if v is not None and v.requires_grad:
        return "the class weight requires grad: Liger gives it none"
    return None


def _ce_check(m: Match) -> str | None:
    return _class_weight_check(_vals(m).get("weight"))


def _flce_inputs(m: Match):
    hidden, w, target, bias = m.args
    keys = ("ignore_index", "reduction", "label_smoothing")
    params = {k: m.kwargs[k] for k in keys}
    return (hidden, w, target, bias, m.kwargs.get("class_weight")), params


_FLCE_GRADS = (0, 1, 3)  # hidden, the lm-head weight, the bias


def _flce_run(fn, ts, p, need):
    hidden, w, target, bias, class_weight = ts
    leaves = [hidden.reshape(-1, hidden.shape[-1]).detach(), w.detach(), target.reshape(-1)]
    leaves.append(None if bias is None else bias.detach())
    with _autograd():
        wrt = []
        for i in _FLCE_GRADS:
            if need[i] and leaves[i] is not None:
                wrt.append(leaves[i].requires_grad_())
        args = (p["ignore_index"], 0.0, p["label_smoothing"], p["reduction"], None, False, None)
        loss = _first(fn(*leaves, class_weight, *args))
        grads = torch.autograd.grad(loss, wrt) if wrt else ()
    shapes = [ts[i].shape for i in _FLCE_GRADS if need[i] and ts[i] is not None]
    return [loss.detach().float()] + [
        g.detach().reshape(s) for g, s in zip(grads, shapes, strict=True)
    ]


def _flce_fake(ts, p, need):
    loss = ts[0].new_empty((), dtype=torch.float32)
    return [loss] + [_like(ts[i]) for i in _FLCE_GRADS if need[i] and ts[i] is not None]


def _flce_check(m: Match) -> str | None:
    if m.kwargs.get("reduction") not in ("mean", "sum"):
        return "reduction='none': Liger's fused loss takes the lm-head gradient for a scalar loss"
    return _class_weight_check(value(m.kwargs.get("class_weight")))


# --------------------------------------------------------------------------- the table

_LOSS_NOTE = "its gradient taken in the forward, as Liger's losses do"

ADAPTERS: dict[str, Adapter] = {
    "rms_norm": Adapter(_rms_inputs, _rms_run, _same, _rms_check),
    "fused_add_rms_norm": Adapter(
        _fused_add_inputs,
        _fused_add_run,
        lambda ts, p, n: [_like(ts[0]), _like(ts[0])],
        _fused_add_check,
        outputs=2,
    ),
    "layer_norm": Adapter(_layer_norm_inputs, _layer_norm_run, _same, _layer_norm_check),
    "swiglu": Adapter(_tensor_args, _call_all, _same),
    "geglu": Adapter(lambda m: ((m.args[0], m.args[1]), {}), _call_all, _same, _geglu_check),
    "relu_squared": Adapter(_tensor_args, _call_all, _same),
    "softmax": Adapter(_tensor_args, _call_all, _same, _softmax_check),
    "rope": Adapter(_rope_inputs, _rope_run, _rope_fake, _rope_check),
    "cross_entropy": Adapter(
        _ce_inputs, _ce_run, _ce_fake, _ce_check, loss=True, note=f"fp32 logits, {_LOSS_NOTE}"
    ),
    "fused_linear_cross_entropy": Adapter(
        _flce_inputs, _flce_run, _flce_fake, _flce_check, loss=True, note=_LOSS_NOTE
    ),
}


def target(op: str) -> str:
    """Liger's callable for `op`, as the registry names it ("liger_kernel.ops...:Function")."""
    from kernelwright import registry

    return registry.get(op).impl("liger").function + ".apply"


def _liger(op: str) -> Any:
    return resolve(target(op))


def unsupported(m: Match) -> str | None:
    """Why Liger cannot take the site `m` (None when it can): no adapter, liger_kernel not
    installed (or without this op), or what its function does not compute."""
    if m.op not in ADAPTERS:
        return f"no Liger call for {m.op}"
    try:
        _liger(m.op)
    except (ImportError, AttributeError) as e:
        try:
            importlib.import_module("liger_kernel")
        except ImportError:
            return "liger_kernel is not installed"
        return f"{target(m.op)} does not import ({e})"  # e.g. a Liger without this op
    return ADAPTERS[m.op].check(m)


def note(op: str) -> str:
    """What the call adds to what the benchmark times, for the report."""
    return ADAPTERS[op].note


def site(m: Match) -> Match:
    """The site `m` calling Liger instead: `call(op, constants, *tensors)`."""
    tensors, params = ADAPTERS[m.op].inputs(m)
    return dataclasses.replace(m, fn=call, args=(m.op, json.dumps(params), *tensors), kwargs={})


# --------------------------------------------------------------------------- the opaque call


def call(op: str, params: str, *tensors):
    """Liger's `op` on `tensors` with the JSON `params` (what a replaced site calls)."""
    return _LigerCall.apply(op, params, *tensors)


class _LigerCall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, op: str, params: str, *tensors):
        adapter = ADAPTERS[op]
        need = [
            bool(n) and t is not None and t.is_floating_point()
            for n, t in zip(ctx.needs_input_grad[2:], tensors, strict=True)
        ]
        outs = torch.ops.kernelwright.liger_fwd(op, params, list(tensors), need)
        results, grads = outs[: adapter.outputs], outs[adapter.outputs :]
        ctx.op, ctx.params, ctx.need = op, params, need
        ctx.save_for_backward(*(grads if adapter.loss else tensors))
        if adapter.loss:
            ctx.shapes = [t.shape for t, n in zip(tensors, need, strict=True) if n]
        return tuple(results) if adapter.outputs > 1 else results[0]

    @staticmethod
    @once_differentiable
    def backward(ctx, *douts):
        adapter, need = ADAPTERS[ctx.op], ctx.need
        saved = list(ctx.saved_tensors)
        if adapter.loss:
            dy = douts[0]
            grads = [_scale(g, dy, s) for g, s in zip(saved, ctx.shapes, strict=True)]
        else:
            grads = torch.ops.kernelwright.liger_bwd(ctx.op, ctx.params, saved, list(douts), need)
        it = iter(grads)
        return (None, None, *(next(it) if n else None for n in need))


def _scale(g: torch.Tensor, dy: torch.Tensor, shape) -> torch.Tensor:
    """A loss's gradient for a unit upstream gradient, times the upstream one: a scalar, or
    one per row (reduction="none": the rows of [..., V])."""
    if dy.dim() == 0:
        return (g * dy).to(g.dtype)
    return (g.reshape(-1, g.shape[-1]) * dy.reshape(-1, 1)).to(g.dtype).reshape(shape)


def _own(outs: list[torch.Tensor], inputs: Tensors) -> list[torch.Tensor]:
    """`outs`, each copied where it shares memory with an input or an earlier output (a custom
    op's outputs never alias; add's two gradients are one tensor)."""
    taken = {t.untyped_storage().data_ptr() for t in inputs if t is not None}
    owned = []
    for t in outs:
        t = t.detach()
        if t.untyped_storage().data_ptr() in taken:
            t = t.clone()
        taken.add(t.untyped_storage().data_ptr())
        owned.append(t)
    return owned


@torch.library.custom_op("kernelwright::liger_fwd", mutates_args=())
def _liger_fwd(
    op: str, params: str, tensors: list[torch.Tensor | None], need: list[bool]
) -> list[torch.Tensor]:
    adapter = ADAPTERS[op]
    with torch.no_grad():
        outs = adapter.run(_liger(op), tensors, json.loads(params), need)
    if op != "rope":  # the fakes are contiguous; rope's keeps Liger's in-place layout
        outs = [o.contiguous() for o in outs]
    return _own(outs, tensors)


@_liger_fwd.register_fake
def _(op, params, tensors, need):
    return ADAPTERS[op].fake(tensors, json.loads(params), need)


@torch.library.custom_op("kernelwright::liger_bwd", mutates_args=())
def _liger_bwd(
    op: str,
    params: str,
    tensors: list[torch.Tensor | None],
    douts: list[torch.Tensor],
    need: list[bool],
) -> list[torch.Tensor]:
    """Liger's forward again on the saved inputs, then its backward (the gated activations'
    writes over gate and up, and rope's over the upstream gradients, land in copies)."""
    adapter, p = ADAPTERS[op], json.loads(params)
    copies = op in ("swiglu", "geglu")
    leaves: Tensors = []
    for t, n in zip(tensors, need, strict=True):
        if t is not None:
            t = t.detach().clone(memory_format=torch.contiguous_format) if copies else t.detach()
            t.requires_grad_(n)
        leaves.append(t)
    douts = [d.detach().clone() for d in douts]  # Liger's rope backward rotates them in place
    with _autograd():
        outs = adapter.run(_liger(op), leaves, p, [False] * len(need))
        wrt = [t for t, n in zip(leaves, need, strict=True) if n]
        got = torch.autograd.grad(outs, wrt, douts, allow_unused=True)
    grads = [torch.zeros_like(t) if g is None else g for g, t in zip(got, wrt, strict=True)]
    return _own([g.to(t.dtype).contiguous() for g, t in zip(grads, wrt, strict=True)], tensors)


@_liger_bwd.register_fake
def _(op, params, tensors, douts, need):
    return [t.new_empty(t.shape) for t, n in zip(tensors, need, strict=True) if n]
