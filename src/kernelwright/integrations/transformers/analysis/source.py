"""Source access for the analyser: the AST of a class's methods and globals, and Evidence lines.

Every source fact the analyser records points at a real line: `Evidence(source="<file>:<line>",
detail=<the stripped line>)`, the file written relative to the installed transformers (or torch)
package ("transformers/models/llama/modeling_llama.py") and as given for files elsewhere.
"""

from __future__ import annotations

import ast
import functools
import inspect
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kernelwright.profiles.model import Evidence

# methods that return a view or a reshaped alias of a tensor: the gradient of their output
# flows back unchanged in value, so a norm whose output only passes through them and then into
# a computing call is as safe as one feeding that call directly
VIEW_METHODS = frozenset(
    {"view", "reshape", "transpose", "permute", "contiguous", "unsqueeze", "squeeze", "flatten"}
)


def _package_roots() -> list[Path]:
    roots = []
    for name in ("transformers", "torch", "kernelwright"):
        mod = sys.modules.get(name)
        if mod is not None and getattr(mod, "__file__", None):
            roots.append(Path(mod.__file__).resolve().parent.parent)
    return roots


@functools.cache
def display_path(path: str) -> str:
    """A file path as evidence shows it: relative to site-packages for installed packages."""
    p = Path(path).resolve()
    for root in _package_roots():
        try:
            return p.relative_to(root).as_posix()
        except ValueError:
            continue
    return str(path)


@dataclass(frozen=True)
class ParsedFile:
    path: str
    tree: ast.Module
    lines: tuple[str, ...]
    parents: dict[int, ast.AST]  # id(node) -> parent node

    def line(self, lineno: int) -> str:
        return self.lines[lineno - 1].strip() if 0 < lineno <= len(self.lines) else ""

    def parent(self, node: ast.AST) -> ast.AST | None:
        return self.parents.get(id(node))


@functools.cache
def parse_file(path: str) -> ParsedFile:
    text = Path(path).read_text()
    tree = ast.parse(text, filename=path)
    parents: dict[int, ast.AST] = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[id(child)] = node
    return ParsedFile(path, tree, tuple(text.splitlines()), parents)


def evidence(pf: ParsedFile, node: ast.AST | int) -> Evidence:
    lineno = node if isinstance(node, int) else node.lineno
    return Evidence(source=f"{display_path(pf.path)}:{lineno}", detail=pf.line(lineno))


def unique(evidence: list[Evidence]) -> list[Evidence]:
    """Evidence without repeats, source lines of one file in line order after the rest."""
    seen, out = set(), []
    for e in evidence:
        if (e.source, e.detail) not in seen:
            seen.add((e.source, e.detail))
            out.append(e)
    return out


def config_evidence(key: str, value) -> Evidence:
    return Evidence(source=f"config:{key}", detail=value if isinstance(value, str) else repr(value))


def check_evidence(detail: str) -> Evidence:
    return Evidence(source="check", detail=detail)


# ----------------------------------------------------------------------------- classes


@dataclass(frozen=True)
class Method:
    """A function definition in its parsed file: a class method or a module-level function."""

    node: ast.FunctionDef
    file: ParsedFile
    owner: type | None  # the class that defines it (None for module functions)

    @property
    def params(self) -> list[str]:
        a = self.node.args
        return [p.arg for p in a.posonlyargs + a.args]

    def ev(self, node: ast.AST | int | None = None) -> Evidence:
        return evidence(self.file, self.node if node is None else node)


def source_file(obj) -> str | None:
    try:
        return inspect.getsourcefile(obj)
    except TypeError:
        return None


@functools.cache
def class_node(cls: type) -> tuple[ast.ClassDef, ParsedFile] | None:
    """The ClassDef of `cls` in its source file (None for builtins and dynamic classes).

    Cached per class: a class's source does not change once it is defined, and `inspect`
    re-reads the whole modeling file for every lookup."""
    path = source_file(cls)
    if path is None or not Path(path).exists():
        return None
    pf = parse_file(path)
    try:
        _, start = inspect.getsourcelines(cls)
    except (OSError, TypeError):
        start = None
    found = None
    for node in ast.walk(pf.tree):
        if isinstance(node, ast.ClassDef) and node.name == cls.__name__:
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            if start is None or first == start or node.lineno == start:
                return node, pf
            found = found or node
    return (found, pf) if found is not None else None


def method(cls: type, name: str) -> Method | None:
    """`name` as defined on `cls` or the first class of its MRO that defines it."""
    for klass in cls.__mro__:
        if name not in vars(klass):
            continue
        found = class_node(klass)
        if found is None:
            return None
        cnode, pf = found
        for item in cnode.body:
            if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and item.name == name:
                return Method(item, pf, klass)
        return None
    return None


def function(fn) -> Method | None:
    """The definition of a module-level function (through decorator wrappers)."""
    fn = inspect.unwrap(fn)
    path = source_file(fn)
    if path is None or not Path(path).exists():
        return None
    pf = parse_file(path)
    lineno = fn.__code__.co_firstlineno
    for node in pf.tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == fn.__name__:
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            if lineno in (first, node.lineno):
                return Method(node, pf, None)
    for node in ast.walk(pf.tree):
        if isinstance(node, ast.FunctionDef) and node.name == fn.__name__:
            return Method(node, pf, None)
    return None


def module_globals(cls_or_fn) -> dict:
    mod = sys.modules.get(getattr(cls_or_fn, "__module__", ""), None)
    return vars(mod) if mod is not None else {}


def init_assignments(cls: type) -> dict[str, tuple[ast.expr, Method]]:
    """`self.X = <expr>` in __init__ across the MRO (subclass first): X -> (expr, method)."""
    out: dict[str, tuple[ast.expr, Method]] = {}
    for klass in reversed(cls.__mro__):
        if "__init__" not in vars(klass):
            continue
        m = method(klass, "__init__")
        if m is None:
            continue
        for node in ast.walk(m.node):
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    name = self_attr(t)
                    if name:
                        out[name] = (node.value, m)
    return out


def is_linear(module) -> bool:
    """nn.Linear, or an adapter layer around one (PEFT LoRA keeps it as `base_layer`)."""
    from torch import nn

    return isinstance(module, nn.Linear) or isinstance(
        getattr(module, "base_layer", None), nn.Linear
    )


# ----------------------------------------------------------------------------- AST helpers


def self_attr(node: ast.AST, self_name: str = "self") -> str | None:
    """'X' for `self.X`, else None."""
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == self_name
    ):
        return node.attr
    return None


def dotted(node: ast.AST) -> str | None:
    """'torch.nn.functional.silu' for an attribute chain of names, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def config_key(node: ast.AST, init: dict[str, tuple[ast.expr, Method]] | None = None):
    """The config key an expression reads: `self.config.K`, `config.K`, or `self.X` set from one."""
    d = dotted(node)
    if d is None:
        return None
    for prefix in ("self.config.", "config."):
        if d.startswith(prefix) and "." not in d[len(prefix) :]:
            return d[len(prefix) :]
    attr = self_attr(node)
    if attr and init and attr in init:
        return config_key(init[attr][0])
    return None


def const_number(node: ast.AST) -> float | None:
    value = getattr(node, "value", None) if isinstance(node, ast.Constant) else None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        v = const_number(node.operand)
        return -v if v is not None else None
    return None


def calls(node: ast.AST) -> Iterator[ast.Call]:
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            yield n


def self_calls(fn: ast.FunctionDef) -> Iterator[tuple[str, ast.Call]]:
    """(attribute, call) for every `self.X(...)` in a function, in source order."""
    found = [(self_attr(c.func), c) for c in calls(fn)]
    found = [(a, c) for a, c in found if a]
    yield from sorted(found, key=lambda ac: (ac[1].lineno, ac[1].col_offset))


def statements(body: list[ast.stmt], block: tuple = ()) -> Iterator[tuple[ast.stmt, tuple]]:
    """Every statement in source order with the block path that holds it (for dataflow)."""
    for i, stmt in enumerate(body):
        yield stmt, block
        for field in ("body", "orelse", "finalbody"):
            sub = getattr(stmt, field, None)
            if isinstance(sub, list) and sub and isinstance(sub[0], ast.stmt):
                yield from statements(sub, (*block, (i, field)))
        for h in getattr(stmt, "handlers", []) or []:
            yield from statements(h.body, (*block, (i, "handler")))


def in_loop(fn: ast.FunctionDef, node: ast.AST, pf: ParsedFile) -> bool:
    p = pf.parent(node)
    while p is not None and p is not fn:
        if isinstance(p, ast.For | ast.While | ast.AsyncFor | ast.comprehension):
            return True
        p = pf.parent(p)
    return False


def enclosing_statement(node: ast.AST, pf: ParsedFile) -> ast.stmt | None:
    p: ast.AST | None = node
    while p is not None and not isinstance(p, ast.stmt):
        p = pf.parent(p)
    return p


def decorator_evidence(nodes: list[ast.expr], pf: ParsedFile) -> list[Evidence]:
    return [evidence(pf, d) for d in nodes]
