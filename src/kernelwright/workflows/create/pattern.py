"""The reference as its author wrote it, as a plain function: the pattern a created op replaces.

`create --into-library` writes it into the op's module as `<op>_pattern(inputs..., params...)`
(the public function's arguments, in its order). `kernelwright.compile` traces it with
torch.fx and looks for the same computation in the graphs it captures (compile/generated.py),
so a model that writes the computation the op was made from gets the op's kernel.

A module's forward becomes the function's body with `self.<parameter>` read as the argument of
that name and `self.<number>` (an int, float or bool attribute) as its value. A forward that
reads anything else of `self` (a submodule, a buffer, a nested parameter), a function with
non-tensor arguments, a closure or a decorated function has no pattern: None.
"""

from __future__ import annotations

import ast
import builtins
import inspect
import textwrap

from kernelwright.workflows.create.load import Reference

_ALLOWED_GLOBALS = {"torch", "F", "nn", "math"}
_IMPORTS = [
    "import math",
    "import torch",
    "import torch.nn.functional as F",
    "from torch import nn",
]


class _SelfReads(ast.NodeTransformer):
    def __init__(self, params: set[str], numbers: dict[str, object]):
        self.params, self.numbers, self.failed = params, numbers, False

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        if isinstance(node.value, ast.Name) and node.value.id == "self":
            if node.attr in self.params and isinstance(node.ctx, ast.Load):
                return ast.copy_location(ast.Name(id=node.attr, ctx=ast.Load()), node)
            if node.attr in self.numbers and isinstance(node.ctx, ast.Load):
                return ast.copy_location(ast.Constant(value=self.numbers[node.attr]), node)
            self.failed = True
            return node
        return self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id == "self":
            self.failed = True  # self passed on, or read other than by an attribute
        return node


def pattern_source(ref: Reference, name: str) -> str | None:
    """`def <name>(<inputs>, <params>): ...` as source, or None where there is no pattern."""
    if ref.constants:
        return None  # non-tensor arguments: the public function does not take them
    if ref.module is not None:
        fn = type(ref.module).forward
        params = {k for k, _ in ref.module.named_parameters() if "." not in k}
        if params != set(ref.param_names):
            return None  # nested parameters (a submodule's) are not plain arguments
        numbers = {
            k: v
            for k, v in vars(ref.module).items()
            if isinstance(v, (int, float, bool)) and not k.startswith("_")
        }
    else:
        fn, params, numbers = ref.function, set(), {}
    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        return None
    if getattr(fn, "__code__", None) is None or fn.__code__.co_freevars:
        return None
    tree = ast.parse(source)
    fdef = tree.body[0]
    if not isinstance(fdef, ast.FunctionDef) or fdef.decorator_list:
        return None
    args = fdef.args
    if args.vararg or args.kwarg or args.kwonlyargs or args.defaults or args.posonlyargs:
        return None
    names = [a.arg for a in args.args]
    if ref.module is not None:
        if not names or names[0] != "self":
            return None
        names = names[1:]
    if names != list(ref.input_names):
        return None
    reads = _SelfReads(params, numbers)
    fdef.body = [reads.visit(stmt) for stmt in fdef.body]
    if reads.failed:
        return None
    fdef.name = name
    fdef.args.args = [ast.arg(arg=n) for n in (*ref.input_names, *ref.param_names)]
    fdef.returns = None
    for a in fdef.args.args:
        a.annotation = None
    body_names = {n.id for n in ast.walk(fdef) if isinstance(n, ast.Name)}
    local = {a.arg for a in fdef.args.args} | {
        t.id for n in ast.walk(fdef) if isinstance(n, ast.Assign) for t in n.targets
        if isinstance(t, ast.Name)
    }  # fmt: skip
    unknown = body_names - local - _ALLOWED_GLOBALS - set(dir(builtins))
    if unknown:
        return None  # a helper or constant of the author's module: not reproducible here
    # docstrings go: the pattern is the computation
    first = fdef.body[0] if fdef.body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
        fdef.body = fdef.body[1:] or [ast.Pass()]
    fdef.body = [*ast.parse("\n".join(_IMPORTS)).body, *fdef.body]
    ast.fix_missing_locations(fdef)
    return ast.unparse(fdef)


def pattern_of(profile) -> str | None:
    """`<op>_pattern` for a profile's reference (loaded again from its source), or None where
    it has none or the source can no longer be loaded."""
    from kernelwright.workflows.create.load import ReferenceError, load_reference

    try:
        ref = load_reference(profile.source, name=profile.name)
    except (ReferenceError, OSError, ImportError):
        return None
    return pattern_source(ref, f"{profile.name}_pattern")
