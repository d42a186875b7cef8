"""Act: a reviewed KernelProfile → Triton source, tests and a benchmark stub (tiers 1 and 2).

Tier 1 (element-wise, inputs broadcast as full/row/col/scalar) is lowered node by node: every
aten node of the profile's forward and backward graphs becomes one `tl` expression on a
[ROWS, BLOCK_N] tile computed in fp32 (loads are upcast, stores round once to the output
dtype: bf16 arithmetic is silently wrong under the interpreter and less accurate on a GPU).
The backward kernel recomputes forward intermediates from the saved inputs (cheap for
element-wise work) and writes each input gradient at full size; a broadcast input's gradient
is written in fp32 and summed to the input's shape by the launcher, except a per-feature or
scalar input's (summed over rows in the kernel) and, in a row kernel, a per-row input's (the
kernel's row sum). The intermediates the profile lists in `stored` are the exception: the
forward kernel writes them as extra outputs (full size, or one value per row in a row kernel;
bool, fp32 or the input's dtype as the profile says), the autograd Function saves them with
only the inputs the backward still reads (the others leave only their shape, dtype and
device), and the backward kernel loads them (`s_<name>`) instead of recomputing them. With
nothing stored (the default) the backward recomputes every intermediate from the inputs.

Tier 2 (work along the row: norms, softmax, logsumexp, losses, argmax, gather, scans) takes
the same path with one program per ROWS rows holding each row whole (BLOCK_N =
next_power_of_2(N)): a reduction over the row becomes `tl.sum/max/min/argmax(..., axis=1)` on
the padded tile (a product `tl.reduce` with `_mul`), the padding replaced by the reduction's
neutral element first; cumsum and cumprod are `tl.cumsum` / `tl.cumprod` along it. Per-row
values stay [ROWS, 1] tiles and broadcast against the row; per-row outputs store one value per
row. The row is the profile's `reduction_dims`: the last dim, several trailing dims flattened
into one, or dims before other ones: then every tensor is an [A, N, B] view read in place, a
program's ROWS rows being B-neighbours so that each load along the row is contiguous
(templates/slab.py.j2): rows up to STRIDED_MAX elements held whole, longer ones walked in
[rows, block_n] tiles by the looped kernels over the same views; B = 1 is an [M, N] view of the
rows. Rows longer than a table row's block_n take the looped kernels (staged.py). A gather of
one value per row that is the forward's only work along the row is read at its target column
alone instead, at any row length (pick.py). A
per-feature parameter's gradient (a sum over rows) is accumulated per program in fp32 and the
launcher sums the partial rows, like a broadcast input of tier 1.
Launch configs come from the module's `TABLE` (the library's table form, which `kernelwright
optimize` rewrites).

The node-by-node lowering is emit.py's `_Emitter`, the looped kernels' plan staged.py; this
module fills the templates and writes the eager reference the tests compare to.

Generation is a pure function of the profile: same profile, byte-identical files. A node
without a lowering raises `UnsupportedNode` naming it — never a kernel we cannot verify.
"""

from __future__ import annotations

from pathlib import Path

import jinja2

from kernelwright.profiles.kernel import GraphNode, KernelProfile
from kernelwright.workflows.create import dtypes, guards, onehot, parts, pick, staged, tail
from kernelwright.workflows.create.emit import _Emitter
from kernelwright.workflows.create.lowering import (  # noqa: F401  (UnsupportedNode: re-exported)
    _CONSTS,
    _NEUTRAL,
    _REDUCE,
    _SCANS,
    MAX_ROW,
    UnsupportedNode,
    _lit,
    _output_args,
)
from kernelwright.workflows.create.pattern import pattern_of

TEMPLATES = Path(__file__).parent / "templates"

# the default launch configs, largest tile first; a repair moves one step down the list
DEFAULT_CONFIGS = [
    {"block_n": 1024, "rows": 4, "num_warps": 4},
    {"block_n": 256, "rows": 4, "num_warps": 4},
    {"block_n": 64, "rows": 2, "num_warps": 2},
]


# the longest row of other dims than the trailing ones that one in-place tile holds whole
# (B-neighbours together); longer rows take the looped kernels, in place too
STRIDED_MAX = 2048

# row kernels: BLOCK_N is the whole row (next power of two of N), only ROWS and warps vary
ROW_CONFIGS = [
    {"rows": 16, "num_warps": 4},
    {"rows": 4, "num_warps": 4},
    {"rows": 2, "num_warps": 4},
    {"rows": 1, "num_warps": 4},
]


def _grad_doc(red: bool, per_row: bool, other: bool) -> str:
    """The generated module's sentence on how broadcast inputs' gradients are reduced."""
    parts = []
    if red:
        parts.append("a per-feature or scalar input's gradient is summed over the rows in the "
                     "kernel (fp32 partial rows, added up by the autograd function)")  # fmt: skip
    if per_row:
        parts.append("a per-row input's gradient is the kernel's row sum, one value per row")
    if other:
        parts.append("any other broadcast input's gradient is written at full size in fp32 "
                     "and summed to the input's shape")  # fmt: skip
    if not parts:
        return "Every input's gradient is written at full size."
    text = "; ".join(parts) + "."
    return text[0].upper() + text[1:]


def launch_repairs(profile: KernelProfile) -> int:
    """How many Verify repairs moved the launch config (each one step down the list)."""
    return sum(1 for r in profile.repairs if r.kind == "launch")


def launch_configs(profile: KernelProfile, row: bool | None = None) -> list[dict]:
    """The launch configs a Verify repair steps down, in order: the profile's own when they
    fit the template (a row kernel needs rows and warps, the element-wise one a whole tile; a
    profile planned for row kernels whose only reductions are parameter gradients, e.g. DyT,
    takes the element-wise defaults), else the template's. `row` None: the profile's kind."""
    row = _Emitter(profile).row if row is None else row
    keys = ("rows", "num_warps") if row else ("block_n", "rows", "num_warps")
    configs = (profile.launch.configs if profile.launch else None) or []
    if not configs or not all(k in c for c in configs for k in keys):
        configs = ROW_CONFIGS if row else DEFAULT_CONFIGS
    return [{k: c[k] for k in keys} for c in configs]


def _config(profile: KernelProfile, row: bool = False) -> dict[str, int]:
    configs = launch_configs(profile, row)
    cfg = configs[min(launch_repairs(profile), len(configs) - 1)]
    if row:
        # BLOCK_N is the widest row the kernel accepts; each launch takes next_power_of_2(N)
        return {"block_n": MAX_ROW, **cfg}
    return cfg


def _out_kinds(profile: KernelProfile, em: _Emitter) -> list[str]:
    """Per output: 'full' ([..., N]), 'row' ([...], one per row) or 'row1' ([..., 1])."""
    kinds = []
    for o in profile.outputs:
        shape = list(o.example_shape)
        if not em.row or shape == em.full:
            kinds.append("full")
        elif shape == em.row_shape(False):
            kinds.append("row")
        elif shape == em.row_shape(True):
            kinds.append("row1")
        else:
            raise UnsupportedNode(
                o.name, f"output shape {shape} is neither {em.full} nor one value per row"
            )
    return kinds


# a stored intermediate's torch dtype in the generated op (None: the first input's dtype)
_ST_DTYPES = {"bool": "torch.bool", "fp32": "torch.float32", "same": "None"}


def _camel(name: str) -> str:
    return "".join(p[:1].upper() + p[1:] for p in name.split("_"))


# where the generated op lives: a standalone package (`--out`, the workspace) or kernelwright's
# own `kernelwright.ops.generated` (`--into-library`)
LIBRARY_PACKAGE = "kernelwright.ops.generated"
_PRODUCTS = {"aten.cumprod.default", "aten.prod.dim_int", "aten.prod.default"}


def render(profile: KernelProfile, *, library: bool = False) -> dict[str, str]:
    """The generated files, {relative path: text}; raises UnsupportedNode for what can't be.

    Standalone: `<name>/{__init__,<name>,test_<name>,bench_<name>}.py`, relative imports.
    library: `ops/generated/<name>.py`, `tests/generated/test_generated_<name>.py` and
    `benchmarks/generated/bench_<name>.py`, importing `kernelwright.ops.generated.<name>`.
    """
    # tier 2 goes through too: last-dim reductions make a row kernel, per-feature parameter
    # gradients are trailing sums; any other reduction raises UnsupportedNode in _Emitter
    if profile.tier == 3:
        node = profile.unsupported_node or "reduction"
        raise UnsupportedNode(
            node, profile.unsupported_reason or f"tier {profile.tier} is not generated yet"
        )
    em = _Emitter(profile)
    out_kinds = _out_kinds(profile, em)
    # the forward's one-tile kernel flags a one_hot's index outside the row as it reads it
    em.index_flag = bool(onehot.checks(em))
    fwd_body, fwd_outs = em.forward_body()
    em.index_flag = False
    # a backward exists when some input gets a gradient, also one that is dy itself (x + c)
    has_bwd = any(n.op == "call_function" for n in profile.backward.nodes) or any(
        a is not None
        for n in profile.backward.nodes
        if n.op == "output"
        for a in (n.args[0] if n.args and isinstance(n.args[0], list) else n.args)
    )
    st_kinds = em.stored_kinds()
    if profile.stored and not has_bwd:
        raise UnsupportedNode(profile.stored[0].name, "stored, but there is no backward")
    if has_bwd:
        bwd_body, grads, summed, needed = em.backward_body()
    else:
        bwd_body, grads, summed, needed = [], [None] * len(profile.inputs), [], set()
    red = [g is not None and spec.broadcast in ("col", "scalar")
           for g, spec in zip(grads, profile.inputs, strict=True)]  # fmt: skip
    used_fwd = {i for i, ph in enumerate(em.f_ph) if f"f_{ph}" in "\n".join(fwd_body + fwd_outs)}
    looped = []
    if em.row:
        f_nodes = em.fwd_needed(_output_args(em.fwd)[: len(profile.outputs)])
        outs = [{"kind": k, "value": v} for k, v in zip(out_kinds, fwd_outs, strict=True)]
        # a per-feature gradient's looped kernel writes fp32 column sums: of each row block in
        # place, of every ROW_PROGS-th row with trailing rows (`walks`)
        g_outs = [{"kind": "red" if r else "row" if i in em.row_grads else "full", "value": g}
                  for i, (g, r) in enumerate(zip(grads, red, strict=True))
                  if g is not None]  # fmt: skip
        plans = [("fwd", [(f_nodes, "f_", {})], outs, sorted(used_fwd), 0)]
        if has_bwd:
            plans.append(("bwd", em.bwd_groups, g_outs, sorted(needed), len(fwd_outs)))
        for kind, groups, kouts, used, n_dys in plans:
            # the backward copies the row values the forward's looped launch keeps
            keep = looped[0].get("keep") if kind == "bwd" and not profile.stored else None
            try:
                looped.append(staged.kernels(em, kind, groups, [o["value"] for o in kouts],
                                             used, em.f_ph, n_dys, kouts, keep))  # fmt: skip
            except UnsupportedNode as e:  # rows up to BLOCK_N still run; longer ones raise
                looped.append({"kind": kind, "unsupported": f"{e.node}: {e.reason}"})
            looped[-1]["walks"] = em.trailing and any(o["kind"] == "red" for o in kouts)
            for k in looped[-1].get("parts", []):  # whether it loads a full tile of anything
                k["full_reads"] = any(
                    profile.inputs[i].broadcast != "row" for i, _ in k["ins"]
                ) or any(out_kinds[d] == "full" for d in k["dys"])
        if not (len(looped) == 2 and looped[1].get("given")):
            looped[0]["keep"] = {}  # nothing the backward reads: the forward keeps nothing
    # the forward's looped launch keeps its row values for the backward's (`stats`)
    keeps = bool(looped and looped[0].get("keep"))
    # a gather of one value per row that is the forward's only work along the row: the forward
    # reads that element alone at any row length (pick.py), so it has no looped kernels
    picked = pick.plan(em, out_kinds, keeps)
    if picked:
        looped = [fb for fb in looped if fb["kind"] != "fwd"]
    # an output's torch dtype when it is not the first input's (indices, a cast to float32)
    out_dtypes = [
        dtypes.out_dtype(em.fwd_by.get(o), spec)
        for o, spec in zip(_output_args(em.fwd), profile.outputs, strict=False)
    ]
    # rows longer than BLOCK_N run (the looped kernels exist and store nothing)
    looped_ok = all(not fb["unsupported"] for fb in looped) and not profile.stored
    ctx = guards.context(profile, em) | {
        "p": profile,
        **_test_shapes(em, looped_ok),
        "looped_ok": looped_ok,
        "float_outs": [k for k, d in enumerate(out_dtypes) if "int" not in d and "bool" not in d],
        "scan": any(n.target in _SCANS for n in em.fwd + em.bwd),
        # products along the row (prod, cumprod): a `_mul` combine, and test inputs whose
        # products stay in range, zeros included
        "products": any(n.target in _PRODUCTS for n in em.fwd + em.bwd),
        # index inputs a one_hot reads, and the row length: checked once before the launch
        "index_checks": onehot.checks(em),
        "looped": looped,
        "keeps": keeps,
        # the pick form's forward: (the index input's position, its lines), or None
        "pick": picked,
        # per-row inputs traced with the row's dims dropped ([N] against [N, V]): 1, else 0
        "dropped": [
            int(s.broadcast == "row" and len(s.example_shape) == em.rank - len(em.block))
            for s in profile.inputs
        ],  # fmt: skip
        "dropped_idx": [
            i
            for i, s in enumerate(profile.inputs)
            if s.broadcast == "row" and len(s.example_shape) == em.rank - len(em.block)
        ],  # fmt: skip
        # per-row inputs (a temperature, a target index): the kernels of trailing rows load them
        # once a row ([ROWS, 1]) and compute on them per row (one load and one evaluation of
        # their arithmetic a row, not one a column); a reduction's `where` on the row's mask
        # broadcasts such a value over the row's columns, so it sums what a full tile would
        "row_ins": [i for i, s in enumerate(profile.inputs) if s.broadcast == "row"],
        "neutral": _NEUTRAL,
        "classic": em.classic,
        "trailing": em.trailing,
        # a row of other dims than the trailing ones: read in place as [A, N, B] (slab.py.j2)
        "moved": not em.trailing,
        "strided_max": STRIDED_MAX,
        "block": em.block,
        "kept": em.kept,
        "rank": em.rank,
        "perm": em.kept + em.block,
        "full": em.full,
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
        # per-row inputs whose gradient the kernel sums along the row: one value per row
        "row_grads": sorted(em.row_grads),
        "grad_doc": _grad_doc(
            any(red),
            bool(em.row_grads),
            any(
                g is not None and s.broadcast != "full" and not r and i not in em.row_grads
                for i, (g, s, r) in enumerate(zip(grads, profile.inputs, red, strict=True))
            ),
        ),
        # gradients reduced over rows inside the backward kernel: per-feature and scalar inputs
        "red": red,
        "has_red": any(red),
        "red_idx": [i for i, r in enumerate(red) if r],
        "grad_reduced": [red[i] for i, g in enumerate(grads) if g is not None],
        "red_kinds": [(i, profile.inputs[i].broadcast) for i, r in enumerate(red) if r],
        "cfg": _config(profile, em.row),
        "row": em.row,
        "out_kinds": out_kinds,
        "out_dtypes": out_dtypes,
        # stored intermediates (profile.stored): extra forward outputs the backward loads
        "stored": profile.stored,
        "st_kinds": st_kinds,
        "st_dtypes": [_ST_DTYPES[t.dtype] for t in profile.stored],
        "ref_lines": _ref_lines(profile, em),
        "tail_lines": _tail_lines(profile, em) if profile.tail.nodes else [],
        "tail_args": [n.name for n in profile.tail.nodes if n.op == "placeholder"],
        "ref_grad_lines": _ref_grad_lines(profile, em) if has_bwd else [],
        "params": [i for i in profile.inputs if i.role == "parameter"],
        "args": [i for i in profile.inputs if i.role != "parameter"],
        **parts.context(profile),  # inputs read in parts: the public function takes them whole
    }
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters["tuple_repr"] = lambda v: repr(tuple(v))
    name = profile.name
    ctx["pattern"] = None
    if library:
        ctx["pattern"] = pattern_of(profile)
        ctx.update(module=f"{LIBRARY_PACKAGE}.{name}", namespace="kernelwright_generated")
        return {
            f"ops/generated/{name}.py": env.get_template("op.py.j2").render(**ctx),
            f"tests/generated/test_generated_{name}.py": env.get_template("test.py.j2").render(
                **ctx
            ),
            f"benchmarks/generated/bench_{name}.py": env.get_template("bench.py.j2").render(**ctx),
        }
    ctx.update(module=f".{name}", namespace="kernelwright_create")
    return {
        f"{name}/__init__.py": env.get_template("init.py.j2").render(**ctx),
        f"{name}/{name}.py": env.get_template("op.py.j2").render(**ctx),
        f"{name}/test_{name}.py": env.get_template("test.py.j2").render(**ctx),
        f"{name}/bench_{name}.py": env.get_template("bench.py.j2").render(**ctx),
    }


def _test_shapes(em: _Emitter, looped: bool) -> dict[str, list[tuple[int, ...]]]:
    """Test shapes at the traced rank, for a row of several or other dims than the last: the
    traced shape, odd sizes, a row longer than the in-place tile of a row of other dims than
    the trailing ones, a row longer than one program holds; on a GPU, many rows and a row of
    about 393,216 elements."""
    full = list(em.full)
    last = em.block[-1]

    def longer(shape: list[int], cols: int) -> tuple[int, ...]:
        out = [min(s, 2) if d not in em.block else s for d, s in enumerate(shape)]
        n = 1
        for d in em.block:
            n *= out[d]
        out[last] = out[last] * -(-cols // n)
        return tuple(out)

    shapes = [tuple(full), tuple(s + 1 if s > 1 else s for s in full)]
    if not em.trailing:  # a row longer than one in-place tile holds: the looped kernels in place
        shapes.append(longer(full, STRIDED_MAX + 1))
    if em.row and looped:
        shapes.append(longer(full, MAX_ROW + 1))
    gpu = []
    if em.kept:
        big = list(full)
        big[em.kept[0]] *= 64
        gpu.append(tuple(big))
    if em.row and looped:
        gpu.append(longer(full, 393216))
    return {"test_shapes": shapes, "gpu_shapes": gpu}


_SHAPE_OPS = {"aten.expand.default", "aten.view.default", "aten.reshape.default",
              "aten._unsafe_view.default"}  # fmt: skip
# ops whose argument 1 is a dim (the row's: -1 at any rank in the eager reference)
_DIM_OPS = {
    "aten.squeeze.dim", "aten.squeeze.dims", "aten.flip.default", "aten.gather.default",
    "aten.scatter_add.default", "aten.scatter.src",
}  # fmt: skip
_SIZES = {"aten.sym_numel.default": ".numel()", "aten.sym_size.int": ".shape[{}]"}


def _ref_lines(profile: KernelProfile, em: _Emitter) -> list[str]:
    """The traced forward as eager aten calls in fp32: the reference the tests compare to.

    A row kernel's reference must run at any [..., N]: the traced shapes, the last dim's index
    and the row length baked in as a constant are rewritten in terms of the runtime `_shape`.
    """
    lines = []
    if em.row:
        lines.append(
            f"_shape = torch.broadcast_shapes({', '.join(p + '.shape' for p in em.shaped_ph)})"
        )
    outs = _output_args(em.fwd)[: len(profile.outputs)]
    # what only the backward saves is not part of the reference
    lines += _eager_lines(profile, em, em.fwd_needed(outs), set(em.fwd_by), em.row)
    lines.append("return " + ", ".join(outs))
    if profile.tail.nodes:  # the rows' values go on through the tail
        lines[-1] = f"return {profile.name}_tail({', '.join(outs)})"
        # the gradients are autograd's through this reference: its softmax shifts detached, as
        # the head was traced (tail.shifts)
        shift = tail.shifts([n for n in em.fwd if n.op == "call_function"])
        lines = [f"{ln}.detach()" if ln.split(" = ")[0] in shift else ln for ln in lines]
    if em.row and not any("_shape" in ln for ln in lines[1:]):
        lines.pop(0)  # no shape rewritten: keep the reference free of an unused name
    return lines


def _tail_lines(profile: KernelProfile, em: _Emitter) -> list[str]:
    """The tail (profile.tail) as eager aten calls in fp32 over the kernel's per-row outputs."""
    nodes = profile.tail.nodes
    names = {n.name for n in nodes}
    calls = [n for n in nodes if n.op == "call_function"]
    lines = [f"_device = {nodes[0].name}.device"]
    lines += _eager_lines(profile, em, calls, names, False, row_consts=False)
    return lines + ["return " + ", ".join(str(o) for o in _output_args(nodes))]


def _ref_grad_lines(profile: KernelProfile, em: _Emitter) -> list[str]:
    """The traced backward graph as eager aten calls in fp32, after the forward values it reads:
    the gradient reference. At non-differentiable points it has PyTorch's decomposition
    conventions (HardSwish at x = -3 gives 0, where eager autograd gives -dy/2), which is what
    the kernel implements, so the tests compare like with like there."""
    b_ph = [n.name for n in em.bwd if n.op == "placeholder"]
    saved = [ph for ph in b_ph if ph not in em.f_ph and ph in em.fwd_by]
    tangents = [ph for ph in b_ph if ph not in em.f_ph and ph not in em.fwd_by]
    lines = [
        f"{', '.join(em.f_ph)}{',' if len(em.f_ph) == 1 else ''} = "
        "[_up(t) if t.is_floating_point() else t for t in inputs]",
        f"_device = {em.f_ph[0]}.device",
        f"_shape = torch.broadcast_shapes({', '.join(p + '.shape' for p in em.shaped_ph)})",
    ]
    lines += _eager_lines(profile, em, em.fwd_needed(saved), set(em.fwd_by), True)
    lines += [f"{t} = _up(dys[{k}])" for k, t in enumerate(tangents)]
    lines += _eager_lines(profile, em, em.bwd, set(em.bwd_by), True)
    grads = _output_args(em.bwd)[: len(profile.inputs)]
    lines.append("return " + ", ".join(str(g) if g is not None else "None" for g in grads)
                 + ("," if len(grads) == 1 else ""))  # fmt: skip
    return lines


def _eager_lines(
    profile: KernelProfile,
    em: _Emitter,
    nodes: list[GraphNode],
    names: set[str],
    rewrite: bool,
    row_consts: bool = True,
) -> list[str]:
    """One eager `torch.ops.aten` call per graph node, in fp32. With `rewrite`, the traced
    shapes, reduced dims and row length are expressed through the runtime `_shape`."""
    inputs = dict(zip(em.f_ph, profile.inputs, strict=True))

    def shape_expr(v, node: str) -> str:
        v = list(v)
        if v == em.full:
            return "list(_shape)"
        for ph, spec in inputs.items():  # a parameter's gradient viewed back to its shape
            if v == list(spec.example_shape) and spec.broadcast != "full":
                return f"list({ph}.shape)"
        if not em.classic:  # a row of several or other dims: tests keep the traced rank
            if v == em.row_shape(False):
                return "[" + ", ".join(f"_shape[{d}]" for d in em.kept) + "]"
            if v == em.row_shape(True):
                return "[" + ", ".join("1" if d in em.block else f"_shape[{d}]"
                                       for d in range(em.rank)) + "]"  # fmt: skip
            if v == [em.full[d] if d in em.block else 1 for d in range(em.rank)]:
                return "[" + ", ".join(f"_shape[{d}]" if d in em.block else "1"
                                       for d in range(em.rank)) + "]"  # fmt: skip
            if v == [em.row_n]:
                return f"[{em.n_expr}]"
            if v == [*em.row_shape(False), em.row_n]:
                return "[" + ", ".join([f"_shape[{d}]" for d in em.kept] + [em.n_expr]) + "]"
        elif v == em.full[:-1]:
            return "list(_shape[:-1])"
        elif v == em.full[:-1] + [1]:
            return "[*_shape[:-1], 1]"
        elif em.rank and v == [1] * (em.rank - 1) + em.full[-1:]:
            return "[*([1] * (len(_shape) - 1)), _shape[-1]]"
        raise UnsupportedNode(node, f"shape {v} is not the input's, its rows' or rows x 1")

    def dims_expr(d) -> str:
        if not em.classic:
            return conv(d)  # the traced rank: the traced dims hold
        # the traced last dim's index → -1, every leading dim → all but the last at any rank
        if isinstance(d, (list, tuple)):
            norm = sorted({x % em.rank for x in d}) if em.rank else []
            if em.rank > 1 and norm == list(range(em.rank - 1)):
                return "list(range(len(_shape) - 1))"
            return "[" + ", ".join(dims_expr(x) for x in d) + "]"
        return "-1" if isinstance(d, int) and d in (em.rank - 1, -1) else repr(d)

    def conv(v):
        if isinstance(v, str) and v in names:
            return v
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(conv(x) for x in v) + "]"
        if isinstance(v, str) and v in _CONSTS:
            return _lit(_CONSTS[v])
        if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
            return _lit(v)  # repr() gives a bare `inf`
        return repr(v)

    shapes = {m.name: m.shape for m in em.fwd + em.bwd}
    lines = []
    for n in nodes:
        if n.op != "call_function":
            continue
        if n.target == "getitem":
            lines.append(f"{n.name} = {n.args[0]}[{int(n.args[1])}]")
            continue
        if n.target in _SIZES:  # a tail's size of the rows' values, as torch.compile reads it
            lines.append(f"{n.name} = {n.args[0]}{_SIZES[n.target].format(*n.args[1:])}")
            continue
        if n.target == onehot.ONE_HOT:  # as many classes as the row has columns, at any row length
            full = [ph for ph, s in inputs.items() if s.broadcast == "full"]
            classes = f"{full[0]}.shape[-1]" if full else repr(n.args[1])
            lines.append(f"{n.name} = torch.ops.{n.target}({n.args[0]}.long(), {classes})")
            continue
        conv_args = []
        for i, v in enumerate(n.args):
            if rewrite and (i == 1 and n.target in _SHAPE_OPS
                            or i == 0 and n.target == "aten.full.default"):  # fmt: skip
                conv_args.append(shape_expr(v, n.name))
            elif (
                rewrite
                and em.classic
                and i == 1
                and n.target == "aten.unsqueeze.default"
                and v == em.rank - 1
                and len(shapes.get(n.args[0]) or []) == em.rank - 1
            ):
                conv_args.append("-1")  # a per-row value [...] given back its row dim
            elif rewrite and i == 1 and (n.target in _REDUCE or n.target in _DIM_OPS):
                conv_args.append(dims_expr(v))
            elif row_consts and em._is_n(n, v):
                conv_args.append(em.n_expr)
            elif row_consts and em.n_frac(n, v):
                conv_args.append(f"({em.n_frac(n, v)} / {em.n_expr})")
            elif row_consts and em.n1_frac(n, v):
                conv_args.append(f"({em.n1_frac(n, v)} / ({em.n_expr} - 1))")
            else:
                conv_args.append(conv(v))
        args = ", ".join(conv_args)
        kws = []
        for k, v in n.kwargs.items():
            if k in ("layout", "device", "pin_memory", "memory_format"):
                continue
            if k == "dtype":
                s = str(v).rsplit(".", 1)[-1]
                kws.append(f"dtype=torch.{'bool' if s == 'bool' else 'float32'}")
                continue
            if rewrite and k == "dim" and n.target in _REDUCE:
                kws.append(f"dim={dims_expr(v)}")
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
