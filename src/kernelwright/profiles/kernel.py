"""KernelProfile: the create workflow's decisions for one new kernel, written before any code.

`kernelwright create` (Understand) traces a PyTorch reference into aten-level forward and
backward graphs and writes this profile; a person reviews the YAML; code generation (Act) is a
deterministic function of it — the same profile gives byte-identical files. The graphs are kept
in the profile as node lists, so an edit to the profile (an intermediate stored for the backward
or recomputed, a block size) is what the generator sees.

Saved vs recomputed: `stored` is the decision the generator follows — the forward intermediates
the forward kernel writes as extra outputs for the backward kernel to load; everything else the
backward recomputes from the inputs it reads (and only the inputs it reads are kept for it).
`saved`/`recomputed` are the trace's record of what torch.compile's min-cut partitioner chose,
for the reviewer to compare with; the generator does not read them.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from kernelwright.profiles.base import Strict, YamlProfile

SCHEMA_VERSION = 1


class TensorSpec(Strict):
    """One input or output of the kernel."""

    name: str
    # input: an argument of the reference; parameter: a module parameter (gets a gradient,
    # reduced over rows when per-feature); output: a result
    role: Literal["input", "parameter", "output"]
    example_shape: list[int]  # from the example inputs the reference was traced with
    # which dims the tensor spans relative to the kernel's [rows, cols] view: "full" (same
    # shape as the main input), "row" (one value per row, e.g. a norm statistic), "col" (per
    # feature, e.g. a norm weight), "scalar"
    broadcast: Literal["full", "row", "col", "scalar"] = "full"
    requires_grad: bool = False
    # dtype policy: "same" (the main input's dtype), "fp32" (kept in fp32), "int" (indices)
    dtype: Literal["same", "fp32", "int"] = "same"


class GraphNode(Strict):
    """One node of an aten-level graph, in order: name = target(args, kwargs)."""

    name: str
    op: Literal["placeholder", "call_function", "output"]
    target: str  # "aten.mul.Tensor", or the placeholder's name
    args: list[Any] = Field(default_factory=list)  # node names (str) or constants
    kwargs: dict[str, Any] = Field(default_factory=dict)
    shape: list[int] | None = None  # on the example inputs
    dtype: str | None = None  # "torch.float32"


class Graph(Strict):
    nodes: list[GraphNode] = Field(default_factory=list)
    # the readable form a reviewer reads: one line per node, `name = op(args)`
    readable: list[str] = Field(default_factory=list)


class LaunchPlan(Strict):
    """How the grid and block sizes are chosen."""

    grid: str  # "one program per ROWS rows" / "one program per BLOCK elements"
    block_source: str  # "table: <op> launch table by column count", "pure function ..."
    # candidate configs the Verify stage's repairs may move between, smallest last
    configs: list[dict[str, int]] = Field(default_factory=list)


class StoredTensor(Strict):
    """A forward intermediate the forward kernel stores and the backward kernel loads."""

    name: str  # a call_function node of the forward graph
    # the stored dtype: "bool" (comparisons and masks, 1 byte), "fp32" (precision-sensitive:
    # transcendentals, reductions, row statistics), "same" (the outputs' dtype: the first input's)
    dtype: Literal["bool", "fp32", "same"] = "same"
    reason: str = ""  # why it is stored: the bytes the backward reads with and without it


class Repair(Strict):
    attempt: int
    change: str
    reason: str
    # what the repair changed: the launch config (a smaller tile) or `stored` (a dtype widened
    # to fp32, or the intermediates recomputed instead); launch configs advance per "launch"
    kind: Literal["launch", "stored"] = "launch"


class KernelProfile(YamlProfile):
    REGENERATE: ClassVar[str] = "kernelwright create"

    schema_version: int = SCHEMA_VERSION
    name: str  # snake_case op name: "relu_squared"
    function_name: str  # the generated public function
    module_name: str  # the generated nn.Module class
    source: str  # the reference: a file path or package.module:function
    input_form: Literal["function", "module", "kernelbench"]
    tier: Literal[1, 2, 3]
    tier_reason: str
    # tier 3 or no lowering: the node that stops generation and why
    unsupported_node: str | None = None
    unsupported_reason: str | None = None
    inputs: list[TensorSpec] = Field(default_factory=list)
    outputs: list[TensorSpec] = Field(default_factory=list)
    # tier 2: the dims of the main input every row reduction reduces, negative (-1 = the last);
    # one dim, or several adjacent ones (a norm over [C, H, W], a loss over every dim)
    reduction_dims: list[int] = Field(default_factory=list)
    # the reference's dims count from the first one (softmax(x, dim=1) of a 2-D x): one more
    # leading dim changes what it computes, so the op runs at the traced rank only
    rank_bound: bool = False
    # inputs the reference reads in equal parts of their last dim (a chunk): each input's parts,
    # in order, which stand for it in `inputs` and the graphs; the generated function takes the
    # input whole and hands the kernels its parts as views
    input_parts: dict[str, list[str]] = Field(default_factory=dict)
    forward: Graph = Field(default_factory=Graph)
    backward: Graph = Field(default_factory=Graph)
    # after a reduction over the rows' values (cross-entropy's mean): the ops from there on,
    # over the kernel's per-row outputs (placeholders row0, row1, ... in output order), run
    # in PyTorch after the kernel; empty when the kernel's outputs are the reference's
    tail: Graph = Field(default_factory=Graph)
    # readable gradient formulas, one per differentiable input: "dx = dy * 2 * relu(x)"
    gradients: list[str] = Field(default_factory=list)
    # torch.compile's choice, a record from the trace (the generator reads `stored` instead):
    # the forward tensors its min-cut partitioner saves for the backward, and the forward nodes
    # its backward recomputes
    saved: list[str] = Field(default_factory=list)
    recomputed: list[str] = Field(default_factory=list)
    # how Understand chose `stored`: "recompute" (nothing stored: the backward recomputes every
    # intermediate from the inputs — the fastest forward and least memory), "min-bytes" (store
    # an intermediate when the backward then reads fewer bytes: it drops inputs larger than it)
    save_policy: Literal["recompute", "min-bytes"] = "recompute"
    # the decision: forward intermediates stored for the backward (see StoredTensor); a
    # reviewer may add, drop or retype entries
    stored: list[StoredTensor] = Field(default_factory=list)
    upcast_fp32: list[str] = Field(default_factory=list)  # precision-sensitive ops (why: below)
    closest_kernel: str | None = None  # the library op used as the pattern ("relu_squared")
    launch: LaunchPlan | None = None
    benchmark_sweep: list[dict[str, int]] = Field(default_factory=list)
    repairs: list[Repair] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _one_reduction_dim(cls, data):
        # profiles written before reductions over several dims existed hold one dim
        if isinstance(data, dict) and "reduction_dim" in data:
            data = dict(data)
            dim = data.pop("reduction_dim")
            data.setdefault("reduction_dims", [] if dim is None else [dim])
        return data

    @property
    def reduction_dim(self) -> int | None:
        """The innermost reduced dim (negative), None for no row reduction."""
        return self.reduction_dims[-1] if self.reduction_dims else None

    @model_validator(mode="after")
    def _tier3_says_why(self):
        if self.tier == 3 and not (self.unsupported_node and self.unsupported_reason):
            raise ValueError("a tier-3 KernelProfile names the node that stops it and why")
        return self

    @model_validator(mode="after")
    def _stored_are_forward_intermediates(self):
        nodes = {n.name: n for n in self.forward.nodes}
        seen: set[str] = set()
        for s in self.stored:
            node = nodes.get(s.name)
            if node is None:
                raise ValueError(
                    f"stored: {s.name!r} names no node of the forward graph; stored entries are "
                    "forward intermediates, e.g. "
                    + (", ".join(n.name for n in self.forward.nodes if n.op == "call_function")
                       or "(the forward graph has none)")
                )  # fmt: skip
            if node.op != "call_function":
                what = "an input" if node.op == "placeholder" else "the graph's output node"
                raise ValueError(
                    f"stored: {s.name!r} is {what}, not a forward intermediate; inputs are kept "
                    "for the backward whenever it reads them"
                )
            if s.name in seen:
                raise ValueError(f"stored: {s.name!r} is listed twice")
            seen.add(s.name)
            is_bool = node.dtype == "torch.bool"
            if is_bool != (s.dtype == "bool"):
                raise ValueError(
                    f"stored: {s.name!r} is a {node.dtype} value; store "
                    + ("it with dtype bool" if is_bool else "a non-bool value as same or fp32")
                )
        return self
