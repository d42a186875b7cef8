"""What Understand and codegen read of dtypes beyond "floating or not": an output the reference
casts to a fixed dtype, integer arithmetic the fp32 tiles cannot hold exactly, bool inputs.

The kernels compute every value on fp32 tiles and round once at the store to the output
pointer's dtype, so an output cast to float32 whatever its inputs' dtype (`logits.float()` in a
loss) only needs a float32 output buffer: the profile records it as the output's dtype "fp32".
"""

from __future__ import annotations

import torch

from kernelwright.profiles.kernel import Graph, GraphNode, KernelProfile, TensorSpec
from kernelwright.workflows.create.graph import VIEWS, _calls, _op
from kernelwright.workflows.create.lowering import _integer
from kernelwright.workflows.create.trace import output_names

# (node, reason): where Understand stops (a tier-3 profile)
Stop = tuple[str, str]


def _flat(out) -> list:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def fixed_outputs(ref, outputs: list[TensorSpec], has_tail: bool) -> Stop | None:
    """Mark the outputs whose dtype does not follow the inputs' (float32 from bf16 inputs as
    from fp32 ones) with dtype "fp32"; a stop for a fixed dtype the kernel cannot write yet.
    `ref` runs once more, on its floating inputs and parameters in bfloat16; a reference that
    fails there keeps every output in its inputs' dtype."""
    tensors = ref.example_inputs + ref.params
    half = [t.detach().to(torch.bfloat16) if t.is_floating_point() else t.clone() for t in tensors]
    try:
        with torch.no_grad():
            got = _flat(ref.call(*half))
            full = _flat(ref.call(*[t.detach().clone() for t in tensors]))
    except Exception:  # an op without a bfloat16 kernel on this device: nothing learnt
        return None
    names = output_names(len(full))
    fixed: dict[int, torch.dtype] = {}
    for k, (a, b) in enumerate(zip(got, full, strict=True)):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return None
        if a.is_floating_point() and a.dtype == b.dtype:
            fixed[k] = a.dtype
    for k, dtype in fixed.items():
        if dtype != torch.float32 or has_tail or len(full) != len(outputs):
            return names[k], (
                f"the output is cast to a fixed dtype ({dtype}, whatever the inputs' dtype)"
                + (" before a reduction over the rows' values" if has_tail else "")
                + ": not supported yet (a generated op writes float32 or its inputs' dtype); "
                "return the value uncast and cast it after the op"
            )
        outputs[k].dtype = "fp32"
    return None


def out_dtype(node: GraphNode | None, spec: TensorSpec) -> str:
    """An output's torch dtype in the generated op, as source; "None": the first floating
    input's dtype."""
    if spec.dtype == "fp32":
        return "torch.float32"
    dtype = str(node.dtype) if node is not None else ""
    return dtype if dtype in ("torch.int64", "torch.bool") else "None"


# Ops that read an integer value as a position (a gather's index, a one_hot's class), not as
# a number; and comparisons, whose bool result fp32 gets right for values near 2^24 too
_INDEXING = frozenset(["gather", "scatter", "scatter_add", "take_along_dim"])
_COMPARE = frozenset(["eq", "ne", "lt", "le", "gt", "ge", "one_hot"])
# ops that pass an integer value on unchanged
_PASS = VIEWS | {"where", "_to_copy", "convert_element_type"}
_ORDER = ("raw", "arith")


def int_arith_stop(fwd: Graph, bwd: Graph) -> Stop | None:
    """Integer arithmetic on integer inputs whose result the reference uses as a number (an
    output, or an operand of float arithmetic): on the kernel's fp32 tiles it is exact only up
    to 2^24, so (ids * 3 + 1) % 1000 on token ids would be silently wrong. Index arithmetic
    (a gather's wrapped index, a one_hot's class) and comparisons stay: their values are row
    positions, which fp32 holds."""
    for graph in (fwd, bwd):
        by = {n.name: n for n in graph.nodes}
        # 'raw': an integer input or a view of one; 'arith': computed from one
        kind = {n.name: "raw" for n in graph.nodes if n.op == "placeholder" and _integer(n.dtype)}
        for n in _calls(graph):
            op = _op(n)
            tainted = [a for a in n.args if isinstance(a, str) and a in kind]
            arith = [a for a in tainted if kind[a] == "arith"]
            used_as_index = op in _COMPARE or (op in _INDEXING and n.args[0] not in arith)
            if arith and not used_as_index and not _integer(n.dtype):
                return _stop(by[arith[0]], n)
            if tainted and _integer(n.dtype) and not used_as_index:
                base = "raw" if op in _PASS else "arith"
                kind[n.name] = max([base] + [kind[a] for a in tainted], key=_ORDER.index)
        out = next((n for n in graph.nodes if n.op == "output"), None)
        if graph is fwd and out is not None:
            for a in _flat(out.args[0] if out.args else []):
                if isinstance(a, str) and kind.get(a) == "arith":
                    return _stop(by[a], out)
    return None


def _stop(node: GraphNode, user: GraphNode) -> Stop:
    what = "an output" if user.op == "output" else f"a value of {user.name} ({user.target})"
    return f"{node.name} ({node.target})", (
        f"integer arithmetic on an integer input, used as {what}: the kernel computes on fp32 "
        "tiles, which hold integers exactly only up to 2^24 (token ids times a constant exceed "
        "it), so the result would be silently wrong; compute it in PyTorch"
    )


def bool_inputs(profile: KernelProfile) -> list[int]:
    """The inputs the reference takes as bool tensors (a mask): their forward placeholders."""
    ph = [n for n in profile.forward.nodes if n.op == "placeholder"]
    return [i for i, n in enumerate(ph) if n.dtype == "torch.bool"]
