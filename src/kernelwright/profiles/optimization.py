"""OptimizationProfile: what `kernelwright optimize` learned about one op before changing it.

Stage 1 (Profile) writes it; a person reviews the YAML (reorders or deletes strategies, edits
the target or the variant budget); Stage 2 (the variant loop) reads it. Each variant's lab
notebook keeps a machine-readable `VariantRecord` beside its Markdown (`vN.json`); the planner
reads those records, never the Markdown, before choosing the next variant.

`placeholder: true` marks a dry run: the timings come from a deterministic model of the launch
configs (`workflows.optimize.clock`), not from a GPU, and say nothing about speed.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import ConfigDict, Field

from kernelwright.profiles.base import Strict, YamlProfile

SCHEMA_VERSION = 1

Goal = Literal["speed", "memory", "balanced"]
Scope = Literal["forward", "backward", "all"]
BottleneckClass = Literal["memory-bound", "compute-bound", "latency-occupancy-bound"]
Verdict = Literal["accepted", "rejected", "discarded"]


class Part(Strict):
    # NaN is data here (no peak memory on a CPU, a failed point): JSON notebooks write it as
    # NaN, not null, so they read back
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")


class ConfigRow(Part):
    """One row of a launch-config table: the config for row lengths up to `max_n`."""

    max_n: int
    block_n: int
    num_warps: int = 4
    rows: int = 1
    num_stages: int = 1
    programs_per_sm: int = 1
    evict_hints: bool = False  # two-pass kernels' L2 flags (see LaunchConfig)
    reverse_pass: bool = False
    split_row: bool = False  # a row over programs that wait for each other (see LaunchConfig)
    split_prefetch: bool = False  # split rows: the row's counter prefetched (see LaunchConfig)


class Timing(Part):
    """One measurement of the op (provider "kernelwright" unless said) at one shape and mode."""

    shape: str  # "8192x4096", dims in the bench spec's order
    mode: Literal["forward", "backward", "full"]
    provider: str = "kernelwright"
    ms_p20: float
    ms_p50: float
    ms_p80: float
    peak_mem_mb: float  # NaN where the device keeps no statistics (CPU)
    gbps: float = float("nan")
    pct_copy_bw: float = float("nan")
    error: str = ""


class KernelResources(Part):
    """The compiler's resource report for one compiled kernel specialization."""

    kernel: str  # the Triton function's name
    constants: dict[str, int] = Field(default_factory=dict)  # BLOCK_N, ROWS, ... of this build
    num_warps: int
    registers_per_thread: int
    spills: int
    shared_bytes: int
    occupancy: float  # resident warps / the SM's maximum, implied by the three above
    limited_by: str  # "registers" | "threads" | "shared memory" | "blocks"


class RooflinePoint(Part):
    shape: str
    mode: str
    bytes: int
    flops: int = 0
    ms: float
    gbps: float
    pct_copy_bw: float  # achieved bandwidth over the measured copy bandwidth
    tflops: float = float("nan")
    pct_matmul: float = float("nan")  # achieved FLOP rate over the measured matmul rate


class Bottleneck(Part):
    cls: BottleneckClass
    evidence: list[str] = Field(default_factory=list)
    per_shape: dict[str, BottleneckClass] = Field(default_factory=dict)  # "8192x4096 forward"


class StrategyRef(Part):
    """A catalogue strategy, in the order the variant loop tries them (edit to reorder)."""

    name: str
    addresses: str  # the bottleneck (or "any") it is meant for
    why: str


class OptimizationProfile(YamlProfile):
    REGENERATE: ClassVar[str] = "kernelwright optimize"

    schema_version: int = SCHEMA_VERSION
    op: str
    placeholder: bool  # dry run: modelled timings, not speeds
    timing: str  # "cuda_events" | "placeholder (model of the launch configs)"
    gpu: str  # the device's name
    device_arch: str  # the architecture the timings were taken on
    arch: str  # the launch-table key being tuned ("hopper", ...)
    goal: Goal = "speed"
    scope: Scope = "all"
    max_variants: int = 8
    target: str | None = None  # e.g. "full < 0.3 ms at 8192x4096"
    dtype: str = "bfloat16"
    planted_regression: bool = False  # the tuned arch's entry was de-tuned in-process first
    kernels: list[str]  # table kernels in scope, e.g. ["fwd", "bwd"]
    modes: list[str]  # the benchmark modes measured for every variant
    shapes: list[dict[str, int]]  # the benchmark points, named dims
    table_module: str  # "kernelwright.runtime.tables.rms_norm"
    table_snapshot: str  # workspace copy of the table file as it was
    source_snapshot: str  # workspace copy of the op's source
    baseline_table: dict[str, list[ConfigRow]]  # kernel -> rows in effect for `arch`
    copy_gbps: float
    # bf16 matmul rate measured in Stage 1 (TFLOP/s); None in a dry run (no GPU)
    matmul_tflops: float | None = None
    baseline: list[Timing] = Field(default_factory=list)  # v0
    peers: list[Timing] = Field(default_factory=list)  # PyTorch eager at the same points
    resources: list[KernelResources] = Field(default_factory=list)
    resources_note: str = ""  # why the list is empty (interpreter, nothing compiled)
    ncu: dict[str, float] = Field(default_factory=dict)  # Nsight Compute metric -> value
    ncu_note: str = ""  # "not available: ncu is not on PATH", or what ncu said
    roofline: list[RooflinePoint] = Field(default_factory=list)
    bottleneck: Bottleneck
    strategies: list[StrategyRef] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)


class GuardrailCheck(Part):
    name: str
    passed: bool
    detail: str


class VariantRecord(Part):
    """The structured half of one lab notebook (`vN.json`); `vN_notes.md` renders it."""

    version: int
    strategy: str
    addresses: str
    parent: int  # the variant it was built on (0: the baseline)
    placeholder: bool
    hypothesis: str
    change: list[str]  # human-readable edits, "fwd n<=4096: num_warps 8 -> 4"
    expected: str
    table: dict[str, list[ConfigRow]]  # kernel -> rows for the tuned arch
    smoke_passed: bool
    smoke_detail: str = ""
    measured: list[Timing] = Field(default_factory=list)
    objective: float = float("nan")  # geometric mean of the goal's metric (lower is better)
    gain_pct: float = 0.0  # objective improvement over the parent, in %
    vs_baseline_pct: float = 0.0  # objective improvement over v0, in %
    guardrails: list[GuardrailCheck] = Field(default_factory=list)
    verdict: Verdict
    reason: str = ""
    learnings: list[str] = Field(default_factory=list)
