"""Benchmark declarations: one `BenchSpec` per op, registered in `SPECS`.

A spec says what to run and what the ideal costs; the harness (`bench.harness`) says how to
time it. To benchmark a new op, write its spec below (or in the op's own module) and call
`register(spec)`:

- providers: name -> a builder that takes the inputs and returns a zero-argument function
  running the op's forward on them (ours, eager PyTorch, torch.compile, peers if importable);
- `make_inputs`: fresh random inputs (never zeros: zeros hide unwritten outputs and can run
  faster than real data), and which of them get gradients;
- `bytes`: the minimal device-memory traffic per mode (each input read once, each output
  written once), with a comment that counts it — achieved GB/s is this over the time;
- `flops` (compute-bound ops only): the floating-point operations per mode — TFLOP/s;
- sweeps: (x name, x values, fixed dims), the values taken from `bench.models`.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from kernelwright.bench.models import (
    DEFAULT_TOKENS,
    MODELS,
    REFERENCE,
    distinct,
    token_counts,
)
from kernelwright.testing import class_targets, generator, rand

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
    # decoder layer makes (benchmarks/leaf_grad_probe.py). Elsewhere it makes no difference.
    grad_through_views: bool = False

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
    try:
        return SPECS[op]
    except KeyError:
        raise KeyError(f"no benchmark spec for {op!r}; known: {', '.join(sorted(SPECS))}") from None


def importable(module: str) -> bool:
    """True when `module` imports (peers are optional; a broken install counts as absent)."""
    try:
        importlib.import_module(module)
    except Exception:
        return False
    return True


def compiled(fn: Callable) -> Callable:
    # dynamic=False: one static graph per shape, as a training step of fixed shape gets; the
    # harness raises dynamo's recompile limit so no shape falls back to eager.
    return torch.compile(fn, dynamic=False)


def _call(
    module: str, fn: str, names: tuple[str, ...], *args: Any, compile_it: bool = False, **kw: Any
) -> Builder:
    """A builder running `module.fn(*(inputs[n] for n in names), *args, **kw)`.

    `fn` may be dotted (a peer's "Function.apply"). It is looked up when the provider is built,
    not here, so the harness works while one op's module (or a peer) is broken or missing: its
    providers then give error rows. With `compile_it`, the function runs under torch.compile.
    """

    def build(inp: Inputs):
        f: Any = importlib.import_module(module)
        for part in fn.split("."):
            f = getattr(f, part)
        if compile_it:
            f = compiled(f)
        a = tuple(inp[n] for n in names)
        return lambda: f(*a, *args, **kw)

    return build


def _torch_providers(
    module: str, eager_fn: str, names: tuple[str, ...], *args: Any, **kw: Any
) -> tuple[Provider, Provider]:
    """The eager PyTorch form of an op (`torch`) and the same under torch.compile."""
    return (
        Provider("torch", _call(module, eager_fn, names, *args, **kw)),
        Provider(
            "torch_compile",
            _call(module, eager_fn, names, *args, compile_it=True, **kw),
            compiled=True,
        ),
    )


# --------------------------------------------------------------------------- rms_norm

EPS = 1e-6


def _rms_norm_inputs(shape: Shape, dtype: torch.dtype, device, *, seed: int = 0):
    gen = generator(seed)
    m, n = shape["tokens"], shape["hidden"]
    return {
        "x": rand((m, n), dtype, device, gen=gen),  # [M, N]
        "weight": rand((n,), dtype, device, gen=gen, mean=1.0, std=0.1),  # [N], near 1 as trained
    }


def _rms_norm_bytes(shape: Shape, dtype: torch.dtype, mode: str) -> int:
    m, n, s = shape["tokens"], shape["hidden"], dtype.itemsize
    # forward: read x (M*N*s) and w (N*s); write y (M*N*s) and rstd (M fp32, saved for bwd)
    fwd = m * n * s + n * s + m * n * s + m * 4
    # backward: read dy and x (2*M*N*s), w (N*s), rstd (M*4); write dx (M*N*s), dw (N*s)
    bwd = 2 * m * n * s + n * s + m * 4 + m * n * s + n * s
    return {"forward": fwd, "backward": bwd, "full": fwd + bwd}[mode]


def _rms_norm_providers() -> tuple[Provider, ...]:
    m, names = "kernelwright.ops.rms_norm", ("x", "weight")
    liger = ("liger_kernel.ops.rms_norm", "LigerRMSNormFunction.apply")
    return (
        Provider("kernelwright", _call(m, "rms_norm", names, EPS, in_place_backward=False)),
        Provider(
            "kernelwright_inplace",
            _call(m, "rms_norm", names, EPS, in_place_backward=True),
            mutates=True,
        ),
        *_torch_providers(m, "rms_norm_eager", names, EPS, casting_mode="llama"),
        # (X, W, eps, offset, casting_mode, in_place): in_place=True is Liger's default, so
        # this is Liger as users get it — dx written over dy.
        Provider(
            "liger",
            _call(*liger, names, EPS, 0.0, "llama", True),
            requires="liger_kernel",
            mutates=True,
        ),
    )


RMS_NORM = register(
    BenchSpec(
        op="rms_norm",
        dims=("tokens", "hidden"),
        providers=_rms_norm_providers(),
        make_inputs=_rms_norm_inputs,
        grad_inputs=("x", "weight"),
        bytes=_rms_norm_bytes,
        sweeps=(
            Sweep("hidden", distinct("hidden"), {"tokens": DEFAULT_TOKENS}),
            Sweep("tokens", token_counts(1024, 32768), {"hidden": REFERENCE.hidden}),
        ),
        quick_sweeps=(
            # Llama-3-8B's and the widest (405B) hidden size, as in GPU.md's table
            Sweep("hidden", (REFERENCE.hidden, distinct("hidden")[-1]), {"tokens": DEFAULT_TOKENS}),
        ),
        interpreter_sweeps=(Sweep("hidden", (256, 512), {"tokens": 64}),),
        notes={
            "kernelwright_inplace": "in_place_backward=True: dx over dy (Liger's default)",
            "liger": "LigerRMSNormFunction, in_place=True (its default)",
        },
    )
)


# --------------------------------------------------------------------------- fused_add_rms_norm


def _fused_add_inputs(shape: Shape, dtype: torch.dtype, device, *, seed: int = 0):
    gen = generator(seed)
    m, n = shape["tokens"], shape["hidden"]
    return {
        "x": rand((m, n), dtype, device, gen=gen),  # [M, N] sublayer output
        "residual": rand((m, n), dtype, device, gen=gen),  # [M, N] residual stream
        "weight": rand((n,), dtype, device, gen=gen, mean=1.0, std=0.1),  # [N]
    }


def _fused_add_bytes(shape: Shape, dtype: torch.dtype, mode: str) -> int:
    m, n, s = shape["tokens"], shape["hidden"], dtype.itemsize
    # forward: read x, residual (2*M*N*s), w; write y, s = x + residual (2*M*N*s), rstd (M*4)
    fwd = 4 * m * n * s + n * s + m * 4
    # backward: read dy, ds_out, s (3*M*N*s), w, rstd; write d(x) = d(residual) (M*N*s), dw
    bwd = 4 * m * n * s + 2 * n * s + m * 4
    return {"forward": fwd, "backward": bwd, "full": fwd + bwd}[mode]


def _fused_add_providers() -> tuple[Provider, ...]:
    m, names = "kernelwright.ops.fused_add_rms_norm", ("x", "residual", "weight")
    liger = ("liger_kernel.ops.fused_add_rms_norm", "LigerFusedAddRMSNormFunction.apply")
    return (
        Provider("kernelwright", _call(m, "fused_add_rms_norm", names, EPS)),
        *_torch_providers(m, "fused_add_rms_norm_eager", names, EPS),
        # (X, R, W, eps, offset, casting_mode, in_place): in_place=False is its default
        Provider("liger", _call(*liger, names, EPS, 0.0, "llama", False), requires="liger_kernel"),
    )


FUSED_ADD_RMS_NORM = register(
    BenchSpec(
        op="fused_add_rms_norm",
        dims=("tokens", "hidden"),
        providers=_fused_add_providers(),
        make_inputs=_fused_add_inputs,
        grad_inputs=("x", "residual", "weight"),
        bytes=_fused_add_bytes,
        backward_through=(0, 1),
        grad_through_views=True,
        sweeps=(
            Sweep("hidden", distinct("hidden"), {"tokens": DEFAULT_TOKENS}),
            Sweep("tokens", token_counts(1024, 32768), {"hidden": REFERENCE.hidden}),
        ),
        quick_sweeps=(
            # hidden 4096 and 16384, the sizes the issue benchmarks against Liger
            Sweep("hidden", (REFERENCE.hidden, distinct("hidden")[-1]), {"tokens": DEFAULT_TOKENS}),
        ),
        interpreter_sweeps=(Sweep("hidden", (256, 512), {"tokens": 64}),),
    )
)


# --------------------------------------------------------------------------- layer_norm

LN_EPS = 1e-5


def _layer_norm_inputs(shape: Shape, dtype: torch.dtype, device, *, seed: int = 0):
    gen = generator(seed)
    m, n = shape["tokens"], shape["hidden"]
    return {
        "x": rand((m, n), dtype, device, gen=gen),  # [M, N]
        "weight": rand((n,), dtype, device, gen=gen, mean=1.0, std=0.1),  # [N], near 1 as trained
        "bias": rand((n,), dtype, device, gen=gen, std=0.1),  # [N], near 0 as trained
    }


def _layer_norm_bytes(shape: Shape, dtype: torch.dtype, mode: str) -> int:
    m, n, s = shape["tokens"], shape["hidden"], dtype.itemsize
    # forward: read x (M*N*s), w and b (2*N*s); write y (M*N*s), mean and rstd (2*M fp32, saved
    # for the backward)
    fwd = m * n * s + 2 * n * s + m * n * s + 2 * m * 4
    # backward: read dy and x (2*M*N*s), w (N*s), mean and rstd (2*M*4); write dx (M*N*s),
    # dw and db (2*N*s). The fp32 [programs, N] partial sums stay in L2 and are not counted.
    bwd = 2 * m * n * s + n * s + 2 * m * 4 + m * n * s + 2 * n * s
    return {"forward": fwd, "backward": bwd, "full": fwd + bwd}[mode]


def _layer_norm_providers() -> tuple[Provider, ...]:
    m, names = "kernelwright.ops.layer_norm", ("x", "weight", "bias")
    liger = ("liger_kernel.ops.layer_norm", "LigerLayerNormFunction.apply")
    return (
        Provider("kernelwright", _call(m, "layer_norm", names, LN_EPS)),
        *_torch_providers(m, "layer_norm_eager", names, LN_EPS),
        # (X, W, B, eps); Liger allocates dx, so nothing is written over the inputs or dy
        Provider("liger", _call(*liger, names, LN_EPS), requires="liger_kernel"),
    )


LAYER_NORM = register(
    BenchSpec(
        op="layer_norm",
        dims=("tokens", "hidden"),
        providers=_layer_norm_providers(),
        make_inputs=_layer_norm_inputs,
        grad_inputs=("x", "weight", "bias"),
        bytes=_layer_norm_bytes,
        sweeps=(
            Sweep("hidden", distinct("hidden"), {"tokens": DEFAULT_TOKENS}),
            Sweep("tokens", token_counts(1024, 32768), {"hidden": REFERENCE.hidden}),
        ),
        quick_sweeps=(
            Sweep("hidden", (REFERENCE.hidden, distinct("hidden")[-1]), {"tokens": DEFAULT_TOKENS}),
        ),
        interpreter_sweeps=(Sweep("hidden", (256, 512), {"tokens": 64}),),
        notes={"liger": "LigerLayerNormFunction (X, W, B, eps)"},
    )
)


# --------------------------------------------------------------------------- one-input ops


def _unary_providers(
    module: str, fn: str, eager_fn: str, liger: tuple[str, str]
) -> tuple[Provider, ...]:
    # Ops of one input x: ours, its eager PyTorch form, that compiled, and Liger's Function
    # (which allocates its own gradient: nothing is written over the inputs).
    return (
        Provider("kernelwright", _call(module, fn, ("x",))),
        *_torch_providers(module, eager_fn, ("x",)),
        Provider("liger", _call(liger[0], liger[1] + ".apply", ("x",)), requires="liger_kernel"),
    )


# --------------------------------------------------------------------------- softmax

SOFTMAX_ROWS = 4096  # rows of a logits block; 4096 x 262144 bf16 is 2 GiB (fp32: 4 GiB)


def _softmax_inputs(shape: Shape, dtype: torch.dtype, device, *, seed: int = 0):
    m, n = shape["rows"], shape["n"]
    # std 4: logits-like spread, so the max shift and the exp both matter
    return {"x": rand((m, n), dtype, device, gen=generator(seed), std=4.0)}  # [M, N]


def _softmax_bytes(shape: Shape, dtype: torch.dtype, mode: str) -> int:
    mn_s = shape["rows"] * shape["n"] * dtype.itemsize
    # forward: read x, write y                       -> 2 * M*N*s (the minimum: the looped
    #   kernel's second read of x, for rows past 65536, is not counted, so it tops out at 2/3)
    # backward: read dy and the saved y, write dx    -> 3 * M*N*s
    return {"forward": 2, "backward": 3, "full": 5}[mode] * mn_s


def _softmax_input_bytes(shape: Shape, dtype: torch.dtype) -> int:
    return shape["rows"] * shape["n"] * dtype.itemsize


SOFTMAX = register(
    BenchSpec(
        op="softmax",
        dims=("rows", "n"),
        providers=_unary_providers(
            "kernelwright.ops.softmax",
            "softmax",
            "softmax_eager",
            ("liger_kernel.ops.softmax", "LigerSoftmaxFunction"),
        ),
        make_inputs=_softmax_inputs,
        grad_inputs=("x",),
        bytes=_softmax_bytes,
        sweeps=(
            # powers of two across the fused/looped switch (65536) plus the models' vocabularies
            Sweep(
                "n",
                tuple(
                    sorted({4096, 8192, 16384, 32768, 65536, 131072, 262144, *distinct("vocab")})
                ),
                {"rows": SOFTMAX_ROWS},
            ),
        ),
        quick_sweeps=(Sweep("n", (32768, REFERENCE.vocab), {"rows": SOFTMAX_ROWS}),),
        interpreter_sweeps=(Sweep("n", (512, 5000), {"rows": 16}),),
        input_bytes=_softmax_input_bytes,
        max_input_bytes=2**32,  # 4 GiB: 4096 x 262144 in fp32 just fits
    )
)


# --------------------------------------------------------------------------- gated MLP activations


def _gated_inputs(shape: Shape, dtype: torch.dtype, device, *, seed: int = 0):
    gen = generator(seed)
    m, n = shape["tokens"], shape["intermediate"]
    return {
        "gate": rand((m, n), dtype, device, gen=gen),  # [M, N] = x @ W_gate^T
        "up": rand((m, n), dtype, device, gen=gen),  # [M, N] = x @ W_up^T
    }


def _gated_bytes(shape: Shape, dtype: torch.dtype, mode: str) -> int:
    mn_s = shape["tokens"] * shape["intermediate"] * dtype.itemsize
    # forward: read gate, up; write out = act(gate) * up              -> 3 * M*N*s
    # backward: read dout, gate, up (act recomputed); write dgate, dup -> 5 * M*N*s
    per_mode = {"forward": 3, "backward": 5, "full": 8}
    return per_mode[mode] * mn_s


def _gated_input_bytes(shape: Shape, dtype: torch.dtype) -> int:
    return 2 * shape["tokens"] * shape["intermediate"] * dtype.itemsize


def _gated_providers(
    module: str, fn: str, eager_fn: str, liger: tuple[str, str], **kwargs
) -> tuple[Provider, ...]:
    names = ("gate", "up")
    return (
        Provider("kernelwright", _call(module, fn, names, in_place_backward=False, **kwargs)),
        Provider(
            "kernelwright_inplace",
            _call(module, fn, names, in_place_backward=True, **kwargs),
            mutates=True,
        ),
        *_torch_providers(module, eager_fn, names, **kwargs),
        # Liger's backward writes dgate/dup into the saved gate/up buffers (in place, always).
        Provider(
            "liger",
            _call(liger[0], liger[1] + ".apply", names),
            requires="liger_kernel",
            mutates=True,
        ),
    )


def _gated_spec(op: str, providers: tuple[Provider, ...], liger_note: str) -> BenchSpec:
    return BenchSpec(
        op=op,
        dims=("tokens", "intermediate"),
        providers=providers,
        make_inputs=_gated_inputs,
        grad_inputs=("gate", "up"),
        bytes=_gated_bytes,
        sweeps=(
            Sweep("tokens", token_counts(1024, 16384), {"intermediate": REFERENCE.intermediate}),
            Sweep("intermediate", distinct("intermediate"), {"tokens": DEFAULT_TOKENS}),
        ),
        quick_sweeps=(
            Sweep("tokens", (DEFAULT_TOKENS, 16384), {"intermediate": REFERENCE.intermediate}),
        ),
        interpreter_sweeps=(Sweep("intermediate", (256, 512), {"tokens": 64}),),
        input_bytes=_gated_input_bytes,
        # Full mode holds inputs, output, saved tensors and both grads at once (~3.5x inputs);
        # past 8 GB of inputs the run is about memory capacity, not the kernel.
        max_input_bytes=8 * 10**9,
        notes={"liger": liger_note},
    )


SWIGLU = register(
    _gated_spec(
        "swiglu",
        _gated_providers(
            "kernelwright.ops.swiglu",
            "swiglu",
            "swiglu_eager",
            ("liger_kernel.ops.swiglu", "LigerSiLUMulFunction"),
        ),
        "LigerSiLUMulFunction: grads written in place into gate/up",
    )
)

# Gemma's gelu_pytorch_tanh, the form Liger implements.
GEGLU = register(
    _gated_spec(
        "geglu",
        _gated_providers(
            "kernelwright.ops.geglu",
            "geglu",
            "geglu_eager",
            ("liger_kernel.ops.geglu", "LigerGELUMulFunction"),
            approximate="tanh",
        ),
        "LigerGELUMulFunction (tanh approximation): grads written in place into gate/up",
    )
)


# --------------------------------------------------------------------------- relu_squared


def _relu_squared_inputs(shape: Shape, dtype: torch.dtype, device, *, seed: int = 0):
    m, n = shape["tokens"], shape["intermediate"]
    return {"x": rand((m, n), dtype, device, gen=generator(seed))}  # [M, N] = x @ W_up^T


def _relu_squared_bytes(shape: Shape, dtype: torch.dtype, mode: str) -> int:
    mn_s = shape["tokens"] * shape["intermediate"] * dtype.itemsize
    # forward: read x, write y = relu(x)^2     -> 2 * M*N*s
    # backward: read dy and x, write dx        -> 3 * M*N*s
    return {"forward": 2, "backward": 3, "full": 5}[mode] * mn_s


RELU_SQUARED = register(
    BenchSpec(
        op="relu_squared",
        dims=("tokens", "intermediate"),
        providers=_unary_providers(
            "kernelwright.ops.relu_squared",
            "relu_squared",
            "relu_squared_eager",
            ("liger_kernel.ops.relu_squared", "LigerReLUSquaredFunction"),
        ),
        make_inputs=_relu_squared_inputs,
        grad_inputs=("x",),
        bytes=_relu_squared_bytes,
        sweeps=(
            Sweep("tokens", token_counts(1024, 16384), {"intermediate": REFERENCE.intermediate}),
            Sweep("intermediate", distinct("intermediate"), {"tokens": DEFAULT_TOKENS}),
        ),
        quick_sweeps=(
            Sweep("tokens", (DEFAULT_TOKENS, 16384), {"intermediate": REFERENCE.intermediate}),
        ),
        interpreter_sweeps=(Sweep("intermediate", (256, 512), {"tokens": 64}),),
    )
)


# --------------------------------------------------------------------------- jagged_mean


def _jagged_lengths(shape: Shape, *, seed: int = 0) -> torch.Tensor:
    # Segment lengths uniform in 1..max_len, from a seeded CPU generator: make_inputs and the
    # byte count draw the same lengths, so the byte count knows the total row count.
    gen = generator(seed + 77)
    return torch.randint(1, shape["max_len"] + 1, (shape["segments"],), generator=gen)


def _jagged_inputs(shape: Shape, dtype: torch.dtype, device, *, seed: int = 0):
    lengths = _jagged_lengths(shape, seed=seed)
    offsets = torch.zeros(shape["segments"] + 1, dtype=torch.int64)
    offsets[1:] = lengths.cumsum(0)
    total = int(offsets[-1])
    return {
        "values": rand((total, shape["d"]), dtype, device, gen=generator(seed)),  # [total, D]
        "offsets": offsets.to(device),  # [B + 1] int64
    }


def _jagged_bytes(shape: Shape, dtype: torch.dtype, mode: str) -> int:
    b, d, s = shape["segments"], shape["d"], dtype.itemsize
    total = int(_jagged_lengths(shape).sum())
    offsets = (b + 1) * 8  # int64
    # forward: read values (total*D*s) and offsets; write out (B*D*s)
    fwd = total * d * s + offsets + b * d * s
    # backward: read dout (B*D*s) and offsets; write dvalues (total*D*s)
    bwd = b * d * s + offsets + total * d * s
    return {"forward": fwd, "backward": bwd, "full": fwd + bwd}[mode]


def _jagged_providers() -> tuple[Provider, ...]:
    m, names = "kernelwright.ops.jagged_mean", ("values", "offsets")
    return (
        Provider("kernelwright", _call(m, "jagged_mean", names, validate=False)),
        Provider("kernelwright_validate", _call(m, "jagged_mean", names, validate=True)),
        Provider("loop", _call(m, "jagged_mean_loop", names), slow=True),
        *_torch_providers(m, "jagged_mean_vectorized", names),
        Provider("torch_segment_reduce", _call(m, "jagged_mean_segment_reduce", names)),
        Provider(
            "torch_segment_reduce_compile",
            _call(m, "jagged_mean_segment_reduce", names, compile_it=True),
            compiled=True,
        ),
    )


JAGGED_MEAN = register(
    BenchSpec(
        op="jagged_mean",
        dims=("segments", "max_len", "d"),
        providers=_jagged_providers(),
        make_inputs=_jagged_inputs,
        grad_inputs=("values",),
        bytes=_jagged_bytes,
        # The sweep: 4096 segments of random lengths 1..512 (~1.05M rows), D varies.
        sweeps=(Sweep("d", (64, 256, 1024), {"segments": 4096, "max_len": 512}),),
        quick_sweeps=(Sweep("d", (256, 1024), {"segments": 4096, "max_len": 512}),),
        interpreter_sweeps=(Sweep("d", (64,), {"segments": 8, "max_len": 8}),),
        notes={
            "kernelwright": "validate=False: the kernels alone, no offsets check",
            "kernelwright_validate": "validate=True (the default): one device sync per call",
            "loop": "per-segment .mean(0) in a Python loop: B launches, one host sync (not"
            " compiled: its data-dependent slices would graph-break or recompile per length)",
            "torch": "searchsorted segment ids + fp32 index_add_",
            "torch_segment_reduce": "torch.segment_reduce(values, 'mean', offsets=...)",
        },
    )
)


# --------------------------------------------------------------------------- rope

ROPE_THETA = 500000.0  # Llama 3's rope_theta: the cos/sin tables' values do not change the cost


@dataclass(frozen=True)
class HeadConfigSweep(Sweep):
    """One point per attention head config (heads, kv_heads, head_dim), the other dims fixed.

    Head configs vary three dims at once, so x is one number that names each: its `values`,
    here (heads + kv_heads) * head_dim, the q and k elements per token (distinct per config).
    """

    configs: tuple[tuple[int, int, int], ...] = ()  # (heads, kv_heads, head_dim), as `values`

    def shapes(self) -> list[tuple[int, dict[str, int]]]:
        return [
            (x, {**self.fixed, "heads": h, "kv_heads": kv, "head_dim": d})
            for x, (h, kv, d) in zip(self.values, self.configs, strict=True)
        ]


def _head_config_sweep(tokens: int) -> HeadConfigSweep:
    # The registry's distinct head configs, ordered by q+k width.
    configs = sorted({(m.heads, m.kv_heads, m.head_dim) for m in MODELS},
                     key=lambda c: (c[0] + c[1]) * c[2])  # fmt: skip
    widths = tuple((h + kv) * d for h, kv, d in configs)
    return HeadConfigSweep("qk_width", widths, {"tokens": tokens}, tuple(configs))


_REFERENCE_HEADS = {
    "heads": REFERENCE.heads, "kv_heads": REFERENCE.kv_heads, "head_dim": REFERENCE.head_dim
}  # fmt: skip


def _rope_inputs(shape: Shape, dtype: torch.dtype, device, *, seed: int = 0):
    from kernelwright.ops.rope import rope_tables

    gen = generator(seed)
    s, d = shape["tokens"], shape["head_dim"]  # batch 1: one sequence of `tokens` positions
    # q, k as HF attention hands them over: proj(x).view(1, S, H, D).transpose(1, 2), a
    # non-contiguous [1, H, S, D] view; cos/sin [1, S, D] in q's dtype, as HF's rotary
    # embedding returns them.
    cos, sin = rope_tables(s, d, base=ROPE_THETA, dtype=dtype, device=device)
    return {
        "q": rand((1, s, shape["heads"], d), dtype, device, gen=gen).transpose(1, 2),
        "k": rand((1, s, shape["kv_heads"], d), dtype, device, gen=gen).transpose(1, 2),
        "cos": cos,
        "sin": sin,
    }


def _rope_bytes(shape: Shape, dtype: torch.dtype, mode: str) -> int:
    t, d, s = shape["tokens"], shape["head_dim"], dtype.itemsize
    qk = t * (shape["heads"] + shape["kv_heads"]) * d * s  # q and k, [1, H, S, D] each
    tables = 2 * t * d * s  # cos and sin [1, S, D]: each row read once, for all heads
    # forward: read q, k and cos, sin; write q_out, k_out         -> 2 * qk + tables
    # backward: read dq_out, dk_out and cos, sin; write dq, dk    -> 2 * qk + tables
    per_pass = 2 * qk + tables
    return {"forward": per_pass, "backward": per_pass, "full": 2 * per_pass}[mode]


def _rope_providers() -> tuple[Provider, ...]:
    m, names = "kernelwright.ops.rope", ("q", "k", "cos", "sin")
    return (
        Provider("kernelwright", _call(m, "rope", names, in_place=False)),
        # writes q and k in place (rope(..., in_place=True)), as Liger does
        Provider("kernelwright_inplace", _call(m, "rope", names, in_place=True), mutates=True),
        *_torch_providers(m, "rope_eager", names),
        # (q, k, cos, sin, position_ids=None, unsqueeze_dim=1); half-split, full rotary only.
        # Liger rotates q and k in place when q.transpose(1, 2) is contiguous (HF's layout),
        # and the gradients in place over dq_out / dk_out.
        Provider(
            "liger",
            _call("liger_kernel.transformers.rope", "liger_rotary_pos_emb", names),
            requires="liger_kernel",
            mutates=True,
        ),
    )


ROPE = register(
    BenchSpec(
        op="rope",
        dims=("tokens", "heads", "kv_heads", "head_dim"),
        providers=_rope_providers(),
        make_inputs=_rope_inputs,
        grad_inputs=("q", "k"),
        bytes=_rope_bytes,
        backward_through=(0, 1),
        sweeps=(
            Sweep("tokens", token_counts(1024, 32768), _REFERENCE_HEADS),
            _head_config_sweep(DEFAULT_TOKENS),
        ),
        quick_sweeps=(Sweep("tokens", (DEFAULT_TOKENS, 32768), _REFERENCE_HEADS),),
        interpreter_sweeps=(Sweep("tokens", (8, 16), {"heads": 4, "kv_heads": 2, "head_dim": 32}),),
        notes={
            "torch": "HF apply_rotary_pos_emb (rotate_half) in the input dtype",
            "liger": "liger_rotary_pos_emb: rotates q/k (and the gradients) in place",
        },
    )
)


# --------------------------------------------------------------------------- losses

IGNORE_INDEX = -100
IGNORED_FRACTION = 0.05  # padding / prompt tokens masked out of the loss, as in SFT batches


def _loss_targets(m: int, v: int, gen: torch.Generator, device) -> torch.Tensor:
    # [M] int64 class indices in [0, V), ~5% of them ignore_index
    return class_targets(
        (m,), v, gen, device, ignore_fraction=IGNORED_FRACTION, ignore_index=IGNORE_INDEX
    )


def _ce_inputs(shape: Shape, dtype: torch.dtype, device, *, seed: int = 0):
    gen = generator(seed)
    m, v = shape["tokens"], shape["vocab"]
    return {
        # std 4: a trained lm-head's logits spread over several units (as softmax's inputs)
        "logits": rand((m, v), dtype, device, gen=gen, std=4.0),  # [M, V]
        "target": _loss_targets(m, v, gen, device),  # [M] int64
    }


def _ce_bytes(shape: Shape, dtype: torch.dtype, mode: str) -> int:
    logits = shape["tokens"] * shape["vocab"] * dtype.itemsize
    targets = shape["tokens"] * 8  # int64; the loss is one fp32 scalar, not counted
    # forward: read logits and targets                                    -> M*V*s + M*8
    # full: read logits and targets once, write the gradient              -> 2*M*V*s + M*8
    #   (ours reads each row twice, the second time mostly from L2: not counted)
    # backward: what a standalone backward moves, read logits (or the saved softmax) and
    #   targets, write the gradient -> as "full". Ours wrote the gradient in the forward and
    #   its backward is a multiply skipped at dy = 1: its backward GB/s means nothing.
    full = 2 * logits + targets
    return {"forward": logits + targets, "backward": full, "full": full}[mode]


def _ce_input_bytes(shape: Shape, dtype: torch.dtype) -> int:
    return shape["tokens"] * shape["vocab"] * dtype.itemsize


def _ce_providers() -> tuple[Provider, ...]:
    m, names = "kernelwright.ops.cross_entropy", ("logits", "target")
    liger = ("liger_kernel.ops.cross_entropy", "LigerCrossEntropyFunction.apply")
    return (
        Provider("kernelwright", _call(m, "cross_entropy", names, ignore_index=IGNORE_INDEX)),
        Provider(
            "kernelwright_inplace",
            _call(m, "cross_entropy", names, ignore_index=IGNORE_INDEX, in_place=True),
            mutates=True,
        ),
        *_torch_providers(m, "cross_entropy_eager", names, ignore_index=IGNORE_INDEX),
        # (_input, target, weight, ignore_index, lse_square_scale, label_smoothing, reduction,
        #  softcap, return_z_loss, return_token_accuracy, return_predicted_tokens)
        # -> (loss, z_loss, token_accuracy, predicted_tokens); the backward runs through loss.
        # Its forward writes the gradient over the logits (always in place).
        Provider(
            "liger",
            _call(*liger, names, None, IGNORE_INDEX, 0.0, 0.0, "mean", None, False, False, False),
            requires="liger_kernel",
            mutates=True,
        ),
    )


CROSS_ENTROPY = register(
    BenchSpec(
        op="cross_entropy",
        dims=("tokens", "vocab"),
        providers=_ce_providers(),
        make_inputs=_ce_inputs,
        grad_inputs=("logits",),
        bytes=_ce_bytes,
        sweeps=(
            # the models' vocabularies plus powers of two across the one-block/looped switch
            Sweep(
                "vocab",
                tuple(sorted({32768, 65536, 131072, 262144, *distinct("vocab")})),
                {"tokens": DEFAULT_TOKENS},
            ),
            Sweep("tokens", token_counts(4096, 32768), {"vocab": REFERENCE.vocab}),
        ),
        quick_sweeps=(Sweep("vocab", (REFERENCE.vocab,), {"tokens": DEFAULT_TOKENS}),),
        interpreter_sweeps=(Sweep("vocab", (512, 5000), {"tokens": 16}),),
        input_bytes=_ce_input_bytes,
        # 16 GiB of logits: 32768 x 262144 in bf16 is the largest measured. Eager PyTorch needs
        # several times the logits' size (fp32 upcast, log-softmax, gradients): where it runs
        # out of memory its rows say OOM.
        max_input_bytes=2**34,
        notes={
            "kernelwright": "reduction='mean', ignore_index=-100; the forward also writes the "
            "gradient (already divided by the token count) and the backward is a multiply "
            "skipped at dy = 1, so compare 'full'",
            "kernelwright_inplace": "in_place=True: the gradient written over the logits, as "
            "Liger does",
            "torch": "F.cross_entropy(logits.float(), target), as HF models compute it",
            "torch_compile": "the torch provider under torch.compile",
            "liger": "LigerCrossEntropyFunction: gradient computed in the forward and written "
            "over the logits; one host sync per call (.item() of the token count)",
        },
        unit_grad=True,
        backward_once=True,
    )
)


# ----------------------------------------------------------------------- fused_linear_cross_entropy


def _flce_inputs(shape: Shape, dtype: torch.dtype, device, *, seed: int = 0):
    gen = generator(seed)
    t, h, v = shape["tokens"], shape["hidden"], shape["vocab"]
    return {
        "hidden": rand((t, h), dtype, device, gen=gen),  # [T, H], normed hidden states
        # [V, H] with std 3 / sqrt(H) (0.047 at H = 4096): logits of std ~3, a trained
        # lm-head's spread, whatever H is
        "weight": rand((v, h), dtype, device, gen=gen, std=3.0 / h**0.5),
        "target": _loss_targets(t, v, gen, device),  # [T] int64
    }


def _flce_bytes(shape: Shape, dtype: torch.dtype, mode: str) -> int:
    t, h, v, s = shape["tokens"], shape["hidden"], shape["vocab"], dtype.itemsize
    hidden, weight, targets = t * h * s, v * h * s, t * 8
    # forward: read hidden, weight and targets; the [T, V] logits need never reach memory
    #   -> (T + V)*H*s + T*8
    # full: that, plus write grad_hidden and grad_weight -> 2*(T + V)*H*s + T*8
    # backward (standalone, recomputing the logits): read hidden, weight, targets, write both
    #   gradients -> as "full". Compute-bound: see the FLOP count.
    fwd = hidden + weight + targets
    full = 2 * (hidden + weight) + targets
    return {"forward": fwd, "backward": full, "full": full}[mode]


def _flce_flops(shape: Shape, dtype: torch.dtype, mode: str) -> int:
    matmul = 2 * shape["tokens"] * shape["hidden"] * shape["vocab"]  # [T, H] x [H, V]
    # forward: logits = hidden @ weight.T                                          1 matmul
    # backward: grad_hidden = dlogits @ weight, grad_weight = dlogits.T @ hidden    2 matmuls
    # full: 3 matmuls (25.8 TFLOP at 8192 x 4096 x 128256); the O(T*V) softmax is not counted
    return {"forward": 1, "backward": 2, "full": 3}[mode] * matmul


def _flce_providers() -> tuple[Provider, ...]:
    m, fn = "kernelwright.ops.fused_linear_cross_entropy", "fused_linear_cross_entropy"
    names = ("hidden", "weight", "target")
    liger = ("liger_kernel.ops.fused_linear_cross_entropy", "LigerFusedLinearCrossEntropyFunction")

    def liger_chunk(inp: Inputs):
        # Liger 0.8.5's rule, so the logits buffer (and the memory) is Liger's:
        # next_power_of_2(ceil(T / ceil(V / H))), 256 tokens at 8192 x 4096 x 128256
        (t, h), v = inp["hidden"].shape, inp["weight"].shape[0]
        chunk = 1 << (math.ceil(t / math.ceil(v / h)) - 1).bit_length()
        return _call(m, fn, names, ignore_index=IGNORE_INDEX, chunk_size=chunk)(inp)

    return (
        # chunk_size left to the op
        Provider("kernelwright", _call(m, fn, names, ignore_index=IGNORE_INDEX)),
        Provider("kernelwright_liger_chunk", liger_chunk),
        *_torch_providers(m, fn + "_eager", names, ignore_index=IGNORE_INDEX),
        # (_input, weight, target, bias, ce_weight, ignore_index, lse_square_scale,
        #  label_smoothing, reduction, softcap, return_z_loss, accum_dtype, ...) -> (loss,
        #  z_loss, token_accuracy, predicted_tokens); the rest left at their defaults.
        Provider(
            "liger",
            _call(
                liger[0],
                liger[1] + ".apply",
                names,
                *(None, None, IGNORE_INDEX, 0.0, 0.0, "mean", None, False, None),
            ),
            requires="liger_kernel",
        ),
    )


FUSED_LINEAR_CROSS_ENTROPY = register(
    BenchSpec(
        op="fused_linear_cross_entropy",
        dims=("tokens", "hidden", "vocab"),
        providers=_flce_providers(),
        make_inputs=_flce_inputs,
        grad_inputs=("hidden", "weight"),
        bytes=_flce_bytes,
        flops=_flce_flops,
        sweeps=(
            Sweep(
                "vocab",
                tuple(sorted({*distinct("vocab"), 262144})),
                {"tokens": DEFAULT_TOKENS, "hidden": REFERENCE.hidden},
            ),
            Sweep(
                "tokens",
                token_counts(4096, 32768),
                {"hidden": REFERENCE.hidden, "vocab": REFERENCE.vocab},
            ),
        ),
        quick_sweeps=(
            Sweep(
                "vocab",
                (REFERENCE.vocab,),
                {"tokens": DEFAULT_TOKENS, "hidden": REFERENCE.hidden},
            ),
        ),
        interpreter_sweeps=(Sweep("vocab", (300,), {"tokens": 64, "hidden": 32}),),
        # No input cap: the inputs are small; eager PyTorch's [T, V] logits (and their fp32
        # copies) are what runs out of memory, and its rows then say OOM.
        notes={
            "kernelwright": "chunks of >= 512 tokens; the forward runs all three matmuls "
            "and leaves the gradients ready, the backward is a multiply skipped at dy = 1: "
            "compare 'full' (its forward TFLOP/s counts one matmul of the three it runs)",
            "kernelwright_liger_chunk": "Liger's chunk size (so Liger's memory)",
            "torch": "F.linear to the full [T, V] logits, .float(), F.cross_entropy: HF's "
            "lm-head + loss",
            "torch_compile": "the torch provider under torch.compile",
            "liger": "LigerFusedLinearCrossEntropyFunction: chunked, gradients computed in "
            "the forward; one host sync per call (.item() of the token count)",
        },
        unit_grad=True,
        backward_once=True,
    )
)
