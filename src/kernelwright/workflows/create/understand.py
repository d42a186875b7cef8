"""Understand: a PyTorch reference → a `KernelProfile` a person reviews before any code exists.

Tiers, decided from the traced aten graphs (forward and backward):
- 1: element-wise only — any number of inputs, broadcast full / per-row / per-feature / scalar;
- 2: element-wise plus work along ONE set of adjacent dims of the main input (the row: the
  last dim, another dim, trailing dims or every dim, `reduction_dims`) — reductions (sum,
  mean, amax/amin, prod, var, max/min with indices, argmax/argmin), a gather/scatter of one
  value per row by an index input (or its one-hot mask), cumsum and cumprod, reversed through
  flips (cumprod's backward as products.py writes it) — and per-feature (or scalar)
  parameters whose gradients reduce over all rows (rms_norm's dW, accumulated per program), or
  per-row inputs whose gradients are row sums. A reduction over the rows' values after that
  (cross-entropy's mean, or the rest of a reduction over the row's dims and more: KL's
  batchmean) becomes the profile's tail, run in PyTorch after the kernel (tail.py);
- 3: anything else: matmul/conv, sort/topk, reductions over two sets of dims neither holding
  the other, layout changes (permute), data-dependent control flow (tracing fails), a node the
  generator's lowering refuses (a flipped row combined with an unflipped one). The profile names
  the node that stops it and why; no code is generated.

The closest library kernel (the pattern the generator follows) is picked by a fixed rule:
tier 2 — an integer input → cross_entropy; exp and log → log_softmax; exp → softmax; a mean
subtracted before a square root (var_mean, or two sums) → layer_norm; otherwise rms_norm (one
row statistic, per-feature weight grads). Tier 1 — two or more full-size float inputs: tanh or
erf → geglu, else swiglu; one input → relu_squared.

Saved vs recomputed (`profile.stored`): by a policy, in stored.py.
"""

from __future__ import annotations

import re

from kernelwright.bench.models import DEFAULT_TOKENS, REFERENCE, distinct, token_counts
from kernelwright.profiles.kernel import (
    Graph,
    GraphNode,
    KernelProfile,
    LaunchPlan,
    TensorSpec,
)
from kernelwright.workflows.create import dtypes, params, parts, tail
from kernelwright.workflows.create.graph import (
    LAYOUT,
    REDUCTIONS,
    ROW_INDEXED,
    TRANSCENDENTAL,
    VIEWS,
    _calls,
    _op,
    formula,
)
from kernelwright.workflows.create.load import (
    Reference,
    load_reference,
    rank_bound,
    run_eagerly,
)
from kernelwright.workflows.create.lowering import (
    ELEMENTWISE,
    NOT_LOWERED,
    UnsupportedNode,
    _integer,
)
from kernelwright.workflows.create.trace import Traced, TraceError, trace

# Candidate launch configs, default first and smallest last (Verify's repairs walk down it).
# Tier 1 starts from relu_squared's table (an element-wise [ROWS, BLOCK_N] tile); tier 2 from
# rms_norm's (ROWS whole rows per program, BLOCK_N = next_power_of_2(cols)).
_TIER1_CONFIGS = [
    {"block_n": 1024, "rows": 2, "num_warps": 4},
    {"block_n": 512, "rows": 1, "num_warps": 4},
    {"block_n": 256, "rows": 1, "num_warps": 2},
]
_TIER2_CONFIGS = [
    {"rows": 16, "num_warps": 4},
    {"rows": 4, "num_warps": 4},
    {"rows": 2, "num_warps": 4},
    {"rows": 1, "num_warps": 4},
]


class _Stop(Exception):
    """Internal: a node that makes the reference tier 3 (caught in `understand`)."""

    def __init__(self, node: str, reason: str):
        super().__init__(f"{node}: {reason}")
        self.node, self.reason = node, reason


def camel_case(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in name.split("_") if part)


def _label(node: GraphNode) -> str:
    return f"{node.name} ({node.target})"


# --------------------------------------------------------------------------- classification


def _reduced_dims(node: GraphNode, shapes: dict[str, list[int]]) -> list[int]:
    """The dims a reduction node reduces, non-negative, relative to its input's rank."""
    src = node.args[0]
    rank = len(shapes.get(src) or [])
    dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    if dims is None or dims == []:
        return list(range(rank))
    dims = [dims] if isinstance(dims, int) else dims
    return sorted({d % rank for d in dims}) if rank else []


def _check_ops(fwd: Graph, bwd: Graph) -> None:
    """Stop at the first node without a lowering; layout changes only if nothing else stops."""
    layout = None
    for graph, where in ((fwd, "forward"), (bwd, "backward")):
        for node in _calls(graph):
            op = _op(node)
            if op in ELEMENTWISE or op in VIEWS or op in REDUCTIONS or op in ROW_INDEXED:
                continue
            if op == "getitem":
                continue
            if op in LAYOUT:
                layout = layout or (node, where)
                continue
            if op in ("remainder", "fmod") and _integer(node.dtype):
                continue  # integer operands: exact on the fp32 tiles (lowering.py)
            if f"aten.{op}" in NOT_LOWERED:
                raise _Stop(_label(node), f"{where} op {op}: {NOT_LOWERED[f'aten.{op}']}")
            raise _Stop(_label(node), f"{where} op {op}: {_why_not(op)}")
    if layout:
        node, where = layout
        raise _Stop(
            _label(node),
            f"{where} layout change {_op(node)}: the row templates walk one layout only",
        )


# ops with a more useful reason than "no template lowers it": what to do instead
_PARTS = frozenset(["slice", "split", "split_with_sizes", "chunk", "narrow", "select", "unbind"])
_BUILT = frozenset(["arange", "iota", "triu", "tril", "empty", "zeros", "ones", "eye", "linspace"])
_JOINS = frozenset(["cat", "stack", "constant_pad_nd", "pad"])


def _why_not(op: str) -> str:
    if op in _PARTS:
        return (
            "takes part of a computed tensor or a parameter (a slice, split or chunk): a kernel "
            "reads inputs in equal parts of their last dim (x.chunk(2, -1) of an argument), "
            "not parts of intermediates; pass the parts as separate inputs"
        )
    if op in _BUILT:
        return (
            "builds a tensor inside the forward (a range, a triangular mask): pass it as an "
            "input (the mask, or the positions)"
        )
    if op in _JOINS:
        return "joins or pads tensors: a generated kernel writes each output from whole inputs"
    return (
        "no template lowers it: not element-wise, a view or a reduction over one set of dims "
        "(matmul, conv and sort are tier 3)"
    )


def _check_float_source(inputs: list[TensorSpec], fwd: Graph, outputs: list[str]) -> None:
    """A floating output needs a floating input: the kernel's outputs take its dtype."""
    if any(s.dtype != "int" for s in inputs):
        return
    dtypes = {n.name: str(n.dtype) for n in fwd.nodes}
    for out in outputs:
        if "float" in dtypes.get(out, ""):
            reason = "a floating output from integer or bool inputs only: the kernel writes floats"
            raise _Stop(out, f"{reason} in a floating input's dtype; pass one, or return integers")


def _check_input_dependent(fwd: Graph, outputs: list[str]) -> None:
    """An output computed from constants alone (torch.zeros(4, 8) + 1) has the traced shape
    whatever the inputs' shapes, where the kernel's outputs take the inputs' shapes."""
    nodes = {n.name: n for n in fwd.nodes}

    def names(a) -> list[str]:
        if isinstance(a, (list, tuple)):
            return [m for b in a for m in names(b)]
        return [a] if isinstance(a, str) and a in nodes else []

    reads: dict[str, bool] = {}
    for n in fwd.nodes:  # in order: every argument's node comes first
        reads[n.name] = n.op == "placeholder" or any(
            reads.get(m, False) for m in names([n.args, list(n.kwargs.values())])
        )
    for out in outputs:
        if out in reads and not reads[out]:
            raise _Stop(out, f"{out} reads no input: it is built from constants alone (such as "
                        "torch.zeros(4, 8)), so its shape is fixed; build it from an input "
                        "(torch.zeros_like(x)) or return it outside the op")  # fmt: skip


def _reduction_dims(fwd: Graph, main_rank: int) -> list[int]:
    """The dims every forward reduction reduces (negative, ascending), [] without any.

    One dim anywhere, or a run of adjacent dims (a norm over [C, H, W], a loss over every dim):
    the kernel sees the main input as [rows, cols] with the reduced dims as the row.
    """
    shapes = {n.name: n.shape for n in fwd.nodes}
    found: set[tuple[int, ...]] = set()
    for node in _calls(fwd):
        if _op(node) not in REDUCTIONS:
            continue
        rank = len(shapes.get(node.args[0]) or [])
        dims = _reduced_dims(node, shapes)
        if 0 < rank < main_rank:
            raise _Stop(
                _label(node),
                f"forward reduction of a rank-{rank} value of the rank-{main_rank} input: a "
                "second reduction over rows (tier 2 reduces one set of dims)",
            )
        if rank < 1 or not dims:
            raise _Stop(_label(node), f"forward reduction of a rank-{rank} tensor: nothing to tile")
        if dims != list(range(dims[0], dims[-1] + 1)):
            raise _Stop(
                _label(node),
                f"forward reduction over dims {dims} of a rank-{rank} tensor: the reduced dims "
                "must be adjacent (one run of dims)",
            )
        key = tuple(d - rank for d in dims)  # negative: counts from the last dim
        if found and key not in found:
            (first,) = found
            nested = set(first) <= set(key) or set(key) <= set(first)
            raise _Stop(
                _label(node),
                f"forward reductions over two sets of dims, {list(first)} and {list(key)}"
                + (
                    " (one holds the other, not as a row and then its rows' values)"
                    if nested
                    else ", neither holding the other"
                )  # fmt: skip
                + ": a generated kernel maps one set to the row and each program owns whole "
                "rows, so a reduction over the other set crosses programs; that needs the graph "
                "split into kernels chained through full-size intermediates (their backwards "
                "chained in reverse), which the generator does not make",
            )
        found.add(key)
    dims = list(found.pop()) if found else []
    if dims and -dims[0] > main_rank:
        raise _Stop("reduction", f"reduction over dims {dims}, which the main input lacks")
    return dims


def _check_bwd_reductions(bwd: Graph, block: list[int]) -> None:
    """Backward reductions: the row's dims, one dim, or all rows down to a per-feature or
    scalar gradient."""
    shapes = {n.name: n.shape for n in bwd.nodes}
    for node in _calls(bwd):
        if _op(node) not in REDUCTIONS:
            continue
        rank = len(shapes.get(node.args[0]) or [])
        dims = _reduced_dims(node, shapes)
        kept = [d for d in range(rank) if d not in dims]
        row = sorted(d % rank for d in block) if rank else []
        # e.g. sum(dy * x_hat, [0, 1]) -> dW [N]: every dim but the feature dims
        if len(dims) == 1 or dims == row or not kept or kept == row:
            continue
        raise _Stop(
            _label(node),
            f"backward reduction over dims {dims} keeps dims {kept}: neither the row's dims nor "
            "all rows down to a per-feature gradient",
        )


def _broadcast(shape: list[int], main: list[int], block: list[int]) -> str | None:
    """How `shape` spans the main input's [rows, cols] view (cols: the `block` dims, negative);
    None for other patterns."""
    rank = len(main)
    if shape == main:
        return "full"
    numel = 1
    for s in shape:
        numel *= s
    if numel == 1:
        return "scalar"
    cols = {d % rank for d in block}
    # one value per row with the reduced dims dropped (keepdim=False outputs)
    if len(shape) == rank - len(cols) and shape == [m for d, m in enumerate(main) if d not in cols]:
        return "row"
    if len(shape) > rank:
        return None
    padded = [1] * (rank - len(shape)) + list(shape)
    if all(p == (main[d] if d in cols else 1) for d, p in enumerate(padded)):
        return "col"
    if all(p == (1 if d in cols else main[d]) for d, p in enumerate(padded)):
        return "row"
    return None


# --------------------------------------------------------------------------- the profile


def _closest(tier: int, ops: set[str], specs: list[TensorSpec], fwd: Graph) -> str | None:
    if tier == 3:
        return None
    if tier == 2:
        if any(s.dtype == "int" for s in specs):
            return "cross_entropy"
        if "exp" in ops and ({"log", "log1p"} & ops):
            return "log_softmax"
        if "exp" in ops:
            return "softmax"
        sums = sum(1 for n in _calls(fwd) if _op(n) in {"sum", "mean"})
        if "var_mean" in ops or "var" in ops or sums >= 2:
            return "layer_norm"
        return "rms_norm"
    full_float = [s for s in specs if s.broadcast == "full" and s.dtype != "int"]
    if len(full_float) >= 2:
        return "geglu" if {"tanh", "erf"} & ops else "swiglu"
    return "relu_squared"


def _sweep(tier: int, fixed_cols: int | None = None) -> list[dict[str, int]]:
    """[rows, cols] points from real model configs: token counts at the reference model's size,
    then every model's size at the default token count. Element-wise kernels run on the MLP's
    intermediate activations, row kernels on the hidden states. A reference that runs at one
    row length only (`fixed_cols`) keeps it and varies the token count."""
    if fixed_cols is not None:
        return [{"rows": t, "cols": fixed_cols} for t in token_counts()]
    field = "intermediate" if tier == 1 else "hidden"
    ref_cols = getattr(REFERENCE, field)
    points = [{"rows": t, "cols": ref_cols} for t in token_counts()]
    points += [{"rows": DEFAULT_TOKENS, "cols": c} for c in distinct(field)]
    out: list[dict[str, int]] = []
    for p in points:
        if p not in out:
            out.append(p)
    return out


def _fixed_cols(fwd: Graph) -> int | None:
    """The class count of a one_hot: the reference (`one_hot(target, C)`, C a constant) runs on
    rows of C columns only, whatever length the kernel takes."""
    for n in _calls(fwd):
        if _op(n) == "one_hot" and len(n.args) > 1 and isinstance(n.args[1], int):
            return n.args[1]
    return None


def _launch(name: str, tier: int) -> LaunchPlan | None:
    if tier == 1:
        return LaunchPlan(
            grid="one program per [ROWS, BLOCK_N] tile of the [rows, cols] view",
            block_source=f"table: runtime/tables/{name}.py by column count, seeded from "
            "relu_squared's table",
            configs=[dict(c) for c in _TIER1_CONFIGS],
        )
    if tier == 2:
        return LaunchPlan(
            grid="one program per ROWS rows, each row whole in registers",
            block_source="pure function: BLOCK_N = next_power_of_2(cols); ROWS and num_warps "
            f"from runtime/tables/{name}.py by column count, seeded from rms_norm's table",
            configs=[dict(c) for c in _TIER2_CONFIGS],
        )
    return None


def _upcast(fwd: Graph, bwd: Graph) -> list[str]:
    out: list[str] = []
    for node in _calls(fwd) + _calls(bwd):
        op = _op(node)
        if op in TRANSCENDENTAL:
            entry = f"{op}: transcendental"
        elif op in REDUCTIONS and op not in {"amax", "amin", "max", "min", "argmax", "argmin"}:
            entry = f"{op}: reduction, accumulated in fp32"
        else:
            continue
        if entry not in out:
            out.append(entry)
    return out


def _specs(ref: Reference, traced: Traced | None) -> tuple[list[TensorSpec], list[TensorSpec]]:
    grads = traced.grad_outputs if traced else {}
    inputs = []
    tensors = ref.example_inputs + ref.params
    roles = ["input"] * len(ref.input_names) + ["parameter"] * len(ref.param_names)
    for name, t, role in zip(ref.input_names + ref.param_names, tensors, roles, strict=True):
        inputs.append(
            TensorSpec(
                name=name,
                role=role,
                example_shape=list(t.shape),
                requires_grad=name in grads,
                dtype="same" if t.is_floating_point() else "int",
            )
        )
    outputs = []
    if traced:
        for name, shape in zip(traced.output_names, traced.output_shapes, strict=True):
            outputs.append(TensorSpec(name=name, role="output", example_shape=shape))
    return inputs, outputs


def _main_index(inputs: list[TensorSpec]) -> int:
    """The main input: the largest (first on ties) float input; it defines [rows, cols]."""
    best = 0
    for i, s in enumerate(inputs):
        numel = 1
        for d in s.example_shape:
            numel *= d
        cur = 1
        for d in inputs[best].example_shape:
            cur *= d
        if numel > cur or (inputs[best].dtype == "int" and s.dtype != "int"):
            best = i
    return best


def understand(
    source: str, *, name: str | None = None, save_policy: str = "recompute"
) -> KernelProfile:
    """Load, trace and classify `source`; the profile of a tier-3 reference names the stop.
    `save_policy` picks the intermediates stored for the backward (see stored.plan_stored)."""
    ref = load_reference(source, name=name)
    op_name = name or ref.name
    base = dict(
        name=op_name,
        function_name=op_name,
        module_name=camel_case(op_name),
        source=source,
        input_form=ref.input_form,
    )
    notes = []
    if ref.constants:
        notes.append(f"non-tensor arguments baked in as constants: {ref.constants}")
    notes += params.init_notes(ref.param_names, ref.params)
    # A reference that fails in eager is the user's bug, not tier 3: a ReferenceError.
    problem = run_eagerly(ref)
    try:
        if problem:
            raise TraceError(problem[1], node=problem[0], explained=True)
        traced = trace(ref)
        source_ref = ref  # an input cut in parts: ref and traced over the parts (parts.py)
        ref, traced, cut = parts.over_parts(ref, traced)
    except (TraceError, parts.PartsStop) as e:
        inputs, _ = _specs(ref, None)
        match = re.search(r"aten\.[\w.]+", str(e))
        return KernelProfile(
            **base,
            tier=3,
            tier_reason=f"stops at {e.node}"
            if isinstance(e, parts.PartsStop)
            else "tracing to aten graphs failed",
            unsupported_node=e.node or (match.group(0) if match else "trace"),
            unsupported_reason=str(e)
            if e.explained
            else f"{e} — data-dependent control flow or an op without a fake "
            "kernel cannot be traced, so no kernel can be generated from it",
            inputs=inputs,
            notes=notes,
        )

    inputs, outputs = _specs(ref, traced)
    main = inputs[_main_index(inputs)].example_shape
    tail_graph, tail_stop = Graph(), None
    # a reduction over the row's dims and more: the row's, then one over the rows' values
    wide = tail.split_wide(traced.forward, len(main), REDUCTIONS)
    starts = tail.tail_start(wide, len(main), REDUCTIONS)
    if starts:  # a reduction over the rows' values: the kernel computes the rows (the head)
        try:
            head_outs, tail_graph = tail.split(wide, starts, ELEMENTWISE, len(traced.output_names))
            head = trace(tail.head_reference(ref, wide, head_outs))
            tail_graph = tail.rename(tail_graph, head_outs)
            notes.append(
                "tail (PyTorch, after the kernel, on its per-row outputs): "
                + "; ".join(f"{o} = {formula(tail_graph, o)}" for o in traced.output_names)
            )
            traced = head
            inputs, outputs = _specs(ref, traced)
        except (tail.TailError, TraceError) as e:
            tail_graph = Graph()
            tail_stop = (getattr(e, "node", "tail"), getattr(e, "reason", str(e)))
    fwd, bwd = traced.forward, traced.backward
    ops = {_op(n) for n in _calls(fwd) + _calls(bwd)}
    common = dict(
        **base,
        forward=fwd,
        backward=bwd,
        gradients=[f"{g} = {formula(bwd, g)}" for g in traced.grad_outputs.values()],
        saved=traced.saved,
        recomputed=traced.recomputed,
        upcast_fp32=_upcast(fwd, bwd),
        # a tail reads the rows' count at run time (batchmean): only references without one
        # are checked at another rank
        rank_bound=not starts and rank_bound(source_ref),
        input_parts={i: cut.names(i) for i in cut.counts},
    )
    notes += [
        f"{i} is read in equal parts of its last dim: {', '.join(cut.names(i))}" for i in cut.counts
    ]
    for out in traced.output_names:
        notes.append(f"forward: {out} = {formula(fwd, out)}")
    try:
        if not main:
            raise _Stop("inputs", "the main input is a scalar: nothing to tile")
        _check_float_source(inputs, fwd, traced.output_names)
        _check_input_dependent(fwd, traced.output_names)
        has_tail = bool(tail_graph.nodes)
        stop = dtypes.int_arith_stop(fwd, bwd) or dtypes.fixed_outputs(ref, outputs, has_tail)
        if stop:
            raise _Stop(*stop)
        if tail_stop:
            raise _Stop(*tail_stop)
        _check_ops(fwd, bwd)
        reduction_dims = _reduction_dims(fwd, len(main))
        if stop := parts.row_stop(cut, reduction_dims, has_tail):
            raise _Stop(*stop)
        block = reduction_dims or [-1]
        _check_bwd_reductions(bwd, block)
        for spec in inputs + outputs:
            b = _broadcast(spec.example_shape, main, block)
            if b is None:
                raise _Stop(
                    spec.name,
                    f"shape {spec.example_shape} against the main input's {main} is neither "
                    "full, per-row, per-feature nor scalar",
                )
            spec.broadcast = b
    except _Stop as stop:
        return KernelProfile(
            **common,
            tier=3,
            tier_reason=f"stops at {stop.node}",
            unsupported_node=stop.node,
            unsupported_reason=stop.reason,
            inputs=inputs,
            outputs=outputs,
            notes=notes,
        )

    reductions = [n for n in _calls(fwd) + _calls(bwd) if _op(n) in REDUCTIONS]
    per_feature = [s.name for s in inputs if s.requires_grad and s.broadcast in ("col", "scalar")]
    if not reductions:
        tier, reason = 1, "element-wise only (forward and backward)"
    elif reduction_dims:
        dims = reduction_dims[0] if len(reduction_dims) == 1 else reduction_dims
        tier, reason = (
            2,
            f"element-wise plus reductions over dim{'s' * (len(reduction_dims) > 1)} {dims}",
        )
    else:
        tier = 2
        grads = ", ".join(per_feature) or "broadcast inputs"
        reason = f"element-wise forward; the gradients of {grads} reduce over rows"
    if reduction_dims and per_feature:
        reason += f"; gradients of {', '.join(per_feature)} reduce over rows"
    profile = KernelProfile(
        **common,
        tier=tier,
        tier_reason=reason,
        inputs=inputs,
        outputs=outputs,
        reduction_dims=reduction_dims,
        tail=tail_graph,
        closest_kernel=_closest(tier, ops, inputs, fwd),
        launch=_launch(op_name, tier),
        benchmark_sweep=_sweep(tier, _fixed_cols(fwd)),
        notes=notes,
    )
    from kernelwright.workflows.create.stored import plan_stored  # it imports _main_index here

    profile = plan_stored(profile, save_policy)
    stop = _emit_stop(profile)
    if stop is None:
        return profile
    return KernelProfile(
        **common,
        tier=3,
        tier_reason=f"stops at {stop[0]}",
        unsupported_node=stop[0],
        unsupported_reason=f"generation: {stop[1]}",
        inputs=inputs,
        outputs=outputs,
        notes=notes,
    )


def _emit_stop(profile: KernelProfile) -> tuple[str, str] | None:
    """(node, reason) where the generator's node-by-node lowering stops on a tier-1/2 profile (a
    flipped row combined with an unflipped one), so that tier 2 means a kernel is generated."""
    from kernelwright.workflows.create.emit import _Emitter

    try:
        em = _Emitter(profile)
        em.forward_body()
        if _calls(profile.backward):
            em.backward_body()
    except UnsupportedNode as e:
        nodes = {n.name: n for n in _calls(profile.backward) + _calls(profile.forward)}
        return (_label(nodes[e.node]) if e.node in nodes else e.node), e.reason
    return None
