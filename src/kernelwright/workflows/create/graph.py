"""What understand reads a traced aten graph with: the op sets it classifies nodes by, a node's
short op name, the graph's calls, and a node as one readable formula (the profile's gradient and
tail lines)."""

from __future__ import annotations

from kernelwright.profiles.kernel import Graph, GraphNode
from kernelwright.workflows.create.trace import short_name

# Views that keep the [rows, cols] layout: broadcasts and unit-dim reshapes.
# fmt: off
VIEWS = frozenset([
    "view", "_unsafe_view", "reshape", "expand", "unsqueeze", "squeeze", "alias", "clone",
    "detach"
])
# fmt: on
# Reductions: the dims are args[1] (absent or [] = every dim).
# fmt: off
REDUCTIONS = frozenset([
    "sum", "mean", "amax", "amin", "prod", "var", "var_mean", "max", "min", "argmax", "argmin",
    "gather",  # one value per row picked by a target index (args[1]: the dim)
    "cumsum", "cumprod",  # scans along the row (args[1]: the dim)
])
# fmt: on
# The inverse of gather (its backward): a row written at a per-row index, a select per element;
# one_hot (onehot.py): the mask of a per-row index's column; flip: a reversed scan's halves.
ROW_INDEXED = frozenset(["scatter", "scatter_add", "flip", "one_hot"])
# Layout changes: a different memory walk per element, not lowered by the row templates.
LAYOUT = frozenset(["permute", "transpose", "t"])
# Precision-sensitive: computed in fp32 whatever the input dtype (transcendentals lose digits
# in bf16; reductions accumulate error with the row length).
# fmt: off
TRANSCENDENTAL = frozenset([
    "exp", "exp2", "log", "log2", "log10", "log1p", "expm1", "tanh", "sigmoid", "erf", "erfc",
    "rsqrt", "sqrt", "pow", "reciprocal", "sin", "cos", "tan", "sinh", "cosh", "asinh", "acosh",
    "atanh", "gelu", "silu", "elu"
])
# fmt: on


def _op(node: GraphNode) -> str:
    return short_name(node.target)


def _calls(graph: Graph) -> list[GraphNode]:
    return [n for n in graph.nodes if n.op == "call_function"]


# a node as one expression: infix arithmetic and comparisons, views and casts see-through
_INFIX = {"add": "+", "sub": "-", "mul": "*", "div": "/", "pow": "**"}
_CMP = {"gt": ">", "ge": ">=", "lt": "<", "le": "<=", "eq": "==", "ne": "!="}
_TRANSPARENT = VIEWS | {"_to_copy", "convert_element_type"}
_MAX_INLINE = 120  # longer sub-expressions stay as node names (see the graph's readable lines)


def formula(graph: Graph, name: str) -> str:
    """`name` as one expression over the graph's inputs, inlining what stays short."""
    by_name = {n.name: n for n in graph.nodes if n.op == "call_function"}
    memo: dict[str, str] = {}

    def arg(a) -> str:
        if isinstance(a, str) and a in by_name:
            text = expr(a)
            return text if len(text) <= _MAX_INLINE else a
        if isinstance(a, list):
            return "[" + ", ".join(arg(x) for x in a) + "]"
        return str(a)

    def expr(n: str) -> str:
        if n in memo:
            return memo[n]
        node = by_name[n]
        op, args = _op(node), node.args
        if op in _TRANSPARENT:
            text = arg(args[0])
        elif op in _INFIX and len(args) == 2:
            text = f"({arg(args[0])} {_INFIX[op]} {arg(args[1])})"
        elif op in _CMP and len(args) == 2:
            text = f"({arg(args[0])} {_CMP[op]} {arg(args[1])})"
        elif op == "neg":
            text = f"-{arg(args[0])}"
        elif op == "scalar_tensor":
            text = str(args[0])
        else:
            shown = [arg(a) for a in args] + [f"{k}={v}" for k, v in node.kwargs.items()]
            text = f"{op}({', '.join(shown)})"
        memo[n] = text
        return text

    if name not in by_name:
        return name
    text = expr(name)
    return text[1:-1] if text.startswith("(") and text.endswith(")") and _balanced(text) else text


def _balanced(text: str) -> bool:
    """True when the outer parentheses of `text` enclose all of it."""
    depth = 0
    for i, c in enumerate(text):
        depth += (c == "(") - (c == ")")
        if depth == 0 and i < len(text) - 1:
            return False
    return True
