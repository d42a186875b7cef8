"""Planted bugs for `kernelwright debug` (tests/test_debug.py): each a function named as the
debug target `debug_planted:<name>`, with a library op as its reference (`--ref <op>`).

Each one is a library op with one thing wrong: a wrong constant or option, a cast left out,
a backward that drops or scales one input's gradient, a mask, a stride, a launch-table row.
Some are small Triton kernels of their own (a missing tail tile, the wrong `other` on a masked
load, programs storing over each other's dW partial, an offset computed in int32). Never
shipped: this module lives in tests/ only. `BUGS` lists each bug with where `debug` must
localise it: the pass, and per axis a value its regime must contain while not being every
value of that axis. `GPU_BUGS` are those only a GPU reaches (inputs past 2^31 elements).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch

import kernelwright  # noqa: F401  (selects the interpreter before the kernels below exist)
from kernelwright.ops import rms_norm as rms_norm_mod
from kernelwright.ops import softmax as softmax_mod
from kernelwright.ops.cross_entropy import cross_entropy
from kernelwright.ops.geglu import geglu
from kernelwright.ops.jagged_mean import jagged_mean
from kernelwright.ops.layer_norm import layer_norm, layer_norm_ref
from kernelwright.ops.relu_squared import relu_squared_ref
from kernelwright.ops.rms_norm import rms_norm
from kernelwright.ops.rope import rope, rope_ref
from kernelwright.ops.softmax import softmax
from kernelwright.ops.swiglu import swiglu
from kernelwright.runtime import device_info
from kernelwright.runtime.launch import LaunchConfig
from kernelwright.runtime.tables import softmax as softmax_table

# the bugs written as Triton kernels, re-exported: their targets are `debug_planted:<name>` too
from debug_planted_kernels import (  # isort: skip
    relu_squared_int32_offsets,
    relu_squared_tail_tiles,
    rms_norm_dw_race,
    rms_norm_masked_other,
)


@dataclass(frozen=True)
class Bug:
    name: str  # the function below
    ref: str  # the library op it stands in for
    pass_name: str  # where debug must localise it: "forward", "grad:<input>", "backward"
    regime: dict[str, str] = field(default_factory=dict)  # axis -> a value its regime holds
    what: str = ""


# --------------------------------------------------------------------------- helpers


class _Regrad(torch.autograd.Function):
    """`fn(**inputs)` forward; backward: the true gradients, then `fix(name, grad, inputs, dy)`."""

    @staticmethod
    def forward(ctx, fn, fix, names, kwargs, *tensors):
        ins = [
            t.detach().requires_grad_(t.is_floating_point()) if isinstance(t, torch.Tensor) else t
            for t in tensors
        ]
        with torch.enable_grad():
            out = fn(**dict(zip(names, ins, strict=True)), **kwargs)
        ctx.fix, ctx.names, ctx.ins, ctx.out = fix, names, ins, out
        ctx.originals = tensors
        return out.detach().clone()

    @staticmethod
    def backward(ctx, dy):
        wanted = [
            i for i, t in enumerate(ctx.ins) if isinstance(t, torch.Tensor) and t.requires_grad
        ]
        got = torch.autograd.grad(ctx.out, [ctx.ins[i] for i in wanted], dy, allow_unused=True)
        grads = [None] * len(ctx.ins)
        inputs = dict(zip(ctx.names, ctx.originals, strict=True))
        for i, g in zip(wanted, got, strict=True):
            grads[i] = ctx.fix(ctx.names[i], g, inputs, dy) if g is not None else None
        return (None, None, None, None, *grads)


def _regrad(fn, fix, kwargs=None, **inputs):
    names = tuple(inputs)
    return _Regrad.apply(fn, fix, names, kwargs or {}, *inputs.values())


class _Scoped(torch.autograd.Function):
    """`fn(**inputs)` with `scope()` entered around its forward and its backward (a patch
    that must be in force when the op's backward kernels are looked up too)."""

    @staticmethod
    def forward(ctx, fn, scope, names, *tensors):
        ins = [
            t.detach().requires_grad_(t.is_floating_point()) if isinstance(t, torch.Tensor) else t
            for t in tensors
        ]
        with scope(), torch.enable_grad():
            out = fn(**dict(zip(names, ins, strict=True)))
        ctx.scope, ctx.ins, ctx.out = scope, ins, out
        return out.detach().clone()

    @staticmethod
    def backward(ctx, dy):
        wanted = [
            i for i, t in enumerate(ctx.ins) if isinstance(t, torch.Tensor) and t.requires_grad
        ]
        with ctx.scope():
            got = torch.autograd.grad(ctx.out, [ctx.ins[i] for i in wanted], dy, allow_unused=True)
        grads = [None] * len(ctx.ins)
        for i, g in zip(wanted, got, strict=True):
            grads[i] = g
        return (None, None, None, *grads)


# ------------------------------------------------------------------- wrong constants, options


def rms_norm_wrong_eps(x, weight=None, eps=1e-6, **kw):
    return rms_norm(x, weight, 1e-2, **kw)  # eps 1e-2 where the model says 1e-6


def rms_norm_no_offset(x, weight=None, eps=1e-6, *, offset=0.0, **kw):
    return rms_norm(x, weight, eps, **kw)  # Gemma's 1 + w: the offset dropped


def cross_entropy_no_softcap(logits, target, weight=None, *, softcap=None, **kw):
    return cross_entropy(logits, target, weight, **kw)  # the soft-capping dropped


def cross_entropy_mean_over_all(logits, target, weight=None, *, reduction="mean", **kw):
    # "mean" over every token, ignored ones included
    if reduction != "mean":
        return cross_entropy(logits, target, weight, reduction=reduction, **kw)
    out = cross_entropy(logits, target, weight, reduction="sum", **kw)
    rows = target.numel()
    return tuple(o / rows for o in out) if isinstance(out, tuple) else out / rows


def geglu_tanh_always(gate, up, *, approximate="tanh", **kw):
    return geglu(gate, up, approximate="tanh", **kw)  # erf GELU computed with the tanh form


def rope_no_interleave(q, k, cos, sin, *, interleaved=False, **kw):
    return rope(q, k, cos, sin, **kw)  # GPT-J pairs treated as half-split


# --------------------------------------------------------------------------- casts and values


def rms_norm_half_sumsq(x, weight=None, eps=1e-6, **kw):
    # fp16 inputs: the sum of squares in fp16 (no upcast): overflows past |x| ~ 256
    if x.dtype != torch.float16:
        return rms_norm(x, weight, eps, **kw)
    ms = (x * x).mean(-1, keepdim=True)
    y = x * torch.rsqrt(ms + eps)
    offset = kw.get("offset", 0.0)
    return y if weight is None else y * (offset + weight)


def layer_norm_no_eps(x, weight=None, bias=None, eps=1e-5):
    # rstd = 1 / sqrt(var): the eps left out, so a constant row divides by zero
    x32 = x.float()
    mean = x32.mean(-1, keepdim=True)
    var = (x32 - mean).pow(2).mean(-1, keepdim=True)
    y = (x32 - mean) / var.sqrt()
    if weight is not None:
        y = y * weight.float()
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def softmax_inf_to_nan(x, dim=-1):
    return softmax(x + 0.0 * x, dim)  # 0 * -inf = NaN: a masked (-inf) logit poisons its row


def softmax_no_max(x, dim=-1):
    # exp(x) / sum(exp(x)) without subtracting the row max: overflows for large logits
    e = torch.exp(x.float())
    return (e / e.sum(dim, keepdim=True)).to(x.dtype)


# --------------------------------------------------------------------------- backward bugs


def swiglu_no_up_grad(gate, up, **kw):
    return _regrad(swiglu, lambda n, g, i, dy: torch.zeros_like(g) if n == "up" else g, kw,
                   gate=gate, up=up)  # fmt: skip


def swiglu_bf16_gate_grad(gate, up, **kw):
    # bf16 only: dgate = dy * up * silu(gate) instead of silu'(gate)
    def fix(name, g, inputs, dy):
        gate, up = inputs["gate"].float(), inputs["up"].float()
        if name != "gate" or inputs["gate"].dtype != torch.bfloat16:
            return g
        return (dy.float() * up * torch.nn.functional.silu(gate)).to(g.dtype)

    return _regrad(swiglu, fix, kw, gate=gate, up=up)


def layer_norm_half_dw(x, weight=None, bias=None, eps=1e-5):
    return _regrad(layer_norm, lambda n, g, i, dy: g * 0.5 if n == "weight" else g, {"eps": eps},
                   x=x, weight=weight, bias=bias)  # fmt: skip


def rms_norm_strided_dx(x, weight=None, eps=1e-6, **kw):
    # dx written in the wrong order when x's last dim is not contiguous
    def fix(name, g, inputs, dy):
        return g.flip(-1) if name == "x" and inputs["x"].stride(-1) != 1 else g

    return _regrad(rms_norm, fix, {"eps": eps, **kw}, x=x, weight=weight)


def rms_norm_dw_bf16(x, weight=None, eps=1e-6, **kw):
    # dW summed over rows one row at a time in the weight's dtype (bf16: no fp32 partials)
    def fix(name, g, inputs, dy):
        if name != "weight" or g.dtype == torch.float32:
            return g
        x32 = inputs["x"].detach().float().reshape(-1, g.shape[-1])
        xhat = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
        acc = torch.zeros_like(g)
        for row in dy.float().reshape(-1, g.shape[-1]) * xhat:
            acc = acc + row.to(g.dtype)
        return acc

    return _regrad(rms_norm, fix, {"eps": eps, **kw}, x=x, weight=weight)


class _RopeKGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, cos, sin, kw):
        ins = [t.detach().requires_grad_(True) for t in (q, k)]
        with torch.enable_grad():
            qo, ko = rope(ins[0], ins[1], cos, sin, **kw)
        ctx.saved = (ins, qo, ko, cos, sin, kw)
        return qo.detach().clone(), ko.detach().clone()

    @staticmethod
    def backward(ctx, dq, dk):
        (q, k), qo, ko, cos, sin, kw = ctx.saved
        gq, gk = torch.autograd.grad([qo, ko], [q, k], [dq, dk])
        # the bug: k's gradient rotated forward (+theta) instead of back (-theta)
        _, wrong = rope_ref(dk.float(), dk.float(), cos, sin, **kw)
        return gq, wrong.to(gk.dtype), None, None, None


def rope_k_grad_rotated(q, k, cos, sin, **kw):
    return _RopeKGrad.apply(q, k, cos, sin, kw)


def jagged_mean_grad_no_div(values, offsets, **kw):
    # the backward scatters the segment's gradient without dividing by its length
    def fix(name, g, inputs, dy):
        lengths = torch.diff(inputs["offsets"].long())
        per_row = torch.repeat_interleave(lengths, lengths).to(g.device)
        return g * per_row[:, None].to(g.dtype)

    return _regrad(jagged_mean, fix, kw, values=values, offsets=offsets)


def softmax_looped_dx(x, dim=-1):
    # the looped backward (a row longer than the config's block) scales dx by 0.9
    def fix(name, g, inputs, dy):
        y2 = inputs["x"].reshape(-1, inputs["x"].shape[-1])
        cfg = softmax_mod.backward_config(y2)
        return g * 0.9 if cfg.block_n < y2.shape[-1] else g

    return _regrad(softmax, fix, {"dim": dim}, x=x)


# --------------------------------------------------------------------------- launch-table rows


@contextlib.contextmanager
def _bad_softmax_row():
    # a hand-edited forward row for 257..1024 columns whose block is no power of two (a table
    # that debug replaced by one forced row for every length is left as it is)
    table = softmax_table.TABLE["fwd"]
    arch = device_info(torch.device("cpu")).arch
    key = arch if arch in table else "default"
    saved = table[key]
    if len(saved) > 1:
        rows = [(256, LaunchConfig(block_n=256, rows=16)), (1024, LaunchConfig(block_n=768))]
        table[key] = rows + [r for r in saved if r[0] > 1024]
    try:
        yield
    finally:
        table[key] = saved


def softmax_bad_table_row(x, dim=-1):
    return _Scoped.apply(lambda x: softmax(x, dim), _bad_softmax_row, ("x",), x)


def rms_norm_four_row_programs(x, weight=None, eps=1e-6, **kw):
    # wrong when a forward program holds 4 rows (a config of the GPU tables only)
    y = rms_norm(x, weight, eps, **kw)
    cfg = rms_norm_mod._config("fwd", x.reshape(-1, x.shape[-1]), None)
    return y * 1.01 if cfg.rows == 4 and cfg.block_n >= x.shape[-1] else y


# --------------------------------------------------------------------------- strides


def rms_norm_ignores_row_stride(x, weight=None, eps=1e-6, **kw):
    # rows read as if packed (stride n): a padded or transposed x is read at the wrong places
    packed = x.as_strided(x.shape, torch.empty(x.shape).stride(), x.storage_offset())
    return rms_norm(packed, weight, eps, **kw)


# --------------------------------------------------------------------------- compiled graphs
# `kernelwright debug --compiled`: bugs in what `kernelwright.compile` inserts, planted by
# wrapping the pass's matchers for the duration of a `with`. The model is `tiny_compiled_model`.


class _Block(torch.nn.Module):
    def __init__(self, d: int, h: int):
        from transformers.models.llama.modeling_llama import LlamaRMSNorm

        super().__init__()
        self.norm = LlamaRMSNorm(d, eps=1e-6)
        self.gate = torch.nn.Linear(d, h, bias=False)
        self.up = torch.nn.Linear(d, h, bias=False)
        self.down = torch.nn.Linear(h, d, bias=False)

    def forward(self, x):
        h = self.norm(x)
        return x + self.down(torch.nn.functional.silu(self.gate(h)) * self.up(h))


class _Tiny(torch.nn.Module):
    """Two blocks (RMSNorm, then fused add + RMSNorm on the residual sum; SwiGLU each), a final
    LayerNorm, a head and cross-entropy: six sites of the pass."""

    def __init__(self, d: int = 32, h: int = 64, classes: int = 16):
        super().__init__()
        self.blocks = torch.nn.ModuleList([_Block(d, h), _Block(d, h)])
        self.final_norm = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, classes)

    def forward(self, x, target):
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.final_norm(x))
        return torch.nn.functional.cross_entropy(logits, target)


def tiny_compiled_model():
    """(model, batch) for `kernelwright debug debug_planted:tiny_compiled_model --compiled`;
    its norm weights and biases spread, so that a dropped one shows."""
    model = _Tiny()
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.add_(0.5 * torch.randn(p.shape))
    return model, (torch.randn(8, 32), torch.randint(0, 16, (8,)))


@contextlib.contextmanager
def _planted_match(op: str, change):
    """The pass's matches of `op` changed by `change(match)` while the `with` lasts."""
    import dataclasses

    from kernelwright.compile import passes

    saved = passes.MATCHERS

    def wrapped(matcher):
        def match(node):
            m = matcher(node)
            return change(m, dataclasses.replace) if m is not None and m.op == op else m

        return match

    passes.MATCHERS = tuple(wrapped(f) for f in saved)
    try:
        yield
    finally:
        passes.MATCHERS = saved


class _HalfUpGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate, up):
        return gate.clone(), up.clone()

    @staticmethod
    def backward(ctx, dgate, dup):
        return dgate, dup * 0.5


def _swiglu_half_up_grad(gate, up, **kw):
    return swiglu(*_HalfUpGrad.apply(gate, up), **kw)  # up's gradient halved


@dataclass(frozen=True)
class CompileBug:
    name: str
    op: str  # the op of the site debug must name
    module: str  # the module that site sits in
    pass_name: str
    what: str

    def plant(self):
        return _COMPILE_PLANTS[self.name]()


_COMPILE_PLANTS = {
    # the fused add + RMSNorm match passes eps 1e-2 (a constant read from the wrong node)
    "compiled_fused_add_wrong_eps": lambda: _planted_match(
        "fused_add_rms_norm", lambda m, rep: rep(m, args=(*m.args[:3], 1e-2))
    ),
    # the LayerNorm match drops the weight (the kernel gets None)
    "compiled_layer_norm_drops_weight": lambda: _planted_match(
        "layer_norm", lambda m, rep: rep(m, args=(m.args[0], None, *m.args[2:]))
    ),
    # the SwiGLU inserted has a backward that halves up's gradient
    "compiled_swiglu_half_up_grad": lambda: _planted_match(
        "swiglu", lambda m, rep: rep(m, fn=_swiglu_half_up_grad)
    ),
}

COMPILE_BUGS = [
    CompileBug("compiled_fused_add_wrong_eps", "fused_add_rms_norm", "blocks.1.norm", "forward",
               "the fused add + RMSNorm site gets eps 1e-2"),
    CompileBug("compiled_layer_norm_drops_weight", "layer_norm", "final_norm", "forward",
               "the LayerNorm site's weight dropped"),
    CompileBug("compiled_swiglu_half_up_grad", "swiglu", "blocks.0", "backward",
               "the SwiGLU site's backward halves up's gradient"),
]  # fmt: skip


# --------------------------------------------------------------------------- the corpus


BUGS = [
    Bug("rms_norm_wrong_eps", "rms_norm", "forward", {}, "eps 1e-2 instead of 1e-6"),
    Bug("rms_norm_no_offset", "rms_norm", "forward",
        {"case": "rms_norm_no_offset (gemma)"}, "Gemma's offset (1 + w) dropped"),
    Bug("rms_norm_half_sumsq", "rms_norm", "forward", {"dtype": "float16", "values": "large"},
        "fp16 sum of squares without an upcast (overflow)"),
    Bug("rms_norm_dw_bf16", "rms_norm", "grad:weight", {"shape": "many_rows"},
        "dW reduced row by row in bf16"),
    Bug("rms_norm_strided_dx", "rms_norm", "grad:x", {"layout": "transposed"},
        "dx in the wrong order for a non-contiguous x"),
    Bug("rms_norm_ignores_row_stride", "rms_norm", "forward", {"layout": "row_strided"},
        "the row stride ignored (rows read as packed)"),
    Bug("rms_norm_masked_other", "rms_norm", "forward", {"shape": "tail"},
        "masked lanes loaded as 1.0 (wrong `other`): wrong for rows no power of two"),
    Bug("relu_squared_tail_tiles", "relu_squared", "forward", {"shape": "tail"},
        "the last partial tile never written (floor for ceil)"),
    Bug("layer_norm_no_eps", "layer_norm", "forward", {"values": "all_equal"},
        "rstd = 1 / sqrt(var): NaN on constant rows"),
    Bug("layer_norm_half_dw", "layer_norm", "grad:weight", {}, "dW scaled by 0.5"),
    Bug("swiglu_no_up_grad", "swiglu", "grad:up", {}, "the backward returns zeros for up"),
    Bug("swiglu_bf16_gate_grad", "swiglu", "grad:gate", {"dtype": "bfloat16"},
        "bf16 only: dgate with silu instead of silu'"),
    Bug("geglu_tanh_always", "geglu", "forward", {"case": "geglu_tanh_always (erf)"},
        "erf GELU computed with the tanh form"),
    Bug("softmax_inf_to_nan", "softmax", "forward", {"values": "inf"},
        "0 * -inf = NaN for masked logits"),
    Bug("softmax_no_max", "softmax", "forward", {"values": "large"},
        "no max subtraction: exp overflows"),
    Bug("softmax_looped_dx", "softmax", "grad:x", {"shape": "long_row"},
        "dx scaled on the looped backward path"),
    Bug("rms_norm_four_row_programs", "rms_norm", "forward", {"config": "rows=4"},
        "wrong when a program holds 4 rows (a GPU table's config)"),
    Bug("rms_norm_dw_race", "rms_norm", "grad:weight", {"shape": "many_rows"},
        "programs store their dW partials over each other (a race: the last one wins)"),
    Bug("softmax_bad_table_row", "softmax", "forward",
        {"config": "n <= 1024"},
        "a table row of 257..1024 columns with a block of 768"),
    Bug("cross_entropy_no_softcap", "cross_entropy", "forward",
        {"case": "cross_entropy_no_softcap (smoothing, softcap, z-loss)"}, "softcap dropped"),
    Bug("cross_entropy_mean_over_all", "cross_entropy", "forward", {},
        "mean over every token, ignored ones included"),
    Bug("rope_no_interleave", "rope", "forward", {"case": "rope_no_interleave (interleaved)"},
        "interleaved pairs treated as half-split"),
    Bug("rope_k_grad_rotated", "rope", "grad:k", {}, "dk rotated forward instead of back"),
    Bug("jagged_mean_grad_no_div", "jagged_mean", "grad:values", {},
        "the gradient not divided by the segment's length"),
]  # fmt: skip

# Only a GPU reaches these: the huge regime (inputs past 2^31 elements) is not tried under
# Triton's interpreter (tests/test_debug_huge.py).
GPU_BUGS = [
    Bug("relu_squared_int32_offsets", "relu_squared", "forward", {"shape": "huge"},
        "row offsets computed in int32: rows past 2^31 elements wrap onto earlier ones"),
]  # fmt: skip

__all__ = [
    "BUGS", "COMPILE_BUGS", "GPU_BUGS", "Bug", "CompileBug", "layer_norm_ref", "relu_squared_ref",
    "relu_squared_int32_offsets", "relu_squared_tail_tiles", "rms_norm_dw_race",
    "rms_norm_masked_other",
]  # fmt: skip
