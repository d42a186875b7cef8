"""Act: a reviewed KernelProfile → Triton source, tests and a benchmark stub (tier 1).

Tier 1 (element-wise, inputs broadcast as full/row/col/scalar) is lowered node by node: every
aten node of the profile's forward and backward graphs becomes one `tl` expression on a
[ROWS, BLOCK_N] tile computed in fp32 (loads are upcast, stores round once to the output
dtype: bf16 arithmetic is silently wrong under the interpreter and less accurate on a GPU).
The backward kernel recomputes forward intermediates from the saved inputs (cheap for
element-wise work) and writes each input gradient at full size; a broadcast input's gradient
is written in fp32 and summed to the input's shape by the launcher.

Generation is a pure function of the profile: same profile, byte-identical files. A node
without a lowering raises `UnsupportedNode` naming it — never a kernel we cannot verify.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import jinja2

from kernelwright.profiles.kernel import GraphNode, KernelProfile

TEMPLATES = Path(__file__).parent / "templates"

# Shape-only ops: on an element-wise tile they are the identity. `sum` is allowed only as the
# trailing reduction of a broadcast input's gradient (checked in _grad_sources).
_IDENTITY = {
    "aten.alias.default", "aten.clone.default", "aten.view.default", "aten.reshape.default",
    "aten._unsafe_view.default", "aten.expand.default", "aten.squeeze.dim",
    "aten.squeeze.dims", "aten.squeeze.default", "aten.unsqueeze.default",
    "aten.lift_fresh_copy.default", "aten.detach.default",
}  # fmt: skip
_SUM = {"aten.sum.dim_IntList", "aten.sum.default"}
_FLOAT_DTYPES = ("float", "half", "bfloat16", "float16", "float32", "float64", "double")
# the default launch configs, largest tile first; a repair moves one step down the list
DEFAULT_CONFIGS = [
    {"block_n": 1024, "rows": 4, "num_warps": 4},
    {"block_n": 256, "rows": 4, "num_warps": 4},
    {"block_n": 64, "rows": 2, "num_warps": 2},
]


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


def _lower(n: GraphNode, a: list[str], raw: list, kw: dict) -> str:
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


class _Emitter:
    """Straight-line kernel body: forward nodes as f_<name>, backward nodes as b_<name>."""

    def __init__(self, profile: KernelProfile):
        self.p = profile
        self.fwd = [n for n in profile.forward.nodes]
        self.bwd = [n for n in profile.backward.nodes]
        self.fwd_by = {n.name: n for n in self.fwd}
        self.bwd_by = {n.name: n for n in self.bwd}
        self.f_ph = [n.name for n in self.fwd if n.op == "placeholder"]
        if len(self.f_ph) != len(profile.inputs):
            raise UnsupportedNode(
                "placeholder",
                f"the forward graph has {len(self.f_ph)} placeholders for "
                f"{len(profile.inputs)} profile inputs; re-run Understand",
            )

    @staticmethod
    def _arg(x, prefix: str, names: set[str], alias: dict[str, str]) -> str:
        if isinstance(x, str) and x in names:
            return alias.get(x, prefix + x)
        return _lit(x) if isinstance(x, (int, float)) else repr(x)

    def fwd_needed(self, roots: list[str]) -> list[GraphNode]:
        need: set[str] = set()
        stack = [r for r in roots if r in self.fwd_by]
        names = set(self.fwd_by)
        while stack:
            r = stack.pop()
            if r in need:
                continue
            need.add(r)
            n = self.fwd_by[r]
            stack.extend(_refs(n.args, names) + _refs(list(n.kwargs.values()), names))
        return [n for n in self.fwd if n.name in need and n.op != "output"]

    def emit(self, nodes: list[GraphNode], prefix: str, alias: dict[str, str]) -> list[str]:
        names = {n.name for n in nodes} | set(alias)
        lines = []
        for n in nodes:
            if n.op != "call_function":
                continue
            code = [self._arg(x, prefix, names, alias) for x in n.args]
            if n.target in _IDENTITY or n.target in _SUM:
                expr = code[0]
            else:
                expr = _lower(n, code, list(n.args), dict(n.kwargs))
            lines.append(f"{prefix}{n.name} = {expr}")
        return lines

    def forward_body(self) -> tuple[list[str], list[str]]:
        outs = _output_args(self.fwd)[: len(self.p.outputs)]
        for n in self.fwd:
            if n.target in _SUM:
                raise UnsupportedNode(
                    n.name, "a reduction in the forward: tier-2 row kernels are not generated yet"
                )
        body = self.emit(self.fwd_needed(outs), "f_", {})
        return body, ["f_" + o for o in outs]

    def backward_body(self) -> tuple[list[str], list[str | None], list[bool], set[int]]:
        """Lines, the value per input gradient, whether each was summed, inputs needed."""
        b_ph = [n.name for n in self.bwd if n.op == "placeholder"]
        alias: dict[str, str] = {}
        recompute: list[str] = []
        # a backward placeholder is a forward input, a forward intermediate, or (in order)
        # the gradient of one output ("tangents_1" from aot_function, "dy" from Understand)
        n_tangents = 0
        for ph in b_ph:
            if ph in self.f_ph:
                alias[ph] = "f_" + ph
            elif ph in self.fwd_by:
                alias[ph] = "f_" + ph  # a saved intermediate: recomputed from the inputs
                recompute.append(ph)
            elif n_tangents < len(self.p.outputs):
                alias[ph] = f"dy_{n_tangents}"
                n_tangents += 1
            else:
                raise UnsupportedNode(ph, "a backward input that is neither saved nor a gradient")
        fwd_lines = self.emit(self.fwd_needed(recompute), "f_", {})
        grads = _output_args(self.bwd)
        users = _users(self.bwd)
        values: list[str | None] = []
        summed: list[bool] = []
        for g in grads[: len(self.p.inputs)]:
            if g is None:
                values.append(None)
                summed.append(False)
                continue
            # walk back through shape ops and one trailing sum to the full-size value
            was_summed, cur = False, g
            while cur in self.bwd_by and (
                self.bwd_by[cur].target in _IDENTITY or self.bwd_by[cur].target in _SUM
            ):
                was_summed |= self.bwd_by[cur].target in _SUM
                cur = self.bwd_by[cur].args[0]
            # a sum feeding anything else than shape ops would need a real reduction
            values.append(alias.get(cur, "b_" + cur) if isinstance(cur, str) else None)
            summed.append(was_summed)
        for n in self.bwd:
            if n.target in _SUM:
                bad = [u.name for u in users.get(n.name, [])
                       if u.op != "output" and u.target not in _IDENTITY]  # fmt: skip
                if bad:
                    raise UnsupportedNode(n.name, f"a reduction feeding {bad}: tier 2")
        body = fwd_lines + self.emit(self.bwd, "b_", alias)
        text = "\n".join(body + [v or "" for v in values])
        needed = {i for i, ph in enumerate(self.f_ph) if f"f_{ph}" in text}
        return body, values, summed, needed


def _config(profile: KernelProfile) -> dict[str, int]:
    configs = (profile.launch.configs if profile.launch else None) or DEFAULT_CONFIGS
    # the element-wise template tiles [rows, block_n]: a profile whose launch plan is for row
    # kernels (tier 2 whose only reductions are parameter gradients, e.g. DyT) takes the
    # element-wise defaults instead of failing on a missing key
    if not all("block_n" in c and "rows" in c and "num_warps" in c for c in configs):
        configs = DEFAULT_CONFIGS
    return dict(configs[min(len(profile.repairs), len(configs) - 1)])


def _camel(name: str) -> str:
    return "".join(p[:1].upper() + p[1:] for p in name.split("_"))


def render(profile: KernelProfile) -> dict[str, str]:
    """The generated files, {relative path: text}; raises UnsupportedNode for what can't be."""
    # tier 2 goes through too: its per-feature parameter gradients are trailing sums, which
    # _Emitter handles; a reduction inside the computation raises UnsupportedNode there
    if profile.tier == 3:
        node = profile.unsupported_node or "reduction"
        raise UnsupportedNode(
            node, profile.unsupported_reason or f"tier {profile.tier} is not generated yet"
        )
    em = _Emitter(profile)
    fwd_body, fwd_outs = em.forward_body()
    has_bwd = any(n.op == "call_function" for n in profile.backward.nodes)
    if has_bwd:
        bwd_body, grads, summed, needed = em.backward_body()
    else:
        bwd_body, grads, summed, needed = [], [None] * len(profile.inputs), [], set()
    used_fwd = {i for i, ph in enumerate(em.f_ph) if f"f_{ph}" in "\n".join(fwd_body + fwd_outs)}
    ctx = {
        "p": profile,
        "cls": _camel(profile.name),
        "inputs": [i.name for i in profile.inputs],
        "specs": profile.inputs,
        "ph": em.f_ph,
        "n_out": len(fwd_outs),
        "fwd_body": fwd_body,
        "fwd_outs": fwd_outs,
        "fwd_used": sorted(used_fwd),
        "has_bwd": has_bwd,
        "bwd_body": bwd_body,
        "grads": grads,
        "summed": summed,
        "bwd_used": sorted(needed),
        "grad_idx": [i for i, g in enumerate(grads) if g is not None],
        "cfg": _config(profile),
        "ref_lines": _ref_lines(profile, em),
        "params": [i for i in profile.inputs if i.role == "parameter"],
        "args": [i for i in profile.inputs if i.role != "parameter"],
    }
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        undefined=jinja2.StrictUndefined,
    )
    name = profile.name
    return {
        f"{name}/__init__.py": env.get_template("init.py.j2").render(**ctx),
        f"{name}/{name}.py": env.get_template("op.py.j2").render(**ctx),
        f"{name}/test_{name}.py": env.get_template("test.py.j2").render(**ctx),
        f"{name}/bench_{name}.py": env.get_template("bench.py.j2").render(**ctx),
    }


def _ref_lines(profile: KernelProfile, em: _Emitter) -> list[str]:
    """The traced forward as eager aten calls in fp32: the reference the tests compare to."""
    names = {n.name for n in em.fwd}
    lines = []
    for n in em.fwd:
        if n.op != "call_function":
            continue

        def conv(v):
            if isinstance(v, str) and v in names:
                return v
            if isinstance(v, (list, tuple)):
                return "[" + ", ".join(conv(x) for x in v) + "]"
            if isinstance(v, str):
                return repr(v)
            return repr(v)

        args = ", ".join(conv(v) for v in n.args)
        kws = []
        for k, v in n.kwargs.items():
            if k in ("layout", "device", "pin_memory", "memory_format"):
                continue
            if k == "dtype":
                s = str(v).rsplit(".", 1)[-1]
                kws.append(f"dtype=torch.{'bool' if s == 'bool' else 'float32'}")
                continue
            kws.append(f"{k}={conv(v)}")
        if n.target in ("aten.full.default", "aten.scalar_tensor.default"):
            kws = [k for k in kws if not k.startswith("dtype")] + [
                "dtype=torch.float32",
                "device=_device",
            ]
        if n.target in ("aten.convert_element_type.default", "aten._to_copy.default"):
            # fp32 reference: a float cast stays in fp32
            s = str(n.args[1] if len(n.args) > 1 else n.kwargs.get("dtype")).rsplit(".", 1)[-1]
            lines.append(
                f"{n.name} = {conv(n.args[0])}.to(torch.{'bool' if s == 'bool' else 'float32'})"
            )
            continue
        call = ", ".join([a for a in (args, ", ".join(kws)) if a])
        lines.append(f"{n.name} = torch.ops.{n.target}({call})")
    outs = _output_args(em.fwd)[: len(profile.outputs)]
    lines.append("return " + ", ".join(outs) + ("," if len(outs) == 1 and False else ""))
    return lines


def write(profile: KernelProfile, out_dir: str | Path) -> list[Path]:
    """Render and write the files under out_dir (the package directory <name>/ inside it)."""
    out_dir = Path(out_dir)
    written = []
    for rel, text in render(profile).items():
        path = out_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    return written
