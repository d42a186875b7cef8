"""Loops over jagged segments, captured at the Python level before Dynamo sees them.

A Python loop that pools each segment of a jagged batch — `values[offsets[i]:offsets[i + 1]]`
then `.mean(0)`, once per segment, then `torch.stack` — is unrolled by Dynamo one segment at
a time: thousands of slices in the graph, minutes of compile time, a graph per batch shape.
The graph pass cannot fix that after the fact, so `kernelwright.compile` rewrites such loops
in the source of each module's `forward` (and of a plain function) before handing the model
to torch.compile: the loop becomes one call of `segment_means`, which runs the jagged_mean
kernel in one launch and is opaque to Dynamo (a graph break there, no guard on the offsets).

The spellings recognised, `V` the values, `O` the offsets (a list, or a tensor), `L` lengths:

    torch.stack([V[O[i]:O[i + 1]].mean(0) for i in range(N)])
    torch.stack([V[s:e].mean(dim=0) for s, e in zip(O[:-1], O[1:])])
    torch.stack([c.mean(0) for c in torch.split(V, L)])          (or V.split(L))
    out = []                                                    the same as a for loop:
    for i in range(N):                                          the loop is removed and
        out.append(V[O[i]:O[i + 1]].mean(0))                    torch.stack(out) becomes
    pooled = torch.stack(out)                                   the call

`torch.mean(V[a:b], 0)` and `dim=0` spellings count too. `segment_means` computes exactly what
the loop did: where the kernel cannot (an empty segment, whose eager mean is NaN; bounds out of
order or range; a device or dtype the kernel does not take) it runs the loop as written, and
the loop's `Capture` counts the calls each way with the fallbacks' reasons (the report's line).
A module's forward is rewritten on the instance (`module.forward`); its class is untouched.
"""

from __future__ import annotations

import ast
import inspect
import logging
import textwrap
import types
from dataclasses import dataclass, field

import torch

# The rewritten function reaches the helpers through closure cells of these names (a closure
# Dynamo follows, and no name added to the user's module).
_HELPERS = ("segment_means", "split_means")
_PREFIX = "_kernelwright_"

log = logging.getLogger("kernelwright.compile")


# --------------------------------------------------------------------------- the runtime call


def _kernel_takes(values: torch.Tensor) -> bool:
    from kernelwright.runtime.device import interpreter_mode

    if values.dtype not in (torch.float32, torch.float16, torch.bfloat16) or values.dim() < 1:
        return False
    return values.device.type == "cuda" or (values.device.type == "cpu" and interpreter_mode())


def _as_bounds(offsets) -> list[int]:
    if isinstance(offsets, torch.Tensor):
        return [int(b) for b in offsets.tolist()]  # one read of the offsets, not one a segment
    return [int(b) for b in offsets]


def _pairs(bounds: list[int]) -> list[tuple[int, int]]:
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def _loop(values: torch.Tensor, bounds: list[int]) -> torch.Tensor:
    return torch.stack([values[a:b].mean(0) for a, b in _pairs(bounds)])


def _why_not(values: torch.Tensor, bounds: list[int]) -> str | None:
    """Why the kernel would not compute what the loop does over `bounds` (None: it would)."""
    if len(bounds) < 2:
        return "no segment"  # torch.stack([]) raises, as the loop would
    pairs = _pairs(bounds)
    if any(a == b for a, b in pairs):
        return "an empty segment (eager's mean is NaN)"
    total = values.shape[0] if values.dim() else 0
    if not all(0 <= a < b for a, b in pairs) or bounds[-1] > total:
        return "bounds out of order or past the values (eager clamps the slices)"
    if not _kernel_takes(values):
        dt = str(values.dtype).replace("torch.", "")
        return f"{dt} on {values.device.type}: the kernel takes float32/float16/bfloat16 on CUDA"
    return None


@torch._dynamo.disable
def segment_means(values: torch.Tensor, offsets, count=None, site=None) -> torch.Tensor:
    """`torch.stack([values[offsets[i]:offsets[i + 1]].mean(0) for i in range(count)])` (all
    segments when `count` is None) in one kernel launch where the kernel computes the same;
    `site` (the loop's `Capture`) records which way each call went."""
    bounds = _as_bounds(offsets)
    if count is not None:
        if int(count) + 1 > len(bounds):  # the loop indexes past the offsets: its IndexError
            return torch.stack([values[offsets[i] : offsets[i + 1]].mean(0) for i in range(count)])
        bounds = bounds[: int(count) + 1]
    why = _why_not(values, bounds)
    if site is not None:
        site.record(why)
    if why is not None:
        return _loop(values, bounds)  # eager semantics: NaN, clamped slices, torch's errors
    from kernelwright.ops.jagged_mean import jagged_mean

    first, last = bounds[0], bounds[-1]
    rows = values[first:last]
    feature_shape = rows.shape[1:]
    flat = rows.reshape(rows.shape[0], -1)
    offs = torch.tensor([b - first for b in bounds], dtype=torch.int64).to(values.device)
    return jagged_mean(flat, offs, validate=False).view(len(bounds) - 1, *feature_shape)


def split_means(values: torch.Tensor, lengths, dim: int = 0, site=None) -> torch.Tensor:
    """`torch.stack([c.mean(0) for c in torch.split(values, lengths)])` in one launch."""
    if isinstance(lengths, int) or dim != 0:
        if site is not None:
            site.record("split into equal sizes or along another dimension")
        return torch.stack([c.mean(0) for c in torch.split(values, lengths, dim)])
    bounds = [0]
    for n in _as_bounds(lengths):
        bounds.append(bounds[-1] + n)
    if bounds[-1] != (values.shape[0] if values.dim() else 0):
        return torch.stack([c.mean(0) for c in torch.split(values, lengths)])  # torch raises
    return segment_means(values, bounds, site=site)


# --------------------------------------------------------------------------- matching


def _is_zero(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and node.value == 0 and type(node.value) is int


def _same(a: ast.AST, b: ast.AST) -> bool:
    return ast.dump(a) == ast.dump(b)


def _is_torch(node: ast.AST, name: str) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == name
        and isinstance(node.value, ast.Name)
        and node.value.id == "torch"
    )


def _mean_dim0(node: ast.AST) -> ast.AST | None:
    """X for `X.mean(0)`, `X.mean(dim=0)`, `torch.mean(X, 0)`, `torch.mean(X, dim=0)`."""
    if not isinstance(node, ast.Call):
        return None
    args, kw = node.args, {k.arg: k.value for k in node.keywords}
    if (
        isinstance(node.func, ast.Attribute)
        and node.func.attr == "mean"
        and not _is_torch(node.func, "mean")
    ):
        target, rest = node.func.value, args
    elif _is_torch(node.func, "mean") and args:
        target, rest = args[0], args[1:]
    else:
        return None
    if set(kw) - {"dim"} or len(rest) + len(kw) != 1:
        return None
    dim = rest[0] if rest else kw["dim"]
    return target if _is_zero(dim) else None


def _slice_of(node: ast.AST) -> tuple[ast.AST, ast.AST, ast.AST] | None:
    """(V, lo, hi) for `V[lo:hi]`."""
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Slice):
        s = node.slice
        if s.lower is not None and s.upper is not None and s.step is None:
            return node.value, s.lower, s.upper
    return None


def _index(node: ast.AST) -> tuple[ast.AST, ast.AST] | None:
    """(O, i) for `O[i]`."""
    if isinstance(node, ast.Subscript) and not isinstance(node.slice, ast.Slice):
        return node.value, node.slice
    return None


def _plus_one(node: ast.AST, var: str) -> bool:
    return (
        isinstance(node, ast.BinOp)
        and isinstance(node.op, ast.Add)
        and isinstance(node.left, ast.Name)
        and node.left.id == var
        and isinstance(node.right, ast.Constant)
        and node.right.value == 1
    )


def _range_count(node: ast.AST) -> ast.AST | None:
    """N for `range(N)` or `range(0, N)`."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
        return None
    if node.func.id != "range" or node.keywords:
        return None
    if len(node.args) == 1:
        return node.args[0]
    if len(node.args) == 2 and _is_zero(node.args[0]):
        return node.args[1]
    return None


def _zip_bounds(node: ast.AST) -> ast.AST | None:
    """O for `zip(O[:-1], O[1:])`."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
        return None
    if node.func.id != "zip" or len(node.args) != 2:
        return None
    if any(k.arg != "strict" for k in node.keywords):
        return None
    a, b = node.args
    ok_a = isinstance(a, ast.Subscript) and isinstance(a.slice, ast.Slice)
    ok_b = isinstance(b, ast.Subscript) and isinstance(b.slice, ast.Slice)
    if not (ok_a and ok_b and _same(a.value, b.value)):
        return None
    sa, sb = a.slice, b.slice
    minus_one = (
        isinstance(sa.upper, ast.UnaryOp)
        and isinstance(sa.upper.op, ast.USub)
        and isinstance(sa.upper.operand, ast.Constant)
        and sa.upper.operand.value == 1
    )
    to_last = sa.lower is None and minus_one and sa.step is None
    from_one = isinstance(sb.lower, ast.Constant) and sb.lower.value == 1
    return a.value if to_last and from_one and sb.upper is None and sb.step is None else None


def _segment_call(target: ast.AST, iter_: ast.AST, elt: ast.AST) -> ast.Call | None:
    """The replacement call for one segment per iteration of `for target in iter_: elt`."""
    pooled = _mean_dim0(elt)
    if pooled is None:
        return None
    sliced = _slice_of(pooled)
    if isinstance(target, ast.Name) and sliced is not None:
        values, lo, hi = sliced
        count = _range_count(iter_)
        lo_i, hi_i = _index(lo), _index(hi)
        if count is None or lo_i is None or hi_i is None or not _same(lo_i[0], hi_i[0]):
            return None
        var = target.id
        if not (isinstance(lo_i[1], ast.Name) and lo_i[1].id == var and _plus_one(hi_i[1], var)):
            return None
        return _call("segment_means", values, lo_i[0], count)
    if isinstance(target, ast.Tuple) and sliced is not None and len(target.elts) == 2:
        values, lo, hi = sliced
        offsets = _zip_bounds(iter_)
        s, e = target.elts
        names = isinstance(s, ast.Name) and isinstance(e, ast.Name)
        if offsets is None or not names or not (_is_name(lo, s.id) and _is_name(hi, e.id)):
            return None
        return _call("segment_means", values, offsets)
    if isinstance(target, ast.Name) and _is_name(pooled, target.id):
        split = _split_args(iter_)
        if split is not None:
            return _call("split_means", *split)
    return None


def _is_name(node: ast.AST, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


def _split_args(node: ast.AST) -> tuple[ast.AST, ast.AST] | None:
    """(V, L) for `torch.split(V, L)` or `V.split(L)` (split along dim 0)."""
    if not isinstance(node, ast.Call) or node.keywords:
        return None
    if _is_torch(node.func, "split") and len(node.args) == 2:
        return node.args[0], node.args[1]
    method = isinstance(node.func, ast.Attribute) and node.func.attr == "split"
    if method and len(node.args) == 1 and not _is_torch(node.func, "split"):
        return node.func.value, node.args[0]
    return None


def _call(name: str, *args: ast.AST) -> ast.Call:
    func = ast.Name(id=_PREFIX + name, ctx=ast.Load())
    return ast.Call(func=func, args=list(args), keywords=[])


def _site_name(index: int) -> str:
    """The closure cell holding the `Capture` of the function's `index`-th loop."""
    return f"{_PREFIX}site_{index}"


def _with_site(call: ast.Call, index: int) -> ast.Call:
    call.keywords.append(ast.keyword(arg="site", value=ast.Name(_site_name(index), ast.Load())))
    return call


def _stack_of(node: ast.AST) -> ast.AST | None:
    """The list argument of `torch.stack(x)` / `torch.stack(x, 0)` / `torch.stack(x, dim=0)`."""
    if not (isinstance(node, ast.Call) and _is_torch(node.func, "stack") and node.args):
        return None
    rest, kw = node.args[1:], {k.arg: k.value for k in node.keywords}
    if set(kw) - {"dim"} or len(rest) + len(kw) > 1:
        return None
    if (rest or kw) and not _is_zero(rest[0] if rest else kw["dim"]):
        return None
    return node.args[0]


@dataclass(eq=False)
class Capture:
    """One loop rewritten, and how its calls went at run time: by the kernel, or by the loop
    as written (`fallbacks`: reason -> calls)."""

    where: str  # qualified name of the function
    line: int  # line of the loop in its file
    spelling: str  # "comprehension" or "for loop"
    kernel_calls: int = 0
    fallbacks: dict[str, int] = field(default_factory=dict)

    def record(self, fallback: str | None) -> None:
        """One call: by the kernel (None), or by the loop for the reason `fallback`."""
        if fallback is None:
            self.kernel_calls += 1
            return
        if fallback not in self.fallbacks:
            log.info("source: segment-mean %s at %s:%d: ran the loop as written — %s",
                     self.spelling, self.where, self.line, fallback)  # fmt: skip
        self.fallbacks[fallback] = self.fallbacks.get(fallback, 0) + 1

    def runs(self) -> str:
        """How the calls so far went, in words ("" before the first)."""
        if not self.kernel_calls and not self.fallbacks:
            return ""
        ways = [f"{self.kernel_calls} by the kernel"]
        ways += [f"{n} by the loop ({why})" for why, n in self.fallbacks.items()]
        return "calls so far: " + ", ".join(ways)


class _Rewriter(ast.NodeTransformer):
    def __init__(self):
        self.captures: list[tuple[int, str]] = []
        self.loops: dict[str, ast.Call] = {}  # list name -> replacement call
        self.loop_lines: dict[str, int] = {}  # list name -> line of its (removed) loop
        self.stacked: dict[str, int] = {}  # list name -> line of the torch.stack replaced

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        arg = _stack_of(node)
        if isinstance(arg, ast.ListComp) and len(arg.generators) == 1:
            gen = arg.generators[0]
            if not gen.ifs and not gen.is_async:
                call = _segment_call(gen.target, gen.iter, arg.elt)
                if call is not None:
                    call = _with_site(call, len(self.captures))
                    self.captures.append((node.lineno, "comprehension"))
                    return ast.copy_location(call, node)
        if isinstance(arg, ast.Name) and arg.id in self.loops:
            self.stacked.setdefault(arg.id, node.lineno)
            return ast.copy_location(self.loops[arg.id], node)
        return node

    def rewrite_body(self, body: list[ast.stmt]) -> list[ast.stmt]:
        """Loops of `out.append(<segment mean>)` leave the body; the list name maps to the call
        (before the statements after them are visited)."""
        out = []
        for stmt in body:
            found = self._append_loop(stmt)
            if found is not None:
                name, call = found
                self.loops[name] = _with_site(call, len(self.captures))
                self.loop_lines[name] = stmt.lineno
                self.captures.append((stmt.lineno, "for loop"))
                continue
            for attr in ("body", "orelse", "finalbody"):
                inner = getattr(stmt, attr, None)
                if isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt):
                    setattr(stmt, attr, self.rewrite_body(inner))
            out.append(self.visit(stmt))
        return out or [ast.Pass()]

    def _append_loop(self, stmt: ast.stmt) -> tuple[str, ast.Call] | None:
        if not isinstance(stmt, ast.For) or stmt.orelse or len(stmt.body) != 1:
            return None
        inner = stmt.body[0]
        if not (isinstance(inner, ast.Expr) and isinstance(inner.value, ast.Call)):
            return None
        call = inner.value
        f = call.func
        if not (isinstance(f, ast.Attribute) and f.attr == "append" and len(call.args) == 1):
            return None
        if not isinstance(f.value, ast.Name) or call.keywords:
            return None
        replacement = _segment_call(stmt.target, stmt.iter, call.args[0])
        return (f.value.id, replacement) if replacement is not None else None


def _list_read_elsewhere(fn: ast.FunctionDef, loops: dict[str, int], stacked: dict[str, int]):
    """Whether a removed loop's list is read other than by its `torch.stack`: between the loop
    and the stack, or after the stack before the name is bound again (`pooled =
    torch.stack(pooled)` rebinds it)."""
    for name, loop_line in loops.items():
        names = [n for n in ast.walk(fn) if isinstance(n, ast.Name) and n.id == name]
        stack_line = stacked.get(name)
        if stack_line is None:
            return any(isinstance(n.ctx, ast.Load) for n in names)
        rebinds = [n.lineno for n in names if isinstance(n.ctx, ast.Store)]
        for n in names:
            if not isinstance(n.ctx, ast.Load) or n.lineno < loop_line:
                continue
            if n.lineno <= stack_line:
                return True
            if not any(stack_line <= r < n.lineno for r in rebinds):
                return True
    return False


def rewrite_function(fn: types.FunctionType) -> tuple[types.FunctionType, list[Capture]] | None:
    """`fn` with its segment loops replaced (a new function, same globals), and where they
    were; None when nothing matched or the source cannot be rewritten (no source, closures)."""
    if not isinstance(fn, types.FunctionType) or fn.__code__.co_freevars:
        return None  # closures (super() included) cannot be rebuilt from the source alone
    try:
        source = textwrap.dedent(inspect.getsource(fn))
        first_line = inspect.getsourcelines(fn)[1]
    except (OSError, TypeError):
        return None
    if "mean" not in source:
        return None
    tree = ast.parse(source)
    fdef = tree.body[0]
    if not isinstance(fdef, ast.FunctionDef):
        return None
    if fdef.decorator_list:
        return None  # re-applying decorators from source is not safe to assume
    rw = _Rewriter()
    fdef.body = rw.rewrite_body(fdef.body)
    if not rw.captures:
        return None
    if rw.loops and _list_read_elsewhere(fdef, rw.loop_lines, rw.stacked):
        return None  # the list is read elsewhere (len(out), out[0], ...): keep the loop
    where = f"{fn.__module__}.{fn.__qualname__}"
    captures = [Capture(where, line + first_line - 1, spelling) for line, spelling in rw.captures]
    # def _kernelwright_make(<helpers>, <sites>): <the function>; return it — as closure cells
    params = [_PREFIX + h for h in _HELPERS] + [_site_name(i) for i in range(len(captures))]
    tree = ast.parse(f"def {_PREFIX}make({', '.join(params)}):\n    return None")
    maker = tree.body[0]
    maker.body = [fdef, ast.Return(value=ast.Name(id=fdef.name, ctx=ast.Load()))]
    ast.increment_lineno(fdef, first_line - 1)
    ast.fix_missing_locations(tree)
    code = compile(tree, inspect.getsourcefile(fn) or "<kernelwright>", "exec")
    namespace: dict = {}
    exec(code, fn.__globals__, namespace)  # noqa: S102  (the user's own source, rewritten)
    new = namespace[maker.name](*(globals()[h] for h in _HELPERS), *captures)
    new.__defaults__, new.__kwdefaults__ = fn.__defaults__, fn.__kwdefaults__
    new.__qualname__ = fn.__qualname__
    return new, captures


def capture(model_or_fn):
    """(the model or function with its segment loops rewritten, the captures). A module's
    submodules are rewritten on their instances; a function is returned rewritten."""
    captures: list[Capture] = []
    if isinstance(model_or_fn, torch.nn.Module):
        rewritten: dict = {}  # class forward -> its rewrite (or None)
        for module in model_or_fn.modules():
            forward = type(module).forward
            if "forward" in vars(module) or not isinstance(forward, types.FunctionType):
                continue  # already replaced on the instance, or not plain Python
            if forward not in rewritten:
                rewritten[forward] = rewrite_function(forward)
                if rewritten[forward] is not None:
                    captures.extend(rewritten[forward][1])
            if rewritten[forward] is not None:
                module.forward = types.MethodType(rewritten[forward][0], module)
        return model_or_fn, captures
    if isinstance(model_or_fn, types.FunctionType):
        found = rewrite_function(model_or_fn)
        if found is not None:
            return found
    return model_or_fn, captures
