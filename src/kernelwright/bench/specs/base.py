"""The benchmark declaration types (`BenchSpec`, `Provider`, `Sweep`), `SPECS` and the
provider builders the per-family spec modules share.

A spec says what to run and what the ideal costs; the harness (`bench.harness`) says how to
time it. To benchmark a new op, write its spec in the family's module of this package (or a
new one imported by `__init__`) and call `register(spec)`:

- providers: name -> a builder that takes the inputs and returns a zero-argument function
  running the op's forward on them (ours, eager PyTorch, torch.compile, peers if importable);
  our op's module and functions come from its registry entry (`ours`, `torch_providers`);
- `make_inputs`: fresh random inputs (never zeros: zeros hide unwritten outputs and can run
  faster than real data), and which of them get gradients;
- `bytes`: the minimal device-memory traffic per mode (each input read once, each output
  written once), with a comment that counts it — achieved GB/s is this over the time;
- `flops` (compute-bound ops only): the floating-point operations per mode — TFLOP/s;
- sweeps: (x name, x values, fixed dims), the values taken from `bench.models`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from kernelwright import registry

MODES = ("forward", "backward", "full")

Shape = Mapping[str, int]  # named dims, e.g. {"tokens": 8192, "hidden": 4096}
Inputs = Mapping[str, torch.Tensor]
Builder = Callable[[Inputs], Callable[[], Any]]


@dataclass(frozen=True)
class Provider:
    name: str
    build: Builder  # inputs -> fn() running the forward; may raise (missing package...)
    requires: str | None = None  # a module that must import, for peers such as liger_kernel
    compiled: bool = False  # built with torch.compile: slow to build, left out on CPU by default
    # Writes into its inputs or into dy (in-place backward): the harness copies the original
    # values back before every rep, so no rep runs on what the last one wrote.
    mutates: bool = False
    # Seconds a call at the sweeps' real shapes (a Python loop of launches): left out of quick
    # runs on a GPU (`--quick`, the demo) unless named; full sweeps and the CPU keep it.
    slow: bool = False


@dataclass(frozen=True)
class Sweep:
    name: str  # the dim that varies: the x axis and the CSV's x_name
    values: tuple[int, ...]
    fixed: Mapping[str, int]  # the other dims

    def shapes(self) -> list[tuple[int, dict[str, int]]]:
        return [(v, {**self.fixed, self.name: v}) for v in self.values]


@dataclass(frozen=True)
class BenchSpec:
    op: str
    dims: tuple[str, ...]  # order of the dims in the shape label, e.g. ("tokens", "hidden")
    providers: tuple[Provider, ...]
    make_inputs: Callable[..., dict[str, torch.Tensor]]  # (shape, dtype, device, *, seed=0)
    grad_inputs: tuple[str, ...]
    bytes: Callable[[Shape, torch.dtype, str], int]  # (shape, dtype, mode) -> bytes moved
    sweeps: tuple[Sweep, ...]  # the full sweeps, on a GPU
    quick_sweeps: tuple[Sweep, ...]  # `--quick` on a GPU: a couple of real shapes
    # Under the interpreter every program instance takes milliseconds on the CPU: tiny shapes,
    # which exercise the harness end to end but say nothing about speed.
    interpreter_sweeps: tuple[Sweep, ...]
    backward_through: tuple[int, ...] = (0,)  # outputs that backward runs through
    input_bytes: Callable[[Shape, torch.dtype], int] | None = None
    max_input_bytes: int | None = None  # shapes whose inputs are larger are skipped
    notes: Mapping[str, str] = field(default_factory=dict)  # provider -> what it measures
    # Losses: the backward gets dy = 1, as `loss.backward()` gives it (ops with a fast path for
    # a unit gradient take it, as they would in training); other ops get a random dy.
    unit_grad: bool = False
    # A graph takes one backward (ours computes the gradient in the forward and scales it in
    # place in the backward): "backward" mode runs a fresh, untimed forward before every rep
    # instead of re-walking one retained graph. Every provider of the spec is timed that way.
    backward_once: bool = False
    # Compute-bound ops: (shape, dtype, mode) -> floating-point operations, with a comment that
    # counts them; the rows then carry flops and TFLOP/s beside the byte model's GB/s.
    flops: Callable[[Shape, torch.dtype, str], int] | None = None
    # The grad inputs reach the provider as views of the leaves (non-leaf tensors, as inside a
    # model). For ops whose backward hands one tensor to two inputs (fused_add_rms_norm: ds is
    # the gradient of x and of residual): with both inputs leaves, AccumulateGrad would copy
    # it for one of them (an extra read and write of [M, N], for every provider) — a copy no
    # decoder layer makes. Elsewhere it makes no difference.
    grad_through_views: bool = False
    # Dims that follow from the named ones, for readers that need another measure of a shape:
    # (shape) -> {name: value}. The selection's shape buckets (compile/select.py) read them.
    derived_dims: Callable[[Shape], Mapping[str, int]] | None = None

    @property
    def provider_names(self) -> list[str]:
        return [p.name for p in self.providers]

    def provider(self, name: str) -> Provider:
        for p in self.providers:
            if p.name == name:
                return p
        raise KeyError(f"{self.op}: no provider {name!r}; known: {', '.join(self.provider_names)}")

    def sweep(self, name: str, *, quick: bool = False, interpreter: bool = False) -> Sweep:
        for s in self.sweeps_for(quick=quick, interpreter=interpreter):
            if s.name == name:
                return s
        known = sorted({s.name for s in self.sweeps + self.quick_sweeps + self.interpreter_sweeps})
        raise KeyError(f"{self.op}: no sweep {name!r}; known: {', '.join(known)}")

    def sweeps_for(self, *, quick: bool, interpreter: bool) -> tuple[Sweep, ...]:
        if interpreter:
            return self.interpreter_sweeps
        return self.quick_sweeps if quick else self.sweeps

    def shape_label(self, shape: Shape) -> str:
        return "x".join(str(shape[d]) for d in self.dims)

    def too_large(self, shape: Shape, dtype: torch.dtype) -> str | None:
        """Why `shape` is skipped, or None when it is measured."""
        if self.input_bytes is None or self.max_input_bytes is None:
            return None
        n = self.input_bytes(shape, dtype)
        if n > self.max_input_bytes:
            cap = self.max_input_bytes / 1e9
            return f"skipped: inputs take {n / 1e9:.1f} GB, over the {cap:.0f} GB cap"
        return None


SPECS: dict[str, BenchSpec] = {}


def register(spec: BenchSpec) -> BenchSpec:
    if spec.op in SPECS:
        raise ValueError(f"a benchmark spec for {spec.op!r} is already registered")
    SPECS[spec.op] = spec
    return spec


def get_spec(op: str) -> BenchSpec:
    """The benchmark spec named `op`; an unknown name says which ops have one. A library op's
    spec also times its created implementation, where `create --implements` made one."""
    if op in SPECS:
        return _with_created(SPECS[op])
    created = {e.name: e for e in registry.entries() if e.generated}
    if op in created:  # an op `create --into-library` added: its module declares its benchmark
        from kernelwright.bench.created import spec_of

        return spec_of(created[op])
    if op in registry.names():
        raise registry.UnknownOpError(
            f"{op} has no benchmark spec (its registry entry names none); ops with one: "
            f"{', '.join(SPECS)}"
        )
    raise registry.unknown_op(op, [*SPECS, *created], "op with a benchmark spec")


def _with_created(spec: BenchSpec) -> BenchSpec:
    """`spec` plus a provider per created implementation of its op (`Impl.inputs`: the spec's
    inputs in the created kernel's argument order; its constants are its own)."""
    if spec.op not in registry.names(generated=False):
        return spec
    extra = tuple(
        Provider(impl.provider, call(*impl.function.split(":", 1), impl.inputs))
        for impl in registry.get(spec.op).impls
        if impl.name == "created" and impl.provider not in spec.provider_names
    )
    return replace(spec, providers=spec.providers + extra) if extra else spec


def importable(module: str) -> bool:
    """True when `module` imports (peers are optional; a broken install counts as absent)."""
    try:
        registry.resolve(module)
    except Exception:
        return False
    return True


def compiled(fn: Callable) -> Callable:
    # dynamic=False: one static graph per shape, as a training step of fixed shape gets; the
    # harness raises dynamo's recompile limit so no shape falls back to eager.
    return torch.compile(fn, dynamic=False)


def call(
    module: str, fn: str, names: tuple[str, ...], *args: Any, compile_it: bool = False, **kw: Any
) -> Builder:
    """A builder running `module.fn(*(inputs[n] for n in names), *args, **kw)`.

    `fn` may be dotted (a peer's "Function.apply"). It is looked up when the provider is built,
    not here, so the harness works while one op's module (or a peer) is broken or missing: its
    providers then give error rows. With `compile_it`, the function runs under torch.compile.
    """

    def build(inp: Inputs):
        f = registry.resolve(module, fn)
        if compile_it:
            f = compiled(f)
        a = tuple(inp[n] for n in names)
        return lambda: f(*a, *args, **kw)

    return build


def torch_providers(
    module: str, eager_fn: str, names: tuple[str, ...], *args: Any, **kw: Any
) -> tuple[Provider, Provider]:
    """The eager PyTorch form of an op (`torch`) and the same under torch.compile."""
    return (
        Provider("torch", call(module, eager_fn, names, *args, **kw)),
        Provider(
            "torch_compile",
            call(module, eager_fn, names, *args, compile_it=True, **kw),
            compiled=True,
        ),
    )


def ours(op: str, fn: str | None = None) -> tuple[str, str]:
    """(module, function) of op `op`'s public function (or of `fn`, another function of its
    module), as its registry entry declares them: `call(*ours("rms_norm"), names, ...)`."""
    entry = registry.get(op)
    return entry.module, fn or entry.function


def op_torch_providers(op: str, names: tuple[str, ...], *args: Any, **kw: Any):
    """`torch_providers` of the eager form the op's registry entry names."""
    entry = registry.get(op)
    if entry.eager is None:
        raise ValueError(f"{op}: its registry entry names no eager form (`eager=`)")
    return torch_providers(entry.module, entry.eager, names, *args, **kw)


# --------------------------------------------------------------------------- one-input ops


def unary_providers(op: str, liger: tuple[str, str] | None) -> tuple[Provider, ...]:
    # Ops of one input x: ours, its eager PyTorch form, that compiled, and Liger's Function
    # (which allocates its own gradient: nothing is written over the inputs).
    peer = () if liger is None else (
        Provider("liger", call(liger[0], liger[1] + ".apply", ("x",)), requires="liger_kernel"),
    )  # fmt: skip
    return (
        Provider("kernelwright", call(*ours(op), ("x",))),
        *op_torch_providers(op, ("x",)),
        *peer,
    )
