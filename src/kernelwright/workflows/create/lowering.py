"""Lowering of one aten node to a `tl` expression on a [ROWS, BLOCK_N] fp32 tile, and the
graph helpers codegen's emitter walks with (see codegen's docstring for the tiers)."""

from __future__ import annotations

import math
import struct
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
_REDUCE = _SUM | {"aten.mean.dim", "aten.mean.default", "aten.amax.default", "aten.amin.default",
                  "aten.var_mean.correction", "aten.var.correction", "aten.max.dim",
                  "aten.min.dim", "aten.argmax.default", "aten.argmin.default",
                  "aten.gather.default", "aten.cumsum.default", "aten.cumprod.default",
                  "aten.prod.dim_int", "aten.prod.default"}  # fmt: skip
# scans along the row: (tl function, how a carry joins a tile's scan, the padding's value)
_SCANS = {"aten.cumsum.default": ("tl.cumsum", "+", "0.0"),
          "aten.cumprod.default": ("tl.cumprod", "*", "1.0")}  # fmt: skip
# a row's values (and their indices) at max/min: getitem 0 is the value, 1 the index
_ARG_REDUCE = {"aten.max.dim": "max", "aten.min.dim": "min"}
# padding of a row tile is replaced by the reduction's neutral element before reducing
_NEUTRAL = {"sum": "0.0", "max": '-float("inf")', "min": 'float("inf")', "prod": "1.0"}
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
    if isinstance(v, str) and v in _CONSTS:  # inf/nan, kept as text in the YAML
        v = _CONSTS[v]
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
    if e != int(e):  # a fractional power: NaN for a negative base, as torch.pow
        return f"tl.exp2({e!r} * tl.log2({a}))"
    if abs(e) > 8:  # |x|^n with the sign of x for odd n
        sign = f"tl.where({a} < 0, -1.0, 1.0)" if int(e) % 2 else "1.0"
        return f"({sign} * tl.exp2({e!r} * tl.log2(tl.abs({a}))))"
    n = int(abs(e))
    body = "1.0" if n == 0 else " * ".join([a] * n)
    return f"(1.0 / ({body}))" if e < 0 else f"({body})"


def _lower(n: GraphNode, a: list[str], raw: list, kw: dict, row: bool = False) -> str:
    """One aten node → a `tl` expression over already-named fp32 tiles (`a`: args as code)."""
    t = n.target
    base = t.rsplit(".", 1)[0] if t.count(".") >= 2 else t
    if base.startswith("prims."):  # prims.convert_element_type: the aten op of that name
        base = "aten." + base[len("prims.") :]
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
        # a bound is a constant, or a tensor (clamp.Tensor and friends): then its tile
        by_keyword = isinstance(lo, str) and len(raw) < 2 or isinstance(hi, str) and len(raw) < 3
        if by_keyword and base != "aten.clamp_max":
            raise UnsupportedNode(n.name, f"{t} with a tensor bound given by keyword")
        if lo is not None:
            out = f"tl.maximum({out}, {a[1] if isinstance(lo, str) else _lit(lo)}, {nan})"
        if hi is not None:
            code = a[1] if base == "aten.clamp_max" else a[2] if len(a) > 2 else None
            out = f"tl.minimum({out}, {code if isinstance(hi, str) else _lit(hi)}, {nan})"
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
    if base in _TEMPLATES:
        return _TEMPLATES[base].format(*a)
    more = _lower_more(n, base, a, raw, kw)
    if more is not None:
        return more
    if base in NOT_LOWERED:
        raise UnsupportedNode(n.name, f"{t}: {NOT_LOWERED[base]}")
    raise UnsupportedNode(n.name, f"{t} has no Triton lowering (tier-1 table)")


# Element-wise ops of PyTorch's core ATen set that have no lowering, and why. Every core
# pointwise op is either lowered or listed here (tests/test_create_lowering.py enumerates them).
_NO_REMAINDER = (
    "no Triton lowering: an exact remainder needs libdevice's fmod (a - b * {}(a / b) is off "
    "by b where the quotient rounds across an integer)"
)
NOT_LOWERED = {
    "aten.fmod": _NO_REMAINDER.format("trunc") + "; integer operands are lowered",
    "aten.remainder": _NO_REMAINDER.format("floor") + "; integer operands are lowered",
}
# Every aten packet with a lowering here (by packet name): what create's understand stage counts
# as element-wise (tier 1). One list, next to the code it describes.
# fmt: off
ELEMENTWISE = frozenset([
    "add", "sub", "mul", "div", "neg", "rsub", "exp", "exp2", "log", "log2", "log10", "log1p",
    "expm1", "tanh", "sigmoid", "relu", "abs", "sign", "sgn", "sqrt", "rsqrt", "reciprocal",
    "pow", "erf", "erfc", "sin", "cos", "tan", "asin", "acos", "atan", "atan2", "sinh", "cosh",
    "asinh", "acosh", "atanh",
    "maximum", "minimum", "clamp", "clamp_min", "clamp_max", "where", "gt", "ge", "lt", "le",
    "eq", "ne", "logical_and", "logical_or", "logical_xor", "logical_not", "bitwise_and",
    "bitwise_or", "bitwise_xor", "bitwise_not", "isnan", "isinf", "floor", "ceil", "round",
    "trunc", "masked_fill", "fill", "scalar_tensor", "full", "full_like", "zeros_like",
    "ones_like", "_to_copy", "convert_element_type", "lift_fresh_copy", "copy", "gelu", "silu",
    "hardtanh", "leaky_relu", "elu", "sigmoid_backward", "tanh_backward", "threshold_backward",
])
# fmt: on
_INT_BITWISE = "on integer tensors: tiles are fp32, so only bool masks are lowered"


def _integer(dtype) -> bool:
    return any(str(dtype).endswith(t) for t in ("int8", "int16", "int32", "int64", "uint8"))


def _int_remainder(a: str, b: str, floor: bool) -> str:
    """An integer remainder on fp32 tiles (integer values with |a| + |b| <= 2^24, so that a, b
    and b * k are held exactly): an IEEE-rounded a / b rounds to an integer k only when it is
    k, since a quotient k - r/b (r >= 1) lies 1/|b| or more from it, more than half an ulp of
    k; so a - b * floor(a / b) (remainder, the divisor's sign) or trunc (fmod, the dividend's)
    is exact. An index wrapped by its row length is well inside. A float remainder stays
    unlowered (NOT_LOWERED)."""
    q = f"tl.div_rn({a} + 0.0, {b} + 0.0)"  # fp32 both (the row length N is an int)
    k = f"tl.floor({q})" if floor else f"tl.where({q} < 0.0, -tl.floor(-{q}), tl.floor({q}))"
    return f"({a} - {b} * {k})"


# One-line lowerings over the node's tiles ({0}, {1}: its tensor arguments in order).
_TEMPLATES = {
    "aten.erfc": "(1.0 - tl.erf({0}))",
    "aten.isnan": "({0} != {0})",
    "aten.isinf": '(tl.abs({0}) == float("inf"))',
    "aten.sign": "tl.where({0} > 0, 1.0, tl.where({0} < 0, -1.0, 0.0))",  # sign(NaN) is 0
    "aten.sgn": "tl.where({0} > 0, 1.0, tl.where({0} < 0, -1.0, 0.0))",
    "aten.floor": "tl.floor({0})",
    "aten.ceil": "tl.ceil({0})",
    "aten.trunc": "tl.where({0} < 0, tl.ceil({0}), tl.floor({0}))",
    "aten.log2": "tl.log2({0})",
    "aten.log10": "(tl.log({0}) * 0.4342944819032518)",
    "aten.tan": "(tl.sin({0}) / tl.cos({0}))",
    "aten.sinh": "((tl.exp({0}) - tl.exp(-{0})) * 0.5)",
    "aten.cosh": "((tl.exp({0}) + tl.exp(-{0})) * 0.5)",
    # odd: computed on |x| (no cancellation for large negative x)
    "aten.asinh": "tl.where({0} < 0, -1.0, 1.0) * tl.log(tl.abs({0}) + tl.sqrt({0} * {0} + 1.0))",
    "aten.acosh": "tl.log({0} + tl.sqrt({0} * {0} - 1.0))",
    "aten.atanh": "(0.5 * tl.log((1.0 + {0}) / (1.0 - {0})))",
    "aten.sigmoid_backward": "({0} * {1} * (1.0 - {1}))",  # (grad, y)
    "aten.tanh_backward": "({0} * (1.0 - {1} * {1}))",  # (grad, y)
}


def _mask(x: str) -> str:
    return f"({x} != 0)"  # a mask as a tile: a comparison's int1, or a 0.0/1.0 float


def _lower_more(n: GraphNode, base: str, a: list[str], raw: list, kw: dict) -> str | None:
    """The rest of the core pointwise set: masks, rounding, hyperbolic, and activations the
    core set keeps whole. None when `base` is not one of them."""
    x = a[0] if a else ""
    logical = {"and": "&", "or": "|", "xor": "^"}
    for op, sym in logical.items():
        if base in (f"aten.logical_{op}", f"aten.bitwise_{op}"):
            if base.startswith("aten.bitwise") and not str(n.dtype).endswith("bool"):
                raise UnsupportedNode(n.name, f"{n.target} {_INT_BITWISE}")
            return f"({_mask(a[0])} {sym} {_mask(a[1])})"
    if base in ("aten.logical_not", "aten.bitwise_not"):
        if base == "aten.bitwise_not" and not str(n.dtype).endswith("bool"):
            raise UnsupportedNode(n.name, f"{n.target} {_INT_BITWISE}")
        return f"({x} == 0)"
    if base in ("aten.full_like", "aten.zeros_like", "aten.ones_like", "aten.fill"):
        value = {"aten.zeros_like": 0.0, "aten.ones_like": 1.0}.get(base)
        value = raw[1] if value is None else value
        if isinstance(value, str):
            raise UnsupportedNode(n.name, f"{n.target} with a tensor fill value")
        return f"tl.full([ROWS, BLOCK_N], {_lit(value)}, tl.float32)"
    if base == "aten.masked_fill":
        value = raw[2]
        fill = a[2] if isinstance(value, str) else _lit(value)
        return f"tl.where({_mask(a[1])}, {fill}, {x})"
    if base == "aten.copy":
        return a[1]  # copy(dst, src): src's values in dst's place
    if base == "aten.threshold_backward":
        return f"tl.where({a[1]} <= {_lit(raw[2])}, 0.0, {a[0]})"
    if base in _INVERSE_TRIG:
        return _INVERSE_TRIG[base](*a[: 2 if base == "aten.atan2" else 1])
    if base in ("aten.remainder", "aten.fmod") and _integer(n.dtype):
        return _int_remainder(a[0], a[1], base == "aten.remainder")
    if base == "aten.round":
        if raw[1:] and raw[1] != 0 or kw.get("decimals", 0) != 0:
            raise UnsupportedNode(n.name, f"{n.target} with decimals: only decimals=0")
        r = f"tl.floor({x} + 0.5)"  # halves round to even, as torch.round
        return f"tl.where(({r} - {x} == 0.5) & (tl.floor({r} * 0.5) * 2.0 != {r}), {r} - 1.0, {r})"
    if base == "aten.hardtanh":
        lo = raw[1] if len(raw) > 1 else kw.get("min_val", -1.0)
        hi = raw[2] if len(raw) > 2 else kw.get("max_val", 1.0)
        nan = "propagate_nan=tl.PropagateNan.ALL"
        return f"tl.minimum(tl.maximum({x}, {_lit(lo)}, {nan}), {_lit(hi)}, {nan})"
    if base == "aten.leaky_relu":
        slope = raw[1] if len(raw) > 1 else kw.get("negative_slope", 0.01)
        return f"tl.where({x} > 0, {x}, {x} * {_lit(slope)})"
    if base == "aten.elu":
        alpha = raw[1] if len(raw) > 1 else kw.get("alpha", 1.0)
        scale = raw[2] if len(raw) > 2 else kw.get("scale", 1.0)
        in_scale = raw[3] if len(raw) > 3 else kw.get("input_scale", 1.0)
        neg = f"{_lit(alpha)} * (tl.exp({x} * {_lit(in_scale)}) - 1.0)"
        return f"({_lit(scale)} * tl.where({x} > 0, {x}, {neg}))"
    return None


# Inverse trigonometric functions from portable tl operations (libdevice, which has them, is
# GPU-only): a range reduction, then Cephes' single-precision minimax polynomials (atanf on
# |u| <= tan(pi/8), asinf on |u| <= 0.5). Divisions and square roots are the IEEE-rounded
# tl.div_rn / tl.sqrt_rn (a GPU's `/` and tl.sqrt are approximate); an offset of pi/4 .. pi is
# added as an fp32 value plus its remainder, so the offset itself rounds only once. Results are
# within a few fp32 ulps of the exact value (tests/test_create_lowering.py bounds it), with C's
# special values (NaN propagates, signed zeros kept, atan(+-inf) = +-pi/2, asin/acos outside
# [-1, 1] = NaN, atan2 of zeros and infinities by quadrant). One expression each, as the
# generated kernels have no helper functions for it: the reduced argument is written out
# wherever it is used (a GPU compile folds the repeats).
_TAN_3PI_8 = repr(math.tan(3 * math.pi / 8))
_TAN_PI_8 = repr(math.tan(math.pi / 8))
_ATAN_P = (8.05374449538e-2, -1.38776856032e-1, 1.99777106478e-1, -3.33329491539e-1)
_ASIN_P = (4.2163199048e-2, 2.4181311049e-2, 4.5470025998e-2, 7.4953002686e-2, 1.6666752422e-1)
_PI = math.pi


def _f32(v: float) -> float:
    return struct.unpack("f", struct.pack("f", v))[0]


def _where(cond: str, a: str, b: str) -> str:
    return f"tl.where({cond}, {a}, {b})"


def _cases(tree, literal) -> str:
    """A nested (condition, then, else) tuple of constants → a tl.where tree of literal(v)."""
    if isinstance(tree, tuple):
        return _where(tree[0], _cases(tree[1], literal), _cases(tree[2], literal))
    return literal(tree)


def _plus_offset(tree, term: str) -> str:
    """offset + term, the offset (a tree of constants) split into its fp32 value and the rest."""
    hi = _cases(tree, lambda v: repr(_f32(v)))
    lo = _cases(tree, lambda v: repr(v - _f32(v)))
    return f"({hi} + ({lo} + {term}))"


def _odd_poly(u: str, z: str, coeffs: tuple) -> str:
    """u + u z P(z), P by Horner (z = u^2, written once per use)."""
    p = repr(coeffs[0])
    for c in coeffs[1:]:
        p = f"({p} * {z} + {c!r})"
    return f"({u} + {u} * {z} * {p})"


def _sign(x: str) -> str:
    """-1.0 where x's sign bit is set (negative, -0.0, -inf), else 1.0."""
    return _where(f"({x}.to(tl.int32, bitcast=True) < 0)", "-1.0", "1.0")


def _atan_terms(q: str, over: str, mid: str, under: str) -> tuple[str, str, str]:
    """(q > tan(3pi/8), q > tan(pi/8), atan(u)) for q >= 0: u is the reduced argument of the
    range q falls in (`over`: -1/q, `mid`: (q - 1)/(q + 1), `under`: q), and atan(q) is
    pi/2, pi/4 or 0 plus atan(u)."""
    big, medium = f"({q} > {_TAN_3PI_8})", f"({q} > {_TAN_PI_8})"
    u = _where(big, over, _where(medium, mid, under))
    return big, medium, _odd_poly(u, f"({u} * {u})", _ATAN_P)


def _atan(x: str) -> str:
    ax = f"tl.abs({x})"
    big, mid, p = _atan_terms(
        ax, f"tl.div_rn(-1.0, {ax})", f"tl.div_rn({ax} - 1.0, {ax} + 1.0)", ax
    )
    return f"({_sign(x)} * {_plus_offset((big, _PI / 2, (mid, _PI / 4, 0.0)), p)})"


def _atan2(y: str, x: str) -> str:
    """atan2(y, x): the angle of (|x|, |y|) from q = |y| / |x|, mirrored for x < 0 (pi - a),
    signed as y. Equal magnitudes (both zero or both infinite included) take their exact
    angle: q would be NaN there."""
    ay, ax = f"tl.abs({y})", f"tl.abs({x})"
    q = f"tl.div_rn({ay}, {ax})"
    big, mid, p = _atan_terms(q, f"tl.div_rn(-{ax}, {ay})", f"tl.div_rn({q} - 1.0, {q} + 1.0)", q)
    xneg = f"({x}.to(tl.int32, bitcast=True) < 0)"
    angle = (big, _PI / 2, (mid, (xneg, 3 * _PI / 4, _PI / 4), (xneg, _PI, 0.0)))
    general = _plus_offset(angle, f"{_where(xneg, '-1.0', '1.0')} * {p}")
    equal = _cases((f"({ax} == 0)", (xneg, _PI, 0.0), (xneg, 3 * _PI / 4, _PI / 4)),
                   lambda v: repr(_f32(v)))  # fmt: skip
    return f"({_sign(y)} * {_where(f'({ay} == {ax})', equal, general)})"


def _asin_terms(x: str, reduced: str) -> tuple[str, str]:
    """(|x| > 0.5, asin(w)) with w = sqrt((1 - |x|) / 2) for |x| > 0.5, else `reduced`
    (asin(|x|) = pi/2 - 2 asin(w) there); z = w^2 is exact from (1 - |x|) / 2."""
    ax = f"tl.abs({x})"
    big = f"({ax} > 0.5)"
    half = f"((1.0 - {ax}) * 0.5)"
    w = _where(big, f"tl.sqrt_rn({half})", reduced)
    return big, _odd_poly(w, _where(big, half, f"({x} * {x})"), _ASIN_P)


def _asin(x: str) -> str:
    big, p = _asin_terms(x, f"tl.abs({x})")
    k = _where(big, "-2.0", "1.0")
    return f"({_sign(x)} * {_plus_offset((big, _PI / 2, 0.0), f'{k} * {p}')})"


def _acos(x: str) -> str:
    """pi/2 - asin(x) for |x| <= 0.5; 2 asin(w) for x > 0.5, pi - 2 asin(w) for x < -0.5."""
    big, p = _asin_terms(x, x)
    neg = f"({x} < 0)"
    k = _where(big, _where(neg, "-2.0", "2.0"), "-1.0")
    return _plus_offset((big, (neg, _PI, 0.0), _PI / 2), f"{k} * {p}")


_INVERSE_TRIG = {"aten.atan": _atan, "aten.atan2": _atan2, "aten.asin": _asin,
                 "aten.acos": _acos}  # fmt: skip


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
