"""Trace a reference to aten-level forward and backward graphs (AOT Autograd).

`aot_function` runs the reference once on fake fp32 tensors, builds the joint forward +
backward graph, and the min-cut rematerialization partitioner splits it: it saves for the
backward only what is costly to recompute and recomputes cheap element-wise intermediates —
the same trade a hand-written kernel makes. The decompositions lower composite ops (gelu,
softmax, layer_norm...) to primitive aten ops the code generator has lowerings for.

Node names come from FX and are deterministic for a given reference and shapes; placeholders
are renamed to the reference's argument names (`primals_1` -> `x`, `tangents_1` -> `dy`).
"""

from __future__ import annotations

import math
import operator
import re
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
from functorch.compile import aot_function, make_boxed_func, min_cut_rematerialization_partition
from torch._decomp import core_aten_decompositions, get_decompositions

from kernelwright.profiles.kernel import Graph, GraphNode
from kernelwright.workflows.create import onehot
from kernelwright.workflows.create.factored import factor_sums, factored
from kernelwright.workflows.create.load import Reference
from kernelwright.workflows.create.products import products

aten = torch.ops.aten

# Composite ops the core-aten set keeps whole but a kernel template cannot lower: decomposed
# into exp/erf/amax/sum/... (their backward decompositions are already in the core set).
_EXTRA_DECOMPS = [
    aten.gelu,
    aten.elu,
    aten.leaky_relu,
    aten.hardtanh,
    aten._softmax,
    aten._log_softmax,
    aten.native_layer_norm,
    aten.linalg_vector_norm,
]


def decompositions() -> dict:
    table = dict(core_aten_decompositions())
    table.update(get_decompositions(_EXTRA_DECOMPS))
    table[aten.linalg_vector_norm.default] = _vector_norm
    return table


_TORCH_VECTOR_NORM = get_decompositions([aten.linalg_vector_norm])[aten.linalg_vector_norm.default]


def _vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):  # noqa: A002
    """The 2-norm as sqrt(sum(x * x)), with PyTorch's gradient at a vector of zeros: 0 (its
    backward masks the zero norm). PyTorch's decomposition, pow(sum(x^2), 0.5), is differentiated
    to 0.5 * 0^-0.5 * 0 = NaN there, a NaN gradient for every row of zeros (a padding row
    normalised, a zero vector in a cosine similarity). Any other norm: that decomposition."""
    if ord != 2 or dtype is not None or not x.is_floating_point():
        return _TORCH_VECTOR_NORM(x, ord, dim, keepdim, dtype=dtype)
    dims = None if dim is None or (not isinstance(dim, int) and len(dim) == 0) else dim
    squares = torch.sum(x * x) if dims is None else torch.sum(x * x, dims, keepdim=keepdim)
    if dims is None and keepdim:
        squares = squares.reshape([1] * x.dim())
    nonzero = squares > 0
    # the inner where keeps sqrt's derivative finite where the outer one takes the 0 branch
    return torch.where(nonzero, torch.sqrt(torch.where(nonzero, squares, 1.0)), 0.0)


class TraceError(RuntimeError):
    """AOT tracing failed (data-dependent control flow, an op without a fake kernel...).

    `node`: what stops it, where known; `explained`: the message already says what to change
    (else Understand adds the likely causes)."""

    def __init__(self, message: str, node: str | None = None, explained: bool = False):
        super().__init__(message)
        self.node, self.explained = node, explained


@dataclass
class Traced:
    forward: Graph
    backward: Graph  # empty when no output needs a gradient
    output_names: list[str]  # the real outputs: y, or y0, y1...
    output_shapes: list[list[int]]
    # forward graph outputs beyond the real outputs: what the backward reads (renamed)
    saved: list[str] = field(default_factory=list)
    # backward nodes that recompute a forward node (same name in the joint graph)
    recomputed: list[str] = field(default_factory=list)
    # gradient node (renamed) per differentiable input name, in input order
    grad_outputs: dict[str, str] = field(default_factory=dict)


def target_name(target: Any) -> str:
    """'aten.mul.Tensor' for an OpOverload, 'getitem' for operator.getitem."""
    if target is operator.getitem:
        return "getitem"
    if isinstance(target, torch._ops.OpOverload):
        return f"aten.{target._schema.name.split('::')[-1]}.{target._overloadname}"
    return getattr(target, "__name__", str(target))


def short_name(target: str) -> str:
    """'mul' for 'aten.mul.Tensor'."""
    return target.split(".")[1] if target.startswith("aten.") else target


def _const(value: Any, rename: dict[str, str]) -> Any:
    """An FX argument as YAML-safe data: node names, numbers, strings, lists."""
    if isinstance(value, torch.fx.Node):
        return rename.get(value.name, value.name)
    if isinstance(value, (list, tuple)):
        return [_const(v, rename) for v in value]
    if isinstance(value, dict):
        return {str(k): _const(v, rename) for k, v in value.items()}
    if isinstance(value, float) and not math.isfinite(value):
        # pydantic's JSON dump turns inf/nan into null: keep them as the strings "inf", "-inf",
        # "nan" (float("inf") reads them back; no node is named so)
        return str(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    # dtypes, devices, layouts, memory formats: their repr ("torch.float32")
    return str(value)


def _meta(node: torch.fx.Node) -> tuple[list[int] | None, str | None]:
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        return [int(s) for s in val.shape], str(val.dtype)
    return None, None


def to_graph(
    gm: torch.fx.GraphModule, rename: dict[str, str], detached: frozenset[str] = frozenset()
) -> Graph:
    """`gm` as a profile graph; the nodes named in `detached` keep the target aten.detach."""
    nodes, readable = [], []
    for node in gm.graph.nodes:
        name = rename.get(node.name, node.name)
        shape, dtype = _meta(node)
        if node.op == "placeholder":
            nodes.append(
                GraphNode(name=name, op="placeholder", target=name, shape=shape, dtype=dtype)
            )
            readable.append(f"{name}: input {shape}")
            continue
        args = _const(list(node.args), rename)
        kwargs = _const(dict(node.kwargs), rename)
        if node.op == "output":
            # FX wraps the returned values in a 1-tuple
            outs = args[0] if len(args) == 1 and isinstance(args[0], list) else args
            nodes.append(GraphNode(name="output", op="output", target="output", args=outs))
            readable.append(f"return {', '.join(str(o) for o in outs)}")
            continue
        if node.op == "get_attr":
            raise TraceError(
                f"a tensor constant inside the reference ({node.name}: a torch.tensor(...) "
                "built in it, or an indexed assignment such as y[:, 0] = 0): a kernel's tensors "
                "are its arguments; build the tensor in get_inputs() and pass it in, or write "
                "the assignment as torch.where",
                node=node.name,
                explained=True,
            )
        if node.op != "call_function":
            raise TraceError(f"unexpected FX node {node.format_node()} (op {node.op})")
        target = "aten.detach.default" if node.name in detached else target_name(node.target)
        nodes.append(
            GraphNode(
                name=name, op="call_function", target=target, args=args, kwargs=kwargs,
                shape=shape, dtype=dtype,
            )
        )  # fmt: skip
        shown = [str(a) for a in args] + [f"{k}={v}" for k, v in kwargs.items()]
        readable.append(f"{name} = {short_name(target)}({', '.join(shown)})  # {shape}")
    return Graph(nodes=nodes, readable=readable)


def _detaches(fw: torch.fx.GraphModule, outputs: list) -> frozenset[str]:
    """The reference's own detaches (stop-gradients) in the forward graph: the decompositions
    trace detach as an alias, which the generated eager reference would differentiate through.
    Autograd's own detaches (of what the backward saves) feed no real output."""
    seen: set[torch.fx.Node] = set()
    todo = [n for n in outputs if isinstance(n, torch.fx.Node)]
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo += node.all_input_nodes
    return frozenset(
        n.name
        for n in seen
        if n.target is aten.alias.default
        and str(n.meta.get("original_aten")) == "aten.detach.default"
    )


def _tangents(bw: torch.fx.GraphModule, flat: list) -> list[tuple[torch.fx.Node, int]]:
    """The backward's tangents with the output each is the gradient of, in order, and a new
    (unused) tangent for each output without a gradient before the last one with it: AOT
    Autograd gives tangents to the outputs that need a gradient only, and the generated code
    reads the k-th tangent as output k's gradient (an index or a detached output first would
    shift them all)."""
    tangents = [
        n for n in bw.graph.nodes if n.op == "placeholder" and n.name.startswith("tangents_")
    ]
    wants = [k for k, o in enumerate(flat) if o.requires_grad]
    if len(wants) != len(tangents):  # AOT Autograd returns an input written in place too
        raise TraceError(
            f"{len(tangents)} output gradients for {len(wants)} outputs with one: the reference "
            "writes an input or a parameter in place (an in-place op, or through .data); a "
            "kernel leaves its inputs as they are, so compute a new tensor instead",
            node="output",
            explained=True,
        )
    own = dict(zip(wants, tangents, strict=True))
    for k in reversed(range(wants[-1] if wants else 0)):
        if k not in own:
            with bw.graph.inserting_before(own[min(w for w in own if w > k)]):
                own[k] = bw.graph.placeholder(f"tangents_none_{k}")
            own[k].meta["val"] = torch.empty(flat[k].shape, device="meta")
    return [(own[k], k) for k in sorted(own)]


def _own(out: Any, inputs: tuple, before: list) -> Any:
    """`out`, copied when it aliases an input or an earlier output (see trace's `call`)."""
    if isinstance(out, torch.Tensor) and any(
        isinstance(t, torch.Tensor) and torch._C._is_alias_of(out, t) for t in (*inputs, *before)
    ):
        return out.clone()
    return out


def output_names(count: int) -> list[str]:
    return ["y"] if count == 1 else [f"y{i}" for i in range(count)]


def _apart(gm: torch.fx.GraphModule, rename: dict[str, str], names: list[str]) -> None:
    """Rename the traced nodes that carry an input's name (an input called `exp` beside an exp
    node), so that every name in the graph stands for one value."""
    used = set(names) | set(rename.values()) | {n.name for n in gm.graph.nodes}
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.name not in rename and node.name in names:
            new = f"{node.name}_op"
            while new in used:
                new += "_"
            rename[node.name] = new
            used.add(new)


def _drop_identity_layouts(gm: torch.fx.GraphModule) -> None:
    """A permute to the same order (`x.permute(0, 1)`) or a transpose of a dim with itself
    changes no layout: its users read its input instead."""
    changed = False
    for node in list(gm.graph.nodes):
        if (
            node.op != "call_function"
            or not node.args
            or not isinstance(node.args[0], torch.fx.Node)
        ):
            continue
        val = node.args[0].meta.get("val")
        rank = val.dim() if isinstance(val, torch.Tensor) else None
        if not rank:
            continue
        if node.target is aten.permute.default:
            same = [d % rank for d in node.args[1]] == list(range(rank))
        elif node.target is aten.transpose.int:
            same = node.args[1] % rank == node.args[2] % rank
        else:
            continue
        if same:
            node.replace_all_uses_with(node.args[0])
            gm.graph.erase_node(node)
            changed = True
    if changed:
        gm.recompile()


def _known_failure(e: Exception, text: str) -> tuple[str, str] | None:
    """(node, reason) for a tracing failure whose cause the error names, else None (Understand
    then lists the likely causes)."""
    missing = re.search(r"derivative for (aten::\w+) is not implemented", text)
    if missing:
        op = missing.group(1).replace("::", ".")
        return op, (
            f"PyTorch has no derivative for {missing.group(1)}, so the reference's backward "
            "fails (in eager PyTorch too) and cannot be traced: .detach() its operand where "
            "no gradient should flow through it"
        )
    name = type(e).__name__
    if name == "DataDependentOutputException" or "_local_scalar_dense" in text:
        return "aten._local_scalar_dense.default", (
            "the reference reads a tensor's value into Python (.item(), float(t), int(t), "
            ".tolist(), or an if or a loop on a tensor): the traced graphs hold no values, so "
            "no kernel can be generated from it; compute with tensor ops instead (torch.where "
            "for a branch)"
        )
    if name == "DynamicOutputShapeException":
        op = text.splitlines()[0].strip() if text else "trace"
        return op, (
            f"{op}'s output shape depends on the input's values (boolean-mask indexing, "
            "nonzero, unique): a kernel's shapes are fixed before it runs; keep the shape "
            "(torch.where(mask, x, 0), masked_fill) instead"
        )
    if ".numpy()" in text:
        return "numpy", (
            "the reference computes outside PyTorch (.numpy(), NumPy on a tensor's values): the "
            "traced graphs see only torch ops; write it with torch ops"
        )
    return None


def trace(ref: Reference) -> Traced:
    """Forward and backward graphs of `ref` on its fp32 example inputs."""
    tensors = [t.clone() for t in ref.example_inputs] + [p.clone() for p in ref.params]
    names = ref.input_names + ref.param_names
    for t in tensors:
        t.requires_grad_(t.is_floating_point())

    captured: dict[str, torch.fx.GraphModule] = {}

    def capture(kind: str):
        def compiler(gm: torch.fx.GraphModule, example_inputs):
            captured[kind] = gm
            return make_boxed_func(gm.forward)

        return compiler

    def call(*args: torch.Tensor) -> Any:
        # An output that is an input, a view of one or another output again leaves the graph
        # without its gradient (AOT Autograd rebuilds aliases outside it): a copy is a value of
        # its own, with a gradient like any other output.
        out = ref.call(*args)
        if not isinstance(out, (tuple, list)):
            return _own(out, args, [])
        outs: list[Any] = []
        for o in out:
            outs.append(_own(o, args, outs))
        return tuple(outs)

    compiled = aot_function(
        call,
        fw_compiler=capture("fw"),
        bw_compiler=capture("bw"),
        partition_fn=min_cut_rematerialization_partition,
        decompositions=decompositions(),
    )
    try:
        # cumprod/prod with backward formulas the row templates lower; cosine_similarity with
        # its norms outside the sum (one walk of a long row). PyTorch's warnings while tracing
        # (anomaly mode's report of a failing backward, a scalar read) say nothing the stop
        # does not: the eager run before it shows the reference's own.
        with products(), factored(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = compiled(*tensors)
            flat = list(out) if isinstance(out, (tuple, list)) else [out]
            diff = [o for o in flat if isinstance(o, torch.Tensor) and o.requires_grad]
            if diff:
                torch.autograd.backward(diff, [torch.ones_like(o) for o in diff])
    except Exception as e:
        text = str(e).strip()
        held = [k for k, _ in ref.module.named_buffers()] if ref.module is not None else []
        outside = "FakeTensor" in text and ("non_fake" in text or "convert all Tensors" in text)
        if outside or (held and "_tensor_constant" in text):  # a buffer read, or written
            raise TraceError(
                "the reference uses a tensor that is not one of its arguments"
                + (f" (the module's buffers: {', '.join(held)})" if held else " (a global)")
                + ": a kernel's tensors are its arguments; pass it in through get_inputs()"
                + (" or make it an nn.Parameter(..., requires_grad=False)" if held else ""),
                node=f"buffer {held[0]}" if held else "global tensor",
                explained=True,
            ) from e
        known = _known_failure(e, text)
        if known is not None:
            raise TraceError(known[1], node=known[0], explained=True) from e
        first = text.splitlines()[0] if text else ""
        raise TraceError(f"{type(e).__name__}: {first}") from e
    if not flat or not all(isinstance(o, torch.Tensor) for o in flat):
        kinds = ", ".join(type(o).__name__ for o in flat)
        kinds = f"({kinds})" if isinstance(out, (tuple, list)) else kinds
        raise TraceError(
            f"the reference returns {kinds or 'nothing'}: return a tensor or a flat tuple of "
            "tensors",
            node="output",
            explained=True,
        )

    outs = output_names(len(flat))
    for gm in captured.values():
        _drop_identity_layouts(gm)
    # one_hot's comparison with an arange (and its range check) as one node the rows lower
    folded = {name for gm in captured.values() for name in onehot.fold(gm)}
    fw = captured["fw"]
    factor_sums(fw)  # row constants out of sums over the row (one walk of a long row)
    fw_rename = {f"primals_{i + 1}": n for i, n in enumerate(names)}
    fw_out = list(fw.graph.output_node().args[0])
    for node, name in zip(fw_out[: len(flat)], outs, strict=True):
        # the real outputs take the names y / y0, y1 unless they are an input passed through
        if isinstance(node, torch.fx.Node) and node.op == "call_function":
            fw_rename.setdefault(node.name, name)
    taken = set(names) | set(fw_rename.values())
    taken |= {n.name for gm in captured.values() for n in gm.graph.nodes}
    for old, new in onehot.names(folded, taken).items():
        fw_rename.setdefault(old, new)  # the backward's renames start from these
    _apart(fw, fw_rename, names)
    saved_nodes = [n for n in fw_out[len(flat) :] if isinstance(n, torch.fx.Node)]
    saved = [fw_rename.get(n.name, n.name) for n in saved_nodes]
    detached = _detaches(fw, fw_out[: len(flat)])
    forward = to_graph(fw, fw_rename, detached)

    backward, recomputed, grads = Graph(), [], {}
    if "bw" in captured:
        bw = captured["bw"]
        fw_call = {n.name for n in fw.graph.nodes if n.op == "call_function"}
        bw_rename = dict(fw_rename)
        for node, k in _tangents(bw, flat):
            bw_rename[node.name] = f"d{outs[k]}"
        bw_out = list(bw.graph.output_node().args[0])
        for node, name in zip(bw_out, names, strict=False):
            if isinstance(node, torch.fx.Node) and node.op == "call_function":
                bw_rename.setdefault(node.name, f"d{name}")
        _apart(bw, bw_rename, names)
        for node, name in zip(bw_out, names, strict=False):
            if isinstance(node, torch.fx.Node):
                grads[name] = bw_rename.get(node.name, node.name)
        recomputed = [
            bw_rename.get(n.name, n.name)
            for n in bw.graph.nodes
            if n.op == "call_function" and n.name in fw_call
        ]
        backward = to_graph(bw, bw_rename, detached)
    return Traced(
        forward=forward,
        backward=backward,
        output_names=outs,
        output_shapes=[list(o.shape) for o in flat],
        saved=saved,
        recomputed=recomputed,
        grad_outputs=grads,
    )
