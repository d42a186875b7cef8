"""Lowering of one aten node to a `tl` expression on a [ROWS, BLOCK_N] fp32 tile, and the
graph helpers codegen's emitter walks with (see codegen's docstring for the tiers)."""

from __future__ import annotations

from dataclasses import dataclass

from kernelwright.profiles.kernel import GraphNode

# Shape-only ops: on an element-wise tile they are the identity. `sum` is allowed only as the
# trailing reduction of a broadcast input's gradient (checked in _grad_sources).
_IDENTITY = {
    "aten.alias.default", "aten.clone.default", "aten.view.default", "aten.reshape.default",
    "aten._unsafe_view.default", "aten.expand.default", "aten.squeeze.dim",
    "aten.squeeze.dims", "aten.squeeze.default", "aten.unsqueeze.default",
    "aten.lift_fresh_copy.default", "aten.detach.default",
}  # fmt: skip
_SUM = {"aten.sum.dim_IntList", "aten.sum.default"}
# reductions a row kernel lowers when they run over the last dim only
_REDUCE = _SUM | {"aten.mean.dim", "aten.amax.default", "aten.amin.default",
                  "aten.var_mean.correction"}  # fmt: skip
# padding of a row tile is replaced by the reduction's neutral element before reducing
_NEUTRAL = {"sum": "0.0", "max": '-float("inf")', "min": 'float("inf")'}
# the widest row a row kernel holds in registers (the library norms' one-program limit);
# wider rows need a looped kernel, which is not generated
MAX_ROW = 32768
_CONSTS = {"inf": float("inf"), "-inf": float("-inf"), "nan": float("nan")}
_FLOAT_DTYPES = ("float", "half", "bfloat16", "float16", "float32", "float64", "double")


class UnsupportedNode(ValueError):
    """A graph node with no Triton lowering: generation stops and names it."""

    def __init__(self, node: str, reason: str):
        super().__init__(f"node {node!r}: {reason}")
        self.node = node
        self.reason = reason


def _lit(v) -> str:
    if isinstance(v, bool):
        return "1.0" if v else "0.0"
    if isinstance(v, (int, float)):
        f = float(v)
        if f != f:
            return 'float("nan")'
        if f in (float("inf"), float("-inf")):
            return 'float("inf")' if f > 0 else '-float("inf")'
        return repr(f)
    raise TypeError(f"not a numeric constant: {v!r}")


def _pow(a: str, e, node: str) -> str:
    e = float(e)
    if e == 0.5:
        return f"tl.sqrt({a})"
    if e == -0.5:
        return f"tl.rsqrt({a})"
    if e != int(e) or abs(e) > 8:
        raise UnsupportedNode(node, f"pow with exponent {e}: only integers |n| <= 8 and ±0.5")
    n = int(abs(e))
    body = "1.0" if n == 0 else " * ".join([a] * n)
    return f"(1.0 / ({body}))" if e < 0 else f"({body})"


def _lower(n: GraphNode, a: list[str], raw: list, kw: dict, row: bool = False) -> str:
    """One aten node → a `tl` expression over already-named fp32 tiles (`a`: args as code)."""
    t = n.target
    base = t.rsplit(".", 1)[0] if t.count(".") >= 2 else t
    nan = "propagate_nan=tl.PropagateNan.ALL"
    binary = {"aten.add": "+", "aten.sub": "-", "aten.mul": "*", "aten.div": "/"}
    if base in binary:
        if base == "aten.div" and kw.get("rounding_mode") is not None:
            raise UnsupportedNode(n.name, "div with a rounding_mode")
        rhs = a[1]
        if "alpha" in kw and kw["alpha"] != 1:
            rhs = f"{_lit(kw['alpha'])} * {rhs}"
        return f"({a[0]} {binary[base]} {rhs})"
    cmp = {"aten.gt": ">", "aten.lt": "<", "aten.ge": ">=", "aten.le": "<=", "aten.eq": "==",
           "aten.ne": "!="}  # fmt: skip
    if base in cmp:
        return f"({a[0]} {cmp[base]} {a[1]})"
    unary = {"aten.exp": "tl.exp({})", "aten.log": "tl.log({})", "aten.sqrt": "tl.sqrt({})",
             "aten.rsqrt": "tl.rsqrt({})", "aten.abs": "tl.abs({})", "aten.erf": "tl.erf({})",
             "aten.sigmoid": "tl.sigmoid({})", "aten.neg": "(-{})",
             "aten.reciprocal": "(1.0 / {})", "aten.expm1": "(tl.exp({}) - 1.0)",
             "aten.log1p": "tl.log(1.0 + {})", "aten.exp2": "tl.exp2({})",
             "aten.sin": "tl.sin({})", "aten.cos": "tl.cos({})",
             # no portable tanh (libdevice is GPU-only): tanh(u) = 2 sigmoid(2u) - 1, exact algebra
             "aten.tanh": "(2.0 * tl.sigmoid(2.0 * {}) - 1.0)",
             "aten.relu": "tl.maximum({}, 0.0, " + nan + ")"}  # fmt: skip
    if base in unary:
        return unary[base].format(a[0])
    if base == "aten.rsub":
        return f"({a[1]} - {a[0]})"
    if base in ("aten.maximum", "aten.minimum"):
        return f"tl.{base[5:]}({a[0]}, {a[1]}, {nan})"
    if base == "aten.where":
        return f"tl.where({a[0]}, {a[1]}, {a[2]})"
    if base == "aten.pow":
        if t == "aten.pow.Tensor_Scalar" and isinstance(raw[1], (int, float)):
            return _pow(a[0], raw[1], n.name)
        raise UnsupportedNode(n.name, f"{t}: only a tensor to a constant power is lowered")
    if base in ("aten.clamp", "aten.clamp_min", "aten.clamp_max"):
        lo = raw[1] if len(raw) > 1 else kw.get("min")
        hi = raw[2] if len(raw) > 2 else kw.get("max")
        if base == "aten.clamp_max":
            lo, hi = None, raw[1]
        out = a[0]
        if lo is not None:
            out = f"tl.maximum({out}, {_lit(lo)}, {nan})"
        if hi is not None:
            out = f"tl.minimum({out}, {_lit(hi)}, {nan})"
        return out
    if base in ("aten.full", "aten.scalar_tensor"):
        value = raw[1] if base == "aten.full" else raw[0]
        if row and base == "aten.scalar_tensor":
            # a 0-d constant: [ROWS, 1] broadcasts against a row tile and keeps per-row values
            # per-row (a full tile would turn a per-row output into a row)
            return f"tl.full([ROWS, 1], {_lit(value)}, tl.float32)"
        return f"tl.full([ROWS, BLOCK_N], {_lit(value)}, tl.float32)"
    if base in ("aten.convert_element_type", "aten._to_copy"):
        dtype = str(raw[1] if len(raw) > 1 else kw.get("dtype", "float32"))
        if dtype.endswith("bool"):
            return f"({a[0]} != 0)"
        if dtype.rsplit(".", 1)[-1] in _FLOAT_DTYPES:
            # computed in fp32 throughout: a cast to a float type only changes the dtype
            return f"{a[0]}.to(tl.float32)"
        raise UnsupportedNode(n.name, f"{t} to {dtype}: only float and bool casts are lowered")
    if base == "aten.gelu":
        x = a[0]
        if kw.get("approximate", "none") == "tanh":
            u = f"(0.7978845608028654 * ({x} + 0.044715 * {x} * {x} * {x}))"
            return f"(0.5 * {x} * (2.0 * tl.sigmoid(2.0 * {u})))"
        return f"({x} * 0.5 * (1.0 + tl.erf({x} * 0.7071067811865476)))"
    if base == "aten.silu":
        return f"({a[0]} * tl.sigmoid({a[0]}))"
    raise UnsupportedNode(n.name, f"{t} has no Triton lowering (tier-1 table)")


@dataclass(frozen=True)
class _Arg:
    kind: str  # "input" (a forward placeholder), "grad_out" (a tangent)
    index: int  # position among the profile's inputs / outputs
    name: str  # the kernel argument name


def _users(nodes: list[GraphNode]) -> dict[str, list[GraphNode]]:
    users: dict[str, list[GraphNode]] = {}
    names = {n.name for n in nodes}
    for n in nodes:
        for r in _refs(n.args, names) + _refs(list(n.kwargs.values()), names):
            users.setdefault(r, []).append(n)
    return users


def _refs(args: list, names: set[str]) -> list[str]:
    out = []
    for v in args:
        if isinstance(v, str) and v in names:
            out.append(v)
        elif isinstance(v, (list, tuple)):
            out.extend(_refs(list(v), names))
    return out


def _output_args(nodes: list[GraphNode]) -> list:
    outs = [n for n in nodes if n.op == "output"]
    if len(outs) != 1:
        raise UnsupportedNode("output", "a graph needs exactly one output node")
    args = outs[0].args
    return list(args[0]) if len(args) == 1 and isinstance(args[0], (list, tuple)) else list(args)
