"""DebugProfile: what `kernelwright debug` compared, the probes it ran and where an op diverged.

Stage 1 (Plan) writes the plan: the op and its fp32 reference, each case (function, reference,
inputs maker, options), the tolerances with their source, and the probes per axis (dtypes,
shape regimes, layouts, value regimes, launch configs). A person may edit it (drop a probe,
change a tolerance or the seed) and resume. Stage 2 (Bisect) fills in every probe's result,
the first divergence, the regime it is confined to and the smallest input that still fails.

Axes, one value changed at a time from the base point (case 0, float32, the pow2 shape,
contiguous, normal values, the launch table as it is):
- case: the op's registered cases (options such as `casting_mode="gemma"`, `softcap`);
- dtype: float32, bfloat16, float16;
- shape: pow2 (powers of two), tail (odd sizes), tiny (short rows), many_rows, long_row
  (past the launch table's last bounded row: the looped kernels), huge (the largest input
  past 2^31 elements: on a CUDA device with the memory free only, else "not tried");
- layout: contiguous, row_strided (rows padded), transposed (last dim not contiguous);
- values: normal, large (x 1000), all_equal (each row one value), inf (-inf at some
  positions), nan (NaN at some positions);
- config: every row of the op's launch table at a length it serves ("regime"), and every
  distinct config of the table forced for all lengths ("forced"); not applicable to an op
  that read no row of the table in the other probes (a plain PyTorch function).
The other axes run as one pass per dtype (the base's failing dtype, else float32, bfloat16,
float16 until a pass fails); when the base passed, failing probes are then repeated at the
remaining dtypes.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from kernelwright.profiles.base import Strict, YamlProfile

SCHEMA_VERSION = 1

AXES = ("case", "dtype", "shape", "layout", "values", "config")
DTYPES = ("float32", "bfloat16", "float16")
SHAPES = ("pow2", "tail", "tiny", "many_rows", "long_row", "huge")
LAYOUTS = ("contiguous", "row_strided", "transposed")
VALUES = ("normal", "large", "all_equal", "inf", "nan")
Verdict = Literal["pending", "no divergence", "diverged"]


class CaseSpec(Strict):
    """One way of calling the op: its function and reference ("module:attr"), the inputs
    maker ("module:attr", called as maker(shape, dtype, device, seed) -> {name: tensor}), the
    options passed to both (torch dtypes written as "torch.float32")."""

    label: str
    function: str
    reference: str
    inputs: str
    family: str = (
        "rows"  # how the maker's shape reads: "rows" [..., N], "hidden" [..., H, V], "rope"
    )
    kwargs: dict[str, Any] = Field(default_factory=dict)
    grad_inputs: list[str] | None = None  # None: every float input
    # shape regime -> the maker's shape for it ("pow2" is the base point's)
    shapes: dict[str, list[int]] = Field(default_factory=dict)


class TolSpec(Strict):
    fwd: float  # bound on the outputs' relative-norm error ||out - ref|| / ||ref||
    bwd: float  # bound on every input gradient's relative-norm error


class PassResult(Strict):
    """One compared quantity of a probe: "forward" (output `detail`) or "grad:<input>"."""

    name: str
    detail: str = ""
    error: float  # relative-norm error on the elements where the reference is finite
    max_abs: float = 0.0  # the largest absolute difference there
    tol: float
    ok: bool


class Probe(Strict):
    """One run of the op against its reference at one point of the axes."""

    axis: str  # the axis this probe varies ("base" for the base point)
    value: str  # its value on that axis
    case: str
    dtype: str
    shape: list[int]
    shape_regime: str
    layout: str
    values: str
    config: str  # "table" (as it is) or the launch config row in force
    # skipped: it ran and says nothing (the reference raised); not tried: it cannot run here
    # (a huge input without a GPU or the memory it needs); not applicable: the axis does not
    # apply to this op (config: it read no row of the launch table); `message` says why
    status: Literal["pass", "fail", "skipped", "not tried", "not applicable"]
    failing: list[str] = Field(default_factory=list)  # the failing passes, in order
    max_error: float = 0.0  # the largest error / tol ratio's error
    passes: list[PassResult] = Field(default_factory=list)
    message: str = ""  # an exception, why the probe was skipped or not tried, how it compared
    seconds: float = 0.0


class Divergence(Strict):
    """The first failing probe, its regime and the smallest input that still fails."""

    pass_name: str  # "forward", "grad:<input>" or "backward" (the backward raised)
    passes: list[str]  # every failing pass of that probe
    case: str
    dtype: str
    shape: list[int]
    shape_regime: str
    layout: str
    values: str
    config: str
    error: float
    tol: float
    message: str = ""
    minimal_shape: list[int]
    shrink_steps: list[list[int]] = Field(default_factory=list)  # the shapes tried that failed
    # a huge input: the inputs split into chunks of rows for the reference (None: whole)
    rows: list[str] | None = None
    # per axis, the values whose probe failed (the base point's value included when it failed)
    regime: dict[str, list[str]] = Field(default_factory=dict)
    summary: str  # one sentence: what diverges, where, and where not


class DebugProfile(YamlProfile):
    REGENERATE: ClassVar[str] = "kernelwright debug"

    schema_version: int = SCHEMA_VERSION
    name: str
    target: str  # as given on the command line
    kind: Literal["library", "created", "function"]
    device: str
    arch: str  # the launch-table key in force on this device
    seed: int = 0
    launch_table: str | None = None  # the table module whose rows the config axis probes
    sys_path: list[str] = Field(default_factory=list)  # folders the op's module is imported from
    tolerance_source: str
    tolerances: dict[str, TolSpec]  # by dtype name
    cases: list[CaseSpec]
    # the probes to run, per axis (edit to drop some); config: "regime" and/or "forced"
    dtypes: list[str] = Field(default_factory=lambda: list(DTYPES))
    shapes: list[str] = Field(default_factory=lambda: list(SHAPES))
    layouts: list[str] = Field(default_factory=lambda: list(LAYOUTS))
    values: list[str] = Field(default_factory=lambda: list(VALUES))
    configs: list[Literal["regime", "forced"]] = Field(default_factory=lambda: ["regime", "forced"])
    shrink: bool = True
    verdict: Verdict = "pending"
    probes: list[Probe] = Field(default_factory=list)
    divergence: Divergence | None = None
    notes: list[str] = Field(default_factory=list)


# --------------------------------------------------------------------------- a model


class VsFp32(Strict):
    """A half-precision run against the fp32 reference (the unpatched model in float32): the
    patched model's errors, and the unpatched model's own (what the dtype costs there already).
    The fp32 view's bound on each is the dtype's tolerance plus the unpatched one's error
    (times `fp32_base_factor`)."""

    forward: float | None = None
    grad: float | None = None
    input_grad: float | None = None
    forward_unpatched: float | None = None
    grad_unpatched: float | None = None
    input_grad_unpatched: float | None = None


class ModuleCheck(Strict):
    """One module call of the reference model, in the order the calls finished (children before
    their parent), against the same call in the patched model."""

    index: int
    name: str  # "model.layers.1.mlp"; a module called twice: "name#1" for the second call
    cls: str
    forward_error: float | None = None  # its output (the first tensor of it); None: no output
    grad_error: float | None = None  # the gradient of that output; None: none flowed
    input_grad_error: float | None = None  # the gradient of its input (the first tensor)
    patched: bool = False  # its forward is kernelwright's in the patched model
    input: int | None = None  # the tensor it took as input: calls given the same one share it
    fp32: VsFp32 | None = None  # a bf16 run: the same errors against the fp32 reference


class ParamCheck(Strict):
    name: str
    error: float  # against the unpatched model in the run's dtype
    ok: bool  # within the bound of the view that decides (`reference_dtype`)
    fp32_error: float | None = None  # a bf16 run: against the fp32 reference
    fp32_unpatched_error: float | None = None  # the unpatched bf16 model's, against fp32


class ModelDivergence(Strict):
    pass_name: Literal["forward", "backward"]
    module: str
    cls: str
    error: float
    tol: float  # the bound it exceeded (fp32 view: the tolerance + the unpatched one's error)
    evidence: str  # what diverged first: its output, or the gradient of its input
    summary: str
    view: Literal["same", "float32"] = "same"  # against which reference


class ModelDebugProfile(YamlProfile):
    """`kernelwright debug MODEL`: a patched model against the same model unpatched, module by
    module, on one batch (forward outputs, gradients of every module's output and input, and
    every parameter's gradient). A bf16 run has two views: against the unpatched model in bf16
    ("same") and against it in fp32 ("float32"); `reference_dtype` names the one that decides
    the verdict, `divergences` holds each view's first divergence."""

    REGENERATE: ClassVar[str] = "kernelwright debug"

    schema_version: int = SCHEMA_VERSION
    name: str
    target: str
    model_type: str
    architecture: str
    device: str
    dtype: str
    reference_dtype: Literal["same", "float32"] = "same"
    seed: int = 0
    batch: int
    seq: int
    weights: str | None = None  # the checkpoint folder loaded; None: initialised from the seed
    patched: list[str] = Field(default_factory=list)  # the modules the patch replaced
    tolerance_source: str
    tolerance: TolSpec
    loss_reference: float
    loss_patched: float
    loss_fp32: float | None = None  # a bf16 run: the unpatched model's loss in fp32
    # the fp32 view's bound: the tolerance + this factor x the unpatched run's own error (2
    # under Triton's interpreter, whose casts to bf16 truncate instead of rounding to nearest)
    fp32_base_factor: float = 1.0
    verdict: Verdict = "pending"
    divergence: ModelDivergence | None = None
    divergences: dict[str, ModelDivergence | None] = Field(default_factory=dict)
    modules: list[ModuleCheck] = Field(default_factory=list)
    params: list[ParamCheck] = Field(default_factory=list)
    plot: str | None = None  # the per-module error growth (PNG), beside the profile
    notes: list[str] = Field(default_factory=list)


# --------------------------------------------------------------------------- a compiled model


class SiteCheck(Strict):
    """One site of `kernelwright.compile`'s rewrite (a `Site` of its report)."""

    key: str  # "graph:output node" (Site.key), the name `rewrite(only=...)` takes
    graph: int  # the captured graph; -1: a loop rewritten in the source
    pattern: str
    op: str
    impl: str
    nodes: list[str]  # the replaced nodes, output last
    module: str = ""  # the module its output is computed in ("" when the graph does not say)
    replaced: bool
    reason: str


class QuantityCheck(Strict):
    """One compared quantity of a run: "output:<name>" (forward) or "grad:<parameter>"."""

    name: str
    error: float
    bound: float
    ok: bool


class CompiledRun(Strict):
    """One run of the compiled model with some sites replaced, against eager."""

    label: str  # "every site", "no site", "first 3 sites", "only <key>", ...
    replaced: list[str]  # the keys of the sites replaced in it
    diverged: bool
    failing: list[str] = Field(default_factory=list)  # the quantities beyond their bound
    seconds: float = 0.0


class CompiledDivergence(Strict):
    pass_name: Literal["forward", "backward"]
    site: SiteCheck | None  # None: it diverges with no site replaced (not the rewrite)
    alone: bool | None = None  # the site replaced alone diverges too (None: not run)
    evidence: list[str]  # the failing quantities where the site was localised
    error: float  # the worst of them
    tol: float  # its bound
    summary: str


class CompiledDebugProfile(YamlProfile):
    """`kernelwright debug MODEL --compiled`: the model through `kernelwright.compile` against
    eager; on a divergence, the replaced sites bisected to the first whose replacement
    diverges."""

    REGENERATE: ClassVar[str] = "kernelwright debug --compiled"

    schema_version: int = SCHEMA_VERSION
    name: str
    target: str
    architecture: str
    device: str
    dtype: str
    reference_dtype: Literal["same", "float32"] = "same"
    seed: int = 0
    backend: str  # the compiler after the rewrite
    tolerance_source: str
    tolerance: TolSpec
    graphs: int = 0
    breaks: list[str] = Field(default_factory=list)
    sites: list[SiteCheck] = Field(default_factory=list)
    checks: list[QuantityCheck] = Field(default_factory=list)  # every site replaced
    runs: list[CompiledRun] = Field(default_factory=list)
    verdict: Verdict = "pending"
    divergence: CompiledDivergence | None = None
    notes: list[str] = Field(default_factory=list)
