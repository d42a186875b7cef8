"""Norm classes from their forward's AST: kind, casting mode, offset and attributes (1-3).

A class is a norm only when its forward (with the `self._helper(...)` methods it calls inlined)
is proven to compute one:
- RMSNorm: x * rsqrt(mean(x**2, -1) + eps) times a weight parameter, and where it casts;
- LayerNorm: a call of `F.layer_norm` (nn.LayerNorm and its subclasses, Nemotron's LayerNorm1P).
Names never decide; a class whose name says "Norm" but whose forward is not proven is listed as
unsupported with the reason.

Where each norm is used, and whether its backward may run in place, is `uses.py`.

The forward is read by a small abstract interpreter: every value is tracked as the dtype it has
("in" = the input's dtype, "f32", "w" = the weight's) and what it is (a mean of squares, an
rstd, a normalised x, a weight with an offset). The casting mode follows from where the cast to
the input dtype sits relative to the weight multiply.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field, replace

from torch import nn

from kernelwright.integrations.transformers.analysis import source as S
from kernelwright.profiles.model import Evidence, NormDecision

_FP32 = {"torch.float32", "torch.float"}
_LAYER_NORM_FUNCS = {
    "F.layer_norm",
    "nn.functional.layer_norm",
    "torch.nn.functional.layer_norm",
    "torch.layer_norm",
    "functional.layer_norm",
}
_RMS_NORM_FUNCS = {"F.rms_norm", "nn.functional.rms_norm", "torch.nn.functional.rms_norm"}


class NotProven(Exception):
    """The forward does something the interpreter cannot follow; the message says what."""


@dataclass(frozen=True)
class _V:
    dtype: str = "?"  # "in" | "f32" | "w" | "scalar" | "dtype:in" | "dtype:f32" | "?"
    plain: bool = False  # the forward's input itself (possibly cast or viewed)
    square: bool = False  # x**2
    sq_mean: bool = False  # mean(x**2, -1) (+ eps)
    rstd: bool = False  # rsqrt(mean(x**2) + eps)
    sqrt: bool = False  # sqrt(mean(x**2) + eps)
    normed: bool = False  # x * rstd
    weight: str | None = None  # a weight parameter's attribute (possibly offset / cast)
    offset: float = 0.0
    weighted: bool = False  # normed * weight
    mean: bool = False  # mean(x, -1) of a non-squared value
    centered: bool = False  # x - mean(x): a hand-written LayerNorm
    number: float | None = None
    ln: bool = False  # the output of F.layer_norm


@dataclass
class _State:
    module: nn.Module
    cls: type
    evidence: list[Evidence] = field(default_factory=list)
    eps_attrs: set[str] = field(default_factory=set)
    norm_dtype: str | None = None  # dtype the rstd was computed in
    mult: tuple[str, str, float, str] | None = None  # (x_hat dtype, weight dtype, offset, attr)
    layer_norm: dict | None = None
    rms_builtin: bool = False
    centered: bool = False  # the variance is of x - mean(x): a LayerNorm written by hand
    depth: int = 0


def _promote(*dts: str) -> str:
    real = [d for d in dts if d not in ("scalar",)]
    if not real:
        return "scalar"
    if "?" in real:
        return "?"
    if "f32" in real:
        return "f32"
    return "in"  # "in" and "w": the weight has the model's dtype


class _Interp:
    def __init__(self, st: _State):
        self.st = st

    def run(self, m: S.Method, args: list[_V]) -> _V:
        env: dict[str, _V] = {}
        params = m.params[1:] if m.owner is not None else m.params
        for name, v in zip(params, args, strict=False):
            env[name] = v
        out = self.block(m.node.body, env, m)
        if out is None:
            raise NotProven(f"{m.node.name} has no return statement")
        return out

    def block(self, body: list[ast.stmt], env: dict[str, _V], m: S.Method) -> _V | None:
        for stmt in body:
            if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
                continue  # docstring
            if isinstance(stmt, ast.Return):
                if stmt.value is None:
                    raise NotProven(f"line {stmt.lineno}: returns nothing")
                return self.expr(stmt.value, env, m)
            if isinstance(stmt, ast.Assign | ast.AnnAssign):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                value = self.expr(stmt.value, env, m)
                for t in targets:
                    if not isinstance(t, ast.Name):
                        raise NotProven(f"line {stmt.lineno}: assignment to a non-name target")
                    env[t.id] = value
                continue
            if isinstance(stmt, ast.With):
                # autocast guards (Nemotron's LayerNorm1P): the body runs unconditionally
                out = self.block(stmt.body, env, m)
                if out is not None:
                    return out
                continue
            raise NotProven(
                f"line {stmt.lineno}: {type(stmt).__name__} statements are not followed "
                f"({m.file.line(stmt.lineno)!r})"
            )
        return None

    # expressions ---------------------------------------------------------------------------

    def expr(self, node: ast.expr, env: dict[str, _V], m: S.Method) -> _V:
        if isinstance(node, ast.Name):
            return env.get(node.id, _V())
        if (n := S.const_number(node)) is not None:
            return _V(dtype="scalar", number=n)
        if isinstance(node, ast.Attribute):
            return self.attribute(node, env, m)
        if isinstance(node, ast.BinOp):
            return self.binop(node, env, m)
        if isinstance(node, ast.Call):
            return self.call(node, env, m)
        return _V()  # anything else is opaque: it proves nothing

    def attribute(self, node: ast.Attribute, env, m) -> _V:
        d = S.dotted(node)
        if d in _FP32:
            return _V(dtype="dtype:f32")
        attr = S.self_attr(node)
        if attr is not None:
            value = getattr(self.st.module, attr, None)
            if isinstance(value, nn.Parameter):
                return _V(dtype="w", weight=attr)
            if isinstance(value, float):
                self.st.eps_attrs.add(attr)
                return _V(dtype="scalar", number=value)
            return _V()
        if node.attr == "dtype":
            base = self.expr(node.value, env, m)
            if base.dtype in ("in", "f32"):
                return _V(dtype=f"dtype:{base.dtype}")
        return _V()

    def binop(self, node: ast.BinOp, env, m) -> _V:
        a, b = self.expr(node.left, env, m), self.expr(node.right, env, m)
        dt = _promote(a.dtype, b.dtype)
        if isinstance(node.op, ast.Add | ast.Sub):
            sub = isinstance(node.op, ast.Sub)
            # (c + w), (w + c), (w - c): a weight with an offset; (c - w) is not a scale we know
            if a.weight and not a.weighted and b.number is not None:
                self.st.evidence.append(m.ev(node))
                return replace(a, offset=a.offset + (-b.number if sub else b.number))
            if b.weight and not b.weighted and a.number is not None and not sub:
                self.st.evidence.append(m.ev(node))
                return replace(b, offset=b.offset + a.number)
            for v, c in ((a, b), (b, a)):
                if v.sq_mean and c.dtype == "scalar" and not sub:
                    return replace(v, dtype=dt)  # variance + eps
            if sub and b.mean:
                return _V(dtype=dt, centered=True)
            return _V(dtype=dt, centered=a.centered or b.centered)
        if isinstance(node.op, ast.Pow):
            if b.number == 2.0:
                return _V(dtype=a.dtype, square=a.plain or a.centered, centered=a.centered)
            if b.number == -0.5 and a.sq_mean:
                return self._rstd(a, node, m)
            return _V(dtype=dt)
        if isinstance(node.op, ast.Mult):
            for x, y in ((a, b), (b, a)):
                if x.normed and not x.weighted and y.weight and not y.weighted:
                    self.st.mult = (x.dtype, y.dtype, y.offset, y.weight)
                    self.st.evidence.append(m.ev(node))
                    return replace(x, dtype=dt, weighted=True)
                if y.rstd and x.plain:  # the same input its statistics came from
                    return _V(dtype=dt, normed=True)
            if (
                isinstance(node.left, ast.Name)
                and isinstance(node.right, ast.Name)
                and node.left.id == node.right.id
            ):
                return _V(dtype=dt, square=a.plain)  # x * x
            return _V(dtype=dt)
        if isinstance(node.op, ast.Div):
            if a.number == 1.0 and b.sqrt:
                return replace(b, sqrt=False, rstd=True)
            if b.sqrt and a.plain:
                return _V(dtype=dt, normed=True)
            return _V(dtype=dt)
        return _V(dtype=dt)

    def _rstd(self, v: _V, node: ast.AST, m: S.Method) -> _V:
        if self.st.norm_dtype is None:
            self.st.norm_dtype = v.dtype
            self.st.evidence.append(m.ev(node))
        return _V(dtype=v.dtype, rstd=True)

    def _sqrt(self, v: _V, node: ast.AST, m: S.Method) -> _V:
        if not v.sq_mean:
            return _V(dtype=v.dtype)
        if self.st.norm_dtype is None:
            self.st.norm_dtype = v.dtype
            self.st.evidence.append(m.ev(node))
        return _V(dtype=v.dtype, sqrt=True)

    def _cast(self, v: _V, target: _V, node: ast.AST, m: S.Method) -> _V:
        if v.normed or v.weighted or v.dtype == "in":
            self.st.evidence.append(m.ev(node))  # where the input (or x_hat) changes dtype
        if target.dtype in ("dtype:in", "in"):
            return replace(v, dtype="in")
        if target.dtype in ("dtype:f32", "f32"):
            return replace(v, dtype="f32")
        raise NotProven("a cast to a dtype the analyser cannot resolve")

    def call(self, node: ast.Call, env, m) -> _V:
        func = node.func
        name = S.dotted(func)
        args = [self.expr(a, env, m) for a in node.args]
        kwargs = {k.arg: k.value for k in node.keywords if k.arg}
        if name in _LAYER_NORM_FUNCS:
            return self._layer_norm(node, env, m)
        if name in _RMS_NORM_FUNCS:
            self.st.rms_builtin = True
            self.st.evidence.append(m.ev(node))
            return _V(dtype="in", ln=False)
        if name in ("torch.rsqrt",) and args:
            return self._rstd(args[0], node, m) if args[0].sq_mean else _V(dtype=args[0].dtype)
        if name in ("torch.sqrt",) and args:
            return self._sqrt(args[0], node, m)
        if name in ("torch.mean",) and args:
            return self._mean(args[0], node.args[1:], kwargs)
        if name in ("torch.pow",) and len(args) == 2 and args[1].number == 2.0:
            return _V(dtype=args[0].dtype, square=args[0].plain)
        if name in ("torch.square",) and args:
            return _V(dtype=args[0].dtype, square=args[0].plain)
        attr = S.self_attr(func)
        if attr is not None:  # self._norm(x): inline the helper method
            helper = S.method(self.st.cls, attr)
            if helper is None or isinstance(getattr(self.st.module, attr, None), nn.Module):
                raise NotProven(f"line {node.lineno}: calls self.{attr}, not an inlinable method")
            if self.st.depth > 3:
                raise NotProven("helper methods nested too deeply")
            self.st.depth += 1
            try:
                return self.run(helper, args)
            finally:
                self.st.depth -= 1
        if isinstance(func, ast.Attribute):  # a method of a value: x.float(), x.pow(2) ...
            recv = self.expr(func.value, env, m)
            meth = func.attr
            if meth == "float":
                return self._cast(recv, _V(dtype="dtype:f32"), node, m)
            if meth == "to":
                target = args[0] if args else None
                if target is None and "dtype" in kwargs:
                    target = self.expr(kwargs["dtype"], env, m)
                if target is None:
                    raise NotProven(f"line {node.lineno}: .to() without a dtype")
                if target.dtype.startswith("dtype:") or target.dtype in ("in", "f32"):
                    return self._cast(recv, target, node, m)
                raise NotProven(f"line {node.lineno}: .to() with an unresolved dtype")
            if meth == "type_as" and args:
                return self._cast(recv, args[0], node, m)
            if meth in ("pow", "square") and (meth == "square" or args and args[0].number == 2.0):
                sq = recv.plain or recv.centered
                return _V(dtype=recv.dtype, square=sq, centered=recv.centered)
            if meth == "mean":
                return self._mean(recv, node.args, kwargs)
            if meth == "rsqrt" and recv.sq_mean:
                return self._rstd(recv, node, m)
            if meth == "sqrt":
                return self._sqrt(recv, node, m)
            if meth in S.VIEW_METHODS:
                return recv
        return _V()

    def _mean(self, v: _V, pos: list[ast.expr], kwargs: dict[str, ast.expr]) -> _V:
        dim = kwargs.get("dim", pos[0] if pos else None)
        last = dim is not None and S.const_number(dim) == -1.0
        if v.square and last:
            if v.centered:
                self.st.centered = True
            return _V(dtype=v.dtype, sq_mean=True)
        return _V(dtype=v.dtype, mean=last and v.plain)

    def _layer_norm(self, node: ast.Call, env, m) -> _V:
        args: list[ast.expr] = []
        for a in node.args:
            if isinstance(a, ast.Starred) and isinstance(a.value, ast.Name):
                # Nemotron: args = _cast_if_autocast_enabled(device_type, x, shape, w + 1, b, eps)
                packed = _assigned_call(m.node, a.value.id)
                if packed is None:
                    raise NotProven(f"line {node.lineno}: layer_norm(*{a.value.id}) unresolved")
                args += [x for x in packed.args if not isinstance(x, ast.Starred)]
            else:
                args.append(a)
        args += [k.value for k in node.keywords]
        info = {"weight": None, "bias": None, "eps": None, "offset": 0.0}
        for a in args:
            v = self.expr(a, env, m)
            if v.weight and info["weight"] is None:
                info["weight"], info["offset"] = v.weight, v.offset
            elif v.weight and info["bias"] is None:
                info["bias"] = v.weight
            elif v.number is not None and S.self_attr(a):
                info["eps"] = S.self_attr(a)
        self.st.layer_norm = info
        self.st.evidence.append(m.ev(node))
        return _V(dtype="in", ln=True)


def _assigned_call(fn: ast.FunctionDef, name: str) -> ast.Call | None:
    for n in ast.walk(fn):
        if (
            isinstance(n, ast.Assign)
            and len(n.targets) == 1
            and isinstance(n.targets[0], ast.Name)
            and n.targets[0].id == name
            and isinstance(n.value, ast.Call)
        ):
            return n.value
    return None


# ----------------------------------------------------------------------------- classes


def looks_like_norm(module: nn.Module) -> bool:
    """A leaf module whose class name says norm: listed as unsupported when not proven."""
    return "norm" in type(module).__name__.lower() and not any(True for _ in module.children())


def analyze_norm_class(module: nn.Module) -> NormDecision | None:
    """The NormDecision of `module`'s class, or None when its forward is not a norm at all.

    A class that computes something the interpreter cannot prove but is named like a norm gets
    status "unsupported" with the reason; anything else that is not a norm returns None.
    """
    cls = type(module)
    if any(True for _ in module.children()):
        return None  # norms are leaf modules
    fwd = S.method(cls, "forward")
    if fwd is None:
        if looks_like_norm(module):
            return NormDecision(
                class_name=cls.__name__,
                status="unsupported",
                reason=f"no Python source for {cls.__qualname__}.forward",
            )
        return None
    st = _State(module=module, cls=cls)
    interp = _Interp(st)
    try:
        out = interp.run(fwd, [_V(dtype="in", plain=True)])
    except NotProven as e:
        if looks_like_norm(module) or st.norm_dtype is not None or st.layer_norm is not None:
            return NormDecision(
                class_name=cls.__name__,
                status="unsupported",
                reason=f"{cls.__name__}.forward not proven to be an RMSNorm/LayerNorm: {e}",
                evidence=[fwd.ev()],
            )
        return None
    ev = S.unique([fwd.ev(), *st.evidence])
    if st.layer_norm is not None and out.ln:
        return _layer_norm_decision(module, st, ev)
    if st.rms_builtin:
        return NormDecision(
            class_name=cls.__name__,
            kind="rms_norm",
            status="unsupported",
            reason="calls torch's fused rms_norm, whose internal casting cannot be read from "
            "source; left unpatched",
            evidence=ev,
        )
    if st.centered:
        return NormDecision(
            class_name=cls.__name__,
            kind="layer_norm",
            status="unsupported",
            reason=f"{cls.__name__} is a LayerNorm written by hand (mean subtracted); only "
            "F.layer_norm calls are proven equivalent to the layer_norm kernel",
            evidence=ev,
        )
    if out.weighted and st.norm_dtype is not None and st.mult is not None:
        return _rms_decision(module, st, out, ev)
    if looks_like_norm(module) or st.norm_dtype is not None:
        what = "no weight multiply" if st.norm_dtype is not None else "no rsqrt(mean(x**2))"
        return NormDecision(
            class_name=cls.__name__,
            status="unsupported",
            reason=f"{cls.__name__}.forward not proven to be an RMSNorm/LayerNorm ({what} found "
            f"on the returned value)",
            evidence=[fwd.ev()],
        )
    return None


def _eps_attribute(st: _State) -> str | None:
    if len(st.eps_attrs) == 1:
        return next(iter(st.eps_attrs))
    eps = sorted(a for a in st.eps_attrs if "eps" in a.lower())
    return eps[0] if len(eps) == 1 else None


def _rms_decision(module, st: _State, out: _V, ev: list[Evidence]) -> NormDecision:
    cls = type(module)
    x_dtype, _w_dtype, offset, w_attr = st.mult
    d = NormDecision(
        class_name=cls.__name__,
        kind="rms_norm",
        offset=offset,
        eps_attribute=_eps_attribute(st),
        weight_attribute=w_attr,
        evidence=ev,
    )
    if st.norm_dtype == "f32" and x_dtype == "in":
        d.casting_mode = "llama"  # x_hat cast to the input dtype, then the weight multiply
    elif st.norm_dtype == "f32" and x_dtype == "f32" and out.dtype == "in":
        d.casting_mode = "gemma"  # weight multiply in fp32, one cast at the end
    elif st.norm_dtype == "in" and x_dtype == "in":
        d.casting_mode = "none"
    else:
        d.reason = (
            f"casting not recognised: rstd in {st.norm_dtype}, x_hat in {x_dtype} at the weight "
            f"multiply, output in {out.dtype}"
        )
        d.status = "unsupported"
    if d.eps_attribute is None:
        d.reason = f"eps attribute not identified among {sorted(st.eps_attrs)}"
        d.status = "unsupported"
    return d


def _layer_norm_decision(module, st: _State, ev: list[Evidence]) -> NormDecision:
    cls = type(module)
    info = st.layer_norm
    d = NormDecision(
        class_name=cls.__name__,
        kind="layer_norm",
        offset=info["offset"],
        eps_attribute=info["eps"],
        weight_attribute=info["weight"] or "weight",
        bias_attribute=info["bias"],
        evidence=ev,
    )
    shape = getattr(module, "normalized_shape", None)
    if shape is not None and len(tuple(shape)) != 1:
        d.reason = f"normalizes over {tuple(shape)}, not the last dimension alone"
        d.status = "unsupported"
    elif d.eps_attribute is None:
        d.reason = "eps argument of layer_norm not read from a module attribute"
        d.status = "unsupported"
    elif info["weight"] is None and getattr(module, "weight", None) is not None:
        d.reason = "layer_norm weight argument not resolved to the module's parameter"
        d.status = "unsupported"
    return d
